"""Compute time on a GPU, operation by operation (for accelerators that declare the GPU fields).

Every constant below is fitted on its own component's published data (benchmarks/fit_components.py,
src/meshwise/catalog/components_*.csv), never on end-to-end training runs. One micro-batch of
``T = mbs * s`` tokens on one TP rank:

- **GEMMs by shape and dtype** (the attention's: ``attention_shapes``, latent attention's by its own
  projections). Each linear ``X (T x K) @ W (K x N)`` after dividing by TP runs forward
  as ``(M, N, K) = (T, N, K)`` and backward as ``(T, K, N)`` (input gradient) and ``(K, N, T)`` (weight
  gradient). A GEMM of ``(M, N, K)`` covers ``ceil(M / tm) * ceil(N / tn)`` output tiles, run in
  ``ceil(tiles / SMs)`` waves; the fraction of the waves' tile slots doing useful work is
  ``util = M N / (waves * SMs * tm * tn)`` (tile and wave quantization); when the tiles leave SMs idle,
  K is split over up to ``SMs // tiles`` slices of at least ``SPLIT_K_MIN_DEPTH``. Each tile's main loop runs
  ``K`` deep after a fixed prologue and epilogue worth ``k_half`` of depth, so a busy tile reaches
  ``efficiency * K / (K + k_half)`` of peak, at the clock the GPU holds under sustained dense math
  (``sustained_clock``: micro-benchmarks run at the peak's clock, training at the power limit).
  Time = ``floor + max(2 M N K / (peak * efficiency * util)
  * (1 + k_half / K), bytes moved / (HBM * hbm_efficiency))``; ``(efficiency, k_half)`` per dtype
  (``gemm_row``), ``floor`` = ``kernel_floor_s`` (what the smallest GEMMs take however little they do).
- **Attention.** Fused (flash / cuDNN): causal, so half the square: forward ``2 b s^2 d h / t`` FLOPs,
  backward 2.5 times that (five matmuls against two: Dao 2023, FlashAttention-2, Sec. 3), each at the
  runtime's kernel's throughput for the sequence and head width (``attention_efficiency``: the
  FlashAttention-3 paper's figures for FlashAttention-2 and cuDNN on H100). Unfused (Megatron-LM 2021):
  the full square as batched GEMMs of head width, plus the softmax's (scale, mask, dropout) bytes: 9
  per score forward, 8 backward.
- **Memory-bound operations** by bytes over HBM, plus ``floor`` per kernel (``KERNELS``): norms,
  residual adds, rotary, the MLP's activation, the embedding and the loss's softmax / cross-entropy.
  Bytes per element per runtime (``PASSES``): eager torch moves each tensor several times (an RMSNorm
  upcasts to float32 and runs five kernels), by the model code it runs (``ops_key``: meshwise's own, or
  torchtitan's Llama); Megatron/NeMo's fused kernels read and write each once.
  Backward moves twice the forward's bytes.
- **Recompute** as what is recomputed: ``full`` re-runs the block's forward; meshwise's ``selective``
  re-runs its memory-bound ops (runtime/activation_checkpointing.py keeps matmul and attention outputs);
  torchtitan's op-level selective (``selective_policy = "every-other-matmul"``) also re-runs every
  second matmul in forward order (the K projection, the output projection and the up projection);
  Megatron's ``selective`` re-runs the attention core (free under flash attention, which recomputes
  inside its own backward) and latent attention's up-projections (``mla_up_proj``).

Under a float8 precision the linear layers' GEMMs run at the format's peak with the ``fp8`` row and
their casts are memory-bound work (cost/fp8.py); attention, the head, the embedding and the norms stay
in bf16.

Everything is cached per shape, so the planner's search pays each distinct shape once.
"""

from __future__ import annotations

import math
from functools import lru_cache

from meshwise.cost import fp8
from meshwise.cost.rank_work import RankWork
from meshwise.spec import AcceleratorSpec, ModelSpec, TrainSpec

