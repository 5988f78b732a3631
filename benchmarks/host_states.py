"""How still this machine holds: the probe's figures (measure/probe.py), read again every second.

Each reading, one after the other: a 512-sided fp32 GEMM's rate on one thread and on every core's
threads (best of 15 each), and the probe's operator time (a 32-operator chain's forward + backward,
best of 15, per operator). Prints each series, its least, median and largest, and the share of
readings more than 25% from the median (the bound at which ``train`` and ``measure`` recalibrate,
measure/auto_profile.py). Run it with nothing else running; it never asserts.

    OMP_NUM_THREADS=1 flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/host_states.py --seconds 60 \
        > benchmarks/results/host-states-cpu2core.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from meshwise.measure.probe import best_time, probe

GEMM_SIDE = 512
BOUND = 0.25


def gemm_rate(threads: int) -> float:
    """FLOP/s of one ``GEMM_SIDE`` GEMM on ``threads`` threads, best of 15."""
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(GEMM_SIDE, GEMM_SIDE, generator=gen), torch.randn(GEMM_SIDE, GEMM_SIDE, generator=gen)
    return 2.0 * GEMM_SIDE**3 / best_time(lambda: torch.mm(a, b), 15, 0.002)


def summary(name: str, values: list[float], unit: str) -> str:
    mid = statistics.median(values)
    off = sum(abs(v / mid - 1) > BOUND for v in values) / len(values)
    return (
        f"{name}: least {min(values):.3g}, median {mid:.3g}, largest {max(values):.3g} {unit}; "
        f"{off:.0%} of readings beyond ±{BOUND:.0%} of the median"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to read (default 60)")
    args = ap.parse_args()
    if not args.seconds > 0:
        ap.error(f"--seconds must be a positive number, not {args.seconds}")
    cores = os.cpu_count() or 1
    one, every, ops = [], [], []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        one.append(gemm_rate(1) / 1e9)
        every.append(gemm_rate(cores) / 1e9)
        ops.append(probe()["probe_op_s"] * 1e6)
        time.sleep(0.7)  # the three readings take about 0.3 s: about one a second
    print(f"{len(ops)} readings over {args.seconds:.0f} s, {cores} cores")
    for name, values, unit in (
        ("GEMM, 1 thread", one, "GFLOP/s"),
        (f"GEMM, {cores} threads", every, "GFLOP/s"),
        ("operator", ops, "us"),
    ):
        print(summary(name, values, unit))
        print("  " + " ".join(f"{v:.3g}" for v in values))
    print(f"{cores} threads over 1: " + " ".join(f"{b / a:.2f}" for a, b in zip(one, every)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
