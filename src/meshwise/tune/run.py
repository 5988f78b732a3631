"""The tune's loop on every rank: rank 0 chooses, every rank measures, rank 0 records and reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from meshwise.errors import MeshwiseError, RunStopped
from meshwise.launch import init_process_group
from meshwise.runtime.mesh import end_process_group
from meshwise.train import layout_choice, loop
from meshwise.tune.driver import Driver
from meshwise.tune.memory_limit import memory_bytes
from meshwise.tune.show import Progress, report
from meshwise.tune.trials import MIN_TIMED_S, TIMED_STEPS, WARMUP_STEPS
from meshwise.tune.worker import Limits, TrialPlan, run_runoff, run_trial


def run(cfg: Any, opts: dict[str, Any], guard: Any, timeout_s: float) -> int:
    """The whole tune (collective: every rank of the job calls it); 0 when it ends, a pick or none
    (the table says which)."""
    prep = loop.preflight(cfg)
    _, world, local_world = loop.env_world()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu":
        torch.set_num_threads(layout_choice.threads_per_rank(local_world))
    limits = Limits(
        opts.get("trial_warmup") or WARMUP_STEPS,
        opts.get("trial_steps") or TIMED_STEPS,
        memory_bytes(opts.get("memory_limit")),
        MIN_TIMED_S,
    )
    init_process_group("nccl" if device_type == "cuda" else "gloo", timeout_s)
    try:
        made: list[Any] = []
        _on_rank0(lambda: made.append(Driver(cfg, opts, prep.model, world, local_world, device_type)))
        _trials(cfg, prep, made[0] if made else None, limits, guard)
        dist.barrier()
        return 0
    finally:
        end_process_group()


def _on_rank0(call: Callable[[], Any]) -> Any:
    """``call()`` on rank 0 and its result on every rank: a MeshwiseError there (bad input found
    while planning, reading the results file or reporting) stops every rank with its one line,
    none left waiting on rank 0."""
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", call())
        except MeshwiseError as e:
            box[0] = ("error", str(e))
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise MeshwiseError(value)
    return value


def _trials(cfg: Any, prep: Any, driver: Any, limits: Limits, guard: Any) -> None:
    """Trial after trial as rank 0 chooses them, the run-off of the closest, then rank 0's report."""
    progress = Progress(driver) if driver is not None else None
    try:
        while (message := _on_rank0(lambda: driver.next())) is not None:
            plan = TrialPlan(*message)
            if progress is not None:
                progress.start(plan)
            trial = run_trial(cfg, prep, plan, limits, guard)
            _on_rank0(lambda: driver.record(trial))
            if progress is not None:
                progress.done(trial)
        runoff = _on_rank0(lambda: driver.runoff())
        if runoff is not None:
            trials = run_runoff(cfg, prep, [TrialPlan(*m) for m in runoff], limits, guard)
            _on_rank0(lambda: driver.record_runoff(trials))
    except RunStopped as e:
        if driver is None:
            raise
        raise RunStopped(
            f"{e}; {len(driver.tune.trials)} finished trial(s) kept in {driver.out}, tune --resume continues",
            e.status,
        ) from None
    finally:
        if progress is not None:
            progress.close()
    _on_rank0(lambda: report(driver, prep.model, cfg))
