"""Time the exhaustive search for Llama 3 405B on 16,384 H100 (8 per node), sequence 8,192, global
batch 2,048, as a whole process (interpreter start-up included). Prints the time of each run and the
best; the target is under 1 s on a 2-core machine.

    python benchmarks/plan_405b.py [runs] > benchmarks/results/plan-speed-cpu2core.txt
"""

from __future__ import annotations

import sys

from _plan_timing import time_plan

CMD = [sys.executable, "-m", "meshwise.cli", "plan", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384",
       "--gpus-per-node", "8", "--seq-len", "8192", "--global-batch", "2048"]


def main(runs: int = 3) -> None:
    out = time_plan(CMD, runs)
    print(next(line for line in out.splitlines() if line.startswith("Chosen:")))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
