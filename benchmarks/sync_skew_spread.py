"""How much one calibration's sync-skew ratio moves when measured again at once: calibrate's own
benchmark (``calibrate_worker.bench_sync_skew``, one pass, fitted by ``calibrate.sync_skew``) repeated
``--repeats`` times at 4 and at 8 calls per run, against the one-core rate of rank 0's GEMMs.

    flock /tmp/meshwise-heavy.lock .venv/bin/torchrun --nproc-per-node 4 benchmarks/sync_skew_spread.py \
        > benchmarks/results/sync-skew-spread-cpu2core.txt

Prints each repeat's ratio and rows ``[slice MFLOP, slice alone ms, slice then all-reduce ms]``, then
the median, least and largest ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from meshwise.measure.calibrate import sync_skew
from meshwise.measure.calibrate_worker import SKEW_GEMM_SIDE, bench_sync_skew


def one_core_flops_per_s(gemms: int = 200) -> float:
    """Rank 0's 256-side GEMM rate while the other ranks wait at a barrier (a core of its own)."""
    a, b = torch.randn(SKEW_GEMM_SIDE, SKEW_GEMM_SIDE), torch.randn(SKEW_GEMM_SIDE, SKEW_GEMM_SIDE)
    rate = torch.zeros(1)
    dist.barrier()
    if dist.get_rank() == 0:
        start = time.perf_counter()
        for _ in range(gemms):
            torch.mm(a, b)
        rate[0] = gemms * 2 * SKEW_GEMM_SIDE**3 / (time.perf_counter() - start)
    dist.broadcast(rate, 0)
    return float(rate[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rate, ratios = one_core_flops_per_s(), []
    for i in range(args.repeats):
        for calls in (4, 8):
            rows = bench_sync_skew(5, calls, passes=1)
            ratio, _ = sync_skew(rows, rate)
            ratios.append(ratio)
            if dist.get_rank() == 0:
                cells = " ".join(f"[{f / 1e6:.0f} {alone * 1e3:.1f} {both * 1e3:.1f}]" for f, alone, both, *_ in rows)
                print(f"repeat {i}, {calls} calls: ratio {ratio:.2f}  {cells}", flush=True)
    if dist.get_rank() == 0:
        print(
            f"{len(ratios)} ratios: median {statistics.median(ratios):.2f}, least {min(ratios):.2f}, "
            f"largest {max(ratios):.2f} (one-core GEMM rate {rate / 1e9:.1f} GFLOP/s)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
