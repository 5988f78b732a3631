"""Helpers of the parity suite: the single-process reference, and worker groups that run many
layouts of one world size in one set of processes (torch start-up is the main cost on CPU).

Every layout builds its own DeviceMesh (new process groups) inside the same workers. A failure in
any rank is sent back with its traceback and the whole group is killed; a group that runs past
its deadline is killed too, so a test fails with a message instead of hanging.

The workers of a group are forked from one spawned process that imported torch and meshwise's
runtime once (``_zygote``), not spawned one by one: each spawn imports torch again (about 3 s of
CPU), which on a 2-core machine made the 8-rank group wait for 8 imports before its first layout.
Nothing runs a torch operation or starts a thread before the fork. ``launch_forked`` starts the
ranks of a worker module (tests/test_measure.py: ``meshwise.measure.worker``) the same way.
"""

from __future__ import annotations

import importlib
import io
import os
import queue as queue_mod
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from meshwise.launch import free_port
from meshwise.runtime.mesh import end_process_group, exit_worker
from meshwise.spec import ModelSpec, load_model

SEED = 0
DATA_SEED = 1234
STEPS = 4  # three steps after the first: Adam's moments matter from step 2 on; tiny clips steps 3 and 4, not 1 and 2
GLOBAL_BATCH = 8
MODEL = "tiny"
MAX_GRAD_NORM = 0.65  # inside the test models' gradient norms (~0.5-0.8): some steps are clipped, some not
LR = 3e-3  # the regime the clipping and tolerances above were chosen in (not the trainer's default)


def optim_config():
    from meshwise.runtime import OptimizerConfig

    return OptimizerConfig(lr=LR, grad_clip=MAX_GRAD_NORM)


def spec(model: str = MODEL) -> ModelSpec:
    return load_model(model)