# Bytes moved per element (read + write, in units of the activation element) per forward, per model code
# (``ops_key``): the meshwise runtime's own model, torchtitan's Llama, or Megatron/NeMo's fused kernels.
# geglu (Gemma's gated tanh-GeLU, act(gate) * up) moves the same tensors as swiglu. ``repeat_kv``: the
# expanded K and V copies a model materialises under grouped-query attention (read kv, write h per token).
# torchtitan's Llama (models/llama/model.py and models/norms.py at its commits 0413364 of 2024-04 and
# 9dec370 of 2024-12), op by op in bf16 units: its eager RMSNorm upcasts, squares, takes the mean, scales,
# casts back and multiplies by the weight: 3 + 4 + 2 + 4 + 3 + 2 = 18; its rotary upcasts Q and K to float32,
# multiplies them as complex64 and casts back: 3 + 4 + 3 = 10; repeat_kv expands K and V by copy; its
# Triton fused RMSNorm (norm_type "fused_rmsnorm") reads and writes once: 2.
PASSES = {
    "meshwise": {
        "norm": 6.0,
        "residual": 3.0,
        "rotary": 6.0,
        "swiglu": 5.0,
        "geglu": 5.0,
        "gelu": 4.0,
        "loss_bytes": 28.0,
        "repeat_kv": 0.0,
    },
    "torchtitan": {
        "norm": 18.0,
        "residual": 3.0,
        "rotary": 10.0,
        "swiglu": 5.0,
        "geglu": 5.0,
        "gelu": 4.0,
        "loss_bytes": 28.0,
        "repeat_kv": 1.0,
    },
    "megatron": {
        "norm": 2.0,
        "residual": 3.0,
        "rotary": 2.0,
        "swiglu": 3.0,
        "geglu": 3.0,
        "gelu": 2.0,
        "loss_bytes": 52.0,
        "repeat_kv": 0.0,
    },
}
PASSES["torchtitan-fused-norm"] = {**PASSES["torchtitan"], "norm": 2.0}  # its Triton RMSNorm: one read, one write
# Megatron's loss without --cross-entropy-loss-fusion (its default): vocab_parallel_cross_entropy on the
# logits upcast to float32, counted on megatron-core 0.16.1 (benchmarks/megatron_loss_bytes.py): forward
# the cast 2 + 4, max 4, in-place subtract 8, exp 8, sum 4, in-place divide 8 = 38 B per logit; backward
# the in-place multiply 8 and the cast back to bf16 4 + 2 = 14.
# With the fusion (``TrainSpec.loss_fusion``) one read and one write of the logits each way: 14.
PASSES["megatron-fused-loss"] = {**PASSES["megatron"], "loss_bytes": 14.0}
# Memory-bound kernels a block's forward launches besides its GEMMs and attention (backward: twice as
# many): eager torch runs each RMSNorm as ~6 kernels (casts, square, mean, rsqrt, two products), each
# rotary as ~4 per tensor (Q, K), residual adds 1 each, SwiGLU 2; Megatron's fused norm, bias-dropout-add,
# rotary and activation kernels run once each (2 + 2 + 2 + 1). torchtitan: 8 per eager norm (1 fused),
# 3 per rotary tensor, 2 repeat_kv copies, 2 residual adds, 2 for SwiGLU.
KERNELS = {"meshwise": 24, "torchtitan": 28, "torchtitan-fused-norm": 14, "megatron": 7, "megatron-fused-loss": 7}
SPLIT_K_MIN_DEPTH = 512  # a split-K slice's least depth (cuBLAS splits K only while each slice stays this deep)
FLASH_BACKWARD = 2.5  # FlashAttention-2 backward / forward FLOPs
SOFTMAX_FWD_BYTES = 9.0
SOFTMAX_BWD_BYTES = 8.0


