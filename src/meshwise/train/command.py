"""The ``meshwise train``, ``export`` and ``generate`` commands: arguments in, a run out.

``meshwise train [--config FILE] [--S.F VALUE ...] [--print-config] [--nproc-per-node N]
[--max-restarts K]``: every config field ``F`` of section ``S`` is an option ``--S.F`` (plus the
aliases of :data:`meshwise.train.config.ALIASES`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from meshwise.errors import MeshwiseError
from meshwise.train import config as config_mod
from meshwise.train import launch


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise MeshwiseError(message)


def build_train_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="meshwise train", description="Train a model under a layout (given, or auto from the planner).",
                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="TOML file with [model], [data], [layout], [optimizer], [schedule], "
                                    "[checkpoint], [metrics], [generate] sections")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--nproc-per-node", type=int, help="outside torchrun: start this many local workers "
                                                      "(default: one per GPU, else 4)")
    p.add_argument("--max-restarts", type=int, help="outside torchrun: restarts after a worker failure (default 0)")
    p.add_argument("--inject-nan-at-step", type=int, help=argparse.SUPPRESS)
    aliases: dict[str, list[str]] = {}
    for alias, dotted in config_mod.ALIASES.items():
        aliases.setdefault(dotted, []).append(alias)
    for section, cls in config_mod.SECTIONS.items():
        group = p.add_argument_group(f"[{section}]")
        for f in fields(cls):
            dotted = f"{section}.{f.name}"
            group.add_argument(f"--{dotted}", *aliases.get(dotted, []), dest=dotted, metavar=str(f.type).upper(),
                               help=f"default: {f.default!r}")
    p.add_argument("--compile", action="store_const", const="true", dest="layout.compile",
                   help="same as --layout.compile true: torch.compile each transformer block")
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


def train_main(argv: list[str]) -> int:
    args, cfg = resolve(argv)
    opts = vars(args)
    if opts.get("print_config"):
        print(config_mod.to_toml(cfg), end="")
        return 0
    from meshwise.train import loop

    debug = loop.Debug(inject_nan_at_step=opts.get("inject_nan_at_step"))
    if launch.in_torchrun():  # a worker process of torchrun's: it ends here
        from meshwise.runtime.mesh import exit_worker

        exit_worker(_worker(cfg, debug))
    nproc = opts.get("nproc_per_node") or launch.default_nproc()
    if nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
    # Refuse bad input here, before any worker starts (the workers repeat these checks).
    prep = loop.preflight(cfg)
    from meshwise.train import layout_choice

    if cfg.layout.spec != "auto":
        layout, _ = layout_choice.choose(cfg.layout.spec, prep.model, nproc, nproc, cfg.schedule.global_batch,
                                         cfg.data.seq_len, "cpu")
        if cfg.layout.compile:
            from meshwise.runtime.compile import check as check_compile

            check_compile(layout)
    if nproc == 1:
        with launch.single_process_env():
            return _worker(cfg, debug)
    return launch.launch_local(argv, nproc, opts.get("max_restarts", 0))


def _worker(cfg: config_mod.TrainConfig, debug) -> int:
    """A worker: bad input is one line on rank 0 (or handed to the launching process), exit status 2."""
    import faulthandler
    import signal

    from meshwise.train import loop

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints where a worker is
    try:
        return loop.run(cfg, debug)
    except MeshwiseError as e:
        if not launch.report_error(str(e)) and int(os.environ.get("RANK", "0")) == 0:
            print(f"meshwise: error: {e}", file=sys.stderr, flush=True)
        return 2


def export_main(checkpoint: str, out: str) -> int:
    from meshwise.train.export import export

    for line in export(checkpoint, out):
        print(line)
    return 0


def generate_main(checkpoint: str, prompt: str, tokens: int, temperature: float, top_k: int, seed: int) -> int:
    from meshwise.train.export import load_plain_model
    from meshwise.train.generate import sample

    if tokens < 0 or top_k < 0 or temperature < 0:
        raise MeshwiseError("generate: --tokens, --top-k and --temperature must not be negative")
    model, spec = load_plain_model(checkpoint)
    print(sample(model, prompt, tokens, temperature, top_k, seed, spec.max_seq))
    return 0
