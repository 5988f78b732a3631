"""The search: enumerate every valid layout, estimate each, drop what does not fit, rank.

Pure Python: never imports torch. The search covers every factorisation world = dp * cp * tp * pp
with tp dividing the heads, KV heads, MLP width and vocabulary, and cp a power of two that leaves
each rank at least ``CP_MIN_TOKENS`` of a sequence divisible by 2 * cp (context parallelism is for
long sequences); ZeRO stages 0-3 with every sharding group size that divides dp (HSDP when
smaller), and ep over the sharding group times cp for mixture-of-experts models; sp on/off; the four
schedules with vpp from 2 to ``MAX_VPP`` for the interleaved ones; micro-batch sizes that are
powers of two up to ``MAX_MBS`` and divide the per-replica batch; and the three
activation-checkpointing modes. Ties go to less machinery (:func:`break_ties`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meshwise.cost import memory
from meshwise.cost.context_parallel import local_train
from meshwise.cost.estimate import (
    DEFAULT_HEADROOM,
    estimate,
    lower_bound_experts_s,
    lower_bound_step_s,
    optimizer_seconds,
)
from meshwise.cost.memory import RankShape
from meshwise.cost.memory_peaks import RankEntry
from meshwise.cost.plan_cache import PlanCache, plan_cache
from meshwise.layout import AC_MODES, Layout, runs_here
from meshwise.plan.candidates import (  # noqa: F401  (re-exported: the search's names, as before)
    _RUNS_HERE_FIELDS,
    CP_MIN_TOKENS,
    MAX_MBS,
    MAX_VPP,
    RUNNER_UP_POOL,
    SHORT,
    TIE,
    SearchResult,
    _ac_modes,
    _cp_choices,
    _divisors,
    _layout,
    _rank_key,
    _schedule_ok,
    _simplicity,
    _simplicity_words,
    _structure_fields,
    _structures,
    _with,
    break_ties,
    cp_degrees,
    enumerate_layouts,
    keep_ranked,
    pipeline_options,
    simpler_in,
    tp_degrees,
)
from meshwise.plan.megatron_search import search_megatron
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

_AC_ORDER = {ac: i for i, ac in enumerate(AC_MODES)}  # the enumeration's order of checkpointing modes


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one search. The search allocates hundreds of thousands
    of small tuples, dicts and layouts that reference counting frees (it makes no cycles), and the
    collector's passes over them took about 7% of a Mixtral 8x22B plan. The pause is process-wide
    (the collector has no other switch), so it lasts only while the search runs."""
    resume = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if resume:
            gc.enable()


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    top: int = 5,
    headroom: float = DEFAULT_HEADROOM,
    where: Callable[[Layout], bool] | None = None,
    cache: PlanCache | None = None,
) -> SearchResult:
    """Exhaustive search with two exact prunings: the layouts taken fastest lower bound first, one whose
    compute + bubble alone is slower than the worst of the best ``max(top, RUNNER_UP_POOL)`` ends the
    search (the memory of those after it is never worked out: ``result.checked``), and a layout whose
    memory exceeds the device is never timed. ``where``
    restricts the search (it sees each layout with mbs=1); by default, for meshwise's own runtime,
    to what that runtime runs (:func:`meshwise.layout.runs_here`). ``cache``: the plan's caches
    (cost/plan_cache.py), where it serves this model, cluster and setting; else the search makes its own."""
    with _collector_paused():
        if train.runtime == "megatron" and not model.states_only:  # Megatron-Core's memory and MoE folding
            return search_megatron(model, cluster, train, top, headroom, where, cache=cache)
        return _Search(model, cluster, train, top, headroom, where, plan_cache(model, cluster, train, cache)).run()


