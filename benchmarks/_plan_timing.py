"""Shared by the plan-speed benchmarks: run ``meshwise plan`` as a whole process several times and
print its wall-clock and CPU seconds (CPU seconds are robust to a busy machine; the target is < 1 s)."""

from __future__ import annotations

import resource
import subprocess
import time


def time_plan(cmd: list[str], runs: int) -> str:
    """Run ``cmd`` ``runs`` times, print the searched-layouts line and the times; return the last output."""
    times, cpu = [], []
    out = ""
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(next(line for line in out.splitlines() if "layouts searched" in line).strip())
    print("whole-process seconds: " + ", ".join(f"{t:.3f}" for t in times) + f"; best {min(times):.3f} s (target < 1 s)")
    print("CPU seconds of the process (robust to a busy machine): " + ", ".join(f"{c:.3f}" for c in cpu))
    return out
