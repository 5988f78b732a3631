"""The search under ``--runtime megatron``: the same layouts as plan/search.py plus expert
parallelism folded over the TP ranks (Megatron-Core's MoE parallel folding), judged by Megatron-Core's
memory (cost/megatron_memory.py) rather than meshwise's runtime's. Pure Python, no torch.

Plain where the main search is clever: every layout's memory is worked out (cached by what it reads),
the fitting ones are timed fastest lower bound first, and the first whose compute-only bound is slower
than the worst of the best ``max(top, RUNNER_UP_POOL)`` ends it.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterator

from meshwise.cost.estimate import DEFAULT_HEADROOM, estimate, lower_bound_step_s, rank_memories
from meshwise.layout import Layout
from meshwise.plan.search import (RUNNER_UP_POOL, SearchResult, _ac_modes, _divisors, _layout, _rank_key,
                                  _schedule_ok, _structure_fields, _with, break_ties)
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def _fields(model: ModelSpec, world: int, global_batch: int, seq_len: int) -> Iterator[tuple]:
    """plan/search.py's structures, and after each one with ep=1 and tp > 1 of a mixture of experts
    the same with ep folded over tp (a multiple of tp dividing dp_shard x cp x tp, not dp_shard x cp)."""
    for fields in _structure_fields(model, world, global_batch, seq_len):
        yield fields
        dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options = fields
        if ep != 1 or tp == 1 or not model.moe or model.states_only:
            continue
        for folded in _divisors(shard * cp * tp):
            if folded % tp == 0 and (shard * cp) % folded and model.experts % folded == 0:
                yield dp, zero, shard, cp, tp, sp, pp, vpp, schedule, folded, mbs_options


def search_megatron(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
                    headroom: float = DEFAULT_HEADROOM, where: Callable[[Layout], bool] | None = None) -> SearchResult:
    keep = max(top, RUNNER_UP_POOL)
    usable = cluster.accelerator.memory_bytes * (1 - headroom)
    result = SearchResult()
    stages: dict = {}
    bounds: dict[tuple, float] = {}
    fitting: list[tuple[float, int, Layout, tuple]] = []
    for dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options in _fields(
            model, cluster.world_size, train.global_batch, train.seq_len):
        base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
        for ac in _ac_modes(model):
            for mbs in mbs_options:
                if not _schedule_ok(base, train.global_batch // (dp * mbs)):
                    continue
                layout = _with(base, mbs, ac)
                if where is not None and not where(layout):
                    continue
                result.enumerated += 1
                mems = rank_memories(model, cluster, train, layout)
                if max(mm.total for mm in mems) > usable:
                    continue
                result.fitting += 1
                key = (tp, cp, pp, vpp, schedule, mbs, ac, sp, layout.ep_folds_tp)
                bound = bounds.get(key)
                if bound is None:
                    bound = bounds[key] = lower_bound_step_s(model, cluster, train, layout, compute_only=True,
                                                             stage_cache=stages)
                fitting.append((bound, len(fitting), layout, mems))
    fitting.sort(key=lambda f: (f[0], f[1]))
    keys: list[tuple] = []
    for bound, index, layout, mems in fitting:
        if len(result.best) >= keep and bound > result.best[-1].time.step_s:
            break
        e = estimate(model, cluster, train, layout, headroom, stages, mems)
        key_e = (_rank_key(e), index)
        at = bisect.bisect_right(keys, key_e)
        if at < keep:
            keys.insert(at, key_e)
            result.best.insert(at, e)
            del keys[keep:], result.best[keep:]
    result.best = break_ties(result.best, usable)
    result.pool = result.best[:]
    del result.best[top:]
    return result
