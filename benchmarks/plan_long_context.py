"""Time ``plan`` for Llama 3.1 70B (the catalog's llama3.1-70b, 128K context) on 512 H100 with 131,072-token
sequences, as a whole process (interpreter start-up included): the search over cp as well as dp, tp
and pp. Prints the time of each run, the CPU seconds, and the chosen layout with its step 3b.

    python benchmarks/plan_long_context.py [runs]
"""

from __future__ import annotations

import sys

from _plan_timing import time_plan

CMD = [
    sys.executable,
    "-m",
    "meshwise.cli",
    "plan",
    "--model",
    "llama3.1-70b",
    "--gpu",
    "h100",
    "--gpus",
    "512",
    "--seq-len",
    "131072",
]


def main(runs: int = 3) -> None:
    out = time_plan(CMD, runs)
    print(next(line for line in out.splitlines() if line.startswith("3b.")))
    print(next(line for line in out.splitlines() if line.startswith("Chosen:")))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
