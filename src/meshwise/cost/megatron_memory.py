"""Per-rank memory under Megatron-Core (``--runtime megatron``), for judging Megatron's published
layouts by Megatron's memory; meshwise's own runtime keeps cost/memory.py's traced model.

Sources: NVIDIA/Megatron-LM docs/user-guide/features/dist_optimizer.md, transformer_config.py,
argument_utils.py, moe/README.md; Transformer Engine's docs and base.py (docs/sources.md).

- **States** (the distributed optimizer): bf16 weights (2 B/param) and an fp32 main-gradient buffer
  (4 B/param) unsharded, the fp32 master and Adam's moments sharded over the data-parallel group
  (``6 + 12/d`` bytes per parameter; DeepSeek-V3's bf16 moments under fp8-blockwise: ``6 + 8/d``);
  ``zero=0`` is plain DDP (nothing sharded); ``zero=2`` / ``3`` are Megatron-FSDP's sharding of the
  gradients / also the weights. Dense parameters shard over dp x cp, routed experts over the expert
  data-parallel ranks left by ep (MoE parallel folding: ep x expert-dp = dp x cp, or dp x cp x tp
  where ep is folded over the TP ranks, Layout.ep_folds_tp, whose ranks then route 1/tp of the tokens each).
- **float8 weights**: Transformer Engine casts each linear weight to float8 once per step and keeps
  the cast across micro-batches (1 B/param), and on GPUs without MX block scaling a transposed copy
  for the backward (1 B more); MXFP8 quantizes rowwise and columnwise separately (2 B).
- **Activations** per block and micro-batch: activations.block_bytes under Megatron-Core's
  conventions (``MEGATRON_CORE``: flash attention, no dropout, sequence parallelism keeping the
  shards, the norms' statistics); ``selective`` is Megatron's selective recompute with
  ``recompute_modules`` core_attn, layernorm, moe_act (the MLP activation) and, for latent attention,
  mla_up_proj (DeepSeek-V3's own recomputation, arXiv 2412.19437 Sec. 3.3): the norms' outputs, the
  activation's output and the up-projected queries, keys and values are not kept; ``full`` keeps
  each block's input. The fused SwiGLU keeps its input
  (``2f``) and TE's second MLP linear its input (``f``), one ``f``-wide tensor fewer than torch. The schedule holds
  pipeline.in_flight chunk-micro-batches (1F1B: ``p - r``; interleaved ``(v - 1)p + 2(p - 1 - r) + 1``,
  at most ``m v``, the first ones of Megatron's order with their chunks' own block counts);
  pipeline outputs are freed once sent (``deallocate_pipeline_outputs``, forced on by Megatron-LM's
  argument parsing), so a stage keeps no copy of what it sent. A checkpointed block being recomputed
  and the head's tensors of one micro-batch (the vocabulary-parallel logits and the cross-entropy's
  float32 softmax, ``V/t`` per token each) come on top.
- **TP communication overlap** (``tp_comm_overlap``, the megatron runtime's default): Transformer
  Engine's userbuffers, one ``[s b / cp, h]`` buffer per overlapped GEMM (8 all-gather ones, in float8
  under a float8 precision, and 4 reduce-scatter ones in bf16).
"""

from __future__ import annotations

from functools import lru_cache

from meshwise.cost import activations as act
from meshwise.cost import pipeline
from meshwise.cost.context import local_train, weights_layout
from meshwise.cost.memory import Memory, RankShape
from meshwise.layout import Layout
from meshwise.spec import ModelSpec, TrainSpec

MEGATRON_CORE = act.Conventions(dropout=False, fused_attention=True, sp_keeps_gathered_input=False,
                                out_proj_input_is_copy=False, norm_stats=True)
UB_ALL_GATHERS = 8      # TE initialize_ub: qkv_fprop, qkv_dgrad, proj_dgrad, proj_wgrad, fc1_fprop, fc1_dgrad,
UB_REDUCE_SCATTERS = 4  # fc2_dgrad, fc2_wgrad; proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad
# Bytes per linear parameter of TE's cached float8 weights: rowwise and columnwise (Hopper's FP8 GEMM is
# TN only, so the backward needs a transposed copy; MXFP8 quantizes each direction separately). Blackwell's
# shared layout for per-tensor scales (one copy) is not told apart: an upper bound there.
FP8_WEIGHT_COPIES = 2.0


@lru_cache(maxsize=65536)
def _states(model: ModelSpec, train: TrainSpec, shard: int, zero: int, ep: int, expert_dp: int, shape: RankShape
            ) -> tuple[float, float, float]:
    """(weights incl. float8 casts, fp32 main gradients, optimizer) bytes, over the weights' layout (cp
    folded into dp): dense parameters shard over ``shard``, the rank's 1/ep of the routed experts over
    the ``expert_dp`` expert data-parallel ranks (Layout.expert_dp: ``shard / ep``, folded over tp
    ``shard tp / ep``)."""
    experts = shape.expert_params / ep
    dense = shape.params - shape.expert_params
    zero = zero if shard > 1 or expert_dp > 1 else 0

    def sharded(stage: int) -> float:
        """Parameters a rank holds of a state ZeRO ``stage`` and above shard."""
        if zero < stage:
            return dense + experts
        return dense / shard + experts / expert_dp
    grad_elem = 2 if train.precision == "bf16" else 4
    w = sharded(3) * train.weight_bytes
    if train.fp8:  # rowwise + columnwise float8 copies of the linear weights (all but the model's ends)
        w += (dense + experts - shape.root_params) * FP8_WEIGHT_COPIES
    return w, sharded(2) * grad_elem, sharded(1) * train.optimizer_bytes


