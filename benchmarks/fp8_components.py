"""Float8 components from Transformer Engine's GEMM profiling tables (components_te_linears.csv), no
training run: each constant of cost/fp8.py below is solved or checked on kernel timings.

- ``PER_TENSOR_RATIO``: cuBLAS per-tensor float8 GEMMs against bf16's on the 12 GEMMs of TE's layer
  (H200 NVL, operands quantized before the timed loop), solved under the H100's op model (the same
  132 SMs and rows; the clock cancels in the ratio) as the per-tensor kernels' rate over the block-scaled
  ones the ``gemm.fp8`` row is fitted on. B300's pre-quantized table checks it on Blackwell.
- TE's quantization bytes (``TE_QUANTIZE_BYTES``, ``TE_CURRENT_EXTRA_BYTES``): each recipe's autocast
  time (both operands quantized rowwise and columnwise in every call) less its pre-quantized GEMMs (delayed
  scaling has none: the per-tensor current-scaling kernels stand in), over the elements quantized, at the part's HBM x ``hbm_efficiency`` (the H100's 0.866 for both
  parts; no STREAM figure of either was found). A check, not a fit.
- torchao's float8 Linear: 1.39x bf16 forward + backward at M, K, N = 4096, 8192, 16384 on H100, casts
  included (pytorch/ao torchao/float8/README.md @ a0a0969), against the op model at that ratio with
  torchao's casts (cost/fp8.py ``FORMATS``): a check of those casts.
- torchao's rowwise float8 Linear (``fp8-rowwise``): forward + backward against bf16 at four Llama-70B-under-TP
  shapes on H100, casts included, compiled (pytorch/ao pull request #2185, table "tensorwise w/ rescale": the
  recipe as torchao runs it, cuBLAS per-tensor kernels with the row scales applied after the backward's GEMMs;
  the excerpt read names the scaling only by that title), against the op model with ``fp8-rowwise``'s ratio and
  casts: a check, not a fit.

    python benchmarks/fp8_components.py
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

from meshwise.cost import fp8, kernels
from meshwise.spec import TrainSpec, load_cluster

CATALOG = Path(__file__).resolve().parents[1] / "src/meshwise/catalog"
TOKENS = 15872  # 31 x 512
LINEARS = (("qkv", 4096, 12288), ("attn_out", 4096, 4096), ("mlp_up", 4096, 16384), ("mlp_down", 16384, 4096))
HBM_BYTES_PER_S = {"h200-nvl": 4.8e12, "b300": 8.0e12}  # datasheets: H200 NVL, HGX B300
HBM_EFFICIENCY = 0.866  # the H100's STREAM copy fraction (accelerators.toml)
M, K, N = 4096, 8192, 16384  # torchao's README shape
TORCHAO_SPEEDUP = 1.39
# (M, K, N, bf16 s, rowwise float8 s): pytorch/ao #2185, fast accumulation on, torch.compile
ROWWISE_LINEARS = (
    (16384, 8192, 1280, 1.954e-3, 1.757e-3),
    (16384, 1024, 8192, 1.701e-3, 1.193e-3),
    (16384, 8192, 7168, 9.871e-3, 5.707e-3),
    (16384, 3584, 8192, 5.192e-3, 3.034e-3),
)


def rows() -> list[dict[str, str]]:
    with open(CATALOG / "components_te_linears.csv", encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def source_shapes(pass_name: str) -> list[tuple[int, int, int]]:
    """The pass's GEMMs as the source writes them, (M, K, N): dgrad swaps K and N, wgrad runs K x T x N."""
    if pass_name == "fprop":
        return [(TOKENS, k, n) for _, k, n in LINEARS]
    if pass_name == "dgrad":
        return [(TOKENS, n, k) for _, k, n in LINEARS]
    if pass_name == "wgrad":
        return [(k, TOKENS, n) for _, k, n in LINEARS]
    op = pass_name.split(":")[1]
    return [(TOKENS, k, n) for name, k, n in LINEARS if name == op]


def groups(gpu: str, recipe: str, mode: str, ops: bool = False) -> list[tuple[tuple[tuple[int, int, int], ...], float]]:
    """(the (M, N, K) of kernels.gemm_seconds, seconds) of each pass (``ops``: each fprop GEMM) of one table."""
    out = []
    for r in rows():
        if (r["gpu"], r["recipe"], r["mode"]) != (gpu, recipe, mode) or (":" in r["pass"]) != ops:
            continue
        shapes = tuple((m, n, k) for m, k, n in source_shapes(r["pass"]))
        out.append((shapes, float(r["ms"]) * 1e-3))
    return out


def total_s(gpu: str, recipe: str, mode: str) -> float:
    return sum(s for _, s in groups(gpu, recipe, mode))


def quantized_elements() -> float:
    """Elements an autocast layer quantizes: both operands of each of its 12 GEMMs (M x K and K x N)."""
    return sum(m * k + k * n for p in ("fprop", "dgrad", "wgrad") for m, k, n in source_shapes(p))


def _model_total_s(accel, dtype: str, peak: float, elem: int) -> float:
    return sum(
        kernels.gemm_seconds(m, n, k, accel, peak, elem, 1, dtype)
        for p in ("fprop", "dgrad", "wgrad")
        for m, k, n in source_shapes(p)
    )


