"""The float8 formats in the cost model: the linear layers' GEMMs at the device's float8 peak, the
casts around them as memory-bound work, and what each format sends and keeps.

Every format keeps bf16 for what its recipes keep in bf16 (torchao float8 and Transformer Engine
convert ``nn.Linear`` only; DeepSeek-V3, arXiv 2412.19437 Sec. 3.3): the embedding, the LM head,
the MoE router, attention (softmax and its two matmuls) and the norms.

- **GEMM rate.** A linear's GEMMs run at ``peak_fp8 * gemm_ratio`` through the same tile/wave model
  with the device's ``gemm.fp8`` row (cost/kernels.py; fitted by benchmarks/fit_components.py on
  DeepGEMM's block-scaled FP8 table), operands of 1 byte in its memory-bound bound; ``gemm_ratio``
  is the format's kernels against those block-scaled ones (``FORMATS``). On the flat path (no op
  model) the linear layers' FLOPs run at ``peak_fp8 * gemm_ratio * FLAT_FP8_EFFICIENCY`` of the
  efficiency curve, the rest at bf16's.
- **Casts** (memory-bound, at ``hbm_efficiency`` of HBM), as each runtime's float8 library runs them.
  torchao (meshwise's runtime): per linear and micro-batch the forward quantizes the input
  ``X (t x k)`` and the weight ``W (k x n)``, the backward the output gradient ``dY (t x n)``:
  ``cast_bytes`` per element each (bf16 read, float8 written, scales; per-tensor scaling reads the
  tensor twice, once for its amax). The backward's other operands are the columnwise (transposed)
  copies of X, W and dY: ``column_bytes`` per element each (a float8 transpose, 1 B read + 1 B
  written, for per-tensor scales; re-quantized from bf16 along the other axis for row, block and MX
  scales, whose scales follow the axis: TE docs, mxfp8.rst "Handling transposes"). Full recompute
  casts X and W again. Transformer Engine (``--runtime megatron``; per-tensor and MX formats): one
  kernel reads the bf16 tensor once and writes its rowwise and columnwise copies together
  (``TE_QUANTIZE_BYTES`` + scales per element; delayed scaling, Megatron-Core's default
  ``fp8_recipe``, takes the amax inside that kernel); the norm before QKV and the first MLP GEMM
  writes float8 itself (TE's LayerNormLinear, ``TE_NORM_FUSED_BYTES``); the weight's copies are made on
  a step's first micro-batch of each chunk and cached for the rest (Megatron's ``is_first_microbatch``).
  Checked on TE's GEMM profiling tables (benchmarks/fp8_components.py).
- **Communication.** FSDP2's float8 all-gather (torchao ``enable_fsdp_float8_all_gather``) sends
  the linear layers' weights at 1 byte per parameter, for per-tensor scaling only; row, block and
  MX formats gather bf16 (torchtitan docs/float8.md, torchao mxfp8 docs). Under sequence
  parallelism the activations gathered into the column-parallel QKV and first MLP projections
  travel in float8 too, for per-tensor scaling (torchao's float8 TP plans cast the input before the
  all-gather; Transformer Engine's all-gather userbuffers are float8 under FP8); the backward's
  gathers of gradients stay bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.errors import MeshwiseError
from meshwise.spec import AcceleratorSpec, TrainSpec


@dataclass(frozen=True)
class Fp8Format:
    name: str
    gemm_ratio: float  # float8 GEMM fraction of the float8 peak / bf16 GEMM fraction of the bf16 peak
    cast_bytes: float  # HBM bytes per element of one quantization from bf16
    column_bytes: float  # HBM bytes per element of the columnwise copy the backward needs
    gathers_fp8: bool  # FSDP2 all-gathers the linear weights in float8
    mx: bool = False  # an MX format: needs the device's MX tensor cores
    te_scale_bytes: float | None = None  # TE: scale bytes per element of its two copies; None: no TE recipe
    te_norm_fused: bool = False  # TE's norm writes the format itself (delayed per-tensor scaling)


# gemm_ratio, against the block-scaled kernels the ``gemm.fp8`` row is fitted on (benchmarks/fp8_components.py):
# - block (DeepGEMM 1x128 / 128x128): 1, by construction;
# - row: no published row-scaled GEMM table was found; taken as the block kernels' (a scaled epilogue per
#   output row), an assumption;
# - per-tensor (cuBLAS): solved so that the H100 op model gives the bf16 / per-tensor float8 kernel ratio
#   of Transformer Engine's GEMM profiling table on H200 NVL (1.905 on a layer's 12 GEMMs, operands
#   quantized beforehand);
# - MX: 1, the Blackwell rows are fitted on MXFP8 kernels (TE's B300 table; Blackwell runs block-scaled
#   FP8 as MXFP8).
PER_TENSOR_RATIO = 1.13  # benchmarks/fp8_components.py
TENSOR_ROW = "fp8-tensor"  # the GEMM row of per-tensor kernels, where a device has its own (meshwise calibrate)
# Transformer Engine's quantization of a bf16 tensor into its rowwise and columnwise float8 copies in one
# kernel: 2 B read + 1 + 1 B written per element (TE's cast_transpose; MXFP8 and block scaling quantize
# both axes from the same read); current (per-tensor "tensorwise") scaling reads it once more for its amax
# first (TE_CURRENT_EXTRA_BYTES, not Megatron's default). Checked on TE's GEMM profiling tables: autocast
# less pre-quantized time, 3.7 B (delayed) and 5.9 B (current) per element on H200 NVL
# (benchmarks/fp8_components.py).
TE_QUANTIZE_BYTES = 4.0
TE_CURRENT_EXTRA_BYTES = 2.0
# TE's LayerNormLinear under delayed scaling: the norm kernel writes float8 (1 B where its bf16 output,
# counted in cost/kernels.py PASSES, is 2) and the backward transposes it (1 B read + 1 B written)
TE_NORM_FUSED_BYTES = 1.0
FORMATS = {
    "fp8": Fp8Format(
        "fp8",
        gemm_ratio=PER_TENSOR_RATIO,
        cast_bytes=5.0,
        column_bytes=2.0,
        gathers_fp8=True,
        te_scale_bytes=0.0,
        te_norm_fused=True,
    ),
    "fp8-rowwise": Fp8Format(
        "fp8-rowwise", gemm_ratio=1.0, cast_bytes=3.0 + 4 / 4096, column_bytes=3.0, gathers_fp8=False
    ),
    "fp8-blockwise": Fp8Format(
        "fp8-blockwise", gemm_ratio=1.0, cast_bytes=3.0 + 4 / 128, column_bytes=3.0 + 4 / 128, gathers_fp8=False
    ),
    "mxfp8": Fp8Format(
        "mxfp8",
        gemm_ratio=1.0,
        cast_bytes=3.0 + 1 / 32,
        column_bytes=3.0 + 1 / 32,
        gathers_fp8=False,
        mx=True,
        te_scale_bytes=2 / 32,
    ),
}
# The flat path's float8 GEMMs against its bf16 ones: the H100's fitted rows, fp8 0.763 / bf16 0.869
# (benchmarks/fit_components.py), the one device with both
FLAT_FP8_EFFICIENCY = 0.763 / 0.869
DEFAULT_HBM_EFFICIENCY = 0.8  # for profiles without the op model's hbm_efficiency (flat path)


def fmt(train: TrainSpec) -> Fp8Format | None:
    return FORMATS.get(train.precision)


def check_supported(accel: AcceleratorSpec, precision: str) -> None:
    """One line naming the precision and what would be valid, where the device lacks the format."""
    f = FORMATS.get(precision)
    if f is None:
        return
    peak = accel.peak_mxfp8_flops_per_s if f.mx else accel.peak_fp8_flops_per_s
    if not peak:
        kind = (
            "MX (32-element block) float8 tensor cores: Blackwell (b200, b300, gb200, gb300) or mi355x"
            if f.mx
            else "float8 tensor cores (peak_fp8_flops_per_s): h100, h200, h800, b200, mi300x and later"
        )
        raise MeshwiseError(f"--precision {precision}: {accel.name} has no {kind}; use bf16-mixed on it")


def gemm_peak_flops_per_s(accel: AcceleratorSpec, train: TrainSpec) -> float:
    """The peak a linear layer's GEMM is priced at: the float8 peak times the format's ratio (1 where the
    device has a row of the format's own kernels, ``TENSOR_ROW``), else the precision's own peak; on a
    device without the format's tensor cores (a CPU rank, where torch emulates float8 GEMMs; ``plan``
    refuses such a device up front) the bf16 peak."""
    f = fmt(train)
    if f is None:
        return accel.peak_flops_per_s(train.precision)
    peak = accel.peak_mxfp8_flops_per_s if f.mx else accel.peak_fp8_flops_per_s
    own_row = gemm_dtype(train) == TENSOR_ROW and accel.has_gemm_row(TENSOR_ROW)
    return peak * (1.0 if own_row else f.gemm_ratio) if peak else accel.peak_flops_per_s(train.precision)


def gemm_dtype(train: TrainSpec) -> str:
    """The GEMM row (cost/kernels.gemm_row) a linear layer's GEMMs use: ``fp8-tensor`` under per-tensor
    scaling (a device's row fitted on per-tensor kernels: a GPU calibration's, else its ``fp8`` row at
    ``PER_TENSOR_RATIO``), ``fp8`` under the other float8 formats."""
    if not train.fp8:
        return "bf16"
    return TENSOR_ROW if train.precision == "fp8" else "fp8"


def gemm_elem_bytes(train: TrainSpec) -> int:
    """Bytes per operand element a linear's GEMM reads: 1 in float8, else the activation's."""
    return 1 if train.fp8 else train.activation_bytes


def te_casts(train: TrainSpec) -> bool:
    """Whether the linear layers' casts are Transformer Engine's (``--runtime megatron``, per-tensor or MX)."""
    f = fmt(train)
    return train.runtime == "megatron" and f is not None and f.te_scale_bytes is not None


def linear_cast_bytes(
    train: TrainSpec, t: float, n: float, k: float, weight_share: float = 1.0, norm_fed: bool = False
) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one linear's casts, ``X (t x k) @ W (k x n)``, per micro-batch.
    Under Transformer Engine (``--runtime megatron``) ``weight_share`` is the micro-batch's share of the
    weight's once-per-step quantization (1 / micro-batches) and ``norm_fed`` says a norm writes X."""
    f = fmt(train)
    if f is None:
        return 0.0, 0.0
    x, w, dy = t * k, k * n, t * n
    if te_casts(train):
        quantize = TE_QUANTIZE_BYTES + f.te_scale_bytes
        x_bytes = TE_NORM_FUSED_BYTES if norm_fed and f.te_norm_fused else quantize
        return x_bytes * x + quantize * w * weight_share, quantize * dy
    return f.cast_bytes * (x + w), f.cast_bytes * dy + f.column_bytes * (x + w + dy)


