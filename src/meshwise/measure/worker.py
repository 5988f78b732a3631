"""One rank of ``meshwise measure`` (run under torchrun): build the layout with the runtime, run a
warm-up step, then measure one step's collectives and peak memory and time the next steps (their
median, split into parts that add up to it: measure/timing.py).

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
from meshwise.layout import Layout, parse
from meshwise.measure._torch_tools import peak_by_category, tracker_for
from meshwise.measure.timeline import StageTimeline
from meshwise.measure.timing import StepClock, profile_step, split
from meshwise.runtime import build_mesh, parallelize
from meshwise.launch import init_process_group, report
from meshwise.measure.comm_trace import CollectiveTrace
from meshwise.runtime.mesh import default_backend, end_process_group, exit_worker
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


def measure_layout(spec, layout: Layout, global_batch: int, seq: int, steps: int) -> dict:
    """Measure one layout on the running process group; returns this rank's record."""
    mesh = build_mesh(layout, spec, global_batch)
    model = parallelize(spec, layout, mesh, global_batch, seq_len=seq, seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab, (global_batch, seq + 1), generator=gen)
    x, y = model.local_batch(tokens[:, :-1]), model.local_batch(tokens[:, 1:])

    model.step(x, y)  # warm-up: lazy state (optimizer moments, FSDP buffers) exists from here on
    tracker = tracker_for(model.modules, model.optimizer)
    with CollectiveTrace(mesh) as trace, tracker:
        model.step(x, y)
    memory = peak_by_category(tracker)
    # gloo works asynchronously, so a transient buffer sometimes lands on a step's peak: of
    # MEMORY_STEPS measured steps, the lowest peak is the step's own
    for _ in range(MEMORY_STEPS - 1):
        tracker = tracker_for(model.modules, model.optimizer)
        with tracker:
            model.step(x, y)
        again = peak_by_category(tracker)
        if sum(again.values()) < sum(memory.values()):
            memory = again

    times: list[tuple[float, float, float]] = []  # (step, forward/backward, optimizer) seconds
    timeline = StageTimeline(model.stages, enabled=False)
    with StepClock(model) as clock:
        for i in range(steps):
            dist.barrier()
            clock.reset()
            with StageTimeline(model.stages, enabled=i == steps - 1) as timeline:  # the last timed step's F/B/W
                start = time.perf_counter()
                model.step(x, y)
                times.append((time.perf_counter() - start, clock.fb_s, clock.opt_s))
        timing: dict[str, float] = {}
        if steps:  # steps = 0: memory and collectives only
            dist.barrier()
            timing = profile_step(lambda: model.step(x, y))
    if times:  # the median step (the upper one of an even count) and its parts, which add up to it
        median = sorted(times)[len(times) // 2]
        timing = {"step_s": median[0], **split(*median, timing), "steps_s": [t[0] for t in times],
                  "profile": timing}

    comm: dict[tuple[str, str], list[int]] = {}
    for key, calls in trace.calls.items():
        entry = comm.setdefault((key.kind, canonical_dim(key.dim, layout)), [0, 0])
        entry[0] += calls
        entry[1] += trace.bytes[key]
    return {
        "rank": dist.get_rank(), "pp_rank": mesh.get_local_rank("pp"), "layout": layout.format(),
        "global_batch": global_batch, "seq_len": seq, "world": dist.get_world_size(), "memory": memory,
        "comm": [{"kind": k, "dim": d, "count_per_step": c, "bytes_per_step": b}
                 for (k, d), (c, b) in sorted(comm.items())],
        "time": timing or None,
        "timeline": timeline.events,
    }


def _refuse(e: MeshwiseError) -> int:
    """Bad input: handed to the launcher (one line, exit status 2), or printed under a plain torchrun."""
    if not report(2, str(e)):
        print(f"meshwise: error: {e}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layout", action="append", default=None, help="repeat to measure several layouts in turn")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True, help="folder; layout i writes <out>/<i>/rank<r>.json")
    ap.add_argument("--timeout", type=float, default=900.0, help="collective timeout, seconds")
    args = ap.parse_args(argv)

    spec = load_model(args.model)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    seq = args.seq_len or spec.max_seq
    try:
        layouts = [parse(text, world) for text in (args.layout or [""])]
    except MeshwiseError as e:
        return _refuse(e)
    init_process_group(default_backend(), args.timeout)
    for i, layout in enumerate(layouts):
        try:
            record = measure_layout(spec, layout, args.global_batch, seq, args.steps)
        except MeshwiseError as e:
            return _refuse(e)
        record["model"] = args.model
        folder = Path(args.out) / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / f"rank{record['rank']}.json", json.dumps(record))
        gc.collect()
    end_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(main())