class _Search:
    """One search: its memo tables are the fields, its prunings the methods. Every memo is keyed by a
    plain tuple of the fields its answer reads (cheaper to hash than a spec), so one answer serves
    every layout that shares them. Each pruning below says why it drops nothing that could fit or
    make the top: the result equals the brute force's (tests/unit/test_planner.py holds it)."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        train: TrainSpec,
        top: int,
        headroom: float,
        where: Callable[[Layout], bool] | None,
        cache: PlanCache,
    ) -> None:
        if where is None and train.runtime == "meshwise" and not model.states_only:
            where = runs_here(model, train.seq_len)
        self.model, self.cluster, self.train, self.top, self.headroom, self.where = (
            model,
            cluster,
            train,
            top,
            headroom,
            where,
        )
        self.keep = max(top, RUNNER_UP_POOL)
        self.capacity = cluster.accelerator.memory_bytes
        self.usable = self.capacity * (1 - headroom)
        self.peaks = cache.peaks  # the memory's parts
        self.result = SearchResult()
        # The micro-batch sizes and checkpointing modes of a structure depend only on these fields
        # when the filter is runs_here (it reads no others); a custom ``where`` is asked every time.
        self.shared_where = where is None or getattr(where, "reads", None) == _RUNS_HERE_FIELDS
        self.options: dict[tuple, tuple[list[int], list[str]]] = {}
        self.floor_fits: dict[tuple, bool | tuple] = {}  # False, or (rank shapes, their RankEntry)
        self.widest_fits: dict[tuple, bool] = {}  # the floor of a whole-dp sharding group
        self.local_trains: dict[int, TrainSpec] = {}  # context.local_train by cp
        self.rank_shapes: dict[tuple, tuple[RankShape, ...]] = {}  # memory.rank_shapes by what it reads
        self.stages = cache.stages  # estimate's per-rank memo, bounds and estimates alike
        self.bounds: dict[tuple, float] = {}  # the compute-only bound
        self.optimizers: dict[tuple, float] = {}  # estimate.optimizer_seconds
        self.with_experts: dict[tuple, float] = {}  # estimate.lower_bound_experts_s
        self.tight: dict[tuple, float] = {}  # the tighter bound: everything but the DP collectives
        # the structures by what their compute-only bound reads: (enumeration index, fields, options) each
        self.groups: dict[tuple, list[tuple[int, tuple, tuple[list[int], list[str]]]]] = {}
        self.structures = 0
        self.ordered: dict[tuple, list] = {}  # the groups' structures, widest sharding group first (_widest_first)
        self.bases: dict[int, tuple[Layout, tuple, TrainSpec, dict]] = {}  # a fitting floor's base, by structure

    def run(self) -> SearchResult:
        for cp_bound in (True, False):  # cp past CP_MIN_TOKENS only when no layout within it is valid
            for fields in _structure_fields(
                self.model, self.cluster.world_size, self.train.global_batch, self.train.seq_len, cp_bound
            ):
                self._enumerate(*fields)
            if self.result.enumerated:
                break
        return self._rank()

    def _enumerate(
        self,
        dp: int,
        zero: int,
        shard: int,
        cp: int,
        tp: int,
        sp: bool,
        pp: int,
        vpp: int,
        schedule: str,
        ep: int,
        all_mbs: list[int],
    ) -> None:
        """Count the structure's layouts and file it under what its compute-only bound reads (no
        DP/ZeRO field: dp is fixed by tp, cp and pp; ep only for a mixture of experts). Eleven
        arguments: one structure of _structure_fields, unpacked."""
        opts = self._options(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, all_mbs)
        mbs_options, acs = opts
        if not acs:
            return
        self.result.enumerated += len(acs) * len(mbs_options)
        gkey = (tp, cp, pp, vpp, schedule, sp, ep if self.model.moe else 1)
        members = self.groups.get(gkey)
        if members is None:
            members = self.groups[gkey] = []
        members.append((self.structures, (dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep), opts))
        self.structures += 1

    # ------------------------------------------------------------------ what fits
    def _options(
        self,
        dp: int,
        zero: int,
        shard: int,
        cp: int,
        tp: int,
        sp: bool,
        pp: int,
        vpp: int,
        schedule: str,
        ep: int,
        all_mbs: list[int],
    ) -> tuple[list[int], list[str]]:
        """The structure's micro-batch sizes the schedule admits and the checkpointing modes ``where``
        admits (shared by every structure with the same fields runs_here reads and dp)."""
        okey = (dp, cp, tp, sp, pp, schedule)
        opts = self.options.get(okey) if self.shared_where else None
        if opts is None:
            base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
            mbs_options = [b for b in all_mbs if _schedule_ok(base, self.train.global_batch // (dp * b))]
            acs = [ac for ac in _ac_modes(self.model) if self.where is None or self.where(_with(base, base.mbs, ac))]
            opts = self.options[okey] = (mbs_options, acs)
        return opts

    def _shapes_of(self, layout: Layout) -> tuple[RankShape, ...]:
        key = (layout.tp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2)
        shapes = self.rank_shapes.get(key)
        if shapes is None:
            shapes = self.rank_shapes[key] = memory.rank_shapes(self.model, layout)
        return shapes

    def _floor_fit(
        self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int, schedule: str, ep: int
    ) -> bool | tuple:
        """False when the structure fits at no mbs or ac (most do not), else (its rank shapes, their
        RankEntry). The floor (PeakCache.floor) reads only these fields: the rank shapes come from tp,
        pp, vpp and the V schedule, not from sp nor the schedule otherwise."""
        fkey = (dp, cp, zero, shard, tp, pp, vpp, schedule == "zero-bubble" and vpp == 2, ep)
        fit = self.floor_fits.get(fkey)
        if fit is not None:
            return fit
        if zero and 1 < shard < dp:
            # the floor only shrinks as the sharding group grows (every term is divided by it or does
            # not read it, for shard > 1): if the whole dp group's fails, this one's does too
            widest = fkey[:3] + (dp,) + fkey[4:]
            if widest not in self.widest_fits:
                whole = _layout(dp, zero, dp, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
                self.widest_fits[widest] = all(
                    self.peaks.floor(whole, sh) <= self.usable for sh in self._shapes_of(whole)
                )
            if not self.widest_fits[widest]:
                self.floor_fits[fkey] = False
                return False
        base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
        shapes = self._shapes_of(base)
        fit = all(self.peaks.floor(base, sh) <= self.usable for sh in shapes)
        self.floor_fits[fkey] = fit = fit and (shapes, [self.peaks.rank_entry(base, sh, self.train) for sh in shapes])
        return fit

    def _fits(
        self, base: Layout, entries: list[RankEntry], table: dict, lt: TrainSpec, m: int, ac: str, mbs: int
    ) -> tuple[Layout | None, bool]:
        """Whether ``base`` at (ac, mbs) fits on every rank, and its layout when one was built: every
        rank's fit floor first (memory.candidates_floor), then the full peaks (PeakCache.total_from);
        under the interleaved runtime a rank below its ceiling fits without its moments. Most tries
        are refused before a layout is built."""
        layout = None
        if self.model.states_only:
            layout = _with(base, mbs, ac)
            return layout, all(self.peaks.fits(layout, e.shape, m, e.static, lt, self.usable, table) for e in entries)
        usable = self.usable
        full: list[tuple[RankEntry, tuple]] = []
        for e in entries:
            per_mb = table.get((ac, mbs, e.shape.pp_rank))
            if per_mb is None:
                layout = layout or _with(base, mbs, ac)
                per_mb = table[ac, mbs, e.shape.pp_rank] = self.peaks.per_micro_batch(layout, e.shape, m, lt)
            if memory.candidates_floor(e.halves, per_mb) > usable:
                return layout, False
            if e.ceiling is not None and e.ceiling + memory.ceiling_activations(per_mb) <= usable:
                continue
            full.append((e, per_mb))
        if full:
            layout = layout or _with(base, mbs, ac)
            for e, per_mb in full:
                if self.peaks.total_from(layout, e.shape, m, e.static, lt, per_mb) > usable:
                    return layout, False
        return layout, True

    # ------------------------------------------------------------------ ranking
    def _rank(self) -> SearchResult:
        """Weigh the layouts in order of their compute-only lower bound, which reads no memory: each
        group of layouts sharing one bound is checked for memory, and its fitting ones estimated, until
        the ``keep`` best are known and the next bound is slower than the worst of them (no layout
        after it can make the top), so the memory of the layouts past that point is never worked out:
        ``result.checked`` counts those weighed, ``result.fitting`` those of them that fit. A fitting
        layout whose tighter bound (every part of the step but the data-parallel collectives) is slower
        is not estimated. Exact ties between rank keys go to the earlier enumerated layout, as if
        estimated in that order."""
        result, keep = self.result, self.keep
        keys: list[tuple] = []  # (_rank_key, enumeration index) of result.best, in order
        for bound, _, gkey, ac, mbs in self._bounded():
            if len(result.best) >= keep and bound > result.best[-1].time.step_s:
                break
            widest_failed: set[int] = set()  # the ZeRO stages whose whole-dp sharding group does not fit
            for s_index, fields, (mbs_options, acs) in self._widest_first(gkey):
                if not self.shared_where and (ac not in acs or mbs not in mbs_options):
                    continue
                result.checked += 1
                dp, zero, shard = fields[:3]
                if zero and 1 < shard < dp and zero in widest_failed:
                    continue  # what does not fit the whole-dp sharding group fits no narrower one
                layout, shapes = self._fitting(s_index, fields, ac, mbs)
                if layout is None:
                    if zero and shard == dp:
                        widest_failed.add(zero)
                    continue
                result.fitting += 1
                if len(result.best) >= keep:
                    worst = result.best[-1].time.step_s
                    if bound > worst:
                        break
                    if self._slower_than(layout, shapes, worst):
                        continue
                e = estimate(
                    self.model,
                    self.cluster,
                    self.train,
                    layout,
                    self.headroom,
                    self.stages,
                    self.peaks.memories(layout, shapes, self.capacity),
                )
                keep_ranked(result.best, keys, e, (s_index, _AC_ORDER[ac], mbs), keep)
        result.best = break_ties(result.best, self.usable)
        result.pool = result.best[:]
        del result.best[self.top :]
        return result

    def _widest_first(self, gkey: tuple) -> list[tuple]:
        """The group's structures, for each ZeRO stage the whole-dp sharding group first. Whether a
        layout fits only improves as the sharding group grows (every state is divided by it or does not
        read it; FSDP2's padded shard, ceil(rows / shard), shrinks too): what does not fit the whole dp
        group fits no narrower one. The order of the estimates changes nothing (:meth:`_rank`)."""
        members = self.ordered.get(gkey)
        if members is None:
            members = self.ordered[gkey] = sorted(self.groups[gkey], key=lambda s: (s[1][1], s[1][2] != s[1][0]))
        return members

    def _bounded(self) -> list[tuple[float, tuple, tuple, str, int]]:
        """(compute-only bound, first enumeration index, group, ac, mbs) of every group and (ac, mbs)
        of its structures, fastest first; a group none of whose structures has a memory floor that
        fits is left out."""
        out = []
        for gkey, members in self.groups.items():
            if not any(self._floor_fit(*fields) for _, fields, _ in members):
                # no member's memory floor fits: none of its layouts does (checked, as a whole)
                self.result.checked += sum(len(acs) * len(mbs_options) for _, _, (mbs_options, acs) in members)
                continue
            seen: set[tuple] = set()
            for s_index, fields, (mbs_options, acs) in members:
                for ac in acs:
                    for mbs in mbs_options:
                        if (ac, mbs) in seen:
                            continue
                        seen.add((ac, mbs))
                        out.append((self._bound(fields, ac, mbs), (s_index, _AC_ORDER[ac], mbs), gkey, ac, mbs))
                if self.shared_where:  # every member has the same options
                    break
        out.sort(key=lambda b: (b[0], b[1]))
        return out

    def _bound(self, fields: tuple, ac: str, mbs: int) -> float:
        """The compute-only lower bound of the structure ``fields`` at (ac, mbs), cached by what it reads."""
        dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep = fields
        key = (tp, cp, pp, vpp, schedule, mbs, ac, sp, ep if self.model.moe else 1)
        bound = self.bounds.get(key)
        if bound is None:
            layout = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, mbs, ac, ep)
            bound = self.bounds[key] = lower_bound_step_s(
                self.model, self.cluster, self.train, layout, compute_only=True, stage_cache=self.stages
            )
        return bound

    def _fitting(self, s_index: int, fields: tuple, ac: str, mbs: int) -> tuple[Layout | None, tuple]:
        """The structure's layout at (ac, mbs) and its rank shapes if it fits on every rank, else None:
        the structure's memory floor first (cached), then the layout's peaks."""
        base = self.bases.get(s_index)
        if base is None:
            fit = self._floor_fit(*fields)
            if not fit:
                self.bases[s_index] = base = (None, (), None, {})
            else:
                layout = _layout(*fields[:9], 1, "none", fields[9])
                lt = self.local_trains.get(layout.cp)
                if lt is None:
                    lt = self.local_trains[layout.cp] = local_train(self.train, layout)
                self.bases[s_index] = base = (layout, fit, lt, self.peaks.table_of(layout))
        layout, fit, lt, table = base
        if layout is None:
            return None, ()
        shapes, entries = fit
        found, fits = self._fits(layout, entries, table, lt, self.train.global_batch // (layout.dp * mbs), ac, mbs)
        return ((found or _with(layout, mbs, ac)) if fits else None), shapes

    def _slower_than(self, layout: Layout, shapes: tuple[RankShape, ...], worst: float) -> bool:
        """Whether a lower bound of the layout's step is above ``worst``: the optimizer plus, for a
        mixture of experts, compute and the expert all-to-alls first (cheaper; most refusals of a
        mixture of experts are for those), then the tighter bound. Each part is cached by the fields
        it reads (cost/estimate.py)."""
        model, cluster, train = self.model, self.cluster, self.train
        okey = (
            layout.tp,
            layout.cp,
            layout.pp,
            layout.vpp,
            layout.schedule == "zero-bubble" and layout.vpp == 2,
            layout.ep,
            layout.zero >= 1,
            layout.shard,
            layout.dp > 1,
        )
        opt_s = self.optimizers.get(okey)
        if opt_s is None:
            opt_s = self.optimizers[okey] = optimizer_seconds(model, cluster, train, layout, shapes)
        if model.moe and not model.states_only:
            key = (
                layout.tp,
                layout.cp,
                layout.pp,
                layout.vpp,
                layout.schedule,
                layout.mbs,
                layout.ac,
                layout.ep,
                layout.sp,
            )
            busy = self.with_experts.get(key)
            if busy is None:
                busy = self.with_experts[key] = lower_bound_experts_s(model, cluster, train, layout, self.stages)
            if busy + opt_s > worst:
                return True
        key = (
            layout.tp,
            layout.cp,
            layout.pp,
            layout.vpp,
            layout.schedule,
            layout.mbs,
            layout.ac,
            layout.ep,
            layout.sp,
            layout.zero >= 2,
        )
        busy = self.tight.get(key)
        if busy is None:
            busy = self.tight[key] = lower_bound_step_s(model, cluster, train, layout, stage_cache=self.stages)
        return busy + opt_s > worst
