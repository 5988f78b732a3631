"""Per-rank memory, by category: params, grads, optimizer, activations, other.

Model states (Rajbhandari et al. 2020, arXiv 1910.02054): with ``w``, ``g``, ``o`` bytes per
parameter for weights, gradients and optimizer (TrainSpec), a rank holding ``P`` parameters keeps
``w*P + g*P + o*P`` under DDP; ZeRO-1 divides the optimizer term by the sharding group ``shard``,
ZeRO-2 also the gradients, ZeRO-3 also the weights (HSDP: the group is ``shard``, not ``dp``).

``P`` is what the rank's pipeline chunks hold after tensor parallelism: each block's matrices split
``t`` ways, its two norm weights replicated; the embedding (vocabulary-parallel) on the first
chunk; the final norm and the LM head on the last (a tied head needs its own copy there when the
embedding lives on another rank).

``other``: the last stage's logits and loss buffers for one micro-batch (activations.head_bytes),
DDP's gradient buckets, FSDP's all-gather and reduce-scatter buffers (two blocks of unsharded
weights for prefetch, one block of unreduced gradients), and the pipeline's send/receive buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshwise.cost import activations as act
from meshwise.cost import pipeline
from meshwise.layout import Layout, chunk_rank, stage_layers
from meshwise.spec import ModelSpec, TrainSpec

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb = 25


@dataclass(frozen=True)
class RankShape:
    """What one pipeline rank holds: its chunks' block counts and the ends of the model it owns."""

    pp_rank: int
    chunk_blocks: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    params: float            # after TP
    largest_unit: float      # parameters of its largest FSDP unit (one block, or the embedding/head), after TP

    @property
    def blocks(self) -> int:
        return sum(self.chunk_blocks)


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


def rank_shapes(model: ModelSpec, layout: Layout) -> tuple[RankShape, ...]:
    """The distinct pipeline ranks: ranks holding the same blocks and model ends cost the same, and
    of those the lowest rank keeps the most micro-batches in flight (pipeline.in_flight), so it
    stands for them all."""
    v_shape = layout.schedule == "zero-bubble" and layout.vpp == 2
    return _rank_shapes(model, layout.tp, layout.pp, layout.vpp, v_shape)


@lru_cache(maxsize=4096)
def _rank_shapes(model: ModelSpec, t: int, pp: int, vpp: int, v_shape: bool) -> tuple[RankShape, ...]:
    if model.states_only:
        per_rank = model.params / (t * pp)  # the shape is unknown: no FSDP unit to size buffers by
        return (RankShape(0, (0,), True, pp == 1, per_rank, 0.0),) + (
            (RankShape(pp - 1, (0,), False, True, per_rank, 0.0),) if pp > 1 else ())
    block = (model.attention_params + model.mlp_params) / t + 2 * model.hidden
    embed = model.embedding_params / t
    head = model.vocab * model.hidden / t
    stages = pp * vpp
    counts = stage_layers(model.layers, stages)
    last = stages - 1
    schedule = "zero-bubble" if v_shape else "interleaved-1f1b"
    owner = [chunk_rank(c, pp, vpp, schedule) for c in range(stages)]
    shapes: dict[tuple, RankShape] = {}
    for r in range(pp):
        chunks = [c for c in range(stages) if owner[c] == r]
        first_here = 0 in chunks
        last_here = last in chunks
        params = sum(counts[c] for c in chunks) * block
        if first_here:
            params += embed
        if last_here:
            params += model.hidden  # final norm
            if not model.tied_embeddings or not first_here:
                params += head
        unit = max(block, embed if first_here else 0.0, head if last_here else 0.0)
        blocks = tuple(counts[c] for c in chunks)
        shapes.setdefault((blocks, first_here, last_here), RankShape(r, blocks, first_here, last_here, params, unit))
    return tuple(shapes.values())


def states(params: float, train: TrainSpec, layout: Layout) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes for ``params`` parameters under the layout's ZeRO stage."""
    n = layout.shard if layout.zero else 1
    w = params * train.weight_bytes / (n if layout.zero >= 3 else 1)
    g = params * train.grad_bytes / (n if layout.zero >= 2 else 1)
    o = params * train.optimizer_bytes / (n if layout.zero >= 1 else 1)
    return w, g, o


def activation_bytes(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int) -> float:
    """Activations at the rank's peak: the schedule's chunk-micro-batches in flight, each of the rank's
    average chunk, plus one block's full activations while a checkpointed block is recomputed."""
    if model.states_only:
        return 0.0
    shapes = act.Shapes.of(model)
    per_block = act.block_bytes(shapes, train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp, layout.ac)
    chunks = len(shape.chunk_blocks)
    blocks_per_chunk = shape.blocks / chunks
    held = pipeline.in_flight(layout.schedule, layout.pp, layout.vpp, m, shape.pp_rank)
    total = held * blocks_per_chunk * per_block
    if layout.ac != "none" and shape.blocks:
        total += act.block_bytes(shapes, train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp, "none")
    return total


def other_bytes(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    return fixed_other_bytes(train, layout, shape) + micro_batch_other_bytes(model, train, layout, shape)


def fixed_other_bytes(train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """Buffers that do not depend on the micro-batch: DDP buckets, FSDP gather/scatter buffers."""
    total = 0.0
    if layout.dp > 1 and layout.zero == 0:
        total += min(DDP_BUCKET_BYTES, shape.params * train.grad_bytes)
    if layout.zero >= 2 and layout.shard > 1:
        prefetch_units = 2 if layout.zero == 3 else 0
        total += shape.largest_unit * (prefetch_units * train.weight_bytes + reduce_bytes(train))
    return total


def micro_batch_other_bytes(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape) -> float:
    """Buffers that scale with the micro-batch: logits and loss, pipeline send/receive buffers."""
    if model.states_only:
        return 0.0
    total = 0.0
    if shape.has_head:
        total += act.head_bytes(model, train.seq_len, layout.mbs, train.activation_bytes, layout.tp, layout.sp)
    if layout.pp > 1:
        message = train.seq_len * layout.mbs * model.hidden * train.activation_bytes / (layout.tp if layout.sp else 1)
        total += 2 * message * len(shape.chunk_blocks)
    return total


def reduce_bytes(train: TrainSpec) -> int:
    """Bytes per gradient element in data-parallel reductions: float32 except under pure bf16."""
    return 2 if train.precision == "bf16" else 4


def rank_memory(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int,
                capacity: float) -> Memory:
    w, g, o = states(shape.params, train, layout)
    return Memory(params=w, grads=g, optimizer=o,
                  activations=activation_bytes(model, train, layout, shape, m),
                  other=other_bytes(model, train, layout, shape), capacity=capacity)
