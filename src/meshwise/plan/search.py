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
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meshwise.cost import memory
from meshwise.cost.context_parallel import local_train
from meshwise.cost.estimate import DEFAULT_HEADROOM, estimate
from meshwise.cost.memory import RankShape
from meshwise.cost.memory_peaks import RankEntry
from meshwise.cost.plan_cache import PlanCache, plan_cache
from meshwise.layout import AC_MODES, Degrees, Layout, runs_here
from meshwise.plan.bounds import Bounds, OrderBroken, compute_key, in_bound_order, past, v_shape
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
    of_kind,
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
        kind = getattr(where, "ep_split", None)
        if kind is not None and cache is not None and cache.search_state is not None:
            found = cache.search_state.of_kind(kind, top, headroom)
            if found is not None:
                return found
        cache = plan_cache(model, cluster, train, cache)
        if train.runtime == "megatron" and not model.states_only:  # Megatron-Core's memory and MoE folding
            return search_megatron(cache, top, headroom, where)
        searched = _Search(model, cluster, train, top, headroom, where, cache)
        result = searched.run()
        if where is None:  # the plan's own search: of_kind serves the explanation's
            cache.search_state = searched
        return result


def anything_fits(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    headroom: float = DEFAULT_HEADROOM,
    cache: PlanCache | None = None,
) -> bool:
    """Whether ``search(model, cluster, train, 1, headroom).best`` holds a layout, by memory alone:
    the search's own structures and memory checks (:meth:`_Search.any_fits`), no time bound, ending at
    the first layout that fits. A search that finds nothing works out every layout's memory and the
    time bound of every group with a fitting floor; this works out only the memory. Under
    ``--runtime megatron`` (plan/megatron_search.py), the search itself answers."""
    cache = plan_cache(model, cluster, train, cache)
    if train.runtime == "megatron" and not model.states_only:
        return bool(search(model, cluster, train, 1, headroom, cache=cache).best)
    with _collector_paused():
        return _Search(model, cluster, train, 1, headroom, None, cache).any_fits()