def ops_key(train: TrainSpec) -> str:
    """Whose memory-bound operators run (the key of ``PASSES`` and ``KERNELS``): the meshwise runtime's
    model code (``train.model_code``), else the runtime's own (Megatron's fused kernels; its loss fused or
    not, ``train.loss_fusion``)."""
    if train.runtime == "meshwise":
        return train.model_code
    return "megatron-fused-loss" if train.loss_fusion else train.runtime


def gemm_row(accel: AcceleratorSpec, dtype: str = "bf16") -> tuple[float, float]:
    """``(efficiency, k_half)`` of ``dtype``'s GEMMs on ``accel``: its fitted row (``gemm.<dtype>`` in the
    catalog), else the other float8 row (``fp8``: block-scaled kernels, ``fp8-tensor``: per-tensor ones;
    cost/fp8.py), else the bf16 row, else a profile's flat ``gemm_efficiency`` with no depth term."""
    rows = {row[0]: row[1:] for row in accel.gemm}
    other = {"fp8": "fp8-tensor", "fp8-tensor": "fp8"}.get(dtype, "bf16")
    found = rows.get(dtype) or rows.get(other) or rows.get("bf16")
    return (found[0], found[1]) if found else (accel.gemm_efficiency, 0.0)


def gemm_seconds(
    m: float,
    n: float,
    k: float,
    accel: AcceleratorSpec,
    peak: float,
    elem_bytes: int,
    batch: int = 1,
    dtype: str = "bf16",
) -> float:
    """``batch`` GEMMs of (M, N, K) in ``dtype``: the kernel floor plus tile/wave-quantized compute, slowed by
    the tile's fixed depth ``k_half``, or bytes over HBM, whichever is longer (module docstring)."""
    m, n, k = max(1, math.ceil(m)), max(1, math.ceil(n)), max(1, math.ceil(k))
    efficiency, k_half = gemm_row(accel, dtype)
    tm, tn, sms = accel.gemm_tile_m, accel.gemm_tile_n, accel.sm_count
    tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
    splits = max(1, min(sms // tiles, k // SPLIT_K_MIN_DEPTH))  # split-K when the tiles leave SMs idle
    waves = math.ceil(tiles * splits / sms)
    util = batch * m * n * splits / (waves * sms * tm * tn)
    rate = peak * accel.sustained_clock * efficiency * util
    compute_s = 2.0 * batch * m * n * k / rate * (1.0 + k_half * splits / k)
    memory_s = batch * (m * k + k * n + m * n) * elem_bytes / hbm_bytes_per_s(accel)
    return accel.kernel_floor_s + max(compute_s, memory_s)


def hbm_bytes_per_s(accel: AcceleratorSpec) -> float:
    return accel.hbm_bytes_per_s * accel.hbm_efficiency


def linear_seconds(
    t: int, n: float, k: float, accel: AcceleratorSpec, peak: float, e: int, dtype: str = "bf16"
) -> tuple[float, float]:
    """(forward, backward) seconds of ``X (t x k) @ W (k x n)`` in ``dtype``."""
    fwd = gemm_seconds(t, n, k, accel, peak, e, dtype=dtype)
    bwd = gemm_seconds(t, k, n, accel, peak, e, dtype=dtype) + gemm_seconds(k, n, t, accel, peak, e, dtype=dtype)
    return fwd, bwd


def _saturating(top: float, half: float, x: float) -> float:
    return top * x / (x + half)


def attention_efficiency(accel: AcceleratorSpec, runtime: str, seq: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) fraction of peak of the runtime's fused causal attention at ``seq`` tokens and
    head width ``head_dim``: each direction ``top * s / (s + s_half)``, fitted on the FlashAttention-3
    paper's H100 figures (benchmarks/fit_components.py). The backward figures are non-causal; causal
    backward takes the forward's causal / non-causal ratio at the same length. Head width 64 reaches
    ``head64`` of 128's, linear in between, 128's above. Without a row: the flat ``attention_efficiency``."""
    rows = {row[0]: row[2:] for row in accel.attention}
    row = rows.get(runtime) or next(iter(rows.values()), None)
    if row is None:
        return accel.attention_efficiency, accel.attention_efficiency
    fwd, fwd_half, causal, causal_half, bwd, bwd_half, head64 = row
    width = head64 + (1.0 - head64) * min(1.0, max(0.0, (head_dim - 64) / 64))
    forward = _saturating(causal, causal_half, seq)
    backward = _saturating(bwd, bwd_half, seq) * forward / _saturating(fwd, fwd_half, seq)
    return width * forward, width * backward


def _attention_s(
    model: ModelSpec,
    accel: AcceleratorSpec,
    peak: float,
    e: int,
    mbs: int,
    seq: int,
    tp: int,
    train: TrainSpec,
) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core of one block (``train``: whether it is fused,
    and whose runtime)."""
    fused, runtime = train.fused_attention, train.runtime
    heads = model.heads // tp
    if fused:
        # causal: half of 2 b s^2 (d_qk + d_v) per head (QK^T and PV; d_v = d_qk but under MLA)
        fwd_flops = mbs * seq * seq * (model.head_dim + (model.v_head_dim if model.mla else model.head_dim)) * heads
        fwd_eff, bwd_eff = attention_efficiency(accel, runtime, seq, model.head_dim)
        floor = accel.kernel_floor_s
        peak *= accel.sustained_clock
        return floor + fwd_flops / (peak * fwd_eff), floor + FLASH_BACKWARD * fwd_flops / (peak * bwd_eff)
    d, batch = model.head_dim, mbs * heads
    scores = gemm_seconds(seq, seq, d, accel, peak, e, batch)  # Q K^T
    context = gemm_seconds(seq, d, seq, accel, peak, e, batch)  # P V
    elements = batch * seq * seq
    fwd = scores + context + elements * SOFTMAX_FWD_BYTES / hbm_bytes_per_s(accel)
    bwd = 2 * (scores + context) + elements * SOFTMAX_BWD_BYTES / hbm_bytes_per_s(accel)
    return fwd, bwd


def _mlp_width(model: ModelSpec) -> float:
    """The MLP width a token passes through: ``ffn_hidden``, or for a mixture of experts the active
    MLP (k experts, the shared expert, the router; the mean over the blocks) as one dense MLP of the
    same parameters: the width of its activation's memory-bound bytes (its GEMMs are
    cost/moe_block.py's)."""
    if not model.moe:
        return model.ffn_hidden
    return model.active_mlp_params / ((2 if model.mlp == "gelu" else 3) * model.hidden)


def block_memory_bound_elements(model: ModelSpec, runtime: str, tokens: float, tp: int, sp: bool) -> float:
    """Activation elements a block's norms, residual adds, rotary and MLP activation move in one
    forward on one TP rank (``PASSES``): the two norms and two residual adds over every token of the
    rank (``tokens / tp`` under SP: TP replicates them otherwise), rotary over its Q/K heads and the
    activation over its MLP columns (both split by TP)."""
    p = PASSES[runtime]
    t_norm = tokens / tp if sp else tokens
    elems = (2 * p["norm"] + 2 * p["residual"]) * t_norm * model.hidden
    elems += p["rotary"] * tokens * (model.hidden + model.kv_dim) / tp
    if model.kv_heads < model.heads:  # K and V expanded to every query head by copy (read kv, write h each)
        elems += p["repeat_kv"] * 2 * tokens * (model.heads * model.head_dim + model.kv_dim) / tp
    elems += p[model.mlp] * tokens * _mlp_width(model) / tp
    return elems


def head_memory_bound_bytes(
    model: ModelSpec, runtime: str, e: int, tokens: float, tp: int, sp: bool, loss_vocab: float
) -> float:
    """Forward + backward bytes of the final norm (3 passes of ``PASSES``' norm) and of the loss's
    softmax / cross-entropy over ``loss_vocab`` logits per token (``loss_bytes`` per logit)."""
    p = PASSES[runtime]
    t_norm = tokens / tp if sp else tokens
    return tokens * loss_vocab * p["loss_bytes"] + 3 * p["norm"] * t_norm * model.hidden * e


def embedding_bytes(model: ModelSpec, e: int, tokens: float, tp: int, sp: bool) -> float:
    """Forward (gather) + backward (scatter-add) bytes of the embedding: 5 passes over its output
    (``tokens / tp`` of it under SP)."""
    return 5 * tokens / (tp if sp else 1) * model.hidden * e


def rank_memory_bound_bytes(
    model: ModelSpec, runtime: str, e: int, seq_len: int, work: RankWork, loss_vocab: float
) -> float:
    """Bytes one micro-batch (``work.mbs`` sequences of ``seq_len`` tokens) moves through memory-bound
    operations on one rank, forward + backward: ``blocks * e * F * (3 + [ac != none])`` (backward moves
    twice the forward's bytes; ``full`` and meshwise's ``selective`` re-run the forward's memory-bound
    operations), plus the head's (``loss_vocab`` logits per token) and the embedding's. The CPU path's
    term (cost/host.py ``memory_bound_seconds``); the calibration (measure/calibrate.py) asks it of
    shapes it has no Layout for."""
    tokens, tp, sp = work.mbs * seq_len, work.tp, work.sp
    passes = 3.0 + (work.ac != "none")
    total = work.blocks * passes * e * block_memory_bound_elements(model, runtime, tokens, tp, sp)
    if work.has_head:
        total += head_memory_bound_bytes(model, runtime, e, tokens, tp, sp, loss_vocab)
    if work.has_embedding:
        total += embedding_bytes(model, e, tokens, tp, sp)
    return total


def _block_memory_bound_s(
    model: ModelSpec, accel: AcceleratorSpec, runtime: str, e: int, tokens: int, tp: int, sp: bool
) -> float:
    """Forward seconds of a block's norms, residual adds, rotary and MLP activation (``KERNELS`` of them)."""
    return (
        block_memory_bound_elements(model, runtime, tokens, tp, sp) * e / hbm_bytes_per_s(accel)
        + KERNELS[runtime] * accel.kernel_floor_s
    )


def linears_seconds(
    accel: AcceleratorSpec,
    train: TrainSpec,
    tokens: float,
    *shapes: tuple[float, float],
    weight_share: float = 1.0,
    norm_fed: tuple[bool, ...] = (),
) -> tuple[float, float]:
    """(forward, backward) seconds of linear layers ``X (tokens x k) @ W (k x n)``, one per ``(n, k)``, in
    the precision's GEMM format, with the casts around them over HBM (cost/fp8.py ``linear_cast_bytes``:
    ``weight_share`` of the weights' once-per-step casts, ``norm_fed[i]`` where a norm writes shape i's X)."""
    gemm_peak, ge, dtype = fp8.gemm_peak_flops_per_s(accel, train), fp8.gemm_elem_bytes(train), fp8.gemm_dtype(train)
    fwd = bwd = 0.0
    for i, (n, k) in enumerate(shapes):
        f, b = linear_seconds(tokens, n, k, accel, gemm_peak, ge, dtype)
        cf, cb = fp8.linear_cast_bytes(train, tokens, n, k, weight_share, i < len(norm_fed) and norm_fed[i])
        fwd, bwd = fwd + f + cf / hbm_bytes_per_s(accel), bwd + b + cb / hbm_bytes_per_s(accel)
    return fwd, bwd


@lru_cache(maxsize=4096)
def mlp_seconds(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, tokens: float, tp: int, width: float | None = None
) -> tuple[float, float]:
    """(forward, backward) seconds of a dense MLP of ``width`` (default: the block's, ``_mlp_width``) on
    one TP rank: gate and up as one GEMM (gated), then down."""
    return linears_seconds(accel, train, tokens, *_mlp_shapes(model, tp, _mlp_width(model) if width is None else width))


def attention_shapes(model: ModelSpec, tp: int) -> tuple[tuple[float, float], ...]:
    """(N, K) of the attention's linears on one TP rank, output projection last: Q, K and V as one
    ``(q + 2 kv, h)`` and the output ``(h, q)`` with ``q = heads * head_dim`` (not ``h``: Qwen3's 64 heads
    of 128 over a hidden of 4096, GPT-OSS's 64 of 64 over 2880). Multi-head latent attention (DeepSeek-V2/V3;
    Megatron-Core multi_latent_attention.py): the up-projections ``(heads * d_qk, r_q)`` and
    ``(heads * (d_nope + d_v), r_kv)`` split by TP, the output ``(h, heads * d_v)``; its down-projections
    are ``mla_down_shapes``."""
    h = model.hidden
    if not model.mla:
        q = model.heads * model.head_dim
        return ((q + 2 * model.kv_dim) / tp, h), (h, q / tp)
    heads = model.heads / tp
    nope = model.head_dim - model.qk_rope_head_dim
    q_up = (heads * model.head_dim, model.q_lora_rank) if model.q_lora_rank else (heads * model.head_dim, h)
    kv_up = (heads * (nope + model.v_head_dim), model.kv_lora_rank)
    return q_up, kv_up, (h, heads * model.v_head_dim)


def mla_down_shapes(model: ModelSpec) -> tuple[tuple[float, float], ...]:
    """(N, K) of latent attention's down-projections, which Megatron-Core keeps whole on every TP rank
    (``parallel_mode="duplicated"``): the query's ``(r_q, h)`` (when compressed) and the joint KV's
    ``(r_kv + d_rope, h)``."""
    h = model.hidden
    kv = (model.kv_lora_rank + model.qk_rope_head_dim, h)
    return ((model.q_lora_rank, h), kv) if model.q_lora_rank else (kv,)


def _mlp_shapes(model: ModelSpec, tp: int, width: float) -> tuple[tuple[float, float], ...]:
    """(N, K) of a dense MLP's GEMMs on one TP rank: gate and up as one (gated: swiglu, geglu), down."""
    return (((1 if model.mlp == "gelu" else 2) * width / tp, model.hidden), (model.hidden, width / tp))


@lru_cache(maxsize=4096)
def block_seconds(
    model: ModelSpec,
    accel: AcceleratorSpec,
    train: TrainSpec,
    mbs: int,
    tp: int,
    sp: bool,
    ac: str,
    cp: int = 1,
    microbatches: int = 1,
) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of one block for one micro-batch on one TP rank (nine
    parameters: the layout's keys that shape a block's kernels, one each).

    Under context parallelism ``train.seq_len`` is the rank's s/cp tokens, and the load-balanced
    causal ring computes ``cp`` attention blocks of (s/cp)^2 scores (half masked) per rank: the
    attention core of a sequence of s/cp tokens, cp times. ``microbatches`` per step share the
    weights' float8 casts Transformer Engine makes once per step (cost/fp8.py)."""
    peak = accel.peak_flops_per_s(train.precision)
    e = train.activation_bytes
    tokens, seq, h = mbs * train.seq_len, train.seq_len, model.hidden
    width = _mlp_width(model)
    # the linear layers in their format (cost/fp8.py: a float8 format's peak, row and operand bytes); a
    # mixture of experts' MLPs are cost/moe_block.py's
    mlp = () if model.moe else _mlp_shapes(model, tp, width)
    attn = attention_shapes(model, tp)
    # the norms write the inputs of the first attention GEMMs (QKV, or MLA's up-projections) and of the
    # MLP's first GEMM (TE's fused norm); the output projections read the attention's and the MLP's own
    norm_fed = (True,) * (len(attn) - 1) + (False,) + ((True, False) if mlp else ())
    fwd, bwd = linears_seconds(accel, train, tokens, *attn, *mlp, weight_share=1.0 / microbatches, norm_fed=norm_fed)
    if model.mla:  # the down-projections: whole on each TP rank, over its T/tp tokens under SP
        down_f, down_b = linears_seconds(
            accel, train, tokens / tp if sp else tokens, *mla_down_shapes(model), weight_share=1.0 / microbatches
        )
        fwd, bwd = fwd + down_f, bwd + down_b
    gemm_peak, ge, dtype = fp8.gemm_peak_flops_per_s(accel, train), fp8.gemm_elem_bytes(train), fp8.gemm_dtype(train)
    attn_f, attn_b = (cp * x for x in _attention_s(model, accel, peak, e, mbs, seq, tp, train))
    mem_f = _block_memory_bound_s(model, accel, ops_key(train), e, tokens, tp, sp)
    fwd += attn_f + mem_f
    bwd += attn_b + 2 * mem_f
    if ac == "full":
        recompute = fwd
    elif ac == "selective" and train.runtime == "megatron":
        recompute = 0.0 if train.fused_attention else attn_f
        if model.mla:  # recompute_modules mla_up_proj: the up-projections' forward again
            recompute += linears_seconds(accel, train, tokens, *attention_shapes(model, tp)[:-1])[0]
    elif ac == "selective":
        recompute = mem_f
        if train.selective_policy == "every-other-matmul":
            up = width / tp
            recompute += sum(
                gemm_seconds(tokens, n, k, accel, gemm_peak, ge, dtype=dtype)
                for n, k in ((model.kv_dim / tp, h), (h, h / tp), (up, h))
            )
    else:
        recompute = 0.0
    return fwd, bwd, recompute


@lru_cache(maxsize=1024)
def head_seconds(model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, mbs: int, tp: int, sp: bool) -> float:
    """Forward + backward seconds of the final norm, the LM head and the loss for one micro-batch."""
    peak = accel.peak_flops_per_s(train.precision)
    e = train.activation_bytes
    tokens = mbs * train.seq_len
    f, b = linear_seconds(tokens, model.vocab / tp, model.hidden, accel, peak, e)
    return (
        f
        + b
        + head_memory_bound_bytes(model, ops_key(train), e, tokens, tp, sp, model.vocab / tp) / hbm_bytes_per_s(accel)
    )


def embedding_seconds(model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, mbs: int, tp: int, sp: bool) -> float:
    """Forward (gather) + backward (scatter-add) bytes of the embedding for one micro-batch."""
    return embedding_bytes(model, train.activation_bytes, mbs * train.seq_len, tp, sp) / hbm_bytes_per_s(accel)


def rank_seconds(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, work: RankWork, cp: int = 1, microbatches: int = 1
) -> float:
    """Seconds of one micro-batch's forward, backward and recompute of ``work`` (``train.seq_len``: the
    rank's tokens per sequence, s/cp under context parallelism; ``microbatches`` per step:
    ``block_seconds``); for a mixture of experts every block less its MLP (cost/moe_block.py
    ``rank_mlp_seconds`` times them)."""
    mbs, tp, sp = work.mbs, work.tp, work.sp
    shared = microbatches if fp8.te_casts(train) else 1  # the only use of it: one cache entry per shape otherwise
    fwd, bwd, rec = block_seconds(model, accel, train, mbs, tp, sp, work.ac, cp, shared)
    total = work.blocks * (fwd + bwd + rec)
    if work.has_head:
        total += head_seconds(model, accel, train, mbs, tp, sp)
    if work.has_embedding:
        total += embedding_seconds(model, accel, train, mbs, tp, sp)
    return total
