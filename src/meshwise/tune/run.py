"""The tune's loop on every rank: rank 0 chooses, every rank measures, rank 0 records and reports."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from meshwise.errors import MeshwiseError, RunStopped
from meshwise.train import layout_choice, loop
from meshwise.tune.worker import Limits, TrialPlan, run_trial


def run(cfg: Any, opts: dict[str, Any], guard: Any, timeout_s: float) -> int:
    """The whole tune (collective: every rank of the job calls it); 0 with a pick, 1 when no layout fit."""
    from meshwise.launch import init_process_group
    from meshwise.runtime.mesh import end_process_group
    from meshwise.tune.memory_limit import memory_bytes

    prep = loop.preflight(cfg)
    rank, world, local_world = loop.env_world()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu":
        torch.set_num_threads(layout_choice.threads_per_rank(local_world))
    limits = Limits(opts.get("trial_warmup") or 2, opts.get("trial_steps") or 5, memory_bytes(opts.get("memory_limit")))
    init_process_group("nccl" if device_type == "cuda" else "gloo", timeout_s)
    try:
        driver = None
        if rank == 0:
            from meshwise.tune.driver import Driver

            driver = Driver(cfg, opts, prep.model, world, local_world, device_type)
        status = _trials(cfg, prep, driver, limits, guard)
        dist.barrier()
        return status
    finally:
        end_process_group()


def _trials(cfg: Any, prep: Any, driver: Any, limits: Limits, guard: Any) -> int:
    from meshwise.tune.show import Progress, report

    progress = Progress(driver) if driver is not None else None
    try:
        while True:
            message: list[Any] = [driver.next() if driver is not None else None]
            dist.broadcast_object_list(message, src=0)
            if message[0] is None:
                break
            plan = TrialPlan(*message[0])
            if progress is not None:
                progress.start(plan)
            try:
                trial = run_trial(cfg, prep, plan, limits, guard)
            except RunStopped as e:
                if driver is None:
                    raise
                raise RunStopped(f"{e}; {len(driver.tune.trials)} finished trial(s) kept in {driver.out}, "
                                 "tune --resume continues", e.status) from None
            if driver is not None:
                driver.record(trial)
                progress.done(trial)
    finally:
        if progress is not None:
            progress.close()
    refusal: list[Any] = [None]
    if driver is not None:
        try:
            report(driver, prep.model, cfg)
        except MeshwiseError as e:  # every rank stops with rank 0's line, none waits on it
            refusal[0] = str(e)
    dist.broadcast_object_list(refusal, src=0)
    if refusal[0] is not None:
        raise MeshwiseError(refusal[0])
    return 0
