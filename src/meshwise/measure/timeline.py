"""The measured pipeline timeline: when each stage ran each micro-batch's forward and backward.

While active, :class:`StageTimeline` wraps the methods torch.distributed.pipelining's schedules
call on a ``PipelineStage`` (``forward_one_chunk``, ``backward_one_chunk``,
``backward_weight_one_chunk``) and records wall-clock start and end, relative to entering the
context. Every schedule (GPipe, 1F1B, interleaved, zero-bubble) goes through these methods, so no
profiler range names are needed. Kinds are the cost model's (``cost.pipeline.Op``): ``F`` forward,
``B`` backward (the input-gradient part when the weight gradient is split off), ``W`` weight
gradient. The wrappers are instance attributes, removed on exit.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

_METHODS = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}


class StageTimeline:
    """``with StageTimeline(model.stages, enabled) as tl: model.step(x, y)``; then ``tl.events``:
    ``[{"kind", "chunk", "microbatch", "start", "end"}]`` in seconds from entering the context."""

    def __init__(self, stages: list[Any], enabled: bool = True) -> None:
        self.stages = list(stages) if enabled else []
        self.events: list[dict[str, Any]] = []
        self.t0 = 0.0

    def _wrap(self, stage: Any, kind: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(chunk_id, *args, **kwargs)
            finally:
                self.events.append(
                    {
                        "kind": kind,
                        "chunk": int(stage.stage_index),
                        "microbatch": int(chunk_id),
                        "start": start - self.t0,
                        "end": time.perf_counter() - self.t0,
                    }
                )

        return timed

    def __enter__(self) -> StageTimeline:
        for stage in self.stages:
            for name, kind in _METHODS.items():
                if hasattr(stage, name):
                    setattr(stage, name, self._wrap(stage, kind, getattr(stage, name)))
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        for stage in self.stages:
            for name in _METHODS:
                stage.__dict__.pop(name, None)
