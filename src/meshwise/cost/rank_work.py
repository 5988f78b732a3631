"""One micro-batch's work on one rank: what the op model (cost/kernels.py ``rank_seconds``) and the
CPU path's memory-bound term (cost/host.py ``memory_bound_seconds``) read of a layout and of the
rank's pipeline position, and nothing else."""

from __future__ import annotations

from typing import NamedTuple


class RankWork(NamedTuple):
    """``mbs`` sequences through ``blocks`` blocks split ``tp`` ways (``sp``: sequence parallelism on the
    TP group; ``ac``: the checkpointing mode), plus the embedding and the head where the rank holds
    them. A NamedTuple because the per-rank memo (cost/estimate.py ``_compute_of``) keys by it."""

    mbs: int
    tp: int
    sp: bool
    ac: str
    blocks: int
    has_embedding: bool
    has_head: bool
