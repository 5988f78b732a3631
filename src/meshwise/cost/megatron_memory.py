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
  for the backward (1 B more); MXFP8 quantizes rowwise and columnwise separately (2 B). Of the
  routed experts, the rank's own 1/ep; under Megatron-FSDP (zero=3) sharded as the weights are.
- **Activations** per block and micro-batch, tensor by tensor (:func:`attention_token_bytes`,
  :func:`mlp_token_bytes`): Korthikanti et al. 2022's inventory without its dropout masks and ``s^2``
  scores (no dropout in Llama or DeepSeek: Megatron's fused bias-dropout-add at p = 0 makes no mask;
  TE's fused attention keeps its output and an fp32 log-sum-exp), with GQA/MLA widths, SwiGLU's saved
  input ``2f`` and fc2's input ``f``, the norms' rsigma, and no tensor counted twice (the attention output
  is also the output projection's input; fc1's output is the SwiGLU's input). ``selective`` is Megatron's
  ``recompute_modules`` core_attn, layernorm, moe_act and, for latent attention, mla_up_proj, as
  transformer_layer.py applies them: ``layernorm`` only to a norm that is a module of its own (TE's dense
  specs fuse both norms into the next linear, so a dense GQA block keeps what it keeps without recompute;
  MoE blocks' pre-MLP norm and MLA's input norm are recomputed), ``moe_act`` only to the routed experts.
  ``full`` keeps each block's input. Under fp8-blockwise, DeepSeek-V3's recipe (arXiv 2412.19437
  Sec. 3.3.3): linear inputs cached in float8 with a float32 scale per 1x128 tile, the MoE SwiGLU's inputs
  in float8 too; the attention output (the output projection's input) stays at 16 bits.
  The schedule holds pipeline.in_flight chunk-micro-batches (1F1B: ``p - r``; interleaved
  ``(v - 1)p + 2(p - 1 - r) + 1``, at most ``m v``: Megatron's get_pp_rank_microbatches with its group
  size ``p``, which must lie in [p, m]), the first ones of Megatron's order with their chunks' own block
  counts; pipeline outputs are freed once sent (``deallocate_pipeline_outputs``), so a stage keeps no
  copy of what it sent beyond the next block's input counted above. A checkpointed block being
  recomputed and the head's tensors of one micro-batch (the vocabulary-parallel logits and the
  cross-entropy's float32 softmax, ``V/t`` per token each) come on top.
- **TP communication overlap**, only where the run asks for it (``overlap_tp_comm``: Megatron-LM's
  ``--tp-comm-overlap``, off by default, and only with sequence parallelism; context.tp_overlap_on, which
  the time model reads too): Transformer Engine's userbuffers, one ``[s b / cp, h]`` buffer per overlapped
  GEMM (8 all-gather ones, in float8 under a float8 precision, and 4 reduce-scatter ones in bf16).
"""

from __future__ import annotations

from functools import lru_cache

from meshwise.cost import activations as act
from meshwise.cost import pipeline
from meshwise.cost.context_parallel import local_train, tp_overlap_on, weights_layout
from meshwise.cost.memory import Memory, RankShape
from meshwise.layout import Layout
from meshwise.spec import ModelSpec, TrainSpec

MEGATRON_CORE = act.Conventions(
    dropout=False, fused_attention=True, sp_keeps_gathered_input=False, out_proj_input_is_copy=False, norm_stats=True
)
UB_ALL_GATHERS = 8  # TE initialize_ub: qkv_fprop, qkv_dgrad, proj_dgrad, proj_wgrad, fc1_fprop, fc1_dgrad,
UB_REDUCE_SCATTERS = 4  # fc2_dgrad, fc2_wgrad; proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad
# Bytes per linear parameter of TE's cached float8 weights: rowwise and columnwise (Hopper's FP8 GEMM is
# TN only, so the backward needs a transposed copy; MXFP8 quantizes each direction separately). Blackwell's
# shared layout for per-tensor scales (one copy) is not told apart: an upper bound there.
FP8_WEIGHT_COPIES = 2.0
FP8_TILE = 128  # DeepSeek-V3's 1x128 activation tiles (arXiv 2412.19437 Sec. 3.3.2), one fp32 scale each
FP32_BYTES = 4


@lru_cache(maxsize=65536)
def _states(
    model: ModelSpec, train: TrainSpec, shard: int, zero: int, ep: int, expert_dp: int, shape: RankShape
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
    if train.fp8:  # rowwise + columnwise float8 copies of the linear weights (all but the model's ends),
        # of the rank's own 1/ep experts, sharded as the weights are (Megatron-FSDP's zero=3 keeps and
        # gathers its parameters in float8: fp8_param_gather)
        ends = shape.root_params / shard if zero >= 3 else shape.root_params
        w += (sharded(3) - ends) * FP8_WEIGHT_COPIES
    return w, sharded(2) * grad_elem, sharded(1) * train.optimizer_bytes


def states_of(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> tuple[float, float, float]:
    """:func:`_states` for ``layout`` (its weights' layout: context.weights_layout)."""
    wl = weights_layout(layout)
    return _states(model, train, wl.shard, wl.zero, wl.ep, wl.expert_dp, shape)


def linear_input_bytes(local: TrainSpec) -> float:
    """Bytes per element of a saved linear input: under fp8-blockwise (DeepSeek-V3's recipe, arXiv 2412.19437
    Sec. 3.3.3 "Low-Precision Activation") float8 with one float32 scale per 1x128 tile (``1 + 4/128``), as
    Transformer Engine's blockwise recipe saves its quantized input; otherwise the activation's own width."""
    return 1 + FP32_BYTES / FP8_TILE if local.precision == "fp8-blockwise" else local.activation_bytes


def attention_token_bytes(model: ModelSpec, local: TrainSpec, t: int, sp: bool, selective: bool) -> float:
    """What one block's attention keeps per token on a TP rank, its input included (Megatron-Core, TE specs).

    GQA: the input norm is fused into the QKV linear (TE LayerNormLinear), so ``layernorm`` recompute does not
    apply (transformer_layer.py skips an IdentityOp norm): its input, rsigma and output (the linear's saved
    input), Q, K, V, the fused attention's output (also the output projection's input: one tensor) and its
    float32 log-sum-exp. MLA: the input norm is a module of its own (recomputed under ``selective``); the
    query latent and the key-value latent with its rope part (bf16: the latent norms' inputs), the latent
    norms' outputs (the up-projections' inputs) and the up-projected Q, K, V (``mla_up_proj`` recomputes
    norms, up-projections and RoPE: neither kept), the attention output (``heads x v_head_dim``) and LSE."""
    e, c, rep, sh = local.activation_bytes, linear_input_bytes(local), (1 / t if sp else 1.0), 1 / t
    h, a = model.hidden, model.heads
    kept = h * rep * e + FP32_BYTES * rep  # the block input (norm input) and the norm's inverse RMS
    if not model.mla:
        q, kv = a * model.head_dim, model.kv_dim
        kept += h * rep * c + (q + 2 * kv) * sh * e
        return kept + q * sh * e + a * sh * FP32_BYTES
    r_q, r_kv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    latents = r_q + r_kv + rope
    kept += latents * rep * e  # the latents (the latent norms' inputs, k_pe)
    if not selective:
        kept += h * rep * (2 * c if c < e else e)  # the input norm's output: one bf16 tensor, or the two down
        # projections' own float8 copies
        kept += (r_q + r_kv) * rep * c + 2 * FP32_BYTES * rep  # latent norms' outputs and rsigma
        kept += (2 * a * model.head_dim + a * model.v_head_dim) * sh * e  # Q, K, V after RoPE
    return kept + a * model.v_head_dim * sh * e + a * sh * FP32_BYTES


def mlp_token_bytes(
    model: ModelSpec, local: TrainSpec, t: int, sp: bool, selective: bool, ep: int, folded: bool
) -> tuple[float, float]:
    """(dense block's, MoE block's) MLP bytes kept per token on a TP rank, the residual (the MLP norm's input)
    and its rsigma included.

    Dense (TE spec): the norm fused into fc1 (its output kept as fc1's saved input), fc1's output (the fused
    SwiGLU's saved input, ``2f``; GeLU's, ``f``) and the activation's output (fc2's input, ``f``); ``moe_act``
    does not touch a dense MLP. MoE: the pre-MLP norm is its own module (recomputed under ``selective``:
    ``layernorm``); the router's logits and fp32 scores (``E``); per routed copy (the busiest EP rank's
    capacity, 1/tp of the tokens when EP folds over TP) the dispatched input (fc1's), fc1's output (the
    SwiGLU's input: float8 under the DeepSeek-V3 recipe, Sec. 3.3.3), its fp32 routing probability
    (Megatron-Core applies it in the weighted SwiGLU, so the combine keeps no expert output) and, unless
    ``moe_act`` recomputes it, the SwiGLU's output (fc2's input); the shared expert as a dense MLP of its
    width (its own float8 input copy under float8)."""
    e, c, rep, sh = local.activation_bytes, linear_input_bytes(local), (1 / t if sp else 1.0), 1 / t
    h = model.hidden
    residual = h * rep * e + FP32_BYTES * rep
    gated = 2 if model.mlp != "gelu" else 1  # fc1's output: gate and up, or GeLU's input
    dense = residual + h * rep * c + model.ffn_hidden * sh * (gated * e + c)
    if not model.moe:
        return dense, 0.0
    moe = residual + model.experts * (e + FP32_BYTES)
    if not selective:
        moe += h * rep * e  # the MLP norm's output (router's input, bf16)
    per_copy = h * c + 2 * model.expert_ffn_hidden * c + FP32_BYTES + (0 if selective else model.expert_ffn_hidden * c)
    routed = (act.CAPACITY_FACTOR if ep > 1 else 1.0) * model.experts_per_token * per_copy
    moe += routed / t if folded else routed
    if model.shared_ffn_hidden:
        shared_input = h * rep * c if c < e else 0.0  # in bf16 the norm's output itself, counted above
        moe += shared_input + model.shared_ffn_hidden * sh * (gated * e + c)
        moe += h * rep * e if model.shared_expert_gate else 0.0
    return dense, moe


@lru_cache(maxsize=65536)
def _block_kept(
    model: ModelSpec, local: TrainSpec, tp: int, sp: bool, mbs: int, ac: str, ep: int, folded: bool
) -> tuple[float, float]:
    """(what one block keeps per micro-batch, what a recomputed one holds while it runs):
    :func:`attention_token_bytes` + :func:`mlp_token_bytes` per token, of the heavier kind of block when the
    model mixes dense and MoE blocks (a stage may hold only that kind: DeepSeek-V3's dense blocks 0-2 sit on
    the first stage, every other stage holds MoE blocks only)."""
    tokens, selective = local.seq_len * mbs, ac == "selective"
    dense, moe = mlp_token_bytes(model, local, tp, sp, selective, ep, folded)
    mlp = dense if not model.moe_layers else (moe if model.moe_layers == model.layers else max(dense, moe))
    whole = tokens * (attention_token_bytes(model, local, tp, sp, selective) + mlp)
    if ac == "full":  # the block input kept; the recomputed block holds everything while it runs
        return act.block_bytes(
            act.Shapes.of(model), local.seq_len, mbs, local.activation_bytes, tp, sp, "full", MEGATRON_CORE
        ), whole
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
    """(activations, userbuffers) of the rank: ``layout_key`` = (tp, sp, mbs, ac, ep, folded, schedule, pp, vpp,
    overlap), ``overlap`` = context.tp_overlap_on."""
    tp, sp, mbs, ac, ep, folded, schedule, pp, vpp, overlap = layout_key
    kept, recomputing = _block_kept(model, local, tp, sp, mbs, ac, ep, folded)
    a = _blocks_in_flight(schedule, pp, vpp, m, shape) * kept + recomputing
    seq, e, t = local.seq_len, local.activation_bytes, tp
    if shape.has_head:
        # the final norm's and the head's inputs (shards under SP), the vocabulary-parallel logits
        # and the float32 softmax the fused cross-entropy keeps, per rank (V / t each)
        rep = 1 / t if sp else 1.0
        a += seq * mbs * (2 * model.hidden * e * rep + model.vocab / t * (e + 4))
    other = 0.0
    if overlap:
        tile = seq * mbs * model.hidden
        other = tile * (UB_ALL_GATHERS * (1 if local.fp8 else 2) + UB_REDUCE_SCATTERS * 2)
    return a, other


def rank_memory(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, capacity: float
) -> Memory:
    """The rank's memory at its peak under Megatron-Core (see the module's docstring)."""
    w, g, o = states_of(model, train, layout, shape)
    if model.states_only:
        return Memory(params=w, grads=g, optimizer=o, activations=0.0, other=0.0, capacity=capacity)
    key = (
        layout.tp,
        layout.sp,
        layout.mbs,
        layout.ac,
        layout.ep,
        layout.ep_folds_tp,
        layout.schedule,
        layout.pp,
        layout.vpp,
        tp_overlap_on(train, layout),
    )
    a, other = transient(model, local_train(train, layout), key, m, shape)
    return Memory(params=w, grads=g, optimizer=o, activations=a, other=other, capacity=capacity)
