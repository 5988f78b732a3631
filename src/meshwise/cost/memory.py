"""Per-rank memory at the step's peak, by category: params, grads, optimizer, activations, other.

Model states (Rajbhandari et al. 2020, arXiv 1910.02054): with ``w``, ``g``, ``o`` bytes per
parameter for weights, gradients and optimizer (TrainSpec), a rank holding ``P`` parameters keeps
``w*P + g*P + o*P`` under DDP; ZeRO-1 divides the optimizer term by the sharding group ``shard``,
ZeRO-2 also the gradients, ZeRO-3 also the weights (HSDP: the group is ``shard``, not ``dp``).

The runtime's peak (measured with ``meshwise measure``; see docs/cost-model.md) is the largest of
seven moments of the busiest micro-batch (MOMENTS): the end of its forward, its backward, the end of
the step's last backward, the loss's backward (last chunk), late in a block's backward (ZeRO-2/3
without PP), under cp with ZeRO-3 the ring attention's backward of the last block but one
(``_ring_backward``), and under TP the embedding's backward; the moments are told in _candidates. Per category:

- ``params``: FSDP2 keeps each parameter's shard (``P/N``; ``replicate`` a 1-way "shard", a full
  copy) beside the unsharded copy it computes with; under bf16-mixed that shard is the fp32 master,
  counted as optimizer state by the convention. ZeRO-0/1/2 keep every unit unsharded through the
  step; ZeRO-3 keeps the chunk roots (embedding, final norm, head) gathered, and one block per
  chunk while it is differentiated.
- ``grads``: those earlier backwards left (none with one micro-batch or under GPipe): unsharded
  under DDP, ZeRO-1, no DP, and any ZeRO under PP (the schedule defers the reduce-scatter); the
  first weight gradient of a backward; under TP a second copy of a tied (vocabulary-parallel)
  embedding's gradient (it accumulates out of place).
- ``activations``: activations.block_bytes per block and micro-batch times the schedule's
  micro-batches in flight, the pipeline stages' cached outputs, the head's saved tensors and the
  gathered logits, a checkpointed block being recomputed; torch 2.13's zero-bubble schedules keep
  every micro-batch's weight-gradient tensors until the step ends.
- ``other``: ZeRO-2/3's reduce-scatter input (without PP), the rotary tables, and under the
  interleaved runtime the chunks gathered ahead of use; the pipeline's receive buffers are counted
  with the activations (one per micro-batch and chunk in each direction).

Context parallelism (``cp``) splits each sequence over cp ranks that hold the same weights: the
states are those of a layout with dp·cp replicas and a sharding group of shard·cp
(``context.weights_layout``; FSDP shards over dp_shard x cp), and the activations those of a sequence
of s/cp tokens (``context.local_train``), plus the ring's K/V blocks in flight at the start of a
backward (``context.ring_bytes``).

``P`` is what the rank's pipeline chunks hold after tensor parallelism: each block's matrices split
``t`` ways, its two norm weights replicated; the embedding (hidden shards; tied: vocabulary-parallel)
on the first chunk; the final norm and the LM head on the last (a tied head needs its own copy
there when the embedding lives on another rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate
from typing import NamedTuple

from meshwise.cost import activations as act
from meshwise.cost import pipeline
from meshwise.cost.context_parallel import local_train, ring_bytes, weights_layout
from meshwise.cost.fp8 import float8_copy_bytes
from meshwise.layout import Layout, chunk_rank, stage_layers
from meshwise.spec import ModelSpec, TrainSpec, cached_hash


@dataclass(frozen=True)
class RankShape:
    """What one pipeline rank holds: its chunks (ids and block counts), the ends of the model it owns,
    its parameters after TP, and how many chunk boundaries it sends across per micro-batch."""

    pp_rank: int
    chunk_blocks: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    params: float  # after TP
    block_params: float  # one block, after TP
    root_params: float  # embedding, final norm and head held by this rank, after TP
    root_units: int  # chunks of this rank that hold any of those (one FSDP unit each)
    sends_per_mb: int  # activations and gradients this rank sends to another rank, per micro-batch
    expert_params: float = 0.0  # routed experts in its blocks, before expert parallelism
    last_blocks: float = 0.0  # the last block of each of its chunks, summed, after TP (0: block_params each)
    last_blocks_experts: float = 0.0  # the routed experts of those blocks, before expert parallelism

    __hash__ = cached_hash

    @cached_property
    def blocks(self) -> int:
        return sum(self.chunk_blocks)

    @cached_property
    def units(self) -> int:
        """FSDP2 / replicate units: one per block, one per chunk root that holds parameters."""
        return self.blocks + self.root_units


@dataclass(frozen=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    capacity: float

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.other

    def as_json(self) -> dict[str, int]:
        keys = ("params", "grads", "optimizer", "activations", "other", "total", "capacity")
        return {k: int(round(getattr(self, k))) for k in keys}


class Moment(NamedTuple):
    """One moment of the step (MOMENTS) on one rank, in bytes by category (``Memory``'s)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    other: float


class StaticParts(NamedTuple):
    """What does not depend on mbs or ac, in bytes (:func:`_static_parts`)."""

    weights_forward: float  # weights at a forward's end
    weights_backward: float  # weights at a backward's start
    optimizer: float
    all_grads: float  # gradients after a backward
    first_grad: float  # the first gradient of a backward
    fixed_other: float  # fixed buffers
    copies: tuple[float, float]  # FSDP2's strided copies (root, block)
    embed_gap: float  # the embedding's accumulated gradient less its fresh one
    block_grads: float  # a block's gradients once its MLP is differentiated
    last_block: float  # the last block gathered (ZeRO-3's prefetch of the one before it)
    shared_grads: float  # the last block's shared expert's gradients


class Activations(NamedTuple):
    """Activations at the moments of a micro-batch, in bytes (:func:`_activations` tells each)."""

    forward: float  # at the end of a forward
    backward: float  # at the start of a backward
    loss: float  # in the loss's backward (last chunk)
    second: float  # at the start of the second backward
    embed: float  # in the embedding's backward (TP)
    late: float  # late in the second block a backward differentiates
    kept: float  # what one block keeps per micro-batch
    extras: float  # what one more chunk-micro-batch in flight adds beside its blocks


class PerMicroBatch(NamedTuple):
    """What depends on the micro-batch and the schedule, not on DP or ZeRO, in bytes
    (:func:`_per_micro_batch`): :class:`Activations`' moments, the ring attention's
    (:func:`_ring_backward`) and what the last block's shared expert keeps for its backward."""

    forward: float
    backward: float
    loss: float
    second: float
    embed: float
    late: float
    ring_last: float  # inside the ring attention's backward of the last block
    ring: float  # of the last block but one
    ring_temps: float  # its temporaries
    shared_kept: float
    kept_block: float
    extras: float


def rank_shapes(model: ModelSpec, layout: Layout) -> tuple[RankShape, ...]:
    """The distinct pipeline ranks: ranks that hold the same blocks and model ends cost the same,
    and of those the lowest rank keeps the most micro-batches in flight (pipeline.in_flight), so it
    stands for them all."""
    v_shape = layout.schedule == "zero-bubble" and layout.vpp == 2
    return _distinct_rank_shapes(model, layout.tp, layout.pp, layout.vpp, v_shape)


@lru_cache(maxsize=4096)
def _distinct_rank_shapes(model: ModelSpec, t: int, pp: int, vpp: int, v_shape: bool) -> tuple[RankShape, ...]:
    return tuple(dict.fromkeys(_standing_for(model, t, pp, vpp, v_shape)))


@lru_cache(maxsize=4096)
def _standing_for(model: ModelSpec, t: int, pp: int, vpp: int, v_shape: bool) -> tuple[RankShape, ...]:
    """Per pipeline rank, the distinct rank shape that stands for it (the lowest of the same blocks and ends)."""
    shapes: dict[tuple, RankShape] = {}
    return tuple(
        shapes.setdefault(
            (s.chunk_blocks, s.has_embedding, s.has_head, s.sends_per_mb, s.params, s.expert_params, s.last_blocks), s
        )
        for s in _rank_shapes(model, t, pp, vpp, v_shape)
    )


def plan_rank_shape(model: ModelSpec, layout: Layout, pp_rank: int) -> RankShape:
    """The rank shape whose memory ``plan`` prints and decides fit by for pipeline rank ``pp_rank``
    (one of rank_shapes: the lowest rank holding the same blocks and model ends)."""
    v_shape = layout.schedule == "zero-bubble" and layout.vpp == 2
    return _standing_for(model, layout.tp, layout.pp, layout.vpp, v_shape)[pp_rank]


def rank_groups(model: ModelSpec, layout: Layout) -> tuple[tuple[int, ...], ...]:
    """The pipeline ranks each of rank_shapes stands for, in its order."""
    v_shape = layout.schedule == "zero-bubble" and layout.vpp == 2
    return _rank_groups(model, layout.tp, layout.pp, layout.vpp, v_shape)


@lru_cache(maxsize=4096)
def _rank_groups(model: ModelSpec, t: int, pp: int, vpp: int, v_shape: bool) -> tuple[tuple[int, ...], ...]:
    standing = _standing_for(model, t, pp, vpp, v_shape)
    return tuple(
        tuple(p for p, s in enumerate(standing) if s == rep)
        for rep in _distinct_rank_shapes(model, t, pp, vpp, v_shape)
    )


def all_rank_shapes(model: ModelSpec, layout: Layout) -> tuple[RankShape, ...]:
    """One RankShape per pipeline rank, in rank order."""
    v_shape = layout.schedule == "zero-bubble" and layout.vpp == 2
    return _rank_shapes(model, layout.tp, layout.pp, layout.vpp, v_shape)


@lru_cache(maxsize=4096)
def _rank_shapes(model: ModelSpec, t: int, pp: int, vpp: int, v_shape: bool) -> tuple[RankShape, ...]:
    if model.states_only:  # the shape is unknown: no FSDP unit to size buffers by
        per_rank = model.params / (t * pp)
        return tuple(RankShape(r, (0,), r == 0, r == pp - 1, per_rank, 0.0, 0.0, 1, 0) for r in range(pp))
    # MoE blocks are not split by TP (the runtime runs them whole on every TP rank); a rank's blocks
    # are its own layers' (a MoE model's dense layers, model.dense_layers, hold no experts)
    moe = [model.moe and i not in model.dense_layers for i in range(model.layers)]
    dense_mlp, moe_mlp = model._mlp(model.ffn_hidden), model._moe_block(model.experts) if model.moe else 0
    # a block's parameters after TP, for a dense and for a MoE block (the same expression per block)
    per_layer = {
        e: (model.attention_params + (0 if e else dense_mlp)) / t + (moe_mlp if e else 0) + model.layer_norm_params
        for e in (False, True)
    }
    layer = [per_layer[e] for e in moe]
    experts_per_block = model.experts * model._mlp(model.expert_ffn_hidden) if model.moe else 0.0
    layer_experts = [experts_per_block if e else 0.0 for e in moe]
    embed = model.embedding_params / t
    head = model.vocab * model.hidden / t
    stages = pp * vpp
    counts = stage_layers(model.layers, stages)
    last = stages - 1
    schedule = "zero-bubble" if v_shape else "interleaved-1f1b"
    owner = [chunk_rank(c, pp, vpp, schedule) for c in range(stages)]
    starts = [0, *accumulate(counts[:-1])]
    rank_chunks: list[list[int]] = [[] for _ in range(pp)]  # each rank's chunks, ascending
    for c in range(stages):
        rank_chunks[owner[c]].append(c)
    shapes = []
    for r in range(pp):
        chunks = rank_chunks[r]
        first_here, last_here = 0 in chunks, last in chunks
        root = embed if first_here else 0.0
        if last_here:
            root += model.final_norm_params + (head if not model.tied_embeddings or not first_here else 0.0)
        root_units = int(first_here) + int(last_here) - int(first_here and last_here and len(chunks) == 1)
        sends = sum(1 for c in chunks if c < last and owner[c + 1] != r)  # activations forward
        sends += sum(1 for c in chunks if c > 0 and owner[c - 1] != r)  # gradients backward
        blocks = tuple(counts[c] for c in chunks)
        mine = [i for c in chunks for i in range(starts[c], starts[c] + counts[c])]
        held = sum([layer[i] for i in mine])
        lasts = [starts[c] + counts[c] - 1 for c in chunks if counts[c]]
        shapes.append(
            RankShape(
                r,
                blocks,
                first_here,
                last_here,
                held + root,
                held / max(len(mine), 1),
                root,
                root_units,
                sends,
                sum([layer_experts[i] for i in mine]),
                sum(layer[i] for i in lasts),
                sum(layer_experts[i] for i in lasts),
            )
        )
    return tuple(shapes)


def held(params: float, expert_params: float, layout: Layout) -> float:
    """Parameters a rank holds unsharded by ZeRO: every dense one, its EP share of the experts."""
    return params - expert_params * (1 - 1 / layout.ep)


def states(params: float, train: TrainSpec, layout: Layout, expert_params: float = 0.0) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes for ``params`` parameters (``expert_params`` of them routed
    experts) under the layout's ZeRO stage. Experts are sharded ``ep`` ways, then by ZeRO over the
    ``shard / ep`` ranks that remain: sharded, an expert costs what a dense parameter does (1/shard)."""
    n = layout.shard if layout.zero else 1
    local = held(params, expert_params, layout) if expert_params else params
    w = params * train.weight_bytes / n if layout.zero >= 3 else local * train.weight_bytes
    g = params * train.grad_bytes / n if layout.zero >= 2 else local * train.grad_bytes
    o = params * train.optimizer_bytes / n if layout.zero >= 1 else local * train.optimizer_bytes
    return w, g, o


def reduce_bytes(train: TrainSpec) -> int:
    """Bytes per gradient element in data-parallel reductions: the run's stated ``grad_reduce_bytes``, else
    float32 except under pure bf16."""
    return train.grad_reduce_bytes or (2 if train.precision == "bf16" else 4)


# ------------------------------------------------------------------------------ the step's peak
# The runtime's memory peaks at one of two moments of the rank's busiest micro-batch:
#   "forward": its forward has just ended: every micro-batch in flight holds its activations, the
#              head's included; gradients are those accumulated by earlier backwards;
#   "backward": its backward has just begun: the head's (last chunk) or the last block's down
#              projection's (other chunks) first weight gradient exists, ZeRO-3 has gathered the
#              block being differentiated, the head's saved tensors are gone, and a checkpointed
#              block is being recomputed.
# The peak is the larger total; ``Memory`` reports its categories.


def _all_grads(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """The rank's gradients once a backward has run: unsharded (DDP, ZeRO-1, no DP, or any ZeRO
    under PP, which defers the reduce-scatter), else the shard; under TP a tied (vocabulary-parallel)
    embedding's gradient accumulates out of place, a second copy of it (an untied one is split on
    the hidden dimension, its gradient its shard: runtime/tensor_parallel.py). FSDP2 (dp > 1)
    accumulates unsharded gradients in its reduce dtype, and a sharded gradient has its float32 shard's dtype:
    float32 under bf16-mixed either way (found by ``meshwise verify``)."""
    unsharded = layout.dp == 1 or layout.zero <= 1 or layout.pp > 1
    elem = reduce_bytes(train) if layout.dp > 1 else train.grad_bytes  # FSDP2's shard is float32 too
    local = held(shape.params, shape.expert_params, layout) if shape.expert_params else shape.params
    grads = local * elem if unsharded else shape.params * elem / layout.shard
    if unsharded and layout.tp > 1 and shape.has_embedding and model.tied_embeddings and not model.states_only:
        grads += model.embedding_params / layout.tp * elem
    return grads


def _weights(train: TrainSpec, layout: Layout, shape: RankShape, moment: str, runtime: bool = True) -> float:
    """Weight copies: the convention's, plus FSDP2's shard beside the unsharded weights (which is
    the fp32 master under bf16-mixed, counted as optimizer state), or under ZeRO-3 the gathered
    roots (which stay gathered through the step) and, in backward, one gathered block per chunk;
    under ZeRO-3 and bf16-mixed FSDP2 keeps no bf16 shard beside the fp32 master (``runtime``;
    a bare parameter count keeps the ZeRO paper's convention)."""
    w = states(shape.params, train, layout, shape.expert_params)[0]
    if layout.dp == 1:
        return w
    if layout.zero == 3:
        if train.mixed and runtime:
            w = 0.0  # FSDP2 keeps only the fp32 shard (the master, counted as optimizer state)
        w += shape.root_params * train.weight_bytes
        if moment == "backward":
            w += _gathered_blocks(layout, shape) * train.weight_bytes
        return w
    if not train.mixed:
        # replicate keeps no second copy of experts that no other rank shares (dp = ep; measured)
        alone = shape.expert_params / layout.ep if layout.dp == layout.ep else 0.0
        w += (
            shape.params / layout.shard if layout.zero else held(shape.params, shape.expert_params, layout) - alone
        ) * train.weight_bytes
    if evicts_chunks(layout):
        # at most three chunks gathered at once; the fewest any moment of the step holds before
        # it ends are the rank's three smallest (pipeline.interleaved_moments)
        w -= _gathered_weights(train, layout, shape) * (1 - _fewest_gathered(shape))
    return w


def interleaved(layout: Layout) -> bool:
    """Whether torch runs the layout's step through its pipeline runtime's interleaved order
    (pipeline.interleaved_moments)."""
    return layout.pp > 1 and layout.vpp > 1 and layout.schedule == "interleaved-1f1b"


def evicts_chunks(layout: Layout) -> bool:
    """Whether the interleaved runtime reshards chunks FSDP2 would keep gathered (ZeRO-1/2, more
    chunks than it keeps active)."""
    return (
        interleaved(layout)
        and layout.dp * layout.cp > 1
        and layout.zero in (1, 2)
        and layout.vpp > pipeline.ACTIVE_CHUNKS
    )


def frees_gradients(layout: Layout) -> bool:
    """Whether the interleaved runtime reduces each chunk's gradients to a shard once its last
    backward has run (FSDP, ZeRO >= 1): no moment holds every unsharded gradient."""
    return interleaved(layout) and layout.dp * layout.cp > 1 and layout.zero >= 1


def _gathered_weights(train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """The bytes of the rank's unsharded weights, every chunk gathered (ZeRO-1/2)."""
    local = held(shape.params, shape.expert_params, layout) if shape.expert_params else shape.params
    return local * train.weight_bytes


def _chunk_fractions(shape: RankShape) -> tuple[float, ...]:
    """Each local chunk's share of the rank's parameters (blocks; the embedding on the first
    pipeline rank's first chunk, the head on the last rank's last)."""
    sizes = [b * shape.block_params for b in shape.chunk_blocks]
    if shape.has_embedding:
        sizes[0] += shape.root_params
    elif shape.has_head:
        sizes[-1] += shape.root_params
    total = sum(sizes) or 1.0
    return tuple(x / total for x in sizes)


def _fewest_gathered(shape: RankShape) -> float:
    """The share of the rank's parameters in its ACTIVE_CHUNKS smallest chunks: the fewest weights
    any busiest moment of the interleaved runtime holds gathered where it evicts chunks."""
    return sum(sorted(_chunk_fractions(shape))[: pipeline.ACTIVE_CHUNKS])


def _receive_buffers(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int
) -> tuple[float, float, float]:
    """Under PP, torch's PipelineStage allocates, per chunk, a receive buffer for every micro-batch's
    input and one for its output's gradient, kept from the first step on (stage._prepare_forward_infra,
    _setup_backward_recv_info; meshwise verify: 2 x 64 of them on Llama 3 405B, pp=8, vpp=8, m=8):
    (one message's bytes, all the buffers' bytes, the share of the rank's chunks that receive).
    ``train`` is the rank's setting (context.local_train's)."""
    chunks = len(shape.chunk_blocks)
    message = train.seq_len * layout.mbs * model.hidden * train.activation_bytes / (layout.tp if layout.sp else 1)
    buffers = m * ((chunks - int(shape.has_embedding)) + (chunks - int(shape.has_head))) * message
    return message, buffers, (chunks - int(shape.has_embedding)) / chunks


def _gathered_blocks(layout: Layout, shape: RankShape) -> float:
    """What ZeRO-3 has gathered at the start of a backward: each chunk's last block, less its routed
    experts under expert parallelism (their own FSDP unit, gathered only when their backward
    starts; measured: tiny-moe dp=2,zero=3,ep=2 and dp=4,zero=3,ep=2 peak before it)."""
    if not shape.last_blocks:
        return len(shape.chunk_blocks) * shape.block_params
    return shape.last_blocks - (shape.last_blocks_experts if layout.ep > 1 else 0.0)


def _first_grad(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """The first weight gradient a backward computes: the head's (and final norm's) on the last
    chunk, else the last block's down projection."""
    if model.states_only:
        return 0.0
    if shape.has_head:
        return (model.vocab * model.hidden / layout.tp + model.hidden) * train.grad_bytes
    return model.hidden * model.ffn_hidden / layout.tp * train.grad_bytes


def _activations(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> Activations:
    """Activations (at the end of a forward, at the start of a backward): the schedule's
    chunk-micro-batches in flight (pipeline.in_flight) of the rank's average chunk and the token
    ids; at the end of a forward, on the last chunk, the head's saved tensors (``m`` micro-batches
    of them under GPipe, else one). At the start of a backward the head's are gone except the logits
    a pipeline stage caches as its output, and a checkpointed block is recomputed: what it did not
    keep (none - kept) is alive again.
    On the last chunk, the loss's backward (``loss``): the loss's three float32 tensors
    over the logits (act.loss_backward_bytes) and, under PP, the cached logits, beside what the
    blocks keep; the head's other saved tensors are gone by then.
    ``second``: at the start of the second backward, one chunk-micro-batch fewer than at the
    first (base / held of them), where every micro-batch of the step is in flight at once (the
    warm-up holds them all, so no gradient of the step exists before the first backward).
    ``embed``, under TP on the embedding's chunk: the end of a micro-batch's backward, in the
    embedding's backward, where the rank's shard of the table's gradient is made in the compute
    dtype beside the other micro-batches' activations (meshwise verify, Llama 3 70B pp=4,dp=2,
    zero=1,tp=8 rank 0 peaks there; the whole table in two dtypes once traced here was DTensor's
    sharding propagation, which the tracker now skips: measure/_torch_tools.StepMemTracker).
    ``late``: late in the second block a backward differentiates, the first one's activations
    freed (one block's kept tensors fewer than at the start of the backward)."""
    shapes = act.Shapes.of(model)
    seq, mbs, e, t, sp = train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp
    kept = _kept_per_block(model, train, layout, shapes)
    held = pipeline.in_flight(layout.schedule, layout.pp, layout.vpp, m, shape.pp_rank)
    base, blocks_part, buffers = _in_flight(model, train, layout, shape, m, shapes, kept, held)
    forward = backward = base + buffers
    loss = 0.0
    if shape.has_head:
        gpipe = layout.pp > 1 and layout.schedule == "gpipe"
        loss = (
            base
            + buffers
            + (m - 1 if gpipe else 0) * act.head_bytes(model, seq, mbs, e, t, sp)
            + act.loss_backward_bytes(model, seq, mbs)
            + (act.logits_bytes(model, seq, mbs, e) if layout.pp > 1 else 0.0)
        )
    if shape.has_head:
        gpipe = layout.pp > 1 and layout.schedule == "gpipe"
        forward += (m if gpipe else 1) * act.head_bytes(model, seq, mbs, e, t, sp)
        if layout.pp > 1:
            # the stage caches its output (the logits) until the micro-batch's backward ends, and
            # with checkpointing the loss gradient over them is still alive while blocks recompute
            backward += act.logits_bytes(model, seq, mbs, e)
            if layout.ac != "none":
                backward += act.loss_grad_bytes(model, seq, mbs)
    if layout.ac != "none" and shape.blocks:
        backward += act.block_bytes(shapes, seq, mbs, e, t, sp, "none") - kept
    if layout.cp > 1 and shape.blocks:
        backward += ring_bytes(model, train, layout)
    embed = 0.0
    if shape.has_embedding and t > 1:
        embed = backward - base / held + model.vocab * model.hidden / t * e
    # what one more chunk-micro-batch in flight adds beside its blocks (its output sent on, less its
    # input's receive buffer, the token ids): the interleaved moments weigh each chunk's blocks
    extras = (base - blocks_part) / held
    return Activations(forward, backward, loss, backward - base / held, embed, backward - kept, kept, extras)


def _kept_per_block(model: ModelSpec, train: TrainSpec, layout: Layout, shapes: act.Shapes) -> float:
    """What one block keeps for its backward per micro-batch (act.block_bytes; MoE blocks' experts
    averaged in, and the rotary tables' bf16 copies a checkpointed block keeps as its inputs)."""
    seq, mbs, e, t, sp = train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp
    kept = act.block_bytes(shapes, seq, mbs, e, t, sp, layout.ac)
    if model.moe:  # MoE blocks keep their experts' tensors instead of a dense MLP's (the mean over blocks)
        dense_mlp = 0.0 if layout.ac == "full" else seq * mbs * model.ffn_hidden * e / t * (4 if shapes.swiglu else 2)
        moe = act.moe_mlp_bytes(model, seq, mbs, e, layout.ep, layout.ac)
        kept += model.moe_layers / model.layers * (moe - dense_mlp)
    if model.position == "rope" and train.mixed and layout.dp * layout.cp > 1 and layout.ac != "none":
        # FSDP2's policy casts each block's inputs: the float32 rotary cos and sin tables (s x head_dim)
        # become a bf16 copy per block and micro-batch, which a checkpointed block keeps as its inputs
        # (meshwise verify, Llama 3 405B under ac=full and selective: 2 x 2.1 MB per block and
        # micro-batch in flight; Llama 3 70B dp=8,zero=3,tp=8 without checkpointing: none)
        kept += 2 * seq * model.head_dim * e
    return kept


def _in_flight(
    model: ModelSpec,
    train: TrainSpec,
    layout: Layout,
    shape: RankShape,
    m: int,
    shapes: act.Shapes,
    kept: float,
    held: int,
) -> tuple[float, float, float]:
    """What the ``held`` chunk-micro-batches in flight keep (the schedule's), without the head's:
    (all of it, their blocks' part, the pipeline's receive buffers)."""
    seq, mbs, e, t, sp = train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp
    per_chunk = shape.blocks / len(shape.chunk_blocks)
    # the chunks in flight at the busiest moment (interleaved: those chunks' own, not the rank's average)
    blocks_part = kept * (
        pipeline.busiest_blocks(layout.pp, layout.vpp, m, shape.pp_rank, shape.chunk_blocks)
        if interleaved(layout)
        else held * per_chunk
    )
    base = blocks_part
    if layout.schedule == "zero-bubble" and layout.pp > 1 and layout.ac == "none":
        # torch 2.13 keeps every chunk-micro-batch's weight-gradient tensors until the step ends;
        # one micro-batch per chunk is whole (act.weight_grad_bytes)
        kept_w = act.weight_grad_bytes(shapes, seq, mbs, e, t, sp)
        base = shape.blocks * (m * kept_w + (kept - kept_w))
    elif layout.schedule == "zero-bubble" and layout.pp > 1:
        # with checkpointing, the split backward recomputes each block for its input gradient and
        # again for its weight gradient, and torch 2.13 keeps both recomputed graphs of every
        # chunk-micro-batch until the step ends (meshwise verify, Llama 3 405B dp=256,zero=1,
        # shard=8,tp=8,pp=8,vpp=2,ac=full, pipeline rank 4: 437 GB traced, 3.4 GB per block and
        # micro-batch; 2 x 1.6 GB unsplit blocks and the 0.27 GB input here)
        base = shape.blocks * m * (2 * act.block_bytes(shapes, seq, mbs, e, t, sp, "none") + kept)
    if shape.has_embedding:
        base += held * seq * mbs * 8  # act.ids_bytes
    buffers = 0.0
    if layout.pp > 1:
        # a pipeline stage caches each micro-batch's output until its backward: the hidden states
        # it sent on (the last chunk's output, the logits, is counted with the head)
        chunks = len(shape.chunk_blocks)
        message, buffers, receiving = _receive_buffers(model, train, layout, shape, m)
        sending = (chunks - int(shape.has_head)) / chunks
        # a received chunk input is its receive buffer (_receive_buffers), not a tensor of its own
        base += held * (sending - receiving) * message
    return base, blocks_part, buffers


def _ring_backward(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> tuple[float, float, float]:
    """Inside a ring attention's backward (cp > 1, no checkpointing, ``train`` the rank's s/cp
    setting; traced with meshwise verify, measured with meshwise measure): (activations inside the
    chunk's last block's, inside the last block but one's, backward temporaries).
    Activations: every block below it whole, its own attention part (its MLP's are freed), the
    token ids; temporaries: the ring's K/V and dK/dV buffers (context.ring_bytes) and four float32
    score-sized blocks (``a/t * mbs * T * T`` each, T = s/cp: probabilities, their gradient and
    the two products that make it)."""
    if layout.cp == 1 or layout.ac != "none" or shape.blocks < 2 or model.states_only:
        return 0.0, 0.0, 0.0
    shapes = act.Shapes.of(model)
    seq, mbs, e, t, sp = train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp
    full = act.block_bytes(shapes, seq, mbs, e, t, sp, "none")
    kept = full
    if model.moe:
        dense_mlp = seq * mbs * model.ffn_hidden * e / t * (4 if shapes.swiglu else 2)
        kept += model.moe_layers / model.layers * (act.moe_mlp_bytes(model, seq, mbs, e, layout.ep, "none") - dense_mlp)
    attention = full - act.mlp_bytes(shapes, seq, mbs, e, t, sp)
    ids = seq * mbs * 8 if shape.has_embedding else 0.0  # act.ids_bytes
    scores = 4 * model.heads / t * mbs * seq * seq * 4
    return (
        (shape.blocks - 1) * kept + attention + ids,
        (shape.blocks - 2) * kept + attention + ids,
        ring_bytes(model, train, layout) + scores,
    )


def _last_block(model: ModelSpec, layout: Layout, shape: RankShape) -> tuple[float, float]:
    """(parameters of the chunk's last block this rank holds gathered, of those its FSDP unit
    reduces when the block's backward ends) under ZeRO-3: under expert parallelism its routed
    experts are their own unit over the ranks left (1/ep of them gathered here), reduced when the
    experts' backward ends (runtime/data_parallel.py). The last block stands in for the one before
    it (a MoE model's dense layers come first)."""
    block = shape.last_blocks / len(shape.chunk_blocks) if shape.last_blocks else shape.block_params
    experts = shape.last_blocks_experts / len(shape.chunk_blocks)
    if layout.ep == 1 or model.states_only:
        return block, block
    return block - experts * (1 - 1 / layout.ep), block - experts


def _shared_expert(model: ModelSpec, shape: RankShape) -> float:
    """Parameters of the chunk's last block's shared expert and its gate, where that block is a
    MoE block (not split by TP, runtime/moe.py): computed last in the block's forward, the shared
    expert is the first its backward differentiates."""
    if not (model.moe and model.shared_ffn_hidden and shape.last_blocks_experts) or model.states_only:
        return 0.0
    return model._mlp(model.shared_ffn_hidden) + (model.hidden if model.shared_expert_gate else 0)


def _block_grads_after_mlp(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """A block's unsharded gradients once its attention's output projection is differentiated:
    all of its FSDP unit's but the Q/K/V projections and the first norm (FSDP2's reduce dtype);
    under expert parallelism its experts' unit has been reduced already (:func:`_last_block`)."""
    if model.states_only:
        return 0.0
    attention_in = (model.attention_params - model.heads * model.head_dim * model.hidden) / layout.tp + model.hidden
    return (_last_block(model, layout, shape)[1] - attention_in) * (
        reduce_bytes(train) if layout.dp > 1 else train.grad_bytes
    )


def _fixed_other(train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """ZeRO-2/3's reduce-scatter input: one block's gradients, unsharded; of its routed experts the
    rank's 1/ep share (under expert parallelism the rank computes gradients for those alone). Under
    PP none: the schedule reduces a chunk's gradients after its last backward, past the peak
    (meshwise verify, Llama 3 405B under pp=16, zero=2: 1.6 GB planned, none traced)."""
    if layout.zero >= 2 and layout.shard > 1 and layout.dp > 1 and layout.pp == 1:
        block = shape.block_params - (shape.expert_params / shape.blocks * (1 - 1 / layout.ep) if shape.blocks else 0.0)
        return block * reduce_bytes(train)
    return 0.0


def receive_buffers_idle(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> float:
    """Of the pipeline's receive buffers (_activations), those no micro-batch in flight holds as its
    input at the busiest moment: a tracker that starts after the first step (``meshwise measure``)
    never sees them made, where a traced first step does (``meshwise verify``)."""
    if layout.pp == 1 or model.states_only:
        return 0.0
    message, buffers, receiving = _receive_buffers(model, local_train(train, layout), layout, shape, m)
    held = pipeline.in_flight(layout.schedule, layout.pp, layout.vpp, m, shape.pp_rank)
    return max(buffers - held * receiving * message, 0.0)


def _fp8_casts(train: TrainSpec, shape: RankShape) -> float:
    """Under a float8 precision, the float8 copies of the block being computed (cost/fp8.float8_copy_bytes):
    its weights but the routed experts, which stay bf16."""
    if not train.fp8:
        return 0.0
    return float8_copy_bytes(shape.block_params - (shape.expert_params / shape.blocks if shape.blocks else 0.0))


def _rope_tables(model: ModelSpec, shape: RankShape) -> float:
    """The rotary cos and sin tables each chunk's module keeps as float32 buffers (max_seq x
    head_dim; runtime/model.py; meshwise verify, Llama 3 405B: 2 x 4.2 MB per chunk)."""
    if model.position != "rope" or model.states_only:
        return 0.0
    return 2 * model.max_seq * model.head_dim * 4 * len(shape.chunk_blocks)


def _static_parts(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> StaticParts:
    """What does not depend on mbs or ac (:class:`StaticParts`)."""
    return StaticParts(
        _weights(train, layout, shape, "forward"),
        _weights(train, layout, shape, "backward"),
        states(shape.params, train, layout, shape.expert_params)[2],
        _all_grads(model, train, layout, shape),
        _first_grad(model, train, layout, shape),
        _fixed_other(train, layout, shape) + _rope_tables(model, shape) + _fp8_casts(train, shape),
        _strided_copies(train, layout, shape),
        _embedding_grad_gap(model, train, layout, shape),
        _block_grads_after_mlp(model, train, layout, shape),
        _last_block(model, layout, shape)[0] * train.weight_bytes,
        _shared_expert(model, shape) * train.grad_bytes,
    )


def _embedding_grad_gap(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """What the embedding's unsharded gradient accumulated in FSDP2's reduce dtype holds more than
    its fresh gradient in the compute dtype (the step's first backward holds only the latter)."""
    unsharded = layout.dp > 1 and (layout.zero <= 1 or layout.pp > 1)
    if not (shape.has_embedding and unsharded) or model.states_only:
        return 0.0
    return model.embedding_params / layout.tp * (reduce_bytes(train) - train.grad_bytes)


def _strided_copies(train: TrainSpec, layout: Layout, shape: RankShape) -> tuple[float, float]:
    """FSDP2 over TP-sharded parameters (ZeRO-3) gathers into a buffer and copies out of it into the
    strided TP layout; measured, a second copy of the gathered root and, without checkpointing, of
    one block is alive at the end of the forward (filed by MemTracker as activations):
    (root copy, block copy) in bytes."""
    if layout.zero == 3 and layout.tp > 1 and layout.dp > 1:
        return shape.root_params * train.weight_bytes, shape.block_params * train.weight_bytes
    return 0.0, 0.0


def _per_micro_batch(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> PerMicroBatch:
    """What depends on the micro-batch and the schedule, not on DP or ZeRO (:class:`PerMicroBatch`)."""
    shared = 0.0
    if _shared_expert(model, shape):  # act.moe_mlp_bytes: its four SwiGLU tensors and its gated output
        shared = (
            train.seq_len
            * layout.mbs
            * train.activation_bytes
            * (4 * model.shared_ffn_hidden + (model.hidden if model.shared_expert_gate else 0))
        )
    acts = _activations(model, train, layout, shape, m)
    return PerMicroBatch(
        acts.forward,
        acts.backward,
        acts.loss,
        acts.second,
        acts.embed,
        acts.late,
        *_ring_backward(model, train, layout, shape),
        shared,
        acts.kept,
        acts.extras,
    )


MOMENTS = ("forward", "backward", "end", "loss", "block", "ring", "embed")


def _candidates(
    train: TrainSpec, layout: Layout, shape: RankShape, m: int, static: StaticParts, per_mb: PerMicroBatch
) -> tuple[Moment, ...]:
    """:class:`Moment` at each of the MOMENTS: the end of the
    busiest forward, its backward (the larger of: its start; where the warm-up holds every
    micro-batch, the start of the second backward), the end of
    the step's last backward (every gradient, no activations), the loss's backward, under
    ZeRO-2/3 without PP late in the second block a backward differentiates (else the backward),
    under cp with ZeRO-3 inside the ring attention's backward of the last block but one (else
    the end of the step), and under TP on the embedding's chunk its embedding's backward (else
    the backward)."""
    w_fwd, w_bwd, o, all_grads, first = (
        static.weights_forward,
        static.weights_backward,
        static.optimizer,
        static.all_grads,
        static.first_grad,
    )
    act_fwd = _forward_activations(layout, static, per_mb)
    warm_up_only, grads, fresh_unsharded = _step_gradients(train, layout, shape, m, all_grads)
    root_gathered = shape.root_params * train.weight_bytes if layout.zero == 3 and layout.dp * layout.cp > 1 else 0.0
    ids = _ids_bytes(train, layout, shape)
    other = static.fixed_other
    backward = Moment(w_bwd, grads + first if (grads == 0 or fresh_unsharded) else grads, o, per_mb.backward, other)
    late = _late_moment(train, layout, shape, backward, grads, per_mb.late)
    if static.shared_grads and shape.has_head:
        # the last block is a MoE block with a shared expert, added last in its forward: its backward
        # differentiates the shared expert first, whose fresh gradients then exist beside the
        # head's, its own tensors freed (measured: tiny-moe dp=4,zero=3,cp=2,ep=4 peaks there)
        fresh = static.shared_grads if (grads == 0 or fresh_unsharded) else 0.0
        backward = max(
            backward,
            Moment(backward.params, backward.grads + fresh, o, per_mb.backward - per_mb.shared_kept, other),
            key=sum,
        )
    if warm_up_only and m > 1:
        second = Moment(w_bwd, all_grads + (first if fresh_unsharded else 0.0), o, per_mb.second, other)
        backward = max(backward, second, key=sum)
    embed = backward  # without TP on the embedding's chunk the backward's start stands in
    if per_mb.embed:
        # the embedding's backward: the gradients of every block (this micro-batch's included); in
        # the step's first backward the embedding's own one is its fresh gradient, not yet accumulated
        embed_grads = all_grads - (static.embed_gap if grads == 0 else 0.0)
        embed = Moment(w_bwd, embed_grads, o, per_mb.embed, other)
    end = Moment(w_fwd, all_grads, o, ids, other)
    ring = _ring_moment(layout, shape, static, per_mb, grads, end)
    forward = Moment(w_fwd, grads, o, act_fwd, other)
    loss_moment = Moment(w_fwd - root_gathered, grads, o, per_mb.loss, other) if per_mb.loss else end
    if interleaved(layout):
        standing_in = ring == end
        forward, backward, end, loss_moment, embed = _interleaved_peaks(train, layout, shape, m, static, per_mb)
        late = backward  # late in a block's backward is a moment of its own only without PP
        if standing_in:
            ring = end
    return (
        forward,
        backward,
        end,
        # the loss's backward on the last chunk (found by meshwise verify): ZeRO-3 has resharded
        # the roots after the forward; without the head the end of the step stands in for it
        loss_moment,
        late,
        ring,
        embed,
    )


def _step_gradients(
    train: TrainSpec, layout: Layout, shape: RankShape, m: int, all_grads: float
) -> tuple[bool, float, bool]:
    """(whether every micro-batch of the step is in flight at once, the gradients earlier backwards of
    the step left, whether the first gradient of a backward is a tensor of its own beside them)."""
    gpipe = layout.pp > 1 and layout.schedule == "gpipe"
    # every micro-batch of the step in flight at once (1F1B's warm-up holds them all, as on the first
    # stages with m <= pp): the busiest forward and the first backward come before any gradient of
    # the step, the second backward after one (found by meshwise verify, pp=4,dp=2,zero=1,tp=8 rank 0)
    warm_up_only = (
        layout.schedule in ("1f1b", "interleaved-1f1b")
        and layout.pp > 1
        and pipeline.in_flight(layout.schedule, layout.pp, layout.vpp, m, shape.pp_rank) >= m * layout.vpp
    )
    grads = 0.0 if (m == 1 or gpipe or warm_up_only) else all_grads  # what earlier backwards of the step left
    # the first gradient of a backward is a tensor of its own beside the accumulated ones where it is
    # reduce-scattered at once (ZeRO-2/3 without PP) or FSDP2 accumulates in float32 (bf16-mixed:
    # the bf16 gradient lives until its unit's backward ends; found by meshwise verify)
    return warm_up_only, grads, _fresh_unsharded(train, layout)


def _fresh_unsharded(train: TrainSpec, layout: Layout) -> bool:
    """Whether the first gradient of a backward is a tensor of its own beside the accumulated ones."""
    return layout.dp * layout.cp > 1 and (layout.zero >= 2 and layout.pp == 1 or train.mixed)


def _ids_bytes(train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """The token ids a micro-batch holds on the embedding's rank (activations.ids_bytes)."""
    return train.seq_len * layout.mbs * 8 if shape.has_embedding else 0.0


def _forward_activations(layout: Layout, static: StaticParts, per_mb: PerMicroBatch) -> float:
    """The activations at the end of the busiest forward, with the copies its compute dtype makes."""
    root_copy, block_copy = static.copies
    return per_mb.forward + root_copy + (block_copy if layout.ac == "none" else 0.0)


def _late_moment(
    train: TrainSpec, layout: Layout, shape: RankShape, backward: Moment, grads: float, act_late: float
) -> Moment:
    """Late in a block's backward under ZeRO-2/3 without PP (else the backward's start stands in)."""
    if not (layout.zero >= 2 and layout.pp == 1 and layout.dp * layout.cp > 1 and shape.blocks > 1):
        return backward
    # late in a block's backward (the second the backward differentiates; the first one's
    # activations freed): all of the block's weight gradients exist unsharded in the compute
    # dtype before its reduce-scatter, the block after it is reduced (its sharded gradient and its
    # reduce-scatter input, fixed_other, alive), and ZeRO-3 has prefetched the gather of the block
    # before it (found by meshwise verify, Llama 3 70B dp=64,zero=3)
    # a block's parameters this rank holds: its routed experts are split ep ways
    block = shape.block_params - shape.expert_params / shape.blocks * (1 - 1 / layout.ep)
    late_grads = backward.grads + block * train.grad_bytes
    if grads == 0:
        late_grads += block * reduce_bytes(train) / (layout.shard * layout.cp)
    late_other = backward.other + (block * train.weight_bytes if layout.zero == 3 else 0.0)
    return Moment(backward.params, late_grads, backward.optimizer, act_late, late_other)


def _ring_moment(
    layout: Layout, shape: RankShape, static: StaticParts, per_mb: PerMicroBatch, grads: float, end: Moment
) -> Moment:
    """Inside a ring attention's backward under cp with ZeRO-3 (else the end of the step stands in)."""
    if not (per_mb.ring and layout.zero == 3 and layout.pp == 1 and shape.has_head and layout.dp * layout.cp > 1):
        return end
    # inside a ring attention's backward, of the last block or the last block but one, whichever
    # holds more (meshwise verify: under cp with ZeRO-3 the peak falls in the last but one; meshwise
    # measure, tiny-moe dp=4,zero=3,cp=2,ep=4: in the last, where a MoE block's tensors
    # outweigh its weights): the head's unsharded gradient (the root reduces at the end of the
    # backward) and the block's own beside the shards; the block before it gathered ahead
    # (FSDP2's prefetch) among the temporaries, and in the last block but one also the last
    # block's reduce-scatter input
    w_bwd, o, other = static.weights_backward, static.optimizer, static.fixed_other
    grads_in = grads + static.first_grad + static.block_grads
    last_block, temps = static.last_block, per_mb.ring_temps
    return max(
        Moment(w_bwd, grads_in, o, per_mb.ring_last, other - static.fixed_other + last_block + temps),
        Moment(w_bwd, grads_in, o, per_mb.ring, other + last_block + temps),
        key=sum,
    )


def _interleaved_peaks(
    train: TrainSpec, layout: Layout, shape: RankShape, m: int, static: StaticParts, per_mb: PerMicroBatch
) -> tuple[Moment, Moment, Moment, Moment, Moment]:
    """(forward, backward, end of the step, loss's backward, embedding's backward) under the
    interleaved runtime, from the rank's moments (pipeline.interleaved_moments): at each, the
    weights of the chunks gathered, the gradients of the chunks accumulating (their share of every
    gradient), and the activations: fewer than at the busiest forward (``act_fwd``) or backward
    (``per_mb.backward``) by ``per_mb.kept_block`` per block and ``per_mb.extras`` per chunk-micro-batch
    fewer in flight, and the
    float32 shards of the chunks whose gradients were reduced; at the end of the step only the
    shards remain (every chunk resharded, every gradient reduced)."""
    w_fwd, w_bwd, o, all_grads = static.weights_forward, static.weights_backward, static.optimizer, static.all_grads
    act_fwd, act_bwd = _forward_activations(layout, static, per_mb), per_mb.backward
    act_loss, act_embed = per_mb.loss, per_mb.embed
    kept_block, extras, other = per_mb.kept_block, per_mb.extras, static.fixed_other
    fresh_unsharded = _fresh_unsharded(train, layout)
    evict, frees = evicts_chunks(layout), frees_gradients(layout)
    sharding = layout.shard * layout.cp
    # a block's backward peaks in its MLP's, with the down projection's and the gate's fresh gradients
    # (in the compute dtype, until the block's FSDP unit accumulates them; meshwise verify, Llama 3
    # 405B pp=8, vpp=8, ac=full: both beside the chunk's float32 accumulators); the head's on the last
    fresh = static.first_grad * (1 if shape.has_head else 2)
    fractions, top_f, top_b, low_b, smallest, first_chunk, busiest, low_blocks = _moment_fractions(
        layout.pp, layout.vpp, m, shape, evict, frees
    )
    unsharded = _gathered_weights(train, layout, shape) if evict else 0.0
    forward = backward = loss = None
    best_f = best_b = best_loss = -1.0
    for is_f, in_flight, blocks, gathered, pending, accumulating, reduced in fractions:
        # the total first (most moments lose); the categories of the best (plain tuples here, made
        # Moments once the best are known): a chunk gathered ahead of its use is FSDP2's all-gather
        # output until then (a buffer: other)
        g = all_grads * (accumulating + reduced / sharding)  # reduced: their float32 shards
        w = unsharded * (gathered - smallest)
        if is_f:
            a = act_fwd - (busiest - blocks) * kept_block - (top_f - in_flight) * extras
            total = w_fwd + w + g + o + a + other
            if total > best_f:
                prefetched = unsharded * pending
                forward, best_f = (w_fwd + w - prefetched, g, o, a, other + prefetched), total
        else:
            gb = g + fresh if (accumulating == 0 or fresh_unsharded) else g
            a = act_bwd - (busiest - blocks) * kept_block - (top_b - in_flight) * extras
            total = w_bwd + w + gb + o + a + other
            if total > best_b or (in_flight == top_b and total > best_loss):
                prefetched = unsharded * pending
                cand = (w_bwd + w - prefetched, gb, o, a, other + prefetched)
                if total > best_b:
                    backward, best_b = cand, total
                if in_flight == top_b and total > best_loss:
                    loss, best_loss = (cand, g), total
    forward, backward = Moment._make(forward), Moment._make(backward)
    shards = all_grads / sharding if frees else all_grads
    end = Moment(w_fwd - unsharded * smallest, shards, o, _ids_bytes(train, layout, shape), other)
    loss_moment = Moment(loss[0][0], loss[1], o, act_loss, other) if act_loss else end
    embed = backward
    if act_embed:
        # the embedding's backward comes with its chunk's (the first) last backwards: the fewest in flight
        g0 = all_grads * first_chunk
        embed = Moment(
            w_bwd + unsharded * (first_chunk - smallest),
            g0,
            o,
            act_embed - (busiest - low_blocks) * kept_block - (top_b - low_b) * extras,
            other,
        )
    return forward, backward, end, loss_moment, embed


def interleaved_ceiling(train: TrainSpec, layout: Layout, shape: RankShape, static: StaticParts) -> float:
    """Under the interleaved runtime, what no moment of :func:`_candidates` exceeds but the
    activations (their largest: the forward's end, a backward's start, the
    loss's and the embedding's backward): every chunk gathered, every unsharded gradient and its
    shard, two fresh gradients, the optimizer states and the fixed buffers. The search's shortcut
    for layouts that fit with room to spare (``layout``: context.weights_layout's or the layout)."""
    s = static
    evict = evicts_chunks(layout)
    gathered = _gathered_weights(train, layout, shape) * (1 - _fewest_gathered(shape)) if evict else 0.0
    return (
        max(s.weights_forward, s.weights_backward)
        + gathered
        + s.all_grads * (1 + 1 / (layout.shard * layout.cp))
        + 2 * s.first_grad
        + s.optimizer
        + s.fixed_other
        + sum(s.copies)
    )


@lru_cache(maxsize=16384)
def _moment_fractions(
    p: int, v: int, m: int, shape: RankShape, evict: bool, frees: bool
) -> tuple[tuple[tuple[bool, int, int, float, float, float, float], ...], int, int, int, float, float, int, int]:
    """The rank's interleaved moments (pipeline.interleaved_moments) as (is a forward's end, chunk-
    micro-batches in flight, their blocks, and the shares of the rank's parameters gathered,
    gathered ahead of use, accumulating gradients and reduced), with the most in flight at a
    forward's end and at a backward's start, the fewest at a backward's start, the three smallest
    chunks' share (where chunks are evicted, else 0), the first chunk's share, the blocks in flight
    at the busiest moment (pipeline.busiest_blocks) and at the fewest-in-flight backward."""
    moments = pipeline.interleaved_moments(p, v, m, shape.pp_rank, evict, frees)
    fr = _chunk_fractions(shape)
    out = tuple(
        (
            mo.kind == "F",
            mo.in_flight,
            sum(n * b for n, b in zip(mo.flight, shape.chunk_blocks)),
            sum(fr[c] for c in mo.gathered),
            sum(fr[c] for c in mo.pending),
            sum(fr[c] for c in mo.accumulating),
            sum(fr[c] for c in mo.reduced),
        )
        for mo in moments
    )
    top_f = max(f for is_f, f, *_ in out if is_f)
    top_b = max(f for is_f, f, *_ in out if not is_f)
    low_b, low_blocks = min((f, b) for is_f, f, b, *_ in out if not is_f)
    smallest = _fewest_gathered(shape) if evict else 0.0
    busiest = pipeline.busiest_blocks(p, v, m, shape.pp_rank, shape.chunk_blocks)
    return out, top_f, top_b, low_b, smallest, fr[0], busiest, low_blocks


class FloorHalves(NamedTuple):
    """The static halves of :func:`candidates_floor`'s two sums, added up once per rank shape."""

    forward: float  # the forward's end: weights + optimizer states
    backward: float  # the backward's start: weights + optimizer states
    fixed_other: float  # the fixed buffers


def floor_halves(static: StaticParts) -> FloorHalves:
    """:class:`FloorHalves` of :func:`_static_parts`' answer, summed in :func:`candidates_floor`'s order."""
    o = static.optimizer
    return FloorHalves(static.weights_forward + 0.0 + o, static.weights_backward + 0.0 + o, static.fixed_other)


def candidates_floor(halves: FloorHalves, per_mb: PerMicroBatch) -> float:
    """At most the largest total of :func:`_candidates`, for a tenth of its work: the forward's end
    and the backward's start without their gradients, strided copies and second backward (each
    term is >= 0, and the sum is taken in the same order, so it is below in floating point too).
    The one fit floor: PeakCache.fits and the search both refuse by it."""
    return max(
        halves.forward + per_mb.forward + halves.fixed_other, halves.backward + per_mb.backward + halves.fixed_other
    )


def ceiling_activations(per_mb: PerMicroBatch) -> float:
    """The activations :func:`interleaved_ceiling` leaves out: the largest of the forward's end, a
    backward's start, the loss's and the embedding's backward (of :func:`_per_micro_batch`)."""
    return max(per_mb.forward, per_mb.backward, per_mb.loss, per_mb.embed)


def _all_moments(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> tuple[Moment, ...]:
    wl, lt = weights_layout(layout), local_train(train, layout)
    if model.states_only:  # the convention's states, nothing transient (the shape is unknown)
        w, g, o = states(shape.params, train, wl)
        return (Moment(_weights(train, wl, shape, "forward", runtime=False), g, o, 0.0, 0.0),)
    return _candidates(
        lt, layout, shape, m, _static_parts(model, train, wl, shape), _per_micro_batch(model, lt, layout, shape, m)
    )


def _moments(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> Moment:
    """The peak: the largest of the moments."""
    return max(_all_moments(model, train, layout, shape, m), key=sum)


def rank_memory(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, capacity: float
) -> Memory:
    w, g, o, a, x = _moments(model, train, layout, shape, m)
    return Memory(params=w, grads=g, optimizer=o, activations=a, other=x, capacity=capacity)


def moment_memories(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, capacity: float
) -> dict[str, Memory]:
    """Memory at each of the MOMENTS (rank_memory is the largest). Which one a real run peaks at
    can depend on thread timing when two are close; measure compares against the nearest."""
    moments = dict(zip(MOMENTS, _all_moments(model, train, layout, shape, m)))
    if moments.get("ring") == moments.get("end"):  # no ring attention: the end stands in, not a moment of its own
        moments.pop("ring", None)
    if moments.get("embed") == moments.get("backward"):  # no TP embedding: the backward stands in
        moments.pop("embed", None)
    return {name: Memory(*c, capacity=capacity) for name, c in moments.items()}


def kept_per_block(model: ModelSpec, train: TrainSpec, layout: Layout) -> float:
    """What one block keeps for its backward, per micro-batch of ``layout.mbs``, on one rank (the
    activations' per-block term of :func:`_activations`, MoE blocks averaged in): the explanation's
    'activations of one block'."""
    if model.states_only:
        return 0.0
    shape = rank_shapes(model, layout)[0]
    return _activations(model, local_train(train, layout), layout, shape, 1).kept
