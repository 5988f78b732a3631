"""The field of a tune: the planned layouts whose predicted step overlaps the best one's band.

A layout's band is ``[s (1 - b), s (1 + b)]`` around its predicted step ``s``; a candidate ``i``
overlaps the best's when ``s_i (1 - b) <= s_best (1 + b)``; the field is the ``FIELD_MAX`` fastest
predicted of them (the rest stay in the pool, tried in a later round where the refitted profile
predicts one faster than the measured best). Of candidates that differ only in
fields that do not change this runtime's step (:func:`step_key`), the one predicted faster is kept.

Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.layout import Layout, runs_here
from meshwise.plan import planner
from meshwise.plan.band import band_for
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

# Where plan has no band (a CPU profile: catalog/bands.toml holds published GPU runs only), the CPU time
# model's stated accuracy: the CPU grid's bound, >= 90% of points within 25% (docs/fidelity.md).
CPU_RELATIVE_BAND = 0.25
POOL = 48  # planned candidates kept for re-ranking after a refit (the field is drawn from them)
# The most layouts of a field: what an exhaustive measurement of it costs (benchmarks/tune_regret.py
# measures 12), of which a tune spends a third (tuner.default_trials); the CPU band (25%) otherwise
# draws 22 and 31 layouts for `small` at 2 and 4 ranks, and a budget of a third of them.
FIELD_MAX = 12


def relative_band(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> float:
    """The relative half-width of a predicted step's band on ``cluster``: plan's band for this model,
    accelerator and precision (plan/band.py), its wider side; ``CPU_RELATIVE_BAND`` where it has none."""
    band = band_for(model, cluster.accelerator, train)
    return CPU_RELATIVE_BAND if band is None else max(-band.low, band.high)


@dataclass(frozen=True)
class Candidate:
    """A planned layout and its predicted step (seconds) under the profile it was planned with."""

    layout: Layout
    predicted_step_s: float

    @property
    def text(self) -> str:
        return self.layout.format()


def step_key(layout: Layout, moe: bool) -> tuple:
    """The fields that change a step in this runtime: the schedule and vpp only under PP, ep only
    for mixture-of-experts models."""
    pipe = (layout.pp, layout.vpp, layout.schedule) if layout.pp > 1 else (1,)
    return (
        layout.dp,
        layout.zero,
        layout.shard,
        layout.cp,
        layout.tp,
        layout.sp and layout.tp > 1,
        pipe,
        layout.mbs,
        layout.ac,
        layout.ep if moe else 1,
    )


def plan_pool(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, seq_len: int) -> list[Candidate]:
    """The ``POOL`` fastest fitting layouts this runtime runs, fastest first, one per :func:`step_key`."""
    return plan_pool_and_pick(model, cluster, train, seq_len)[0]


def plan_pool_and_pick(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, seq_len: int
) -> tuple[list[Candidate], str | None]:
    """(:func:`plan_pool`, the layout ``--layout auto`` runs: the planner's first after its tie-breaks)."""
    result = planner.search(model, cluster, train, top=POOL, where=runs_here(model, seq_len))
    seen: set[tuple] = set()
    out = []
    for e in sorted(result.best, key=lambda e: e.time.step_s):
        key = step_key(e.layout, model.experts > 0)
        if key not in seen:
            seen.add(key)
            out.append(Candidate(e.layout, e.time.step_s))
    return out, (result.best[0].layout.format() if result.best else None)


def field_of(pool: list[Candidate], band: float) -> list[Candidate]:
    """The candidates of ``pool`` whose band overlaps the fastest one's, fastest first, at most
    ``FIELD_MAX``."""
    if not pool:
        return []
    best_s = min(c.predicted_step_s for c in pool)
    return sorted(
        (c for c in pool if c.predicted_step_s * (1 - band) <= best_s * (1 + band)), key=lambda c: c.predicted_step_s
    )[:FIELD_MAX]
