"""The batch hint: when the global batch's divisibility rules out data-parallel degrees, search the
nearby batches that allow them and say which one would be faster, and by how much.

Cheap by construction: silent without any search when every data-parallel degree the world allows
divides the batch; otherwise at most ``MAX_TRIES`` extra searches, of batches within ``MAX_SHIFT``
of the given one, those that admit the most data-parallel degrees first.
"""

from __future__ import annotations

import math
from dataclasses import replace

from meshwise.cost.estimate import Estimate
from meshwise.plan.search import TIE, _divisors, search
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MAX_SHIFT = 0.125  # a nearby batch is within 12.5% of the given one
MAX_TRIES = 2  # extra searches at most


def nearby_batches(batch: int, world: int) -> list[int]:
    """Batches within MAX_SHIFT of ``batch`` that admit a data-parallel degree ``batch`` rules out,
    best first: most degrees admitted (largest gcd with the world size), then closest."""
    if math.gcd(batch, world) == world:
        return []
    found = set()
    for d in _divisors(world):
        if batch % d == 0:
            continue
        low = batch // d * d
        found.update(b for b in (low, low + d) if b > 0 and abs(b - batch) <= MAX_SHIFT * batch)
    return sorted(found, key=lambda b: (-math.gcd(b, world), abs(b - batch), b))[:MAX_TRIES]


def batch_hint(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, best: Estimate | None, headroom: float
) -> str | None:
    """One line naming the nearby batch and the faster layout it allows, or None (nothing faster nearby)."""
    if best is None:
        return None
    options = []
    for b in nearby_batches(train.global_batch, cluster.world_size):
        result = search(model, cluster, replace(train, global_batch=b), 1, headroom)
        if result.best:
            options.append((b, result.best[0]))
    if not options:
        return None
    b, e = max(options, key=lambda o: o[1].tokens_per_s)
    gain = e.tokens_per_s / best.tokens_per_s - 1
    if gain <= TIE:
        return None
    ruled_out = [d for d in _divisors(cluster.world_size) if train.global_batch % d and b % d == 0]
    return (
        f"Batch hint: --global-batch {train.global_batch} rules out data-parallel degrees "
        f"{', '.join(map(str, ruled_out))}; --global-batch {b} ({b / train.global_batch - 1:+.1%} tokens per "
        f"step) would allow {e.layout.short()} at {e.tokens_per_s:,.0f} tokens/s, {gain:.0%} faster than "
        f"{best.layout.short()} at {best.tokens_per_s:,.0f}."
    )
