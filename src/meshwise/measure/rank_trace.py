"""What one trace of ``meshwise verify`` is of (torch-free: the command builds it before torch is
imported, and the trace process, measure/verify_worker.py, receives it)."""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.layout import Layout
from meshwise.spec import ModelSpec


@dataclass(frozen=True)
class RankTrace:
    """Rank ``rank`` of ``layout`` for ``model``, through one step of ``global_batch`` sequences of
    ``seq`` tokens, under the precision policy of the device type ``precision_of`` (cpu or cuda);
    ``precision``: fp8 / fp8-rowwise traces torchao's float8 linears (None: the device's own)."""

    model: ModelSpec
    layout: Layout
    rank: int
    global_batch: int
    seq: int
    precision_of: str
    precision: str | None = None
