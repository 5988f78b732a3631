"""One plan's caches: what the cost model works out once for a (model, cluster, setting) and serves to
every layout a plan estimates. A plan (plan/planner.py) or a search (plan/search.py) makes one and
passes it down; it goes with them, so nothing grows from one plan to the next in the process.

- ``stages``: cost/estimate.py's per-rank memo (``stage_cache``): each rank's stage parts
  (estimate._stage_of), its compute seconds (estimate._compute_of) and the pipeline ranks each
  distinct rank shape stands for (estimate._shape_counts), under keys of the fields each reads;
  shared by the search's bounds and estimates alike.
- ``peaks``: the memory's parts (cost/memory_peaks.py), by the fields each reads.
- ``search_state``: what the plan's own search leaves (plan/search.py), so that the explanation's
  search of the layouts of the other expert kind reuses its order and caches.

What stays module-wide is the ``functools.lru_cache`` of pure functions of a spec and a few small
numbers (memory's rank shapes, activation sizes, kernel efficiencies, ...): their answers hold for
any plan, their size is bounded, and the specs hash once per instance (spec.model.cached_hash).
"""

from __future__ import annotations

from meshwise.cost.memory_peaks import PeakCache
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


class PlanCache:
    """The caches of one plan of ``model`` on ``cluster`` under ``train`` (the module docstring)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> None:
        self.model, self.cluster, self.train = model, cluster, train
        self.stages: dict[tuple, object] = {}
        self.peaks = PeakCache(model, train)
        self.search_state: object | None = None

    def serves(self, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> bool:
        """Whether its answers hold for a plan of ``model`` on ``cluster`` under ``train``."""
        return (model, cluster, train) == (self.model, self.cluster, self.train)


def plan_cache(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, cache: PlanCache | None) -> PlanCache:
    """``cache`` where it serves this plan, else a new one."""
    if cache is not None and cache.serves(model, cluster, train):
        return cache
    return PlanCache(model, cluster, train)
