"""Peak totals shared across one search's layouts (cost/memory.py's moments, cached by the parts
that do not change between them)."""

from __future__ import annotations

from typing import NamedTuple

from meshwise.cost import memory
from meshwise.cost.context_parallel import local_train, weights_layout
from meshwise.cost.memory import (
    FloorHalves,
    Memory,
    PerMicroBatch,
    RankShape,
    StaticParts,
    _all_grads,
    _candidates,
    _fixed_other,
    _moments,
    _per_micro_batch,
    _static_parts,
    _weights,
    candidates_floor,
    floor_halves,
    frees_gradients,
    rank_memory,
    states,
)
from meshwise.layout import Layout
from meshwise.spec import ModelSpec, TrainSpec


class RankEntry(NamedTuple):
    """What a search's inner loop reads of one rank shape of a structure, worked out once for every
    mbs and ac: the shape, its static parts (None for a bare parameter count), the static halves of
    the fit floor, and under the interleaved runtime the static part of memory.interleaved_ceiling."""

    shape: RankShape
    static: StaticParts | None
    halves: FloorHalves | None
    ceiling: float | None


class PeakCache:
    """Peak totals for one (model, train) search: the DP/ZeRO parts are shared across micro-batch
    sizes and checkpointing modes, the per-micro-batch parts across DP degrees and ZeRO stages.
    Keys are plain tuples (a layout's fields and the pipeline rank), so lookups cost no spec hashing."""

    def __init__(self, model: ModelSpec, train: TrainSpec) -> None:
        self.model, self.train = model, train
        self._static: dict[tuple, StaticParts] = {}
        self._per_mb: dict[tuple, PerMicroBatch] = {}
        self._tables: dict[tuple, dict] = {}

    @staticmethod
    def _skey(layout: Layout, shape: RankShape) -> tuple:
        """The static parts depend on the schedule only through the rank's shape (cost/memory.py),
        which tp, pp, vpp, the V placement (zero-bubble with vpp=2) and the pipeline rank fix
        (memory.rank_shapes): those name it here, cheaper to hash than the RankShape itself."""
        cp = layout.cp
        return (
            layout.dp * cp,
            layout.zero,
            layout.shard * cp,
            layout.tp,
            layout.pp,
            layout.vpp,
            layout.ep,
            layout.schedule == "zero-bubble" and layout.vpp == 2,
            shape.pp_rank,
        )

    def _static_of(self, layout: Layout, shape: RankShape) -> StaticParts:
        skey = self._skey(layout, shape)
        static = self._static.get(skey)
        if static is None:
            static = self._static[skey] = _static_parts(self.model, self.train, weights_layout(layout), shape)
        return static

    def floor(self, layout: Layout, shape: RankShape) -> float:
        """A lower bound of :meth:`total` at every mbs, ac and micro-batch count: the step's end holds
        the weights, every gradient, the optimizer states and the fixed buffers (the "end" moment of
        :func:`_candidates` less its input ids and pipeline buffers); where the interleaved runtime
        reduces each chunk's gradients as its backwards end, the busiest forward holds the weights
        and the optimizer states."""
        if self.model.states_only:
            return sum(states(shape.params, self.train, weights_layout(layout), shape.expert_params)[0::2])
        kept = not frees_gradients(layout)  # else every moment with gradients has fewer weights gathered
        static = self._static.get(self._skey(layout, shape))
        if static is not None:
            return static.weights_forward + (static.all_grads if kept else 0.0) + static.optimizer + static.fixed_other
        # most structures fail here: compute only the four parts the floor reads (as _static_parts does)
        wl = weights_layout(layout)
        return (
            _weights(self.train, wl, shape, "forward")
            + states(shape.params, self.train, wl, shape.expert_params)[2]
            + (_all_grads(self.model, self.train, wl, shape) if kept else 0.0)
            + _fixed_other(self.train, wl, shape)
        )

    def total(self, layout: Layout, shape: RankShape, m: int) -> float:
        if self.model.states_only:
            return sum(_moments(self.model, self.train, layout, shape, m))
        return self.total_of(layout, shape, m, self._static_of(layout, shape), local_train(self.train, layout))

    def total_of(self, layout: Layout, shape: RankShape, m: int, static: StaticParts, lt: TrainSpec) -> float:
        """:meth:`total` with the parts that do not change with mbs and ac given (``static``, from
        :meth:`static_of`, and ``lt``, context.local_train's setting), as the search's inner loop has them."""
        if self.model.states_only:
            return sum(_moments(self.model, self.train, layout, shape, m))
        akey = (
            layout.tp,
            layout.sp,
            layout.pp,
            layout.vpp,
            layout.schedule,
            layout.mbs,
            layout.ac,
            shape.pp_rank,
            m,
            layout.cp,
            layout.ep > 1,
        )
        per_mb = self._per_mb.get(akey)
        if per_mb is None:
            per_mb = self._per_mb[akey] = _per_micro_batch(self.model, lt, layout, shape, m)
        return max(map(sum, _candidates(lt, layout, shape, m, static, per_mb)))

    def fits(
        self,
        layout: Layout,
        shape: RankShape,
        m: int,
        static: StaticParts | None,
        lt: TrainSpec,
        usable: float,
        table: dict,
    ) -> bool:
        """``total_of(...) <= usable``, with ``table`` from :meth:`table_of` for the layout. Most
        layouts a search tries do not fit, and most of those are refused by
        memory.candidates_floor before the seven moments are built."""
        if self.model.states_only:
            return sum(_moments(self.model, self.train, layout, shape, m)) <= usable
        key = (layout.ac, layout.mbs, shape.pp_rank)
        per_mb = table.get(key)
        if per_mb is None:
            per_mb = table[key] = self.per_micro_batch(layout, shape, m, lt)
        if candidates_floor(floor_halves(static), per_mb) > usable:
            return False
        return self.total_from(layout, shape, m, static, lt, per_mb) <= usable

    def per_micro_batch(self, layout: Layout, shape: RankShape, m: int, lt: TrainSpec) -> PerMicroBatch:
        """memory._per_micro_batch for the rank's setting ``lt`` (context.local_train's)."""
        return _per_micro_batch(self.model, lt, layout, shape, m)

    def total_from(
        self, layout: Layout, shape: RankShape, m: int, static: StaticParts, lt: TrainSpec, per_mb: PerMicroBatch
    ) -> float:
        """The peak total from its two halves (:meth:`static_of` and :meth:`per_micro_batch`)."""
        return max(map(sum, _candidates(lt, layout, shape, m, static, per_mb)))

    def table_of(self, layout: Layout) -> dict:
        """The per-micro-batch parts of every layout with ``layout``'s tp, sp, pp, vpp, schedule, cp,
        dp (which fix the micro-batch count for each mbs) and whether ep > 1, by (ac, mbs, pipeline
        rank). Of ep, memory._per_micro_batch reads only whether it is above 1 (the busiest expert
        rank's capacity factor, activations.moe_mlp_bytes): ep = 2, 4, 8 share one table
        (tests/unit/test_planner.py holds this)."""
        key = (layout.tp, layout.sp, layout.pp, layout.vpp, layout.schedule, layout.cp, layout.ep > 1, layout.dp)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        return table

    def rank_entry(self, layout: Layout, shape: RankShape, train: TrainSpec) -> RankEntry:
        """The shape's :class:`RankEntry` for ``layout`` (``train``: the plan's own setting)."""
        static = self.static_of(layout, shape)
        if static is None:
            return RankEntry(shape, None, None, None)
        ceiling = memory.interleaved_ceiling(train, layout, shape, static) if memory.interleaved(layout) else None
        return RankEntry(shape, static, floor_halves(static), ceiling)

    def static_of(self, layout: Layout, shape: RankShape) -> StaticParts | None:
        """The parts of :meth:`total` shared by every mbs and ac (None for a bare parameter count)."""
        return None if self.model.states_only else self._static_of(layout, shape)

    def memories(self, layout: Layout, shapes: tuple[RankShape, ...], capacity: float) -> tuple[Memory, ...]:
        """estimate.rank_memories' answer (memory.rank_memory of each of the layout's rank shapes,
        ``shapes``) from the cached halves: the peak's categories are those of the largest moment,
        as memory._moments picks it (tests/unit/test_planner.py holds the two equal)."""
        m = layout.accum(self.train.global_batch)
        if self.model.states_only:
            return tuple(rank_memory(self.model, self.train, layout, s, m, capacity) for s in shapes)
        lt = local_train(self.train, layout)
        table = self.table_of(layout)
        out = []
        for shape in shapes:
            per_mb = table.get((layout.ac, layout.mbs, shape.pp_rank))
            if per_mb is None:
                per_mb = table[layout.ac, layout.mbs, shape.pp_rank] = self.per_micro_batch(layout, shape, m, lt)
            peak = max(_candidates(lt, layout, shape, m, self._static_of(layout, shape), per_mb), key=sum)
            out.append(Memory(*peak, capacity=capacity))
        return tuple(out)
