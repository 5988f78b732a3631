"""The predicted pipeline timeline of an estimate, for both reports: one rule, the cost model's.

Per chunk and micro-batch the compute is ``time.compute_s / (m * vpp)`` (the estimate's slowest
rank); a block runs ``compute.recompute_factor(ac)`` forward passes' worth per step (3: forward +
backward at twice the forward; 4 under full recompute), so the forward takes ``1 / factor`` of it
and the backward the rest. Without PP, one rank runs its micro-batches back to back.
"""

from __future__ import annotations

from meshwise.cost.compute import recompute_factor
from meshwise.cost.estimate import Estimate
from meshwise.cost.pipeline import Op, simulate


def chunk_seconds(e: Estimate, global_batch: int) -> tuple[float, float]:
    """(forward_s, backward_s) of one chunk and micro-batch under ``e``'s layout."""
    layout = e.layout
    per_chunk_s = e.time.compute_s / (layout.accum(global_batch) * layout.vpp)
    factor = recompute_factor(layout.ac)
    return per_chunk_s / factor, per_chunk_s * (factor - 1) / factor


def predicted_timeline(e: Estimate, global_batch: int) -> list[Op]:
    """``cost.pipeline.simulate`` of ``e``'s schedule at :func:`chunk_seconds`."""
    layout = e.layout
    forward_s, backward_s = chunk_seconds(e, global_batch)
    schedule = layout.schedule if layout.pp > 1 else "1f1b"
    return simulate(schedule, layout.pp, layout.vpp, layout.accum(global_batch), forward_s, backward_s)
