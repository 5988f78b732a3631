"""Time ``plan`` for Llama 3.1 70B (the catalog's llama3-70b shape) on 512 H100 with 131,072-token
sequences, as a whole process (interpreter start-up included): the search over cp as well as dp, tp
and pp. Prints the time of each run, the CPU seconds, and the chosen layout with its step 3b.

    python benchmarks/plan_long_context.py [runs]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

CMD = [sys.executable, "-m", "meshwise.cli", "plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "512",
       "--seq-len", "131072"]


def main(runs: int = 3) -> None:
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(CMD, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(next(line for line in out.splitlines() if "layouts searched" in line).strip())
    print("whole-process seconds: " + ", ".join(f"{t:.3f}" for t in times) + f"; best {min(times):.3f} s (target < 1 s)")
    print("CPU seconds of the process (robust to a busy machine): " + ", ".join(f"{c:.3f}" for c in cpu))
    print(next(line for line in out.splitlines() if line.startswith("3b.")))
    print(next(line for line in out.splitlines() if line.startswith("Chosen:")))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