class _Search:
    """One search: its memo tables are the fields, its prunings the methods. Every memo is keyed by a
    structure's :class:`Degrees` or a plain tuple of the fields its answer reads (plan/bounds.py),
    so one answer serves every layout that shares them. Each pruning below says why it drops nothing that could fit or
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
        self.bounds = Bounds(model, cluster, train, cache.stages, with_dp=False)
        # the structures by what their compute-only bound reads: (enumeration index, degrees, options) each
        self.groups: dict[tuple, list[tuple[int, Degrees, tuple[list[int], list[str]]]]] = {}
        self.structures = 0
        self.ordered: dict[tuple, list] = {}  # the groups' structures, widest sharding group first (_widest_first)
        self.bases: dict[int, tuple[Layout, tuple, TrainSpec, dict]] = {}  # a fitting floor's base, by structure
        self.bounded: list[tuple] = []  # :meth:`_parents`' list, kept for :meth:`of_kind`
        self.modes: dict[tuple, list[tuple[int, list[str]]]] = {}  # (mbs, its modes), by group
        self.refused: set[tuple] = set()  # the groups of one ranking none of whose floors fits

    def run(self) -> SearchResult:
        self._enumerate_all()
        self.bounded = self._parents()
        return self._rank(self.bounded, self.result, self.keep, self.top, self.usable)

    def any_fits(self) -> bool:
        """Whether :meth:`run` ranks any layout: :meth:`_rank` estimates the first layout that
        :meth:`_fitting` passes, so this asks :meth:`_fitting` of the same layouts (each group with a
        fitting floor, each of its (ac, mbs) as :meth:`_modes` lists them, its structures widest
        sharding group first with the same skips), in the groups' order, until one fits."""
        self._enumerate_all()
        for gkey, members in self.groups.items():
            if not any(self._floor_fit(d) for _, d, _ in members):
                continue
            for ac, mbs in ((ac, mbs) for mbs, acs in self._modes(gkey) for ac in acs):
                widest_failed: set[int] = set()
                for s_index, d, (mbs_options, acs) in self._widest_first(gkey):
                    if not self.shared_where and (ac not in acs or mbs not in mbs_options):
                        continue
                    if d.zero and 1 < d.shard < d.dp and d.zero in widest_failed:
                        continue
                    if self._fitting(s_index, d, ac, mbs)[0] is not None:
                        return True
                    if d.zero and d.shard == d.dp:
                        widest_failed.add(d.zero)
        return False

    def of_kind(self, split: bool, top: int, headroom: float) -> SearchResult | None:
        """The first layout (and the enumerated count) of what ``search(..., top, headroom, where=<the
        layouts of the other kind than a winner with ``split``>)`` answers, from this search's groups,
        order and caches: the same layouts, filed and ordered alike (their enumeration indices are a
        subsequence of this search's), weighed afresh until no layout can change that first one
        (plan/bounds.py ``past``). None where that search would answer otherwise: another usable
        memory, or no layout of that kind in this search's enumeration (it would go on to cp past
        CP_MIN_TOKENS)."""
        if self.capacity * (1 - headroom) != self.usable:
            return None
        result = SearchResult()
        for gkey, members in self.groups.items():
            if (gkey[-1] == 1) == split:
                result.enumerated += sum(len(acs) * len(mbs_options) for _, _, (mbs_options, acs) in members)
        if not result.enumerated:
            return None
        return self._rank(of_kind(self.bounded, split), result, max(top, RUNNER_UP_POOL), top, self.usable, band=True)

    def _enumerate_all(self) -> None:
        for cp_bound in (True, False):  # cp past CP_MIN_TOKENS only when no layout within it is valid
            for degrees, all_mbs in _structure_fields(
                self.model, self.cluster.world_size, self.train.global_batch, self.train.seq_len, cp_bound
            ):
                self._enumerate(degrees, all_mbs)
            if self.result.enumerated:
                break

    def _enumerate(self, d: Degrees, all_mbs: list[int]) -> None:
        """Count the structure's layouts and file it under what its compute-only bound reads."""
        opts = self._options(d, all_mbs)
        mbs_options, acs = opts
        if not acs:
            return
        self.result.enumerated += len(acs) * len(mbs_options)
        gkey = compute_key(d, self.model.moe)
        members = self.groups.get(gkey)
        if members is None:
            members = self.groups[gkey] = []
        members.append((self.structures, d, opts))
        self.structures += 1

    # ------------------------------------------------------------------ what fits
    def _options(self, d: Degrees, all_mbs: list[int]) -> tuple[list[int], list[str]]:
        """The structure's micro-batch sizes the schedule admits and the checkpointing modes ``where``
        admits (shared by every structure with the same fields runs_here reads and dp)."""
        okey = (d.dp, d.cp, d.tp, d.sp, d.pp, d.schedule)
        opts = self.options.get(okey) if self.shared_where else None
        if opts is None:
            base = d.layout()
            mbs_options = [b for b in all_mbs if _schedule_ok(base, self.train.global_batch // (d.dp * b))]
            acs = [ac for ac in _ac_modes(self.model) if self.where is None or self.where(_with(base, base.mbs, ac))]
            opts = self.options[okey] = (mbs_options, acs)
        return opts

    def _shapes_of(self, layout: Layout) -> tuple[RankShape, ...]:
        key = (layout.tp, layout.pp, layout.vpp, v_shape(layout))
        shapes = self.rank_shapes.get(key)
        if shapes is None:
            shapes = self.rank_shapes[key] = memory.rank_shapes(self.model, layout)
        return shapes

    def _floor_fit(self, d: Degrees) -> bool | tuple:
        """False when the structure fits at no mbs or ac (most do not), else (its rank shapes, their
        RankEntry). The floor (PeakCache.floor) reads only the fields of its key: the rank shapes come
        from tp, pp, vpp and the V schedule, not from sp nor the schedule otherwise."""
        fkey = (d.dp, d.cp, d.zero, d.shard, d.tp, d.pp, d.vpp, v_shape(d), d.ep)
        fit = self.floor_fits.get(fkey)
        if fit is not None:
            return fit
        if d.zero and 1 < d.shard < d.dp:
            # the floor only shrinks as the sharding group grows (every term is divided by it or does
            # not read it, for shard > 1): if the whole dp group's fails, this one's does too
            widest = (d.dp, d.cp, d.zero, d.dp, *fkey[4:])
            if widest not in self.widest_fits:
                whole = d._replace(shard=d.dp).layout()
                self.widest_fits[widest] = all(
                    self.peaks.floor(whole, sh) <= self.usable for sh in self._shapes_of(whole)
                )
            if not self.widest_fits[widest]:
                self.floor_fits[fkey] = False
                return False
        base = d.layout()
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
    def _rank(
        self, parents: list[tuple], result: SearchResult, keep: int, top: int, usable: float, band: bool = False
    ) -> SearchResult:
        """Weigh the layouts in order of their compute-only lower bound (worked out lazily:
        plan/bounds.py ``in_bound_order``), which reads no memory: each group of layouts sharing one
        bound is checked for memory, and its fitting ones estimated, until the ``keep`` best are known
        and the next bound is slower than the worst of them (no layout after it can make the top), so
        neither the memory nor the bounds of the layouts past that point are worked out:
        ``result.checked`` counts those weighed, ``result.fitting`` those of them that fit. A fitting
        layout whose tighter bound (every part of the step but the data-parallel collectives) is slower
        is not estimated. Exact ties between rank keys go to the earlier enumerated layout, as if
        estimated in that order. ``parents``: :meth:`_parents`' list, or a part of it; with ``band``
        only the first layout is exact (plan/bounds.py ``past``). Where a bound
        breaks the lazy order's premise (``OrderBroken``) every group is expanded first and the
        ranking starts again."""
        checked, fitting = result.checked, result.fitting
        try:
            self.refused = set()
            self._weigh(in_bound_order(parents, self._expand), result, keep, band)
        except OrderBroken:
            result.best, result.checked, result.fitting, self.refused = [], checked, fitting, set()
            eager = [c for p in parents for c in self._expand(p)]
            self._weigh(in_bound_order(eager, self._expand), result, keep, band)
        for gkey in self.refused:  # no member's memory floor fits: none of its layouts does (checked, as a whole)
            result.checked += sum(len(acs) * len(mbs_options) for _, _, (mbs_options, acs) in self.groups[gkey])
        result.best = break_ties(result.best, usable)
        result.pool = result.best[:]
        del result.best[top:]
        return result

    def _weigh(self, order: Iterator[tuple], result: SearchResult, keep: int, band: bool) -> None:
        """:meth:`_rank`'s loop over ``order`` (plan/bounds.py ``in_bound_order``)."""
        keys: list[tuple] = []  # (_rank_key, enumeration index) of result.best, in order
        for bound, _, gkey, ac, mbs in order:
            if bound > past(result.best, keep, band):
                break
            if ac is None:  # a parent: in_bound_order expands it next
                continue
            widest_failed: set[int] = set()  # the ZeRO stages whose whole-dp sharding group does not fit
            for s_index, d, (mbs_options, acs) in self._widest_first(gkey):
                if not self.shared_where and (ac not in acs or mbs not in mbs_options):
                    continue
                result.checked += 1
                if d.zero and 1 < d.shard < d.dp and d.zero in widest_failed:
                    continue  # what does not fit the whole-dp sharding group fits no narrower one
                layout, shapes = self._fitting(s_index, d, ac, mbs)
                if layout is None:
                    if d.zero and d.shard == d.dp:
                        widest_failed.add(d.zero)
                    continue
                result.fitting += 1
                worst = past(result.best, keep, band)
                if bound > worst:
                    break
                if worst < math.inf and self.bounds.slower(layout, worst, shapes):
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

    def _widest_first(self, gkey: tuple) -> list[tuple]:
        """The group's structures, for each ZeRO stage the whole-dp sharding group first. Whether a
        layout fits only improves as the sharding group grows (every state is divided by it or does not
        read it; FSDP2's padded shard, ceil(rows / shard), shrinks too): what does not fit the whole dp
        group fits no narrower one. The order of the estimates changes nothing (:meth:`_rank`)."""
        members = self.ordered.get(gkey)
        if members is None:
            members = self.ordered[gkey] = sorted(self.groups[gkey], key=lambda s: (s[1].zero, s[1].shard != s[1].dp))
        return members

    def _parents(self) -> list[tuple[float, tuple, tuple, None, int]]:
        """(compute-only bound, (first enumeration index, -1, mbs), group, None, mbs): for every group
        and mbs of its structures, the bound at the first checkpointing mode there, which bounds the
        others (plan/bounds.py ``Bounds.order_s``); :meth:`_expand` makes the (ac, mbs) entries."""
        out = []
        for gkey, members in self.groups.items():
            s_index, d, _ = members[0]
            for mbs, acs in self._modes(gkey):
                bound = self.bounds.compute_s(d.layout(mbs, acs[0]))
                out.append((bound, (s_index, -1, mbs), gkey, None, mbs))
        return out

    def _modes(self, gkey: tuple) -> list[tuple[int, list[str]]]:
        """The group's (mbs, the checkpointing modes of its structures there, in AC_MODES' order)."""
        found = self.modes.get(gkey)
        if found is None:
            members = self.groups[gkey]
            if self.shared_where:  # every member has the same options
                members = members[:1]
            found = self.modes[gkey] = [
                (mbs, acs)
                for mbs in (1, 2, 4, 8, 16, 32)
                if (acs := [a for a in AC_MODES if any(a in o[1] and mbs in o[0] for _, _, o in members)])
            ]
        return found

    def _expand(self, parent: tuple) -> list[tuple]:
        """The (compute-only bound, (first enumeration index, ac's order, mbs), group, ac, mbs) entries
        of a parent (:meth:`_parents`); none for a group none of whose structures has a memory floor
        that fits (:meth:`_rank` counts its layouts checked)."""
        bound, (s_index, _, mbs), gkey, _, _ = parent
        members = self.groups[gkey]
        if gkey in self.refused or not any(self._floor_fit(d) for _, d, _ in members):
            self.refused.add(gkey)
            return []
        acs = next(a for b, a in self._modes(gkey) if b == mbs)
        d = members[0][1]
        out = [(bound, (s_index, _AC_ORDER[acs[0]], mbs), gkey, acs[0], mbs)]
        for ac in acs[1:]:
            out.append((self.bounds.compute_s(d.layout(mbs, ac)), (s_index, _AC_ORDER[ac], mbs), gkey, ac, mbs))
        return out

    def _fitting(self, s_index: int, d: Degrees, ac: str, mbs: int) -> tuple[Layout | None, tuple]:
        """The structure's layout at (ac, mbs) and its rank shapes if it fits on every rank, else None:
        the structure's memory floor first (cached), then the layout's peaks."""
        base = self.bases.get(s_index)
        if base is None:
            fit = self._floor_fit(d)
            if not fit:
                self.bases[s_index] = base = (None, (), None, {})
            else:
                layout = d.layout()
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
