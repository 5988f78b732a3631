"""Activation memory of one transformer block, counted tensor by tensor.

The inventory follows Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4): every tensor the
backward needs, with its size in elements and whether tensor parallelism shards it. The same
inventory reproduces the paper's Table 2 when configured with the paper's conventions
(``MEGATRON``: GeLU MLP of 4h, dropout, attention scores materialised, sequence parallel storing
the sharded norm outputs) and describes meshwise's runtime with ``TORCH`` (see docs/cost-model.md):

- no dropout: the paper's three dropout masks (1 byte each) and the dropout output are gone;
- fused attention (``scaled_dot_product_attention``): no ``a*s^2*b`` term; SDPA keeps its output and
  a float32 log-sum-exp of ``a*s*b`` elements instead;
- GQA: K and V are ``kv_heads * head_dim`` wide, not ``h``;
- SwiGLU: the MLP keeps four ``f``-wide tensors (gate output, SiLU output, up output, their
  product) instead of GeLU's two;
- the output projection's input is a contiguous copy of the attention output, kept separately;
- sequence parallelism through DTensor keeps the all-gathered (full) input of each column-parallel
  matmul, where Megatron keeps the shard and gathers again in backward;
- each RMSNorm keeps its float32 inverse RMS per token (the paper counts no norm statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshwise.spec import ModelSpec

MASK_BYTES = 1
LSE_BYTES = 4  # SDPA's log-sum-exp is float32


@dataclass(frozen=True)
class Conventions:
    """How an implementation stores a block's activations."""

    dropout: bool
    fused_attention: bool
    sp_keeps_gathered_input: bool
    out_proj_input_is_copy: bool
    norm_stats: bool  # the norms' per-token statistics (the paper leaves them out)


MEGATRON = Conventions(
    dropout=True, fused_attention=False, sp_keeps_gathered_input=False, out_proj_input_is_copy=False, norm_stats=False
)
TORCH = Conventions(
    dropout=False, fused_attention=True, sp_keeps_gathered_input=True, out_proj_input_is_copy=True, norm_stats=True
)


@dataclass(frozen=True)
class Shapes:
    """Block widths in elements: hidden h, query width q (= h), K/V width kv, MLP width f, heads a."""

    h: int
    q: int
    kv: int
    f: int
    a: int
    swiglu: bool

    @classmethod
    @lru_cache(maxsize=64)
    def of(cls, model: ModelSpec) -> Shapes:
        return cls(
            h=model.hidden,
            q=model.heads * model.head_dim,
            kv=model.kv_dim,
            f=model.ffn_hidden,
            a=model.heads,
            swiglu=model.mlp == "swiglu",
        )


@lru_cache(maxsize=4096)
def block_bytes(
    shapes: Shapes, seq: int, mbs: int, elem_bytes: int, tp: int, sp: bool, ac: str, conv: Conventions = TORCH
) -> float:
    """Bytes one block keeps for backward, per micro-batch, on one rank.

    ``ac`` = ``none`` (everything below), ``selective`` (meshwise's recipe in meshwise.runtime.activation_checkpointing, or
    the paper's attention-core recompute under MEGATRON), ``full`` (only the block input).
    """
    t = tp
    sb = seq * mbs
    e = elem_bytes
    rep = 1 / t if sp else 1.0  # replicated over TP unless sequence parallel
    gathered = 1.0 if (not sp or conv.sp_keeps_gathered_input) else 1 / t
    shard = 1 / t  # split by TP (heads or MLP columns)
    h, q, kv, f, a = shapes.h, shapes.q, shapes.kv, shapes.f, shapes.a

    if ac == "full":
        return sb * h * e * rep
    if ac == "selective" and conv is TORCH:
        # Saved by the op-level policy: the block input, every matmul output, SDPA's output and LSE.
        # Row-parallel matmul outputs are partial sums of full size before their reduction.
        matmul_outputs = (q + 2 * kv) * shard + h + (2 * f * shard if shapes.swiglu else f * shard) + h
        return sb * e * (h * rep + matmul_outputs + q * shard) + sb * a * shard * LSE_BYTES

    total = 0.0
    # attention sub-block
    total += sb * h * e * rep  # norm 1 input
    if conv.norm_stats:
        total += 2 * sb * 4 * rep  # both norms' float32 inverse RMS
    total += sb * h * e * gathered  # QKV matmul input (norm 1 output)
    total += sb * (q + kv) * e * shard  # Q and K (after rotary)
    total += sb * kv * e * shard  # V
    scores = a * seq * seq * mbs  # a*s^2*b attention-score elements
    if conv.fused_attention:
        total += sb * q * e * shard  # SDPA output
        total += sb * a * LSE_BYTES * shard  # SDPA log-sum-exp
    elif ac != "selective":  # the paper's selective recompute drops these
        total += scores * e * shard  # softmax output
        if conv.dropout:
            total += scores * MASK_BYTES * shard  # attention dropout mask
            total += scores * e * shard  # dropout output (input of scores @ V)
    if conv.out_proj_input_is_copy or not conv.fused_attention:
        total += sb * q * e * shard  # output projection input
    if conv.dropout:
        total += sb * h * MASK_BYTES * rep  # dropout mask after attention
    # MLP sub-block
    total += sb * h * e * rep  # norm 2 input
    total += sb * h * e * gathered  # first MLP matmul input (norm 2 output)
    total += sb * f * e * shard * (4 if shapes.swiglu else 2)  # SwiGLU: gate, SiLU, up, product; GeLU: in, out
    if conv.dropout:
        total += sb * h * MASK_BYTES * rep  # dropout mask after the MLP
    return total


