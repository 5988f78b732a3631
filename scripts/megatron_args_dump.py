"""Write the table of Megatron-LM's training arguments that tests/unit/test_emit_megatron.py parses
``plan --emit megatron`` against: every option string with its destination, kind (store, store_true,
...), type, choices and nargs, as Megatron-LM's own ``add_megatron_arguments`` builds its parser.

megatron-core (pip) ships no argument parser, so this reads a Megatron-LM checkout at the tag that
matches the installed megatron-core:

    git clone https://github.com/NVIDIA/Megatron-LM && git -C Megatron-LM checkout core_v0.16.1
    PYTHONPATH=Megatron-LM python scripts/megatron_args_dump.py Megatron-LM > tests/data/megatron_lm_args.json

(its training package imports ``six``; any empty module of that name will do for building the parser).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def table(parser: argparse.ArgumentParser) -> dict[str, dict]:
    out = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        kind = type(action).__name__.strip("_").replace("Action", "").lower()
        entry = {
            "dest": action.dest,
            "kind": kind,
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "choices": None if action.choices is None else [str(getattr(c, "name", c)) for c in action.choices],
            "nargs": action.nargs if isinstance(action.nargs, (str, type(None))) else int(action.nargs),
        }
        for option in action.option_strings:
            out[option] = entry
    return dict(sorted(out.items()))


def main(checkout: str, commit: str = "") -> None:
    from megatron.core import package_info
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    commit = (
        commit
        or subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    tag = subprocess.run(
        ["git", "-C", checkout, "describe", "--tags", "--exact-match"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "source": {
                    "repository": "https://github.com/NVIDIA/Megatron-LM",
                    "tag": tag,
                    "commit": commit,
                    "file": "megatron/training/arguments.py (add_megatron_arguments)",
                    "megatron_core": package_info.__version__,
                },
                "arguments": table(parser),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])  # checkout [commit: when the checkout is an export of the tag, not a clone]
