"""Run Megatron-LM's own ``validate_args`` on ``plan --emit megatron``'s commands: every case of
tests/unit/test_emit_megatron.py, and the MoE plans of tests/unit/test_emit_megatron_moe.py (six
families' published config.json on 64, 256 and 1,024 H100, four more on 256, planned by
``meshwise plan --emit megatron``). Each command (plus mock data and a null tokenizer) is parsed by
Megatron-LM's parser and checked as ``pretrain_gpt.py`` would at start-up, at the case's world size,
on a Hopper device (its two device probes, the architecture and the grouped GEMM's compute
capability, are patched to report 9). Needs a Megatron-LM checkout at the tag of the installed
megatron-core (scripts/megatron_args_dump.py says how):

    PYTHONPATH=Megatron-LM:. python scripts/megatron_validate.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import warnings
from pathlib import Path


def _moe_commands():
    """(label, world, emitted text, vocabulary) of each MoE plan that emits; refusals are skipped."""
    from tests._moe_configs import CONFIGS, UNSEEN, write

    from meshwise.cli import main

    tmp = Path(tempfile.mkdtemp())
    for name in list(CONFIGS) + list(UNSEEN):
        for gpus in (64, 256, 1024) if name in CONFIGS else (256,):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                rc = main(
                    [
                        "plan",
                        "--model",
                        write(tmp, name),
                        "--gpu",
                        "h100",
                        "--gpus",
                        str(gpus),
                        "--seq-len",
                        "4096",
                        "--global-batch",
                        "1024",
                        "--emit",
                        "megatron",
                        "--json",
                    ]
                )
            if rc == 0:
                plan = json.loads(out.getvalue())
                layout = plan["emit"]["text"].split(", ")[1].split(" on ")[0]
                yield f"{name} {layout}", gpus, plan["emit"]["text"], plan["model"]["vocab"]


def _cases():
    from tests.unit.test_emit_megatron import CASES, _target

    from meshwise.plan import emit

    for case in CASES:
        target = _target(*case)
        yield f"{case[2]} {case[5]}", case[1], emit.emit("megatron", target), target.model.vocab
    yield from _moe_commands()


def main() -> int:
    warnings.filterwarnings("ignore")
    import megatron.training.arguments as megatron_args
    from tests._torchtitan import command_args

    megatron_args.get_device_arch_version = lambda: 9
    megatron_args.torch.cuda.get_device_capability = lambda *a: (9, 0)
    failed = total = 0
    for label, world, text, vocab in _cases():
        total += 1
        argv = command_args(text, "pretrain_gpt.py") + [
            "--mock-data",
            "--tokenizer-type",
            "NullTokenizer",
            "--vocab-size",
            str(vocab),
        ]
        args = megatron_args.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)
        args.world_size, args.rank = world, 0
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        if "CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                megatron_args.validate_args(args)
            print(
                f"ok   {world:>5} {label}: dp={args.data_parallel_size}, vpp={args.virtual_pipeline_model_parallel_size}"
            )
        except (AssertionError, ValueError, RuntimeError) as err:
            failed += 1
            print(f"FAIL {world:>5} {label}: {err}")
    print(f"{total - failed} of {total} pass Megatron-LM's validate_args")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
