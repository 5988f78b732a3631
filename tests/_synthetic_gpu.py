"""A timer for measure/gpu_bench.py that answers with the catalog's H100 time model instead of a clock
(tests of the GPU calibration on fake tensors): each benchmark's closure runs once (on fake CUDA
tensors, its shapes and dispatch are checked) and its time is what cost/kernels.py predicts for the
work its key names, at the short-burst clock the component tables ran at. Fitting these times must
give back the catalog's constants: the fits are checked against the model they invert."""

from __future__ import annotations

from dataclasses import replace

from meshwise.cost import fp8 as float8
from meshwise.cost import kernels
from meshwise.measure.gpu_bench import attention_flops
from meshwise.spec import load_cluster

H100 = load_cluster("h100", 8).accelerator
SHORT = replace(H100, sustained_clock=1.0)  # the burst clock (benchmarks/fit_components.py fits at it)
COPY_BYTES_PER_S = H100.hbm_bytes_per_s * H100.hbm_efficiency


def attention_rate(direction: str, causal: bool, seq: int, head_dim: int) -> float:
    """Fraction of peak of the catalog's ``attention.meshwise`` curve for this call."""
    row = {r[0]: r[2:] for r in H100.attention}["meshwise"]
    fwd, fwd_half, causal_top, causal_half, bwd, bwd_half, head64 = row
    width = head64 if head_dim == 64 else 1.0
    if direction == "backward":
        return width * kernels._saturating(bwd, bwd_half, seq)
    return width * (
        kernels._saturating(causal_top, causal_half, seq) if causal else kernels._saturating(fwd, fwd_half, seq)
    )


def seconds(key: tuple) -> float:
    kind = key[0]
    if kind == "gemm":
        _, dtype, b, m, n, k = key
        fp8 = dtype == "fp8"  # torch._scaled_mm's per-tensor kernels: the fp8 row at PER_TENSOR_RATIO (cost/fp8.py)
        peak = H100.peak_fp8_flops_per_s * float8.PER_TENSOR_RATIO if fp8 else H100.peak_bf16_flops_per_s
        return kernels.gemm_seconds(m, n, k, SHORT, peak, 1 if fp8 else 2, b, dtype)
    if kind == "attention":
        _, direction, causal, seq, head_dim, batch, heads = key
        flops = attention_flops(direction, causal, batch, heads, seq, head_dim)
        return flops / (H100.peak_bf16_flops_per_s * attention_rate(direction, causal, seq, head_dim))
    if kind == "copy":
        return 2.0 * key[1] / COPY_BYTES_PER_S
    if kind == "sustained":
        _, m, n, k, _ = key
        return seconds(("gemm", "bf16", 1, m, n, k)) / H100.sustained_clock
    raise ValueError(f"no synthetic time for {key!r}")


class CatalogTimer:
    """gpu_bench.Timer's interface: run the closure once, answer with :func:`seconds`."""

    def __call__(self, fn, key: tuple) -> float:
        fn()
        return seconds(key)

    def hold(self, fn, seconds_: float) -> None:
        pass