def mlp_bytes(shapes: Shapes, seq: int, mbs: int, elem_bytes: int, tp: int, sp: bool) -> float:
    """The MLP sub-block's part of :func:`block_bytes` (TORCH, no checkpointing): the second norm's
    input, the first MLP matmul's input (gathered under SP) and the SwiGLU (GeLU) tensors; what a
    block still keeps once its MLP's backward has run is ``block_bytes - mlp_bytes``."""
    sb, e = seq * mbs, elem_bytes
    rep = 1 / tp if sp else 1.0
    return sb * shapes.h * e * (rep + 1.0) + sb * shapes.f * e / tp * (4 if shapes.swiglu else 2)


@lru_cache(maxsize=4096)
def weight_grad_bytes(shapes: Shapes, seq: int, mbs: int, elem_bytes: int, tp: int, sp: bool) -> float:
    """What a block keeps for its weight gradients alone (TORCH conventions, no checkpointing): the
    inputs of its matmuls (the normed inputs, gathered under SP, the attention output, the down
    projection's input), the gating multiply's operands (SwiGLU) and one inverse RMS.

    torch 2.13's zero-bubble schedules keep exactly these (measured: 184,576 bytes per block and
    micro-batch for ``tiny``) after each input-gradient pass, until the step ends."""
    sb = seq * mbs
    e = elem_bytes
    gathered = 1.0
    shard = 1 / tp
    kept = sb * e * (2 * shapes.h * gathered + shapes.q * shard + shapes.f * shard)
    if shapes.swiglu:
        kept += 2 * sb * shapes.f * e * shard
    return kept + sb * 4 * (1 / tp if sp else 1.0)


def korthikanti_table2(s: int, b: int, h: int, a: int, t: int, setting: str) -> float:
    """Korthikanti et al. 2022 Table 2, bytes per layer, as printed (16-bit, dropout, 4h GeLU MLP)."""
    return {
        "none": s * b * h * (34 + 5 * a * s / h),
        "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": s * b * h * (34 / t + 5 * a * s / (h * t)),
        "tp+selective": s * b * h * (10 + 24 / t),
        "tp+sp+selective": s * b * h * (34 / t),
        "full": s * b * h * 2,
    }[setting]


@lru_cache(maxsize=4096)
def head_bytes(model: ModelSpec, seq: int, mbs: int, elem_bytes: int, tp: int, sp: bool) -> float:
    """What the last chunk keeps for backward, per micro-batch: the final norm's input (``s*b*h``,
    ``/t`` under SP) and inverse RMS, the head's input (``s*b*h``, gathered under SP), the gathered
    logits (``s*b*V``: the runtime gathers the head's vocabulary shards and every TP rank computes the
    full loss) and, under TP, the local shard they were gathered from (``s*b*V/t``), and the loss's
    float32 log-softmax (``4*s*b*V``, plus the float32 upcast under bf16)."""
    sb = seq * mbs
    e = elem_bytes
    rep = 1 / tp if sp else 1.0
    logits = sb * model.vocab
    local_shard = logits * e / tp if tp > 1 else 0.0
    return sb * model.hidden * e * (rep + 1.0) + sb * 4 * rep + logits * (e + 4 + (4 if e != 4 else 0)) + local_shard


def logits_bytes(model: ModelSpec, seq: int, mbs: int, elem_bytes: int) -> float:
    """The gathered logits of one micro-batch."""
    return seq * mbs * model.vocab * elem_bytes


def loss_grad_bytes(model: ModelSpec, seq: int, mbs: int) -> float:
    """The gradient of the float32 log-softmax over the logits, alive at the start of backward."""
    return seq * mbs * model.vocab * 4


def loss_backward_bytes(model: ModelSpec, seq: int, mbs: int) -> float:
    """What the loss's backward holds over the gathered logits at once: the float32 log-softmax it
    saved, the gradient coming into it and the one going out (3 x 4 bytes per logit; traced)."""
    return 3 * seq * mbs * model.vocab * 4


def ids_bytes(seq: int, mbs: int) -> float:
    """The token ids (int64) the embedding's backward keeps."""
    return seq * mbs * 8


# Switch Transformer's training capacity factor (Fedus et al. 2021, arXiv 2101.03961, Sec. 2.2):
# the busiest expert's tokens over the mean. meshwise's runtime is dropless (no token is dropped),
# so this is the load the busiest EP rank is budgeted for, not a limit.
CAPACITY_FACTOR = 1.25


def moe_mlp_bytes(
    model: ModelSpec, seq: int, mbs: int, elem_bytes: int, ep: int, ac: str, capacity: float = CAPACITY_FACTOR
) -> float:
    """What one MoE block's MLP part keeps for backward, per micro-batch, on one rank (the runtime
    runs it whole on the whole sequence under TP, see runtime/moe.py), in place of a dense MLP's:

    per token: the router's logits (E) and fp32 probabilities (4 E bytes); the token copies each
    expert multiplies, ``k h``, and the SwiGLU tensors of each copy (gate, SiLU, up, product:
    ``4 k f_e``), both times the capacity factor when experts are spread over ep > 1 ranks (the
    busiest rank receives more than the mean); the expert outputs brought back for the weighted
    sum (``k h``); the shared expert's four SwiGLU tensors (``4 f_s``) and, when gated, its output
    (``h``). ``ac=full`` keeps none of it (only the block input, counted by :func:`block_bytes`)."""
    if ac == "full" or not model.moe:
        return 0.0
    tokens = seq * mbs
    e, h, k = elem_bytes, model.hidden, model.experts_per_token
    cap = capacity if ep > 1 else 1.0
    routed = cap * k * (h + 4 * model.expert_ffn_hidden) + k * h
    shared = 4 * model.shared_ffn_hidden + (h if model.shared_expert_gate else 0)
    return tokens * (e * (routed + shared + model.experts) + 4 * model.experts)
