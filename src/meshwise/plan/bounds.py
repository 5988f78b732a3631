"""The lower bounds both searches prune by, each cached by the fields of the layout it reads.

Every key below is a projection of a :class:`~meshwise.layout.Layout` or of its
:class:`~meshwise.layout.Degrees` (the same field names): the fields the answer reads, so one answer
serves every layout that shares them (a plain tuple: cheaper to hash than a layout). What each
bound reads is said by its function in cost/estimate.py. Pure Python.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator

from meshwise.cost.estimate import (
    lower_bound_compute_s,
    lower_bound_experts_s,
    lower_bound_step_s,
    lower_bound_with_dp_s,
    optimizer_seconds,
    rank_fields,
    reduces_per_micro_batch,
)
from meshwise.cost.memory import RankShape, rank_shapes
from meshwise.layout import Degrees, Layout
from meshwise.plan.candidates import TIE
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def v_shape(d: Degrees | Layout) -> bool:
    """Whether the schedule places the chunks in a V (zero-bubble with vpp=2): the rank shapes read it."""
    return d.schedule == "zero-bubble" and d.vpp == 2


def folds_tp(d: Degrees | Layout) -> bool:
    """Layout.ep_folds_tp of the degrees: ep carved over tp because it does not divide shard x cp."""
    return d.ep > 1 and (d.shard * d.cp) % d.ep != 0


def compute_key(d: Degrees | Layout, moe: bool) -> tuple:
    """What the compute-only bound reads but (mbs, ac): no DP or ZeRO field (dp follows tp, cp and pp),
    ep only for a mixture of experts."""
    return (d.tp, d.cp, d.pp, d.vpp, d.schedule, d.sp, folds_tp(d), d.ep if moe else 1)


def optimizer_key(layout: Layout) -> tuple:
    """What estimate.optimizer_seconds reads, with the rank shapes (tp, pp, vpp, the V): zero only as
    ``zero >= 1``."""
    return (
        layout.tp,
        layout.cp,
        layout.pp,
        layout.vpp,
        v_shape(layout),
        layout.ep,
        layout.zero >= 1,
        layout.shard,
        layout.dp > 1,
    )


def experts_key(layout: Layout) -> tuple:
    """What estimate.lower_bound_experts_s reads: estimate.rank_fields, no ZeRO field, ``shard`` only
    through whether ep is folded over tp."""
    return rank_fields(layout)


def tight_key(layout: Layout) -> tuple:
    """What estimate.lower_bound_step_s reads: :func:`experts_key`'s fields and whether FSDP2 reduces
    per micro-batch (estimate.reduces_per_micro_batch: ZeRO-2/3 without PP)."""
    return (*experts_key(layout), reduces_per_micro_batch(layout))


def past(best: list, keep: int, band: bool) -> float:
    """The step past which a layout changes no answer of a search holding ``best`` (the best so far,
    in rank order): the worst of them once ``keep`` are known, else none; with ``band`` (only the
    first layout after candidates.break_ties is asked for, the explanation's other expert kind) also
    TIE past the fastest so far, since break_ties reorders only the layouts within TIE of the
    fastest (a margin of 1e-6 covers the rank key's rounding of tokens/s)."""
    worst = best[-1].time.step_s if len(best) >= keep else math.inf
    if band and best:
        worst = min(worst, best[0].time.step_s * (1 + TIE) * (1 + 1e-6))
    return worst


class OrderBroken(Exception):
    """A child's bound below its parent's in :func:`in_bound_order`: the lazy order would not be sorted."""


def in_bound_order(entries: list[tuple], expand: Callable[[tuple], Iterable[tuple]], at: int = 3) -> Iterator[tuple]:
    """``entries`` ((bound, tie key, group, ac, ...)) and what ``expand`` makes of each of them whose
    item ``at`` is None (a parent: by default one with no ac, which stands for a group's layouts at
    one mbs, its bound a lower bound of all of them), fastest bound first, ties by the tie key. A
    parent is yielded before it is expanded, so a caller that stops at a bound past the best expands
    no further. The order is sorted as long as no child's bound is below its parent's (else
    :class:`OrderBroken`); a list without parents is sorted whole, as an eager search would."""
    heap = entries[:]
    heapq.heapify(heap)
    while heap:
        entry = heapq.heappop(heap)
        yield entry
        if entry[at] is None:
            for child in expand(entry):
                if child[0] < entry[0]:
                    raise OrderBroken
                heapq.heappush(heap, child)


class Bounds:
    """The lower bounds of one search's layouts (model, cluster and setting fixed), each cached by its
    key: the optimizer step, compute with the expert all-to-alls (a mixture of experts), every part of
    the step but the data-parallel collectives, and (``with_dp``) with them. ``stages``: the plan's
    per-rank memo (cost/plan_cache.py)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, stages: dict, with_dp: bool) -> None:
        self.model, self.cluster, self.train, self.stages, self.with_dp = model, cluster, train, stages, with_dp
        self.optimizers: dict[tuple, float] = {}
        self.with_experts: dict[tuple, float] = {}
        self.tight: dict[tuple, float] = {}
        self.compute: dict[tuple, float] = {}

    def slower(self, layout: Layout, worst: float, shapes: tuple[RankShape, ...] | None = None) -> bool:
        """Whether a lower bound of the layout's step is above ``worst``: the optimizer plus, for a
        mixture of experts, compute and the expert all-to-alls first (cheaper; most refusals of a
        mixture of experts are for those), then the tighter bound, then (``with_dp``) the tighter bound
        with the data-parallel collectives. ``shapes``: the layout's rank shapes where the caller has them."""
        model = self.model
        opt_s = self.optimizer_s(layout, shapes)
        if model.moe and not model.states_only and self.experts_s(layout) + opt_s > worst:
            return True
        if self.tight_s(layout) + opt_s > worst:
            return True
        if not self.with_dp:
            return False
        return lower_bound_with_dp_s(model, self.cluster, self.train, layout, self.stages) + opt_s > worst

    def optimizer_s(self, layout: Layout, shapes: tuple[RankShape, ...] | None = None) -> float:
        """estimate.optimizer_seconds (no mbs nor ac); ``shapes``: the layout's rank shapes where the
        caller has them."""
        okey = optimizer_key(layout)
        opt_s = self.optimizers.get(okey)
        if opt_s is None:
            shapes = rank_shapes(self.model, layout) if shapes is None else shapes
            opt_s = self.optimizers[okey] = optimizer_seconds(self.model, self.cluster, self.train, layout, shapes)
        return opt_s

    def tight_s(self, layout: Layout) -> float:
        """estimate.lower_bound_step_s: every part of the step but the data-parallel collectives."""
        key = tight_key(layout)
        busy = self.tight.get(key)
        if busy is None:
            busy = self.tight[key] = lower_bound_step_s(
                self.model, self.cluster, self.train, layout, stage_cache=self.stages
            )
        return busy

    def compute_s(self, layout: Layout) -> float:
        """estimate.lower_bound_compute_s: compute and bubble, by the rank's fields
        (dp follows tp, cp and pp)."""
        key = rank_fields(layout)
        found = self.compute.get(key)
        if found is None:
            found = self.compute[key] = lower_bound_compute_s(self.model, self.cluster, self.train, layout, self.stages)
        return found

    def order_s(self, layout: Layout) -> float:
        """The bound the searches are ordered by: :meth:`experts_s` for a mixture of experts (above the
        compute-only bound, and cached alike), else :meth:`compute_s`. Both grow with the checkpointing
        mode (none, selective, full: recompute only adds work and, under full, the forward's
        all-to-alls), so the first mode's bound at an mbs bounds the group's others at it."""
        if self.model.moe and not self.model.states_only:
            return self.experts_s(layout)
        return self.compute_s(layout)

    def experts_s(self, layout: Layout) -> float:
        """estimate.lower_bound_experts_s: compute and the expert all-to-alls."""
        key = experts_key(layout)
        found = self.with_experts.get(key)
        if found is None:
            found = self.with_experts[key] = lower_bound_experts_s(
                self.model, self.cluster, self.train, layout, self.stages
            )
        return found
