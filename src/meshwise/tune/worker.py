"""One rank of ``meshwise tune``: every trial of the launch on the one process group, a new mesh each.

Rank 0 decides (:class:`meshwise.tune.tuner.Tune`) and broadcasts the next layout; every rank
builds its mesh and model with the runtime ``train`` uses (same model, same data rows, same
optimizer), runs ``warmup`` steps, the last under the memory tracker (CUDA: the allocator's peak),
then up to ``steps`` timed steps (more when they are short: trials.timed_steps), each split into
its parts (measure/timing.py). The step is the slowest rank's. After each timed step the ranks agree on the step time and on a stop request
(SIGTERM, SIGINT): a stop drops the unfinished trial and ends the tune with the finished ones
already in the results file.
"""

from __future__ import annotations

import gc
import signal as signal_module
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from meshwise.errors import RunStopped
from meshwise.layout import Layout
from meshwise.measure._torch_tools import peak_by_category, tracker_for
from meshwise.measure.timing import StepClock
from meshwise.runtime import build_mesh
from meshwise.runtime.mesh import dp_rank
from meshwise.train.loop import Prepared, lr_at, parallelize_as_configured
from meshwise.tune.trials import (
    MEASURED,
    OUT_OF_MEMORY,
    OVER_LIMIT,
    RUNOFF,
    STOPPED,
    Trial,
    runoff_over,
    should_stop,
    timed_steps,
)


@dataclass(frozen=True)
class TrialPlan:
    """What every rank needs to run a trial (broadcast by rank 0)."""

    layout: Layout
    predicted_step_s: float
    round: int
    best_s: float | None  # the best measured step so far (early stop), None before the first
    noise: float
    max_steps: int = 0  # the most timed steps (the budget's share: tuner.Tune.max_timed_steps); 0: no bound


@dataclass(frozen=True)
class Limits:
    warmup: int
    steps: int
    memory_limit_bytes: int  # 0: none (CPU); on CUDA the device's own memory
    min_timed_s: float = 0.0  # a trial of short steps runs more of them (trials.timed_steps); 0: never


def _agree(values: list[float], device: str) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _free(device_type: str) -> None:
    gc.collect()
    if device_type == "cuda":
        torch.cuda.empty_cache()


def stop_signal(guard: Any) -> int:
    return int(guard.signal) if guard is not None else 0


def run_trial(cfg: Any, prep: Prepared, plan: TrialPlan, limits: Limits, guard: Any) -> Trial:
    """One trial (collective). A CUDA out-of-memory error is caught, its memory freed, and the
    trial recorded as not fitting with the allocator's peak; raises RunStopped on a stop request."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        return _measure(cfg, prep, plan, limits, guard, device_type)
    except torch.cuda.OutOfMemoryError:
        peak = int(torch.cuda.max_memory_allocated()) if device_type == "cuda" else 0
        _free(device_type)
        peak = int(_agree([float(peak)], device_type)[0])
        return Trial(plan.layout.format(), OUT_OF_MEMORY, plan.predicted_step_s, peak_bytes=peak, round=plan.round)
    finally:
        _free(device_type)


def _measure(cfg: Any, prep: Prepared, plan: TrialPlan, limits: Limits, guard: Any, device_type: str) -> Trial:
    layout = plan.layout
    pm, one_step = _build(cfg, prep, layout, device_type)
    peak = _warm_up(pm, one_step, limits.warmup, device_type)
    if limits.memory_limit_bytes and peak > limits.memory_limit_bytes:
        return Trial(layout.format(), OVER_LIMIT, plan.predicted_step_s, peak_bytes=peak, round=plan.round)
    mine: list[tuple[float, dict[str, float]]] = []
    steps_s: list[float] = []
    status, count = MEASURED, limits.steps
    while len(steps_s) < count:
        slowest, own = _timed_step(pm, one_step, guard, device_type, layout)
        mine.append(own)
        steps_s.append(slowest)
        if len(steps_s) == 1 and limits.min_timed_s:
            count = timed_steps(limits.steps, slowest, limits.min_timed_s)
        if plan.max_steps:
            count = min(count, plan.max_steps)
        if should_stop(steps_s, plan.best_s, plan.noise):
            status = STOPPED
            break
    parts = _slowest_parts(mine)
    return Trial(layout.format(), status, plan.predicted_step_s, steps_s, parts, peak, plan.round)


def _build(cfg: Any, prep: Prepared, layout: Layout, device_type: str) -> tuple[Any, Any]:
    """(the parallelized model of ``layout`` on a new mesh, its ``one_step()``: train's step on
    train's rows, the learning rate of its step)."""
    B = cfg.schedule.global_batch
    mesh = build_mesh(layout, prep.model, B)
    pm = parallelize_as_configured(cfg, prep.model, layout, mesh, device_type)
    rows = range(dp_rank(mesh) * pm.replica_rows, (dp_rank(mesh) + 1) * pm.replica_rows)
    step = 0

    def one_step() -> torch.Tensor:
        nonlocal step
        step += 1
        for group in pm.optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.schedule, cfg.optimizer)
        x, y = prep.corpus.train_rows((step - 1) * B, rows)
        return pm.step(x, y)[0]

    return pm, one_step


