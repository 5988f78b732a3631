"""One rank of ``meshwise measure`` (run under torchrun): build the layout with the runtime, run a
warm-up step, then measure one step's collectives and peak memory; then time the next steps, round
robin over the launch's layouts (each layout's median step, split into parts that add up to it:
measure/timing.py); for a mixture of experts, as many steps more with its blocks' parts timed
(runtime/moe.py ``timed_parts``), each part's median.

Writes ``<out>/rank<r>.json``: memory by MemTracker category, collectives per kind and mesh
dimension (the planner's names: ``dp`` for the whole data-parallel group, ``dp_shard`` and
``dp_replicate`` under HSDP, ``world`` for a group of every rank), and step times.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshwise.errors import MeshwiseError
from meshwise.files import write_atomically
from meshwise.launch import init_process_group, report
from meshwise.layout import Layout, expert_group_ranks, parse
from meshwise.measure._torch_tools import peak_by_category, peak_moments, tracker_for
from meshwise.measure.comm_trace import CollectiveTrace
from meshwise.measure.timeline import StageTimeline
from meshwise.measure.timing import StepClock
from meshwise.runtime import build_mesh, parallelize
from meshwise.runtime.expert_parallel import grouped_experts
from meshwise.runtime.mesh import default_backend, end_process_group, exit_worker
from meshwise.runtime.moe import timed_parts
from meshwise.spec import load_model

MEMORY_STEPS = 2


def canonical_dim(dim: str, layout: Layout) -> str:
    """The planner's name for a measured mesh dimension."""
    if dim == "dp_shard" and layout.replicate == 1:
        return "dp"
    if dim == "dp_replicate" and layout.shard == 1:
        return "dp"
    if dim.startswith("group") and int(dim[5:]) == layout.dp:
        return "dp"  # zero=0 over dp_replicate x dp_shard flattened
    return dim


