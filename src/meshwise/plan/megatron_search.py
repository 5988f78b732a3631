"""The search under ``--runtime megatron``: the same layouts as plan/search.py under Megatron-Core's
schedules (1F1B and interleaved 1F1B) plus expert
parallelism folded over the TP ranks (Megatron-Core's MoE parallel folding), judged by Megatron-Core's
memory (cost/megatron_memory.py) rather than meshwise's runtime's. Pure Python, no torch.

Plainer than the main search (no memory floor): the layouts are weighed fastest bound first (the
order bound, plan/bounds.py ``Bounds.order_s``, raised to the group's tighter floor when its entry
comes up; both worked out lazily), a weighed layout's memory is worked out (cached by what it reads)
and the fitting ones timed, and the first whose bound is slower than the worst of the best
``max(top, RUNNER_UP_POOL)`` ends it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from meshwise.cost.context_parallel import local_train, tp_overlap_on
from meshwise.cost.estimate import (
    DEFAULT_HEADROOM,
    dp_reads_m,
    dp_unhidden_seconds,
    estimate,
    lower_bound_dp_floor_s,
    reduces_per_micro_batch,
)
from meshwise.cost.megatron_memory import states_of, transient
from meshwise.cost.memory import Memory, rank_shapes
from meshwise.cost.plan_cache import PlanCache
from meshwise.layout import AC_MODES, Degrees, Layout
from meshwise.plan.bounds import Bounds, OrderBroken, compute_key, in_bound_order, past
from meshwise.plan.candidates import (
    RUNNER_UP_POOL,
    SearchResult,
    _ac_modes,
    _divisors,
    _schedule_ok,
    _structure_fields,
    _with,
    break_ties,
    keep_ranked,
    of_kind,
)
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")  # Megatron-Core's pipeline schedules
_FLOORS = 6  # the item of a ranking entry (_Weigh) that holds its floors: None until it is bounded
_AC_ORDER = {ac: i for i, ac in enumerate(AC_MODES)}  # the enumeration's order of checkpointing modes


def _fields(
    model: ModelSpec, world: int, global_batch: int, seq_len: int, cp_bound: bool = True
) -> Iterator[tuple[Degrees, list[int]]]:
    """plan/search.py's structures, and after each one with ep=1 and tp > 1 of a mixture of experts
    the same with ep folded over tp (a multiple of tp dividing dp_shard x cp x tp, not dp_shard x cp)."""
    for d, mbs_options in _structure_fields(model, world, global_batch, seq_len, cp_bound):
        if d.schedule not in MEGATRON_SCHEDULES:
            continue
        yield d, mbs_options
        if d.ep != 1 or d.tp == 1 or not model.moe or model.states_only:
            continue
        for folded in _divisors(d.shard * d.cp * d.tp):
            if folded % d.tp == 0 and (d.shard * d.cp) % folded and model.experts % folded == 0:
                yield d._replace(ep=folded), mbs_options


def search_megatron(
    cache: PlanCache,
    top: int = 5,
    headroom: float = DEFAULT_HEADROOM,
    where: Callable[[Layout], bool] | None = None,
    cp_bound: bool = True,
) -> SearchResult:
    """plan/search.py's search under Megatron-Core's memory, of the plan of ``cache`` (its model, cluster
    and setting; cost/plan_cache.py); cp past CP_MIN_TOKENS (``cp_bound`` False) only when no layout
    within it is valid (search._structure_fields). As in plan/search.py, the layouts are weighed in
    order of their compute-only bound, and memory is worked out only for those no bound refuses:
    ``result.checked`` counts them, ``result.fitting`` those of them that fit."""
    model, cluster, train = cache.model, cache.cluster, cache.train
    result = SearchResult()
    # the structures by what their compute-only bound reads but (mbs, ac): (enumeration index, base,
    # the (mbs, micro-batches) the schedule admits, the (ac, mbs) ``where`` admits or None for all)
    groups: dict[tuple, list[tuple]] = {}
    counts: dict[tuple, int] = {}  # the layouts each group holds
    index = 0
    acs = _ac_modes(model)
    schedule_runs: dict[tuple, tuple] = {}  # the runs by what _schedule_ok reads: dp (with mbs, m), pp, schedule
    for d, mbs_options in _fields(model, cluster.world_size, train.global_batch, train.seq_len, cp_bound):
        base = d.layout()
        runs = schedule_runs.get((d.dp, d.pp, d.schedule))
        if runs is None:
            runs = schedule_runs[d.dp, d.pp, d.schedule] = tuple(
                (mbs, train.global_batch // (d.dp * mbs))
                for mbs in mbs_options
                if _schedule_ok(base, train.global_batch // (d.dp * mbs))
            )
        admitted = None
        if where is not None:
            admitted = frozenset((ac, mbs) for ac in acs for mbs, _ in runs if where(_with(base, mbs, ac)))
            if not admitted:
                continue  # ``where`` admits none of its layouts: nothing to bound or weigh
        gkey = compute_key(d, model.moe)
        members = groups.get(gkey)
        if members is None:
            members = groups[gkey] = []
            counts[gkey] = 0
        counts[gkey] += len(runs) * len(acs) if admitted is None else len(admitted)
        members.append((index, base, admitted))
        index += 1
    result.enumerated = sum(counts.values())
    if cp_bound and not result.enumerated:
        return search_megatron(cache, top, headroom, where, cp_bound=False)
    weigh = _Weigh(model, cluster, train, headroom, cache.stages, groups, counts)
    weigh.parents = weigh.parents_of()
    if where is None:
        cache.search_state = weigh
    return weigh.rank(weigh.parents, result, top)


class _Weigh:
    """The ranking of search_megatron: every group's (ac, mbs) by its order bound (plan/bounds.py
    ``Bounds.order_s``: compute plus expert all-to-alls for a mixture of experts, else compute),
    fastest first and worked out lazily (a group's first mode at each mbs bounds its others:
    ``in_bound_order``), each (group, ac, mbs) raised to its floors when it comes up (:meth:`_bounded`:
    the tighter bound plus the least optimizer step of its members, per ZeRO kind) and put back in
    order, each layout's Megatron-Core memory (megatron_memory, its two parts cached apart) checked
    and the fitting ones estimated into ``result.best`` (held by (_rank_key, enumeration index), so
    the order of the estimates changes nothing), until the next bound is slower than the worst of
    the best ``keep``. A member whose kind's floor is slower is skipped before its memory is worked
    out; a fitting layout whose own bounds are slower (plan/bounds.py) is not estimated."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        train: TrainSpec,
        headroom: float,
        stages: dict,
        groups: dict[tuple, list[tuple]],
        counts: dict[tuple, int],
    ) -> None:
        self.model, self.cluster, self.train, self.headroom, self.stages = model, cluster, train, headroom, stages
        self.groups, self.counts = groups, counts
        self.parents: list[tuple] = []  # :meth:`parents_of`'s list
        self.capacity = cluster.accelerator.memory_bytes
        self.usable = self.capacity * (1 - headroom)
        self.bounds = Bounds(model, cluster, train, stages, with_dp=True)
        self.structures: dict[int, tuple | None] = {}  # (rank shapes, their states, local setting, overlap)
        self.states: dict[tuple, tuple] = {}  # (rank shapes, their states, whether one overflows) by what they read
        self.any_fits: dict[tuple, bool] = {}  # whether any member's states fit (:meth:`_any_fits`), by group
        self.transients: dict[tuple, list[tuple[float, float]]] = {}  # megatron_memory.transient of every rank
        self.modes: dict[tuple, list[tuple[int, list[str]]]] = {}  # (mbs, its admitted modes), by group
        self.floors: dict[tuple, dict] = {}  # :meth:`_optimizer_floors`, by group
        self.cheap: dict[tuple, dict] = {}  # :meth:`_cheap_floors`, by (group, ac, mbs)
        self.unhidden: dict[tuple, list[float]] = {}  # :meth:`_unhidden`, by (enumeration index, m)
        self.refused: set[tuple] = set()  # the groups of one ranking refused as a whole
        self.band = False  # whether the ranking asks only for its first layout (:meth:`rank`)

    def rank(self, parents: list[tuple], result: SearchResult, top: int, band: bool = False) -> SearchResult:
        """``result`` with the best ``top`` of the layouts of ``parents`` (:meth:`parents_of`'s list or a
        part of it), ties broken, and the pool of the best ``max(top, RUNNER_UP_POOL)``; with ``band``
        only its first layout is exact (plan/bounds.py ``past``). Where a bound
        breaks the lazy order's premise (plan/bounds.py ``OrderBroken``), every group is expanded
        first and the ranking starts again."""
        checked, fitting = result.checked, result.fitting
        self.band = band
        try:
            self.refused = set()
            self._weigh(in_bound_order(parents, self._expand, _FLOORS), result, max(top, RUNNER_UP_POOL), band)
        except OrderBroken:
            result.best, result.checked, result.fitting, self.refused = [], checked, fitting, set()
            eager = [child for p in parents for c in self._expand(p) for child in self._expand_parent(c)]
            self._weigh(in_bound_order(eager, self._expand, _FLOORS), result, max(top, RUNNER_UP_POOL), band)
        result.checked += sum(self.counts[g] for g in self.refused)  # refused as a whole
        result.best = break_ties(result.best, self.usable)
        result.pool = result.best[:]
        del result.best[top:]
        return result

    def of_kind(self, split: bool, top: int, headroom: float) -> SearchResult | None:
        """plan/search.py's ``_Search.of_kind``: the search of the layouts of the other kind than a
        winner with ``split``, from this search's groups, bounds and caches: its first layout (and
        enumerated count) is that search's."""
        if self.capacity * (1 - headroom) != self.usable:
            return None
        result = SearchResult(enumerated=sum(n for g, n in self.counts.items() if (g[-1] == 1) == split))
        if not result.enumerated:
            return None
        return self.rank(of_kind(self.parents, split), result, top, band=True)

    def _weigh(self, order: Iterator[tuple], result: SearchResult, keep: int, band: bool) -> None:
        keys: list[tuple] = []
        best = result.best
        for bound, _, gkey, ac, mbs, m, floors in order:
            if bound > past(best, keep, band):
                break
            if floors is None:  # a parent, or a child not yet bounded: in_bound_order expands it next
                continue
            members = self.groups[gkey]
            parts = None  # every rank's transient memory: the members share it (tp, sp, cp, the runs, ep)
            for index, base, admitted in members:
                if admitted is not None and (ac, mbs) not in admitted:
                    continue
                worst = past(best, keep, band)
                full = worst < math.inf
                if bound > worst:
                    break
                if floors[reduces_per_micro_batch(base)] > worst:  # Bounds.slower would say so too
                    continue
                result.checked += 1
                found = self._structure(index, base)
                if found is None:  # its states alone overflow a rank
                    continue
                if parts is None:
                    parts = self._transient(found, base, ac, mbs, m)
                if not self._fits(found, parts):
                    continue
                result.fitting += 1
                layout = _with(base, mbs, ac)
                if full and (
                    self._member_floor(index, base, found[0], layout, worst) > worst
                    or self.bounds.slower(layout, worst)
                ):
                    continue
                mems = tuple(
                    Memory(*st, activations=a, other=o, capacity=self.capacity) for st, (a, o) in zip(found[1], parts)
                )
                e = estimate(self.model, self.cluster, self.train, layout, self.headroom, self.stages, mems)
                keep_ranked(best, keys, e, (index, _AC_ORDER[ac], mbs), keep)

    def parents_of(self) -> list[tuple]:
        """(order bound, (first enumeration index, -1, mbs), group, None, mbs, micro-batches, None): for every
        group and mbs, the order bound at the first checkpointing mode admitted there, which bounds the
        others (``Bounds.order_s``); :meth:`_expand` makes the (ac, mbs) entries of one. The members
        of a group share their runs (dp follows tp, cp, pp). For a mixture of experts each starts at
        its compute-only bound (Bounds.compute_s, below the order bound; -2 in its tie key), its
        expert all-to-alls added when it first comes up."""
        out = []
        lazy = self.model.moe and not self.model.states_only
        for gkey, members in self.groups.items():
            index, base, _ = members[0]
            for mbs, acs in self._modes(gkey):
                m = self.train.global_batch // (base.dp * mbs)
                layout = _with(base, mbs, acs[0])
                if lazy:
                    out.append((self.bounds.compute_s(layout), (index, -2, mbs), gkey, None, mbs, m, None))
                else:
                    out.append((self.bounds.order_s(layout), (index, -1, mbs), gkey, None, mbs, m, None))
        return out

    def _modes(self, gkey: tuple) -> list[tuple[int, list[str]]]:
        """The group's (mbs, the checkpointing modes any member admits there, in AC_MODES' order)."""
        found = self.modes.get(gkey)
        if found is None:
            members = self.groups[gkey]
            base = members[0][1]
            found = []
            for mbs in (1, 2, 4, 8, 16, 32):
                if self.train.global_batch % (base.dp * mbs) or not _schedule_ok(
                    base, self.train.global_batch // (base.dp * mbs)
                ):
                    continue
                acs = [ac for ac in _ac_modes(self.model) if any(a is None or (ac, mbs) in a for _, _, a in members)]
                if acs:
                    found.append((mbs, acs))
            self.modes[gkey] = found
        return found

    def _expand_parent(self, entry: tuple) -> list[tuple]:
        """``entry`` expanded where it is still a parent at its order bound (:meth:`parents_of`), else itself."""
        return self._expand(entry) if entry[3] is None else [entry]

    def _modes_at(self, gkey: tuple, mbs: int) -> list[str]:
        """The checkpointing modes any member of the group admits at ``mbs`` (:meth:`_modes`)."""
        return next(a for b, a in self._modes(gkey) if b == mbs)

    def _expand(self, parent: tuple) -> list[tuple]:
        """The (order bound, (index, ac's order, mbs), group, ac, mbs, micro-batches, None) entries of a
        parent (:meth:`parents_of`); none for a group none of whose members' states fit (its layouts
        are counted checked, as a whole, once per ranking). Such an entry (ac given, no floors) is
        bounded when it comes first (:meth:`_bounded`)."""
        bound, (index, stage, mbs), gkey, ac, _, m, _ = parent
        if ac is not None:
            return [self._bounded(parent)]
        members = self.groups[gkey]
        if stage == -2:  # at its compute-only bound: the order bound next (parents_of)
            first = _with(members[0][1], mbs, self._modes_at(gkey, mbs)[0])
            return [(self.bounds.order_s(first), (index, -1, mbs), gkey, None, mbs, m, None)]
        if not self._any_fits(gkey):
            self.refused.add(gkey)
            return []
        acs = self._modes_at(gkey, mbs)
        base = members[0][1]
        out = [(bound, (index, _AC_ORDER[acs[0]], mbs), gkey, acs[0], mbs, m, None)]
        for ac in acs[1:]:
            out.append((self.bounds.order_s(_with(base, mbs, ac)), (index, _AC_ORDER[ac], mbs), gkey, ac, mbs, m, None))
        return out

    def _bounded(self, entry: tuple) -> tuple:
        """The entry of one (group, ac, mbs) raised to its floors, in two steps as it comes up (each put
        back in order): first the cheap ones (:meth:`_cheap_floors`, its floors still None), then
        ``floors`` (:meth:`_dp_floors`), below which no member of that ZeRO kind steps; its bound the
        larger of its order bound and the least floor."""
        bound, tie, gkey, ac, mbs, m, _ = entry
        cheap = self.cheap.get((gkey, ac, mbs))
        if cheap is None:
            cheap = self.cheap[gkey, ac, mbs] = self._cheap_floors(gkey, ac, mbs)
            if self.band:  # the DP floors when it comes up again at the cheap ones
                return (max(bound, min(cheap.values())), tie, gkey, ac, mbs, m, None)
        floors = self._dp_floors(gkey, ac, mbs, m, cheap) if self.band else cheap
        return (max(bound, min(floors.values())), tie, gkey, ac, mbs, m, floors)

    def _cheap_floors(self, gkey: tuple, ac: str, mbs: int) -> dict[bool, float]:
        """By the one ZeRO field the tighter bound reads (estimate.reduces_per_micro_batch), that bound
        plus the least optimizer step of the members of that kind (:meth:`_optimizer_floors`)."""
        least = self._optimizer_floors(gkey)
        return {k: self.bounds.tight_s(_with(one, mbs, ac)) + opt_s for k, (one, opt_s) in least.items()}

    def _dp_floors(self, gkey: tuple, ac: str, mbs: int, m: int, cheap: dict[bool, float]) -> dict[bool, float]:
        """``cheap`` raised, per ZeRO kind, by estimate.lower_bound_dp_floor_s over the members of that
        kind that fit at (ac, mbs): the DP collectives no compute hides; infinite for a kind none of
        whose members fits there."""
        parts = None
        least: dict[bool, tuple[Layout, float, list[float]]] = {}
        for index, base, _ in self.groups[gkey]:
            found = self._structure(index, base)
            if found is None:
                continue
            if parts is None:
                parts = self._transient(found, base, ac, mbs, m)
            if not self._fits(found, parts):
                continue
            kind, opt_s = reduces_per_micro_batch(base), self.bounds.optimizer_s(base, found[0])
            with_opt = [u + opt_s for u in self._unhidden(index, base, found[0], m)]
            held = least.get(kind)
            if held is not None:
                opt_s, with_opt = min(held[1], opt_s), [min(a, b) for a, b in zip(held[2], with_opt)]
            least[kind] = (base if held is None else held[0], opt_s, with_opt)
        floors = {}
        for k, floor_s in cheap.items():
            if k not in least:
                floors[k] = math.inf
                continue
            one, opt_s, with_opt = least[k]
            layout = _with(one, mbs, ac)
            with_dp = lower_bound_dp_floor_s(
                self.model, self.cluster, self.train, layout, (opt_s, with_opt), self.stages
            )
            floors[k] = max(floor_s, with_dp)
        return floors

    def _fits(self, found: tuple, parts: list[tuple[float, float]]) -> bool:
        """Whether every rank's states (a member's :meth:`_structure` sums) and transient memory (``parts``:
        :meth:`_transient`) fit its usable bytes."""
        return max(t + a + o for t, (a, o) in zip(found[2], parts)) <= self.usable

    def _unhidden(self, index: int, base: Layout, shapes: tuple, m: int) -> list[float]:
        """estimate.dp_unhidden_seconds of a member at ``m`` micro-batches (it reads no ac, and ``m``
        only where estimate.dp_reads_m)."""
        key = (index, m if dp_reads_m(self.train, base) else 0)
        found = self.unhidden.get(key)
        if found is None:
            found = self.unhidden[key] = dp_unhidden_seconds(
                self.model, self.cluster, self.train, base, shapes, m, self.stages
            )
        return found

    def _member_floor(self, index: int, base: Layout, shapes: tuple, layout: Layout, worst: float) -> float:
        """A floor of the member's step at ``layout`` (its ac and mbs), cheaper than Bounds.slower's bound
        with the DP collectives: the tighter bound plus its optimizer step where that is past ``worst``
        (no DP seconds worked out), else estimate.lower_bound_dp_floor_s over the member alone, from its
        unhidden DP seconds (:meth:`_unhidden`, kept across its checkpointing modes and, where the DP
        collectives read no micro-batch count, across its micro-batch sizes)."""
        opt_s = self.bounds.optimizer_s(base, shapes)
        floor_s = self.bounds.tight_s(layout) + opt_s
        if floor_s > worst:
            return floor_s
        unhidden = self._unhidden(index, base, shapes, layout.accum(self.train.global_batch))
        least = (opt_s, [u + opt_s for u in unhidden])
        return lower_bound_dp_floor_s(self.model, self.cluster, self.train, layout, least, self.stages)

    def _optimizer_floors(self, gkey: tuple) -> dict[bool, tuple[Layout, float]]:
        """By estimate.reduces_per_micro_batch, a member of the group of that kind and the least
        optimizer step (Bounds.optimizer_s) of those members, whether their states fit or not (so no
        member's memory is worked out for it: the least is mostly the widest sharding group's, whose
        states are the smallest)."""
        found = self.floors.get(gkey)
        if found is None:
            found = self.floors[gkey] = {}
            members = self.groups[gkey]
            shapes = rank_shapes(self.model, members[0][1])  # the group's: tp, pp, vpp and the schedule
            for _, base, _ in members:
                kind, opt_s = reduces_per_micro_batch(base), self.bounds.optimizer_s(base, shapes)
                if kind not in found or opt_s < found[kind][1]:
                    found[kind] = (base, opt_s)
        return found

    def _any_fits(self, gkey: tuple) -> bool:
        """Whether any member's states alone fit every rank (:meth:`_structure`), its members asked
        from the highest ZeRO stage and widest sharding group (the smallest states) down, so a group
        that has one mostly works out one member's states."""
        found = self.any_fits.get(gkey)
        if found is None:
            members = sorted(self.groups[gkey], key=lambda mem: (-mem[1].zero, -mem[1].shard))
            found = self.any_fits[gkey] = any(self._structure(i, b) is not None for i, b, _ in members)
        return found

    def _structure(self, index: int, base: Layout) -> tuple | None:
        """The structure's (rank shapes, their states, their sums, local setting, TP overlap), or None
        when its states alone overflow a rank (no mbs or ac fits)."""
        found = self.structures.get(index, False)
        if found is False:
            # the rank shapes read tp, pp, vpp and the schedule, their states dp, cp, ZeRO, shard and ep: not sp
            skey = (base.tp, base.pp, base.vpp, base.schedule, base.dp, base.cp, base.zero, base.shard, base.ep)
            held = self.states.get(skey)
            if held is None:
                shapes = rank_shapes(self.model, base)
                states = [states_of(self.model, self.train, base, sh) for sh in shapes]
                totals = [sum(st) for st in states]
                held = self.states[skey] = (shapes, states, totals, any(t > self.usable for t in totals))
            shapes, states, totals, overflows = held
            found = self.structures[index] = (
                None
                if overflows
                else (shapes, states, totals, local_train(self.train, base), tp_overlap_on(self.train, base))
            )
        return found

    def _transient(self, found: tuple, base: Layout, ac: str, mbs: int, m: int) -> list[tuple[float, float]]:
        """Every rank's Megatron-Core transient memory (megatron_memory.transient: activations, other) of
        the structure ``found`` (:meth:`_structure`) at (ac, mbs); a layout fits where every rank's
        states plus these stay within the usable memory (megatron_memory.rank_memory's sum)."""
        shapes, _, _, local, overlap = found
        key = (base.tp, base.sp, mbs, ac, base.ep, base.ep_folds_tp, base.schedule, base.pp, base.vpp, overlap)
        # the rank shapes follow tp, pp, vpp and the schedule (in the key), the local setting cp
        parts = self.transients.get((key, m, base.cp))
        if parts is None:
            parts = self.transients[key, m, base.cp] = [transient(self.model, local, key, m, sh) for sh in shapes]
        return parts
