"""Run Megatron-LM's own ``validate_args`` on every case of tests/unit/test_emit_megatron.py: the
emitted arguments (plus mock data and a null tokenizer) parsed by Megatron-LM's parser and checked
as ``pretrain_gpt.py`` would at start-up, at the case's world size, on a Hopper device (its only
device probe is patched to report compute capability 9). Needs a Megatron-LM checkout at the tag
of the installed megatron-core (scripts/megatron_args_dump.py says how):

    PYTHONPATH=Megatron-LM:. python scripts/megatron_validate.py
"""

from __future__ import annotations

import argparse
import os
import warnings


def main() -> int:
    warnings.filterwarnings("ignore")
    import megatron.training.arguments as megatron_args
    from tests._torchtitan import command_args
    from tests.unit.test_emit_megatron import CASES, _target

    from meshwise.plan import emit

    megatron_args.get_device_arch_version = lambda: 9
    failed = 0
    for case in CASES:
        target = _target(*case)
        text = emit.emit("megatron", target)
        argv = command_args(text, "pretrain_gpt.py") + ["--mock-data", "--tokenizer-type", "NullTokenizer",
                                                        "--vocab-size", str(target.model.vocab)]
        args = megatron_args.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)
        args.world_size, args.rank = case[1], 0
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        if "CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        try:
            megatron_args.validate_args(args)
            print(f"ok   {case[1]:>5} {case[2]} {case[5]}: dp={args.data_parallel_size}, "
                  f"vpp={args.virtual_pipeline_model_parallel_size}")
        except (AssertionError, ValueError) as err:
            failed += 1
            print(f"FAIL {case[1]:>5} {case[2]} {case[5]}: {err}")
    print(f"{len(CASES) - failed} of {len(CASES)} pass Megatron-LM's validate_args")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
