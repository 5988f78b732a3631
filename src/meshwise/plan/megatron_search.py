"""The search under ``--runtime megatron``: the same layouts as plan/search.py under Megatron-Core's
schedules (1F1B and interleaved 1F1B) plus expert
parallelism folded over the TP ranks (Megatron-Core's MoE parallel folding), judged by Megatron-Core's
memory (cost/megatron_memory.py) rather than meshwise's runtime's. Pure Python, no torch.

Plain where the main search is clever: every layout's memory is worked out (cached by what it reads),
the fitting ones are timed fastest lower bound first, and the first whose compute-only bound is slower
than the worst of the best ``max(top, RUNNER_UP_POOL)`` ends it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from meshwise.cost.context_parallel import local_train, tp_overlap_on
from meshwise.cost.estimate import (
    DEFAULT_HEADROOM,
    estimate,
    lower_bound_experts_s,
    lower_bound_step_s,
    lower_bound_with_dp_s,
    optimizer_seconds,
)
from meshwise.cost.megatron_memory import states_of, transient
from meshwise.cost.memory import Memory, rank_shapes
from meshwise.cost.plan_cache import PlanCache, plan_cache
from meshwise.layout import Layout
from meshwise.plan.candidates import (
    RUNNER_UP_POOL,
    SearchResult,
    _ac_modes,
    _divisors,
    _layout,
    _schedule_ok,
    _structure_fields,
    _with,
    break_ties,
    keep_ranked,
)
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")  # Megatron-Core's pipeline schedules


def _fields(model: ModelSpec, world: int, global_batch: int, seq_len: int, cp_bound: bool = True) -> Iterator[tuple]:
    """plan/search.py's structures, and after each one with ep=1 and tp > 1 of a mixture of experts
    the same with ep folded over tp (a multiple of tp dividing dp_shard x cp x tp, not dp_shard x cp)."""
    for fields in _structure_fields(model, world, global_batch, seq_len, cp_bound):
        dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options = fields
        if schedule not in MEGATRON_SCHEDULES:
            continue
        yield fields
        if ep != 1 or tp == 1 or not model.moe or model.states_only:
            continue
        for folded in _divisors(shard * cp * tp):
            if folded % tp == 0 and (shard * cp) % folded and model.experts % folded == 0:
                yield dp, zero, shard, cp, tp, sp, pp, vpp, schedule, folded, mbs_options


def search_megatron(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
                    headroom: float = DEFAULT_HEADROOM, where: Callable[[Layout], bool] | None = None,
                    cp_bound: bool = True, cache: PlanCache | None = None) -> SearchResult:
    """plan/search.py's search under Megatron-Core's memory; cp past CP_MIN_TOKENS (``cp_bound`` False)
    only when no layout within it is valid (search._structure_fields). ``cache``: the plan's."""
    keep = max(top, RUNNER_UP_POOL)
    capacity = cluster.accelerator.memory_bytes
    usable = capacity * (1 - headroom)
    result = SearchResult()
    cache = plan_cache(model, cluster, train, cache)
    stages = cache.stages
    transients: dict[tuple, list[tuple[float, float]]] = {}  # megatron_memory.transient of every rank
    # the fitting layouts grouped by what their compute-only bound reads: (enumeration index, structure,
    # mbs, ac, states, transient parts) each, in enumeration order
    groups: dict[tuple, list[tuple]] = {}
    index = 0
    for dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options in _fields(
            model, cluster.world_size, train.global_batch, train.seq_len, cp_bound):
        base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
        runs = [(mbs, train.global_batch // (dp * mbs)) for mbs in mbs_options
                if _schedule_ok(base, train.global_batch // (dp * mbs))]
        shapes = rank_shapes(model, base)
        states = [states_of(model, train, base, sh) for sh in shapes]
        if any(sum(st) > usable for st in states):  # the states alone overflow: no mbs or ac fits
            result.enumerated += len(runs) * len(_ac_modes(model))
            continue
        local = local_train(train, base)
        folded, overlap = base.ep_folds_tp, tp_overlap_on(train, base)
        for ac in _ac_modes(model):
            for mbs, m in runs:
                if where is not None and not where(_with(base, mbs, ac)):
                    continue
                result.enumerated += 1
                # megatron_memory.rank_memory, its two parts cached apart
                key = (tp, sp, mbs, ac, ep, folded, schedule, pp, vpp, overlap)
                # the rank shapes follow tp, pp, vpp and the schedule (in the key), the local setting cp
                parts = transients.get((key, m, cp))
                if parts is None:
                    parts = transients[key, m, cp] = [transient(model, local, key, m, sh) for sh in shapes]
                if max(sum(st) + a + o for st, (a, o) in zip(states, parts)) > usable:
                    continue
                result.fitting += 1
                bkey = (tp, cp, pp, vpp, schedule, mbs, ac, sp, folded, ep if model.moe else 1)  # MoE compute reads ep
                found = groups.get(bkey)
                if found is None:
                    found = groups[bkey] = []
                found.append((index, base, mbs, ac, states, parts))
                index += 1
    if cp_bound and not result.enumerated:
        return search_megatron(model, cluster, train, top, headroom, where, cp_bound=False, cache=cache)
    result.checked = result.enumerated  # every layout's memory is worked out
    _rank(model, cluster, train, groups, result, headroom, stages, keep)
    result.best = break_ties(result.best, usable)
    result.pool = result.best[:]
    del result.best[top:]
    return result


def _rank(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, groups: dict[tuple, list[tuple]],
          result: SearchResult, headroom: float, stages: dict, keep: int) -> None:
    """Estimate the fitting layouts, group by group in order of their compute-only lower bound (one per
    group: it reads only the group's key), into ``result.best`` (the best max(top, RUNNER_UP_POOL), held
    by (_rank_key, enumeration index), so the order of the estimates changes nothing): once they are
    known, a group whose bound is slower than the worst of them ends the search, and a layout whose
    tighter bounds are slower (:class:`_Slower`) is skipped."""
    capacity = cluster.accelerator.memory_bytes
    slower = _Slower(model, cluster, train, stages)
    bounded = []
    for members in groups.values():
        _, base, mbs, ac, _, _ = members[0]
        first = _with(base, mbs, ac)
        # a mixture of experts: compute plus the expert all-to-alls, which read the group's fields too
        bound = (slower.experts(first) if model.moe else
                 lower_bound_step_s(model, cluster, train, first, compute_only=True, stage_cache=stages))
        bounded.append((bound, members[0][0], members))
    bounded.sort(key=lambda b: (b[0], b[1]))
    keys: list[tuple] = []
    for bound, _, members in bounded:
        if len(result.best) >= keep and bound > result.best[-1].time.step_s:
            break
        for index, base, mbs, ac, states, parts in members:
            if len(result.best) >= keep and bound > result.best[-1].time.step_s:
                break
            layout = _with(base, mbs, ac)
            if len(result.best) >= keep and slower(layout, result.best[-1].time.step_s):
                continue
            mems = tuple(Memory(*st, activations=a, other=o, capacity=capacity) for st, (a, o) in zip(states, parts))
            keep_ranked(result.best, keys, estimate(model, cluster, train, layout, headroom, stages, mems), index, keep)


class _Slower:
    """Whether a layout's step is surely slower than ``worst``: its optimizer step plus, for a mixture of
    experts, compute and the expert all-to-alls first (estimate.lower_bound_experts_s, cheaper), then
    every part of the step but the data-parallel collectives (estimate.lower_bound_step_s), then with
    them (estimate.lower_bound_with_dp_s). The first parts are cached by the fields they read, as
    plan/search.py's ``_slower_than`` caches them."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, stages: dict) -> None:
        self.model, self.cluster, self.train, self.stages = model, cluster, train, stages
        self.optimizers: dict[tuple, float] = {}
        self.with_experts: dict[tuple, float] = {}
        self.tight: dict[tuple, float] = {}

    def __call__(self, layout: Layout, worst: float) -> bool:
        model, cluster, train = self.model, self.cluster, self.train
        okey = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2,
                layout.ep, layout.zero >= 1, layout.shard, layout.dp > 1)
        opt_s = self.optimizers.get(okey)
        if opt_s is None:
            opt_s = self.optimizers[okey] = optimizer_seconds(model, cluster, train, layout, rank_shapes(model, layout))
        if model.moe and self.experts(layout) + opt_s > worst:
            return True
        key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
               layout.sp, layout.ep_folds_tp, layout.zero >= 2)
        busy = self.tight.get(key)
        if busy is None:
            busy = self.tight[key] = lower_bound_step_s(model, cluster, train, layout, stage_cache=self.stages)
        if busy + opt_s > worst:
            return True
        return lower_bound_with_dp_s(model, cluster, train, layout, self.stages) + opt_s > worst

    def experts(self, layout: Layout) -> float:
        """estimate.lower_bound_experts_s, by the fields it reads (no ZeRO field, ``shard`` only through
        whether ep is folded over tp)."""
        key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
               layout.sp, layout.ep_folds_tp)
        found = self.with_experts.get(key)
        if found is None:
            found = self.with_experts[key] = lower_bound_experts_s(self.model, self.cluster, self.train, layout,
                                                                   self.stages)
        return found