def model_ratio(ratio: float) -> float:
    """bf16 over per-tensor float8 time of the layer's 12 GEMMs under the H100's op model."""
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)
    bf16 = _model_total_s(accel, "bf16", accel.peak_bf16_flops_per_s, 2)
    return bf16 / _model_total_s(accel, "fp8", accel.peak_fp8_flops_per_s * ratio, 1)


def solve_ratio() -> tuple[float, float]:
    """(PER_TENSOR_RATIO, the measured bf16 / per-tensor float8 kernel ratio it reproduces)."""
    measured = total_s("h200-nvl", "bf16", "prequant") / total_s("h200-nvl", "fp8-current", "prequant")
    lo, hi = 0.5, 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_ratio(mid) < measured else (lo, mid)
    return (lo + hi) / 2, measured


def cast_bytes_per_element(gpu: str, recipe: str) -> float:
    """Bytes per quantized element the recipe's autocast layer moves beyond the per-tensor kernels."""
    kernel = recipe if groups(gpu, recipe, "prequant") else "fp8-current"  # delayed scaling: no pre-quantized run
    gap_s = total_s(gpu, recipe, "autocast") - total_s(gpu, kernel, "prequant")
    return gap_s * HBM_BYTES_PER_S[gpu] * HBM_EFFICIENCY / quantized_elements()


def torchao_speedup(ratio: float) -> float:
    """bf16 over float8 forward + backward of torchao's README linear under the H100's op model."""
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)
    bf16 = sum(kernels.linear_seconds(M, N, K, accel, accel.peak_bf16_flops_per_s, 2, "bf16"))
    train = TrainSpec(1, 1, precision="fp8")
    gemms = sum(kernels.linear_seconds(M, N, K, accel, accel.peak_fp8_flops_per_s * ratio, 1, "fp8"))
    casts = sum(fp8.linear_cast_bytes(train, M, N, K)) / (accel.hbm_bytes_per_s * accel.hbm_efficiency)
    return bf16 / (gemms + casts)


def rowwise_speedups() -> list[tuple[tuple[int, int, int], float, float]]:
    """((M, K, N), predicted, published) bf16 over rowwise float8 forward + backward of torchao's Linear on H100
    (``ROWWISE_LINEARS``): the op model's ``fp8-rowwise`` GEMMs and torchao's casts at the table clock."""
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)
    train = TrainSpec(1, 1, precision="fp8-rowwise")
    hbm = accel.hbm_bytes_per_s * accel.hbm_efficiency
    out = []
    for m, k, n, bf16_s, fp8_s in ROWWISE_LINEARS:
        bf16 = sum(kernels.linear_seconds(m, n, k, accel, accel.peak_bf16_flops_per_s, 2, "bf16"))
        peak = fp8.gemm_peak_flops_per_s(accel, train)
        rowwise = (
            sum(kernels.linear_seconds(m, n, k, accel, peak, 1, "fp8"))
            + sum(fp8.linear_cast_bytes(train, m, n, k)) / hbm
        )
        out.append(((m, k, n), bf16 / rowwise, bf16_s / fp8_s))
    return out


def report() -> list[str]:
    ratio, measured = solve_ratio()
    b300 = total_s("b300", "bf16", "prequant") / total_s("b300", "fp8-current", "prequant")
    out = [
        f"per-tensor / block-scaled float8 GEMM ratio: {ratio:.3f} (H200 NVL: bf16 / per-tensor float8 kernels "
        f"{measured:.3f} on TE's 12 GEMMs; B300 {b300:.3f})",
        f"  catalog PER_TENSOR_RATIO {fp8.PER_TENSOR_RATIO}",
        "TE quantization, bytes per element (autocast less its pre-quantized kernels, delayed scaling: the per-tensor ones; HBM x 0.866):",
    ]
    want = {
        "fp8-delayed": fp8.TE_QUANTIZE_BYTES,
        "fp8-current": fp8.TE_QUANTIZE_BYTES + fp8.TE_CURRENT_EXTRA_BYTES,
        "mxfp8": fp8.TE_QUANTIZE_BYTES + 2 / 32,
    }
    for gpu, recipes in (
        ("h200-nvl", ("fp8-delayed", "fp8-current")),
        ("b300", ("fp8-delayed", "fp8-current", "mxfp8")),
    ):
        for recipe in recipes:
            got = cast_bytes_per_element(gpu, recipe)
            out.append(
                f"  {gpu:8s} {recipe:12s} {got:5.2f} B (cost/fp8.py: {want[recipe]:.2f}, {got / want[recipe] - 1:+.0%})"
            )
    out.append(
        f"torchao float8 Linear at {M}x{K}x{N}: {torchao_speedup(fp8.PER_TENSOR_RATIO):.3f}x bf16 predicted, "
        f"{TORCHAO_SPEEDUP}x published"
    )
    out.append("torchao rowwise float8 Linear on H100 (pytorch/ao #2185), bf16 / rowwise, predicted vs published:")
    for (m, k, n), got, want in rowwise_speedups():
        out.append(f"  {m}x{k}x{n}: {got:.2f}x predicted, {want:.2f}x published ({got / want - 1:+.0%})")
    return out


if __name__ == "__main__":
    print("\n".join(report()))