def batches(model: ModelSpec, steps: int = STEPS) -> torch.Tensor:
    """(steps, global_batch, seq+1) token ids from a fixed generator: inputs [:-1], targets [1:]."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    return torch.randint(0, model.vocab, (steps, GLOBAL_BATCH, model.max_seq + 1), generator=gen)


def held_out(model: ModelSpec) -> torch.Tensor:
    """One (global_batch, seq+1) batch no step trains on: the eval loss after the last step."""
    gen = torch.Generator().manual_seed(DATA_SEED + 1)
    return torch.randint(0, model.vocab, (GLOBAL_BATCH, model.max_seq + 1), generator=gen)


@dataclass
class Run:
    losses: list[float]
    weights: dict[str, torch.Tensor]
    grad_norms: list[float] = field(default_factory=list)
    eval_loss: float | None = None  # on ``held_out`` after the last step


def reference(
    seed: int = SEED,
    model: str = MODEL,
    precision: str = "",
    steps: int = STEPS,
    tp: int = 1,
    micro_rows: int = GLOBAL_BATCH,
) -> Run:
    """Plain single-process training: whole global batch at once, torch's own clipping and AdamW.
    ``precision`` fp8 / fp8-rowwise: the same model with torchao's float8 linears, converted as the
    runtime converts them under ``tp`` (the same linears kept in high precision). ``micro_rows``:
    the batch runs as micro-batches of that many rows, accumulated (float8's dynamic scales are
    per GEMM call, so a layout's micro-batches quantise as the reference's do)."""
    from meshwise.runtime import build_model, loss_sum

    model_spec = spec(model)
    cfg = optim_config()
    model = build_model(model_spec, seed)
    if precision:
        from meshwise.runtime import float8

        float8.convert(model, precision, tp, emulate=True)  # a CPU rank's GEMMs, as the runtime runs them
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    data = batches(model_spec, steps)
    losses, norms = [], []
    for step in range(steps):
        x, y = data[step, :, :-1], data[step, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for first in range(0, GLOBAL_BATCH, micro_rows):
            rows = slice(first, first + micro_rows)
            part = loss_sum(model(x[rows]), y[rows]) / y.numel()
            part.backward()
            loss = loss + part.detach()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        opt.step()
        losses.append(loss.item())
    ev = held_out(model_spec)
    with torch.no_grad():
        eval_loss = (loss_sum(model(ev[:, :-1]), ev[:, 1:]) / ev[:, 1:].numel()).item()
    return Run(losses, {n: p.detach().clone() for n, p in model.named_parameters()}, norms, eval_loss)


# ----------------------------------------------------------------------------------- workers
@dataclass(frozen=True)
class Case:
    """One layout to run; ``corrupt`` deliberately breaks the run (the suite must notice)."""

    layout: str
    model: str = MODEL  # a catalog model
    # "" | "same-data" (every replica gets replica 0's rows) | "seed" (other init)
    # | "raise" (the last rank fails mid-run while the others wait in a collective)
    # | "cp-local" (context parallelism without the ring: each rank attends to its own tokens only)
    corrupt: str = ""
    compile: bool = False  # torch.compile per block, and a warm-up forward/backward before step 1
    measured: bool = True  # False: parity only, left out of tests/test_measure.py (a known memory-model gap)
    precision: str = ""  # "" the device's; fp8 / fp8-rowwise: torchao float8 linears (meshwise.runtime.float8)
    steps: int = STEPS

    @property
    def name(self) -> str:
        model = "" if self.model == MODEL else f"{self.model}:"
        return (
            model
            + self.layout
            + (f"[{self.corrupt}]" if self.corrupt else "")
            + ("[compile]" if self.compile else "")
            + (f"[{self.precision}]" if self.precision else "")
        )


def run_case(case: Case, world: int) -> tuple[list[float], list[float], dict[str, torch.Tensor], float]:
    """Inside a worker: train STEPS steps under ``case``; return losses, gradient norms, the full
    weights this rank reports (only ranks at dp=0, tp=0 of their stage report, after gathering the
    shards) and the eval loss on ``held_out``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from meshwise.layout import parse
    from meshwise.runtime import build_mesh, parallelize

    model_spec = spec(case.model)
    layout = parse(case.layout, world)
    mesh = build_mesh(layout, model_spec, GLOBAL_BATCH)
    pm = parallelize(
        model_spec,
        layout,
        mesh,
        GLOBAL_BATCH,
        seed=1 if case.corrupt == "seed" else SEED,
        optim=optim_config(),
        compile=case.compile,
        precision=case.precision or None,
    )
    if case.corrupt == "cp-local":
        from meshwise.runtime.model import Attention

        for module in (m for chunk in pm.modules for m in chunk.modules() if isinstance(m, Attention)):
            module.ring = None
    data = batches(model_spec, case.steps)
    if case.compile:  # the warm-up the trainer runs must leave training unchanged
        from meshwise.runtime.compile import warm_up

        warm_up(pm, pm.local_batch(data[0, :, :-1]), pm.local_batch(data[0, :, 1:]))
    losses, norms = [], []
    if case.corrupt == "raise" and dist.get_rank() == world - 1:
        raise RuntimeError("deliberate failure")

    def rows(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if case.corrupt == "same-data":
            return x[: pm.replica_rows], y[: pm.replica_rows]
        return pm.local_batch(x), pm.local_batch(y)

    for step in range(case.steps):
        loss, norm = pm.step(*rows(data[step, :, :-1], data[step, :, 1:]))
        assert isinstance(loss, torch.Tensor) and isinstance(norm, torch.Tensor)  # step never syncs with the host
        losses.append(loss.item())
        norms.append(norm.item())
    ev = held_out(model_spec)
    eval_loss = pm.eval_loss([rows(ev[:, :-1], ev[:, 1:])])
    reporter = all(mesh.get_local_rank(d) == 0 for d in ("dp_replicate", "dp_shard", "tp"))
    weights = {}
    for name, p in pm.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        if reporter:
            weights[name] = full.detach().cpu().clone()
    dist.barrier()
    return losses, norms, weights, eval_loss


def _worker(rank: int, world: int, port: int, cases: list[Case], out: mp.Queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=90))
    except Exception:
        out.put((rank, "<init>", "error", traceback.format_exc()))
        return
    for case in cases:
        try:
            start = time.perf_counter()
            losses, norms, weights, eval_loss = run_case(case, world)
            buf = io.BytesIO()
            torch.save(weights, buf)
            out.put((rank, case.name, "ok", (losses, norms, buf.getvalue(), time.perf_counter() - start, eval_loss)))
        except Exception:
            out.put((rank, case.name, "error", traceback.format_exc()))
            return
    end_process_group()
    out.put((rank, "<end>", "done", None))
    out.close()
    out.join_thread()  # the queue's feeder thread has written everything
    exit_worker(0)


@dataclass
class GroupResult:
    runs: dict[str, Run]
    seconds: dict[str, float]
    error: str = ""  # the first failure (case name, rank, traceback), or a timeout