class LayoutRun:
    """One layout built on the running process group: warmed up, its collectives and memory
    measured (:meth:`__init__`), then timed one step at a time (:meth:`timed_step`, called round
    robin over every layout of the launch so that a machine whose load shifts shifts them all
    alike), and finally recorded (:meth:`record`)."""

    def __init__(self, spec, layout: Layout, global_batch: int, seq: int, precision: str | None = None) -> None:
        self.layout, self.global_batch, self.seq = layout, global_batch, seq
        self.mesh = build_mesh(layout, spec, global_batch)
        model = self.model = parallelize(
            spec, layout, self.mesh, global_batch, seq_len=seq, seed=0, precision=precision
        )
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, spec.vocab, (global_batch, seq + 1), generator=gen)
        self.x, self.y = model.local_batch(tokens[:, :-1]), model.local_batch(tokens[:, 1:])

        model.step(self.x, self.y)  # warm-up: lazy state (optimizer moments, FSDP buffers) exists from here on
        self.memory, self.trace, self.ep_group, self.moments = measure_steps(model, self.mesh, self.x, self.y)
        self.times: list[tuple[float, dict[str, float]]] = []  # (step seconds, its parts)
        self.moe_parts: list[dict[str, float]] = []  # per MoE-parts step, seconds per part (runtime/moe.py)
        self.has_moe = bool(spec.moe)
        self.timeline = StageTimeline(model.stages, enabled=False)

    def timed_step(self, last: bool) -> None:
        """One timed step (every rank starts it at a barrier); ``last``: also record its F/B/W timeline."""
        with StepClock(self.model) as clock:
            dist.barrier()
            with StageTimeline(self.model.stages, enabled=last) as timeline:
                clock.reset()
                start = time.perf_counter()
                loss = self.model.step(self.x, self.y)[0]
                with clock.window("fixed"):
                    loss.item()  # the loss read, as the trainer does: the step's one host sync
                step_s = time.perf_counter() - start
        self.times.append((step_s, clock.parts(step_s)))
        if last:
            self.timeline = timeline

    def moe_parts_step(self) -> None:
        """One step with the MoE blocks' parts timed (runtime/moe.py ``timed_parts``): a step of its own,
        so that the timing's stamps never lengthen the timed steps."""
        with timed_parts() as clock:
            dist.barrier()
            self.model.step(self.x, self.y)[0].item()
        self.moe_parts.append(dict(clock.seconds))

    def record(self) -> dict:
        """This rank's record."""
        timing: dict = {}
        if self.times:  # the median step (the upper one of an even count) and its parts, which add up to it
            median = sorted(self.times, key=lambda t: t[0])[len(self.times) // 2]
            timing = {"step_s": median[0], **median[1], "steps_s": [t[0] for t in self.times]}
        if self.moe_parts:  # each part's median over the parts steps
            timing["moe_parts"] = {
                k: sorted(p[k] for p in self.moe_parts)[len(self.moe_parts) // 2] for k in self.moe_parts[0]
            }
        return {
            **measurement_record(
                self.mesh,
                self.layout,
                self.global_batch,
                self.seq,
                self.memory,
                self.trace,
                self.ep_group,
                self.moments,
            ),
            "time": timing or None,
            "timeline": self.timeline.events,
            **device_memory(),
        }


def device_memory() -> dict[str, int]:
    """On a CUDA device, the caching allocator's peaks since the process started (``cuda_peak_allocated``:
    tensors; ``cuda_peak_reserved``: what it holds from the driver); nothing on a CPU."""
    if not torch.cuda.is_available():
        return {}
    return {
        "cuda_peak_allocated": torch.cuda.max_memory_allocated(),
        "cuda_peak_reserved": torch.cuda.max_memory_reserved(),
    }


def measure_steps(model, mesh, x: torch.Tensor, y: torch.Tensor, steps: int = MEMORY_STEPS):
    """``steps`` steps on (x, y) after a warm-up step, which the caller ran: the first under the
    collective trace, every one under MemTracker. Returns (peak memory by category, the trace, the
    EP group or None, the cost model's moments that peak can be: _torch_tools.peak_moments, None
    where it fell in a backward outside any module, or under PP). gloo works asynchronously, so a transient
    buffer sometimes lands on a step's peak: of several steps, the lowest peak is the step's own."""
    ep_group = next((m.group for c in model.modules for m in grouped_experts(c) if m.group is not None), None)
    named = {"ep": ep_group} if ep_group is not None else None
    memory: dict[str, int] | None = None
    for i in range(steps):
        tracker = tracker_for(model.modules, model.optimizer)
        if i == 0:
            with CollectiveTrace(mesh, named, _expert_dp_ranks(model.layout, ep_group)) as trace, tracker:
                model.step(x, y)
        else:
            with tracker:
                model.step(x, y)
        peak = peak_by_category(tracker)
        if memory is None or sum(peak.values()) < sum(memory.values()):
            # under PP the tracker does not follow a stage's backward (its inputs are leaves it
            # does not hook: _torch_tools._LeafSafeModTracker), so where the peak fell is not known
            # (measured: the 8-rank interleaved layout's first stage read as "forward", params -57%)
            memory, moments = (
                peak,
                (peak_moments(tracker, model.layout.cp > 1) or None) if model.layout.pp == 1 else None,
            )
    return memory, trace, ep_group, moments


def _expert_dp_ranks(layout: Layout, ep_group) -> dict[str, tuple[int, ...]]:
    """The experts' data-parallel group, named ``edp`` as the plan names it (expert parallelism)."""
    if ep_group is None:
        return {}
    return {"edp": expert_group_ranks(layout, dist.get_rank(), "dp_shard_mod_ep")}


def measurement_record(
    mesh,
    layout: Layout,
    global_batch: int,
    seq: int,
    memory: dict[str, int],
    trace: CollectiveTrace,
    ep_group,
    moments: list[str] | None = None,
) -> dict:
    """This rank's record of memory and collectives, without timing (``time`` None, no timeline);
    ``peak_moments`` where the peak fell (compare.peak_moved), if known."""
    comm: dict[tuple[str, str], list[int]] = {}
    for key, calls in trace.calls.items():
        if key.dim == "group1":  # a one-rank group (the experts' DP group when dp = ep) moves nothing
            continue
        # the EP group can be a mesh dim's (dp_shard, cp, dp_shard_cp): only the all-to-alls are expert
        # parallelism's, the rest is named by its ranks
        dim = trace.mesh_dim_of(ep_group) if key.dim == "ep" and key.kind != "all_to_all" else key.dim
        entry = comm.setdefault((key.kind, canonical_dim(dim, layout)), [0, 0])
        entry[0] += calls
        entry[1] += trace.bytes[key]
    if ep_group is not None:
        # a rank combines (and its backward dispatches) the token copies routed to its experts, which
        # vary by rank; their mean over the EP group is every rank's own copies, what plan predicts
        ep_bytes = torch.tensor([comm.get(("all_to_all", "ep"), [0, 0])[1]], dtype=torch.float64)
        dist.all_reduce(ep_bytes, group=ep_group)
        if ("all_to_all", "ep") in comm:
            comm[("all_to_all", "ep")][1] = int(round(ep_bytes.item() / dist.get_world_size(ep_group)))
    return {
        "rank": dist.get_rank(),
        "pp_rank": mesh.get_local_rank("pp"),
        "layout": layout.format(),
        "global_batch": global_batch,
        "seq_len": seq,
        "world": dist.get_world_size(),
        "memory": memory,
        **({"peak_moments": moments} if moments else {}),
        "comm": [
            {"kind": k, "dim": d, "count_per_step": c, "bytes_per_step": b} for (k, d), (c, b) in sorted(comm.items())
        ],
        "time": None,
        "timeline": [],
    }


def _refuse(e: MeshwiseError) -> int:
    """Bad input: handed to the launcher (one line, exit status 2), or printed under a plain torchrun."""
    if not report(2, str(e)):
        print(f"meshwise: error: {e}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument(
        "--layout",
        action="append",
        default=None,
        help="repeat to measure several layouts in turn; model:layout for another model than --model",
    )
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True, help="folder; layout i writes <out>/<i>/rank<r>.json")
    ap.add_argument("--timeout", type=float, default=900.0, help="collective timeout, seconds")
    ap.add_argument("--precision", default=None, help="a float8 format (runtime/float8.py); default: the device's own")
    args = ap.parse_args(argv)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        models = [_model_of(text, args.model) for text in (args.layout or [""])]
        specs = {name: load_model(name) for name in set(m for m, _ in models)}
        layouts = [(specs[name], parse(text, world)) for name, text in models]
    except MeshwiseError as e:
        return _refuse(e)
    init_process_group(default_backend(), args.timeout)
    runs: list[LayoutRun] = []
    for i, (spec, layout) in enumerate(layouts):
        try:
            runs.append(LayoutRun(spec, layout, args.global_batch, args.seq_len or spec.max_seq, args.precision))
        except MeshwiseError as e:
            return _refuse(e)
        if not args.steps:  # memory and collectives only: write it now, keep nothing
            _write(args, i, runs.pop().record(), models[i][0])
    for step in range(args.steps):  # round robin: step k of every layout, then step k + 1
        for run in runs:
            run.timed_step(last=step == args.steps - 1)
    for _ in range(args.steps):  # then the MoE layouts' parts, in steps of their own
        for run in runs:
            if run.has_moe:
                run.moe_parts_step()
    for i, run in enumerate(runs):
        _write(args, i, run.record(), models[i][0])
    end_process_group()
    return 0


def _model_of(text: str, default: str) -> tuple[str, str]:
    """(model, layout) of a ``--layout``: ``model:layout`` (the parity suite's case names) measures
    that catalog model in the same launch, a plain layout the ``--model``."""
    model, sep, layout = text.rpartition(":")
    return (model, layout) if sep else (default, text)


def _write(args: argparse.Namespace, i: int, record: dict, model: str) -> None:
    record["model"] = model
    folder = Path(args.out) / str(i)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / f"rank{record['rank']}.json", json.dumps(record))
    gc.collect()


if __name__ == "__main__":
    exit_worker(main())
