"""The per-tensor float8 GEMM ratio of cost/fp8.py, solved from component data (no training run).

torchao's float8 Linear (per-tensor scaling, cuBLAS) runs forward + backward 1.39x as fast as bf16 at
M, K, N = 4096, 8192, 16384 on H100, casts included (pytorch/ao torchao/float8/README.md @ a0a0969,
Performance). Under the H100's op model (its gemm.bf16 and gemm.fp8 rows, at the clock the
micro-benchmark ran at: sustained_clock 1) with cost/fp8.py's per-tensor casts, this solves the
ratio of the per-tensor kernels to the block-scaled ones the gemm.fp8 row is fitted on.

    python benchmarks/fp8_components.py
"""

from __future__ import annotations

from dataclasses import replace

from meshwise.cost import fp8, kernels
from meshwise.spec import TrainSpec, load_cluster

M, K, N = 4096, 8192, 16384
TORCHAO_SPEEDUP = 1.39


def speedup(ratio: float) -> float:
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)
    bf16 = sum(kernels.linear_seconds(M, N, K, accel, accel.peak_bf16_flops_per_s, 2, "bf16"))
    train = TrainSpec(1, 1, precision="fp8")
    gemms = sum(kernels.linear_seconds(M, N, K, accel, accel.peak_fp8_flops_per_s * ratio, 1, "fp8"))
    casts = sum(fp8.linear_cast_bytes(train, M, N, K)) / (accel.hbm_bytes_per_s * accel.hbm_efficiency)
    return bf16 / (gemms + casts)


def solve() -> float:
    lo, hi = 0.2, 3.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) < TORCHAO_SPEEDUP else (lo, mid)
    return (lo + hi) / 2


if __name__ == "__main__":
    x = solve()
    print(f"per-tensor / block-scaled float8 GEMM ratio: {x:.3f} (speedup {speedup(x):.3f} at {M}x{K}x{N})")