def _zygote(world: int, preload: tuple[str, ...], target, args: tuple, out: mp.Queue) -> None:
    """The group's one spawned process: leads a new process group (so that its parent can kill it
    and its workers at once), imports ``preload``, forks ``world`` workers running
    ``target(rank, world, *args, out)``, and reports their exit codes: ``died`` as soon as one
    fails, ``ended`` once all have ended."""
    os.setpgid(0, 0)
    for module in preload:  # imported once here, shared by every fork
        importlib.import_module(module)
    fork = mp.get_context("fork")
    procs = [fork.Process(target=target, args=(r, world, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    while any(p.exitcode is None for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.1)
    codes = [(r, p.exitcode) for r, p in enumerate(procs)]
    if any(code not in (None, 0) for _, code in codes):
        out.put((-1, "<died>", "died", [(r, code) for r, code in codes if code not in (None, 0)]))
    else:
        out.put((-1, "<ended>", "ended", codes))
    out.close()
    out.join_thread()


def _start_zygote(world: int, preload: tuple[str, ...], target, args: tuple) -> tuple[mp.Process, mp.Queue]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    zygote = ctx.Process(target=_zygote, args=(world, preload, target, args, out))  # not daemonic: it has children
    zygote.start()
    return zygote, out


def _end_zygote(zygote: mp.Process) -> None:
    try:  # whatever is left of the zygote and its workers, which share the process group it leads
        os.killpg(zygote.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # it ended, or had not made the group yet
        zygote.kill()
    zygote.join(timeout=10)


PARITY_PRELOAD = ("torch.distributed.tensor", "meshwise.layout", "meshwise.runtime", "meshwise.runtime.model")


def run_group(world: int, cases: list[Case], timeout_s: float) -> GroupResult:
    """Run ``cases`` in one group of ``world`` workers (forked by ``_zygote``); never waits past ``timeout_s``."""
    preload = PARITY_PRELOAD + (("meshwise.runtime.compile",) if any(c.compile for c in cases) else ())
    zygote, out = _start_zygote(world, preload, _worker, (free_port(), cases))
    partial: dict[str, dict[int, tuple]] = {}
    runs: dict[str, Run] = {}
    seconds: dict[str, float] = {}
    done, error = 0, ""
    deadline = time.monotonic() + timeout_s
    try:
        while done < world and not error:
            report = _next_report(out, zygote, deadline, timeout_s)
            if isinstance(report, str):
                error = report and f"world {world}: {report}; finished: {sorted(runs)}"
                continue
            rank, name, status, payload = report
            if status == "error":
                error = f"world {world}, case {name}, rank {rank} failed:\n{payload}"
            elif status == "died":
                error = f"world {world}: worker(s) died without a report (rank, exit code): {payload}"
            elif status == "done":
                done += 1
            elif status == "ended":
                error = f"world {world}: the workers ended (rank, exit code: {payload}) before every report"
            else:
                partial.setdefault(name, {})[rank] = payload
                if len(partial[name]) == world:
                    ranks = partial.pop(name)
                    weights: dict[str, torch.Tensor] = {}
                    for _, _, blob, _, _ in ranks.values():
                        weights.update(torch.load(io.BytesIO(blob)))
                    runs[name] = Run(ranks[0][0], weights, ranks[0][1], ranks[0][4])
                    seconds[name] = max(r[3] for r in ranks.values())
    finally:
        _end_zygote(zygote)
    return GroupResult(runs, seconds, error)


def _next_report(out: mp.Queue, zygote, deadline: float, timeout_s: float) -> tuple | str:
    """The next report the workers put on ``out``; else why none will come (past the deadline, or
    their parent ended), or "" while one may still come (polled each second)."""
    try:
        return out.get(timeout=1.0)
    except queue_mod.Empty:
        if time.monotonic() > deadline:
            return f"timed out after {timeout_s:.0f} s"
        if zygote.exitcode is not None:
            return f"the workers' parent ended (exit code {zygote.exitcode}) early"
        return ""


def _module_worker(
    rank: int, world: int, port: int, module: str, argv: list[str], run_dir: str, log_dir: str, out: mp.Queue
) -> None:
    """One rank of ``python -m module ARGV`` as meshwise's launcher starts it (the environment of
    ``launch._loopback_env``: a FileStore in ``run_dir``), its stdout and stderr in
    ``log_dir/<rank>/``; ends with ``module.main``'s exit status."""
    folder = Path(log_dir) / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        os.dup2(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        MESHWISE_RUN_DIR=run_dir,
    )
    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    try:
        code = importlib.import_module(module).main(argv)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_worker(code if isinstance(code, int) else 1)


def launch_forked(
    module: str, argv: list[str], nproc: int, log_dir: Path, what: str, tail_lines: int = 10, timeout_s: float = 900
) -> None:
    """In place of ``meshwise.launch.launch_logged`` for a test: the same worker module, environment and
    logs, its ranks forked from one process that imported ``module`` (``_zygote``) instead of each
    starting Python and importing torch (torch's elastic agent starts them one by one). A failed
    run raises RuntimeError naming ``what``, with the tail of each rank's stderr."""
    with tempfile.TemporaryDirectory(prefix="meshwise-run-") as run_dir:
        zygote, out = _start_zygote(
            nproc, (module,), _module_worker, (free_port(), module, argv, run_dir, str(log_dir))
        )
        deadline, error = time.monotonic() + timeout_s, ""
        try:
            while True:
                report = _next_report(out, zygote, deadline, timeout_s)
                if isinstance(report, str):
                    if not report:
                        continue
                    error = report
                    break
                _, _, status, payload = report
                if status == "died":
                    error = f"worker(s) failed (rank, exit code): {payload}"
                break
        finally:
            _end_zygote(zygote)
    if error:
        tail = "\n".join(
            line for f in sorted(Path(log_dir).rglob("stderr.log")) for line in f.read_text().splitlines()[-tail_lines:]
        )
        raise RuntimeError(f"{what} failed: {error}\n{tail}")


# -------------------------------------------------------------------------------- comparison
LOSS_RTOL = 1e-4
FIRST_LOSS_RTOL = 1e-6
WEIGHT_TOL = 1e-4
# tiny-qwen3's embedding is more sensitive to summation order: one process accumulating the same
# global batch in 8 micro-batches instead of 1 already moves it by 1.5e-4 (relative to 1 + max|w|)
# after 10 steps (tiny: 1.5e-5). Its bound is twice that floor; a wrong run is off by 1e-2 or more.
# Gemma 3's and OLMo 2's blocks (norms on the sublayer outputs) are more sensitive still: one process
# accumulating in 8 micro-batches moves tiny-gemma3's gradient norms by 6.6e-5 and its weights by
# 1.2e-4, tiny-olmo2's by 1.2e-4 and 0.9e-4 after the 4 steps (tiny: 5.5e-7 and 9.3e-6); their
# bounds, for the gradient norms and losses after the first step too, are twice that floor. TP's
# reductions move tiny-gemma3's first block's Q and O projections by 2.9e-4 (2026-12-05, tp=2 and
# dp=2,zero=3,tp=2; every other layout within 2.5e-4): its weight bound is 4e-4. A wrong run is off
# by 1e-2 or more.
WEIGHT_TOL_BY_MODEL = {"tiny-qwen3": 3e-4, "tiny-gemma3": 4e-4, "tiny-olmo2": 2.5e-4}
LOSS_RTOL_BY_MODEL = {"tiny-gemma3": 2.5e-4, "tiny-olmo2": 2.5e-4}


def mismatch(run: Run, ref: Run, weight_tol: float = WEIGHT_TOL, loss_rtol: float = LOSS_RTOL) -> str:
    """Empty when ``run`` matches ``ref`` (losses, gradient norms, final weights and the eval loss
    after them); otherwise what differs."""
    problems = []
    if len(run.losses) != len(ref.losses):
        return f"{len(run.losses)} losses, reference has {len(ref.losses)}"
    for i, (got, want) in enumerate(zip(run.losses, ref.losses)):
        tol = FIRST_LOSS_RTOL if i == 0 else loss_rtol
        if abs(got - want) > tol * abs(want):
            problems.append(f"step {i}: loss {got:.9g} vs reference {want:.9g} (rel {abs(got - want) / abs(want):.2e})")
    for i, (got, want) in enumerate(zip(run.grad_norms, ref.grad_norms)):
        if abs(got - want) > loss_rtol * abs(want):
            problems.append(f"step {i}: gradient norm {got:.9g} vs reference {want:.9g}")
    if ref.eval_loss is not None and (
        run.eval_loss is None or abs(run.eval_loss - ref.eval_loss) > loss_rtol * abs(ref.eval_loss)
    ):
        problems.append(f"eval loss {run.eval_loss} vs reference {ref.eval_loss:.9g}")
    missing = sorted(set(ref.weights) - set(run.weights))
    extra = sorted(set(run.weights) - set(ref.weights))
    if missing or extra:
        problems.append(f"weights missing {missing[:4]} extra {extra[:4]}")
    for name in sorted(set(ref.weights) & set(run.weights)):
        got, want = run.weights[name], ref.weights[name]
        if got.shape != want.shape:
            problems.append(f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}")
            continue
        err = (got - want).abs().max().item()
        if err > weight_tol * (1 + want.abs().max().item()):
            problems.append(f"{name}: max abs difference {err:.3e}")
    return "\n".join(problems)