def states_of(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> tuple[float, float, float]:
    """:func:`_states` for ``layout`` (its weights' layout: context.weights_layout)."""
    wl = weights_layout(layout)
    return _states(model, train, wl.shard, wl.zero, wl.ep, wl.expert_dp, shape)


@lru_cache(maxsize=65536)
def _block_kept(model: ModelSpec, local: TrainSpec, tp: int, sp: bool, mbs: int, ac: str, ep: int, folded: bool
                ) -> tuple[float, float]:
    """(what one block keeps per micro-batch, what a recomputed one holds while it runs)."""
    shapes = act.Shapes.of(model)
    seq, e, t = local.seq_len, local.activation_bytes, tp
    whole = act.block_bytes(shapes, seq, mbs, e, t, sp, "none", MEGATRON_CORE)
    if shapes.swiglu:  # the fused SwiGLU keeps its input (gate and up), TE's fc2 its input: 3 f-wide tensors, not 4
        whole -= seq * mbs * model.ffn_hidden * e / t
    tokens, rep = seq * mbs, (1 / t if sp else 1.0)
    selective = ac == "selective"
    if selective:  # layernorm and the MLP activation recomputed: the norms' outputs and SwiGLU's output dropped
        whole -= tokens * e * (2 * model.hidden * rep + model.ffn_hidden / t)
        if model.mla:  # mla_up_proj: the queries, keys and values made from the latents
            whole -= tokens * e * (shapes.q + 2 * shapes.kv) / t
    if model.moe:  # a MoE block keeps its experts' tensors instead of a dense MLP's (the mean over blocks)
        dense_mlp = tokens * model.ffn_hidden * e / t * ((2 if selective else 3) if shapes.swiglu else 2)
        routed = act.CAPACITY_FACTOR if ep > 1 else 1.0
        # torch's 4 SwiGLU tensors per routed copy (act.moe_mlp_bytes) are 3 here, 2 with moe_act recomputed
        fewer = tokens * e * routed * model.experts_per_token * model.expert_ffn_hidden * (2 if selective else 1)
        moe = act.moe_mlp_bytes(model, seq, mbs, e, ep, "none") - fewer
        if folded:  # each TP rank routes its own 1/tp of the tokens
            moe /= t
        whole += model.moe_layers / model.layers * (moe - dense_mlp)
    if ac == "full":
        return act.block_bytes(shapes, seq, mbs, e, t, sp, "full", MEGATRON_CORE), whole
    return whole, 0.0


@lru_cache(maxsize=65536)
def _blocks_in_flight(schedule: str, p: int, v: int, m: int, shape: RankShape) -> float:
    """Blocks' activations (block-micro-batches) the rank holds at its peak: pipeline.in_flight's
    chunk-micro-batches; interleaved, the first ones of Megatron's order, which runs ``p`` micro-batches
    through each chunk in turn (forward ``i`` on chunk ``(i // p) % v``), with those chunks' own blocks."""
    held = pipeline.in_flight(schedule, p, v, m, shape.pp_rank)
    chunks = shape.chunk_blocks
    if schedule != "interleaved-1f1b" or len(chunks) == 1:
        return held * shape.blocks / len(chunks)
    return float(sum(chunks[(i // p) % len(chunks)] for i in range(held)))


@lru_cache(maxsize=65536)
def transient(model: ModelSpec, local: TrainSpec, layout_key: tuple, m: int, shape: RankShape) -> tuple[float, float]:
    """(activations, userbuffers) of the rank: ``layout_key`` = (tp, sp, mbs, ac, ep, folded, schedule, pp, vpp)."""
    tp, sp, mbs, ac, ep, folded, schedule, pp, vpp = layout_key
    kept, recomputing = _block_kept(model, local, tp, sp, mbs, ac, ep, folded)
    a = _blocks_in_flight(schedule, pp, vpp, m, shape) * kept + recomputing
    seq, e, t = local.seq_len, local.activation_bytes, tp
    if shape.has_head:
        # the final norm's and the head's inputs (shards under SP), the vocabulary-parallel logits
        # and the float32 softmax the fused cross-entropy keeps, per rank (V / t each)
        rep = 1 / t if sp else 1.0
        a += seq * mbs * (2 * model.hidden * e * rep + model.vocab / t * (e + 4))
    other = 0.0
    if local.tp_overlap and t > 1:
        tile = seq * mbs * model.hidden
        other = tile * (UB_ALL_GATHERS * (1 if local.fp8 else 2) + UB_REDUCE_SCATTERS * 2)
    return a, other


def rank_memory(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int,
                capacity: float) -> Memory:
    """The rank's memory at its peak under Megatron-Core (see the module's docstring)."""
    w, g, o = states_of(model, train, layout, shape)
    if model.states_only:
        return Memory(params=w, grads=g, optimizer=o, activations=0.0, other=0.0, capacity=capacity)
    key = (layout.tp, layout.sp, layout.mbs, layout.ac, layout.ep, layout.ep_folds_tp, layout.schedule, layout.pp,
           layout.vpp)
    a, other = transient(model, local_train(train, layout), key, m, shape)
    return Memory(params=w, grads=g, optimizer=o, activations=a, other=other, capacity=capacity)
