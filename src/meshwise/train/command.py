"""The ``meshwise train``, ``export`` and ``generate`` commands: arguments in, a run out.

``meshwise train [--config FILE] [--S.F VALUE ...] [--print-config] [--nproc-per-node N]
[--max-restarts K] [--timeout S]``: every config field ``F`` of section ``S`` is an option ``--S.F`` (plus the
aliases of :data:`meshwise.train.config.ALIASES`).
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import signal
import sys
from dataclasses import fields

from meshwise import launch
from meshwise.errors import MeshwiseError, RunStopped
from meshwise.files import check_output_file
from meshwise.launch.guard import Guard, stalled_ranks
from meshwise.train import config as config_mod


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise MeshwiseError(message)


def build_train_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="meshwise train",
        description="Train a model under a layout (given, or auto from the planner).",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument(
        "--config",
        help="TOML file with [model], [data], [layout], [optimizer], [schedule], "
        "[checkpoint], [metrics], [generate] sections",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        help="outside torchrun: start this many local workers (default: one per GPU, else 4)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        help="outside torchrun: restarts after a worker failure, each "
        "resuming from the run's latest checkpoint (default 0)",
    )
    p.add_argument(
        "--timeout",
        help="seconds a collective waits for a rank that stopped answering (default: 300 on CPU, 600 on GPU)",
    )
    p.add_argument("--inject-nan-at-step", type=int, help=argparse.SUPPRESS)
    aliases: dict[str, list[str]] = {}
    for alias, dotted in config_mod.ALIASES.items():
        aliases.setdefault(dotted, []).append(alias)
    for section, cls in config_mod.SECTIONS.items():
        group = p.add_argument_group(f"[{section}]")
        for f in fields(cls):
            dotted = f"{section}.{f.name}"
            group.add_argument(
                f"--{dotted}",
                *aliases.get(dotted, []),
                dest=dotted,
                metavar=str(f.type).upper(),
                help=f"default: {f.default!r}",
            )
    p.add_argument(
        "--compile",
        action="store_const",
        const="true",
        dest="layout.compile",
        help="same as --layout.compile true: torch.compile each transformer block",
    )
    return p


def resolve(argv: list[str]) -> tuple[argparse.Namespace, config_mod.TrainConfig]:
    args = build_train_parser().parse_args(argv)
    opts = vars(args)
    cfg = config_mod.load(opts.get("config"))
    for key, value in opts.items():
        if "." in key:
            cfg = config_mod.override(cfg, key, value)
    config_mod.check(cfg)
    return args, cfg


def _timeout_s(opts: dict) -> float:
    text = opts.get("timeout")
    if text is None:
        return launch.default_timeout_s()
    try:
        value = float(text)
    except ValueError:
        raise MeshwiseError(f"--timeout: {text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise MeshwiseError(f"--timeout: {text} must be a positive, finite number of seconds")
    return value


def train_main(argv: list[str]) -> int:
    args, cfg = resolve(argv)
    opts = vars(args)
    timeout_s = _timeout_s(opts)
    if opts.get("print_config"):
        print(config_mod.to_toml(cfg), end="")
        return 0
    if launch.in_torchrun():  # a worker process (of torchrun's or of launch_local's): it ends here
        from meshwise.runtime.mesh import exit_worker  # torch: only a worker process gets here

        exit_worker(_worker(cfg, opts.get("inject_nan_at_step"), timeout_s, watch_parent=True))
    nproc = opts.get("nproc_per_node")
    if nproc is not None and nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
    restarts = opts.get("max_restarts", 0)
    if restarts < 0:
        raise MeshwiseError(f"--max-restarts: {restarts} must be 0 or more")
    # torch (about 1.6 s): imported once the flags are checked, so a bad one is refused at once
    from meshwise.train import layout_choice, loop

    if launch.has_gpus():
        nproc = nproc or launch.default_nproc()
    # Refuse bad input here, before any calibration or worker starts (the workers repeat these checks).
    try:
        prep = loop.preflight(cfg, local_ranks=nproc)
        layout_choice.check_given(cfg.layout.choice, prep.model, nproc, cfg.schedule.global_batch, cfg.data.seq_len)
    except MeshwiseError as e:
        raise MeshwiseError(_as_written(str(e), argv)) from None
    if not launch.has_gpus():
        cores = os.cpu_count() or 1
        if not cfg.layout.profile:  # this machine's calibration (measured at first use, then cached)
            # start-up (about 20 ms): read only by a CPU run without --layout.profile
            from meshwise.measure import auto_profile
            from meshwise.measure.plan_shapes import shapes_of  # start-up: as auto_profile

            shapes = shapes_of(prep.model, cfg.data.seq_len, 1)  # one sequence: the tables extend flat past it
            print(
                f"Profile: {auto_profile.for_workers(nproc or cores, shapes)} (this machine's calibration; "
                "--layout.profile FILE for another)",
                flush=True,
            )
        if nproc is None:
            nproc, threads, line = layout_choice.choose_cpu_processes(
                cfg.layout.choice, prep.model, cfg.schedule.global_batch, cfg.data.seq_len, cfg.layout.profile, cores
            )
            loop.check_fits_in_memory(prep.model, nproc)
            print(line, flush=True)
        else:
            threads = max(1, cores // nproc)
            if nproc * threads > cores:
                print(
                    f"meshwise: warning: {nproc} processes on {cores} core(s) are oversubscribed: they take turns "
                    "on the cores, each step pays for the switching; fewer processes (or none given) run faster",
                    file=sys.stderr,
                    flush=True,
                )
        os.environ[layout_choice.THREADS_ENV] = str(threads)
    if cfg.layout.choice != "auto":
        layout, _ = layout_choice.choose(
            cfg.layout.choice, prep.model, nproc, nproc, cfg.schedule.global_batch, cfg.data.seq_len, "cpu"
        )
        if cfg.layout.compile:
            from meshwise.runtime.compile import check as check_compile  # torch: as loop above

            check_compile(layout)
    if nproc == 1:
        with launch.single_process_env():
            return _worker(cfg, opts.get("inject_nan_at_step"), timeout_s, watch_parent=False)
    launch.launch_local("meshwise.train", argv, nproc, restarts, stop_grace_s=cfg.checkpoint.stop_grace)
    return 0


def _as_written(message: str, argv: list[str]) -> str:
    """A message naming ``--model.from`` names ``--model.pretrained`` where the user wrote that key
    (on the command line or as ``pretrained`` in --config): the field as its user spells it."""
    alias = "--model.from"
    if message.startswith(f"{alias}:") and not any(a == alias or a.startswith(f"{alias}=") for a in argv):
        return "--model.pretrained" + message[len(alias) :]
    return message


def _worker(cfg: config_mod.TrainConfig, inject_nan_at_step: int | None, timeout_s: float, watch_parent: bool) -> int:
    """A worker: a stop on purpose is one line on rank 0 (or handed to the launching process) and
    its exit status (2 for bad input); a collective that timed out names the rank that stalled."""
    guard = Guard(watch_parent).start()  # before torch starts threads: they inherit the signal mask
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints where a worker is
    except (OSError, ValueError):  # stderr without a file descriptor (captured, in-process)
        pass
    from meshwise.train import loop  # torch: once the guard is set (see above)

    try:
        return loop.run(cfg, loop.Debug(inject_nan_at_step=inject_nan_at_step), guard, timeout_s)
    except MeshwiseError as e:
        return _stop(2, str(e))
    except RunStopped as e:
        return _stop(e.status, str(e))
    except RuntimeError as e:
        if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
            raise
        stalled = stalled_ranks()
        who = f"rank {', '.join(map(str, stalled))} stopped answering" if stalled else "a rank stopped answering"
        return _stop(1, f"{who}: a collective waited --timeout {timeout_s:g} s; the run was stopped")
    finally:
        guard.stop()


def _stop(status: int, message: str) -> int:
    if not launch.report(status, message) and int(os.environ.get("RANK", "0")) == 0:
        print(f"meshwise: error: {message}", file=sys.stderr, flush=True)
    return status


def export_main(checkpoint: str, out: str) -> int:
    from meshwise.train.export import export  # torch: this module is imported by train's and tune's start

    check_output_file("--out", out)  # its folder is made if missing
    for line in export(checkpoint, out):
        print(line)
    return 0


def generate_main(checkpoint: str, prompt: str, tokens: int, temperature: float, top_k: int, seed: int) -> int:
    if tokens < 0 or top_k < 0:
        raise MeshwiseError("generate: --tokens and --top-k must not be negative")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise MeshwiseError(f"--temperature: {temperature} must be a finite number, 0 or more")
    config_mod.check_seed("--seed", seed)
    config_mod.check_text("--prompt", prompt)
    from meshwise.train import checkpoint as ckpt  # torch: once the flags are checked, as export_main's
    from meshwise.train.export import load_plain_model, resolve  # torch: as above
    from meshwise.train.generate import sample  # torch: as above

    model, spec = load_plain_model(checkpoint)
    tokenizer = (ckpt.read_meta(resolve(checkpoint)).get("data") or {}).get("tokenizer", "")
    print(sample(model, prompt, tokens, temperature, top_k, seed, spec.max_seq, tokenizer, spec.eos_ids))
    return 0
