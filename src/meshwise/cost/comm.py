"""Collectives a layout implies, and what they cost.

Each collective costs ``alpha + bytes / beta`` per step of its algorithm on the slowest link tier
its group crosses (ClusterSpec.link_for): a TP group inside a node rides NVLink, a DP group that
spans nodes rides the scale-out link. For ``n`` ranks and a payload of ``B`` bytes:

- ring all-reduce ``2(n-1)*alpha + 2(n-1)/n * B/beta``; tree all-reduce ``2*ceil(log2 n)*alpha + 2*B/beta``;
  the cheaper one is taken (NCCL chooses per size);
- ring all-gather and reduce-scatter ``(n-1)*alpha + (n-1)/n * B/beta``; where the link states a
  ``reduce_scatter_ratio`` r > 0 (gloo, measured by ``meshwise calibrate``), a reduce-scatter costs
  ``r`` times the all-reduce of the same tensor instead: gloo's reduce-scatter of a tensor times like
  an all-reduce of it (calibrate's micro-benchmarks: r about 1 at 2 and 4 processes), twice the ring's;
- across nodes, with ``k`` ranks of the group in each of its ``N = n/k`` nodes, a ring's ``n-1`` steps are
  ``N-1`` between nodes at ``alpha`` and ``n-N`` inside a node at the node's own latency, and the tree's
  ``ceil(log2 n)`` levels ``k-1`` inside a node and ``ceil(log2 N)`` between nodes (NCCL's tuning model,
  src/graph/tuning.cc at v2.21.5: ``nsteps - nInterSteps`` steps at ``intraLat``, ``nInterSteps = nNodes-1``
  for all-gather and reduce-scatter at ``interLat``; its tree ``(nRanks/nNodes-1)`` intra, ``log2i(nNodes)`` inter);
- broadcast ``ceil(log2 n)*alpha + B/beta``; send/recv ``alpha + B/beta``;
- all-to-all (pairwise exchange) ``(n-1)*alpha + (n-1)/n * B/beta``: each rank keeps 1/n of its
  ``B`` bytes and sends the rest, one message per peer (expert parallelism, uniform routing); where
  the link states an ``all_to_all_ratio`` r > 0 (gloo, measured by ``meshwise calibrate`` beside the
  other collectives), ``r`` times that.

``bytes_per_step`` is the payload summed over calls: the full tensor for all-reduce and broadcast,
the full (gathered) tensor for all-gather and reduce-scatter, the message for send and recv, a
rank's whole input for all-to-all. Payload
sizes per layout are listed in docs/cost-model.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from meshwise.spec import LinkSpec


class Collective(NamedTuple):
    """One kind of collective on one mesh dimension, summed over a step, for the busiest rank. A
    NamedTuple: the planner's bounds and estimates make tens of thousands, and a tuple's constructor
    is a third of a frozen dataclass's."""

    kind: str
    dim: str
    bytes_per_step: float
    count_per_step: int
    seconds_per_step: float

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "dim": self.dim,
            "bytes_per_step": int(round(self.bytes_per_step)),
            "count_per_step": self.count_per_step,
        }


def collective_seconds(kind: str, n: int, payload_bytes: float, link: LinkSpec) -> float:
    """Time of one call moving ``payload_bytes`` among ``n`` ranks over ``link``."""
    a, beta = link.latency_s, link.bytes_per_s
    if kind in ("send", "recv"):
        return a + payload_bytes / beta
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        ring = 2 * _ring_steps_s(n, link) + 2 * (n - 1) / n * payload_bytes / beta
        tree = 2 * _tree_levels_s(n, link) + 2 * payload_bytes / beta
        return min(ring, tree)
    if kind == "all_to_all" and link.all_to_all_ratio > 0:
        return link.all_to_all_ratio * ((n - 1) * a + (n - 1) / n * payload_bytes / beta)
    if kind == "reduce_scatter" and link.reduce_scatter_ratio > 0:
        return link.reduce_scatter_ratio * collective_seconds("all_reduce", n, payload_bytes, link)
    if kind in ("all_gather", "reduce_scatter"):
        return _ring_steps_s(n, link) + (n - 1) / n * payload_bytes / beta
    if kind == "all_to_all":
        return (n - 1) * a + (n - 1) / n * payload_bytes / beta
    if kind == "broadcast":
        return math.ceil(math.log2(n)) * a + payload_bytes / beta
    raise ValueError(f"unknown collective kind {kind!r}")


def _ring_steps_s(n: int, link: LinkSpec) -> float:
    """Latency of a ring's ``n-1`` steps: across nodes ``N-1`` at the link's latency and ``n-N`` at the
    node's own (``link.ranks_per_node`` ranks in each of ``N`` nodes)."""
    k = link.ranks_per_node
    if k <= 1 or n <= k:
        return (n - 1) * link.latency_s
    nodes = -(-n // k)
    return (nodes - 1) * link.latency_s + (n - nodes) * link.intra_latency_s


def _tree_levels_s(n: int, link: LinkSpec) -> float:
    """Latency of one pass down (or up) the tree: ``ceil(log2 n)`` levels, or across nodes ``k-1`` inside
    a node and ``ceil(log2 N)`` between the ``N`` nodes."""
    k = link.ranks_per_node
    if k <= 1 or n <= k:
        return math.ceil(math.log2(n)) * link.latency_s
    nodes = -(-n // k)
    return (k - 1) * link.intra_latency_s + math.ceil(math.log2(nodes)) * link.latency_s


def collective(kind: str, dim: str, n: int, payload_bytes: float, calls: int, link: LinkSpec) -> Collective:
    """``calls`` calls of ``payload_bytes`` each."""
    return Collective(kind, dim, payload_bytes * calls, calls, calls * collective_seconds(kind, n, payload_bytes, link))