def _timed_step(
    pm: Any, one_step: Any, guard: Any, device_type: str, layout: Layout
) -> tuple[float, tuple[float, dict[str, float]]]:
    """One timed step (collective): (the slowest rank's step, (this rank's step, its parts));
    raises RunStopped when a rank has a stop request."""
    with StepClock(pm) as clock:
        dist.barrier()
        clock.reset()
        start = time.perf_counter()
        loss = one_step()
        with clock.window("fixed"):
            loss.item()  # the loss read: the step's one host sync, as train's loop
        step_s = time.perf_counter() - start
    slowest, signal = _agree([step_s, float(stop_signal(guard))], device_type)
    if signal:
        name = signal_module.Signals(int(signal)).name
        raise RunStopped(f"stopped by {name} during the trial of {layout.short()}", 128 + int(signal))
    return slowest, (step_s, clock.parts(step_s))


def run_runoff(cfg: Any, prep: Prepared, plans: list[TrialPlan], limits: Limits, guard: Any) -> list[Trial]:
    """The final run-off (collective): every contender built at once and warmed up by one step, then
    their timed steps interleaved, the order rotated each pass (A B, B A, ...), as many per contender
    as a trial of the best's step runs and the budget's passes allow (``max_steps``), fewer once
    model and measurement agree or the steps stop overlapping (trials.runoff_over). A CUDA
    out-of-memory error (the contenders together do not fit) ends it with no result: the tune's
    pick stands."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        built = [_build(cfg, prep, plan.layout, device_type) for plan in plans]
        for _, one_step in built:
            one_step().item()
        count = limits.steps
        if limits.min_timed_s and plans[0].best_s:
            count = timed_steps(limits.steps, plans[0].best_s, limits.min_timed_s)
        if plans[0].max_steps:
            count = min(count, plans[0].max_steps)
        predicted = [plan.predicted_step_s for plan in plans]
        mine: list[list[tuple[float, dict[str, float]]]] = [[] for _ in plans]
        steps_s: list[list[float]] = [[] for _ in plans]
        for k in range(count):
            for i in [(k + j) % len(plans) for j in range(len(plans))]:
                slowest, own = _timed_step(*built[i], guard, device_type, plans[i].layout)
                mine[i].append(own)
                steps_s[i].append(slowest)
            if runoff_over(steps_s, predicted):  # the same on every rank: the steps are the slowest rank's
                break
    except torch.cuda.OutOfMemoryError:
        return []
    finally:
        built = []  # the contenders' models go before the memory is freed
        _free(device_type)
    return [
        Trial(plan.layout.format(), RUNOFF, plan.predicted_step_s, steps, _slowest_parts(own), 0, plan.round)
        for plan, steps, own in zip(plans, steps_s, mine, strict=True)
    ]


def _warm_up(pm: Any, one_step: Any, warmup: int, device_type: str) -> int:
    """Run the warm-up steps, the last under the memory tracker (CPU) or the allocator's peak
    (CUDA); returns the largest rank's peak bytes."""
    for _ in range(max(0, warmup - 1)):
        one_step().item()
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        one_step().item()
        local = int(torch.cuda.max_memory_allocated())
    else:
        tracker = tracker_for(pm.modules, pm.optimizer)
        with tracker:
            one_step().item()
        local = sum(peak_by_category(tracker).values())
    return int(_agree([float(local)], device_type)[0])


def _slowest_parts(mine: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The parts of the rank whose median step was slowest (gathered on every rank)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    median = sorted(mine, key=lambda m: m[0])[len(mine) // 2] if mine else (0.0, {})
    dist.all_gather_object(everyone, median)
    return dict(max(everyone, key=lambda m: m[0])[1])
