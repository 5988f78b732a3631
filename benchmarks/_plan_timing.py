"""Shared by the plan-speed benchmarks: run ``meshwise plan`` as a whole process several times and
print its wall-clock and CPU seconds (CPU seconds are robust to a busy machine; the target is < 1 s).

The runs read meshwise's modules from a warm bytecode cache, as an installed package does (pip
compiles them at install): one untimed run first fills a cache of its own (PYTHONPYCACHEPREFIX),
even where PYTHONDONTWRITEBYTECODE is set. With ``MESHWISE_BENCH_FROM_SOURCE=1`` the environment is
left as it is: under PYTHONDONTWRITEBYTECODE every run compiles the ~30 modules plan imports from
meshwise's source (about 0.1 s more on a 2-core machine)."""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time


def time_plan(cmd: list[str], runs: int) -> str:
    """Run ``cmd`` ``runs`` times, print the searched-layouts line and the times; return the last output."""
    with tempfile.TemporaryDirectory(prefix="meshwise-pyc-") as cache:
        env = dict(os.environ)
        from_source = env.get("MESHWISE_BENCH_FROM_SOURCE") == "1"
        if not from_source:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
            subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)  # fills the cache, untimed
        return _timed(cmd, runs, env, from_source)


def _timed(cmd: list[str], runs: int, env: dict[str, str], from_source: bool) -> str:
    times, cpu = [], []
    out = ""
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(next(line for line in out.splitlines() if "layouts searched" in line).strip())
    print(
        "modules: "
        + (
            "compiled from source on every run (MESHWISE_BENCH_FROM_SOURCE=1)"
            if from_source
            else "from a warm bytecode cache, as installed"
        )
    )
    print(
        "whole-process seconds: " + ", ".join(f"{t:.3f}" for t in times) + f"; best {min(times):.3f} s (target < 1 s)"
    )
    print("CPU seconds of the process (robust to a busy machine): " + ", ".join(f"{c:.3f}" for c in cpu))
    return out
