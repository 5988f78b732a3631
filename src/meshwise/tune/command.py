"""The ``meshwise tune`` command: ``train``'s inputs (a config or flags), then trials, then a pick.

``meshwise tune [train's options] [--trials K] [--budget-minutes M] [--memory-limit SIZE]
[--out DIR] [--resume] [--trial-warmup N] [--trial-steps N] [--emit FRAMEWORK] [--tokens N]
[--price-per-gpu-hour P] [--json]``. Every input is checked before anything is launched; outside
torchrun it launches the local workers as ``train`` does (one launch for every trial), under
torchrun or Slurm every node runs this same command.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshwise import launch
from meshwise.errors import MeshwiseError, RunStopped
from meshwise.files import check_output_dir, check_output_file
from meshwise.launch.guard import Guard
from meshwise.plan.budget import check_budget
from meshwise.report import require_matplotlib
from meshwise.train import config as config_mod
from meshwise.train.command import _stop, _timeout_s, build_train_parser
from meshwise.tune.memory_limit import memory_bytes
from meshwise.tune.trials import read_results


def build_tune_parser() -> argparse.ArgumentParser:
    p = build_train_parser()
    p.prog, p.description = (
        "meshwise tune",
        "Measure the planner's closest layouts for a few steps each; pick the fastest.",
    )
    p.conflict_handler = "resolve"  # --resume is the tune's (train's alias for --checkpoint.resume is dropped)
    g = p.add_argument_group("tune")
    g.add_argument("--trials", type=int, help="at most this many trials (finished ones of a resumed tune count)")
    g.add_argument("--budget-minutes", type=float, help="start no trial after this many minutes")
    g.add_argument(
        "--memory-limit",
        help="per rank, e.g. 2GB: a layout whose tracked peak exceeds it is "
        "recorded as not fitting (on GPU the device's memory is the limit)",
    )
    g.add_argument("--out", help="folder for trials.jsonl, profile.toml, train.toml (default runs/tune)")
    g.add_argument("--resume", action="store_true", help="continue the tune of --out: its finished trials are kept")
    g.add_argument("--trial-warmup", type=int, help="warm-up steps per trial, the last tracked for memory (default 2)")
    g.add_argument("--trial-steps", type=int, help="timed steps per trial at most (default 5)")
    g.add_argument("--emit", help="also print the pick as torchtitan, megatron or deepspeed configuration")
    g.add_argument("--tokens", type=float, help="training tokens: days and GPU-hours from the measured step")
    g.add_argument("--price-per-gpu-hour", type=float, help="with --tokens: the cost")
    g.add_argument("--json", action="store_true", help="print the trials and the pick as one JSON object")
    g.add_argument("--report", help="an HTML page: the trials, predicted against measured (needs matplotlib)")
    g.add_argument("--exhaustive", type=int, help=argparse.SUPPRESS)  # benchmarks: the first N of the pool, all
    return p


def resolve(argv: list[str]) -> tuple[dict[str, Any], config_mod.TrainConfig]:
    opts = vars(build_tune_parser().parse_args(argv))
    cfg = config_mod.load(opts.get("config"))
    for key, value in opts.items():
        if "." in key:
            cfg = config_mod.override(cfg, key, value)
    config_mod.check(cfg)
    # a tune writes no checkpoints, metrics file or sample: its results go to --out
    cfg = replace(
        cfg,
        checkpoint=replace(cfg.checkpoint, dir="", resume=""),
        metrics=replace(cfg.metrics, file="", tensorboard=""),
        generate=replace(cfg.generate, prompt=""),
    )
    return opts, cfg


def check_tune(opts: dict[str, Any], cfg: config_mod.TrainConfig, results: bool = True) -> None:
    """The tune's own inputs, refused in one line before anything starts; ``results``: also the
    results file in --out (where this process writes it: the launcher, or rank 0 under torchrun)."""
    # start-up (about 140 ms, the planner): tune --help and a refused flag skip them
    from meshwise.plan.emit import FRAMEWORKS
    from meshwise.tune.driver import RESULTS  # start-up: as above

    if cfg.layout.choice != "auto":
        raise MeshwiseError(
            f"--layout: {cfg.layout.choice!r}: tune chooses the layout; leave it auto (meshwise train runs a given one)"
        )
    for name in ("trials", "trial_warmup", "trial_steps", "exhaustive"):
        value = opts.get(name)
        if value is not None and value < 1:
            raise MeshwiseError(f"--{name.replace('_', '-')}: {value} must be at least 1")
    budget = opts.get("budget_minutes")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise MeshwiseError(f"--budget-minutes: {budget} must be a positive, finite number of minutes")
    memory_bytes(opts.get("memory_limit"))
    if opts.get("emit") is not None and opts["emit"] not in FRAMEWORKS:
        raise MeshwiseError(f"--emit: {opts['emit']!r} is not one of {', '.join(FRAMEWORKS)}")
    check_budget(opts.get("tokens"), opts.get("price_per_gpu_hour"))
    if opts.get("report") is not None:
        check_output_file("--report", opts["report"], parent_must_exist=True)
        require_matplotlib()
    out = opts.get("out", "runs/tune")
    check_output_dir("--out", out)
    path = os.path.join(out, RESULTS)
    if results and opts.get("resume") and not os.path.isfile(path):
        raise MeshwiseError(f"--resume: {path} does not exist (no tune to resume in --out {out})")
    if results and not opts.get("resume") and os.path.exists(path):
        raise MeshwiseError(f"--out: {out} holds a tune's results; --resume continues it, or give another --out")


def tune_main(argv: list[str]) -> int:
    opts, cfg = resolve(argv)
    timeout_s = _timeout_s(opts)
    if opts.get("print_config"):
        print(config_mod.to_toml(cfg), end="")
        return 0
    if launch.in_torchrun():  # a worker: of meshwise's launcher (inputs checked there), or of torchrun
        from meshwise.runtime.mesh import exit_worker  # torch: only a worker process gets here

        if os.environ.get(launch.LAUNCHER_ENV) != "1":
            try:
                check_tune(opts, cfg, results=os.environ.get("RANK", "0") == "0")
            except MeshwiseError as e:
                exit_worker(_stop(2, str(e)))
        exit_worker(_worker(cfg, opts, timeout_s, watch_parent=True))
    check_tune(opts, cfg)
    nproc = opts.get("nproc_per_node")
    if nproc is not None and nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
    # torch (about 1.6 s): imported once the inputs are checked, so a bad one is refused at once
    from meshwise.train import layout_choice, loop

    if launch.has_gpus():
        nproc = nproc or launch.default_nproc()
    nproc = nproc or os.cpu_count() or 1
    if opts.get("resume"):  # a results file of other inputs is refused here, before any launch
        _check_resume(opts, cfg, nproc)
    loop.preflight(cfg, local_ranks=nproc)
    if not launch.has_gpus():
        cores = os.cpu_count() or 1
        if not cfg.layout.profile:
            from meshwise.measure import auto_profile  # start-up (about 20 ms), as in train_main

            print(
                f"Profile: {auto_profile.for_workers(nproc)} (this machine's calibration; "
                "--layout.profile FILE for another)",
                flush=True,
                file=sys.stderr if opts.get("json") else sys.stdout,
            )
        os.environ[layout_choice.THREADS_ENV] = str(max(1, cores // nproc))
    if nproc == 1:
        with launch.single_process_env():
            return _worker(cfg, opts, timeout_s, watch_parent=False)
    launch.launch_local("meshwise.tune", argv, nproc, 0, stop_grace_s=cfg.checkpoint.stop_grace)
    return 0


def _check_resume(opts: dict[str, Any], cfg: config_mod.TrainConfig, nproc: int) -> None:
    """The results file to resume was written for this model, batch, sequence and world (rank 0
    checks the rest: the starting profile, the precision)."""
    from meshwise.tune.driver import RESULTS  # start-up: as check_tune's

    read_results(
        Path(opts.get("out", "runs/tune")) / RESULTS,
        {
            "model": cfg.model.name,
            "global_batch": cfg.schedule.global_batch,
            "seq_len": cfg.data.seq_len,
            "world": nproc,
            "local_world": nproc,
        },
    )


def _worker(cfg: config_mod.TrainConfig, opts: dict[str, Any], timeout_s: float, watch_parent: bool) -> int:
    """A worker: the tune's loop (every rank); a stop on purpose is one line and its exit status."""
    guard = Guard(watch_parent).start()
    try:
        from meshwise.tune.run import run  # torch: once the guard is set, as train's worker

        return run(cfg, opts, guard, timeout_s)
    except MeshwiseError as e:
        return _stop(2, str(e))
    except RunStopped as e:
        return _stop(e.status, str(e))
    finally:
        guard.stop()