def hbm_bytes_per_s(accel: AcceleratorSpec) -> float:
    return accel.hbm_bytes_per_s * (accel.hbm_efficiency or DEFAULT_HBM_EFFICIENCY)


def tp_float8_gathers(train: TrainSpec, blocks: int, moe_blocks: int, recompute: bool) -> int:
    """Of a micro-batch's TP all-gathers under SP, those sent in float8: each block's QKV input and
    (dense blocks) first MLP input, forward and, under recompute, again; per-tensor formats only."""
    f = fmt(train)
    if f is None or not f.gathers_fp8:
        return 0
    return (2 * blocks - moe_blocks) * (2 if recompute else 1)


def gather_bytes_per_param(train: TrainSpec, linear_share: float) -> float:
    """Bytes per parameter FSDP2's all-gather sends: the weight's bytes, less one for the linear
    layers' share ``linear_share`` of them under per-tensor float8 (sent in float8)."""
    f = fmt(train)
    if f is not None and f.gathers_fp8:
        return train.weight_bytes - linear_share
    return float(train.weight_bytes)


def float8_copy_bytes(block_params: float) -> float:
    """The float8 copies of one block's converted weights while it computes, beside the bf16 ones:
    rowwise and columnwise, 1 B each per parameter (torchao saves the bf16 input and weight and casts
    again in backward). ``block_params`` leaves the routed experts out: meshwise's runtime keeps them
    in bf16 (runtime/float8.py; torchao's float8 grouped GEMM is a prototype it does not take).
    Megatron-LM's (TE) copies, experts included: cost/megatron_memory.py."""
    return 2.0 * block_params
