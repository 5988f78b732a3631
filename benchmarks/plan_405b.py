"""Time the exhaustive search as a whole process (interpreter start-up included): Llama 3 405B on
16,384 H100 (8 per node), sequence 8,192, global batch 2,048, and DeepSeek-V3 (a mixture of experts,
its MoE blocks priced from their parts) on 16,384 H100 under meshwise's runtime and under
``--runtime megatron``. Prints the time of each run and the best; the target is under 1 s on a
2-core machine for each.

    python benchmarks/plan_405b.py [runs] > benchmarks/results/plan-speed-cpu2core.txt
"""

from __future__ import annotations

import sys

from _plan_timing import time_plan

PLAN = [sys.executable, "-m", "meshwise.cli", "plan"]
CASES = {
    "Llama 3 405B, 16,384 H100": [
        "--model",
        "llama3-405b",
        "--gpu",
        "h100",
        "--gpus",
        "16384",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "8192",
        "--global-batch",
        "2048",
    ],
    "DeepSeek-V3, 16,384 H100": ["--model", "deepseek-v3", "--gpus", "16384"],
    "DeepSeek-V3, 16,384 H100, --runtime megatron": [
        "--model",
        "deepseek-v3",
        "--gpus",
        "16384",
        "--runtime",
        "megatron",
    ],
}


def main(runs: int = 3) -> None:
    for name, args in CASES.items():
        print(f"{name}:")
        out = time_plan(PLAN + args, runs)
        print(next(line for line in out.splitlines() if line.startswith("Chosen:")))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
