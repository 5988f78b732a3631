"""Split a measured step into parts that add up to it: compute, exposed communication, pipeline
wait, optimizer, other, by wall clock on the rank's main thread.

:class:`StepClock` cuts each step into three windows, by wrappers on the model's forward/backward
pass over its micro-batches (``fb``) and on ``optimizer.step`` (``opt``); the rest is zeroing
gradients, the gradient norm and the reported loss. Inside every window it times each blocking
wait on a collective (``runtime._torch_private.timed_waits``: c10d ``Work.wait``, the functional
collectives' ``wait_tensor``): a wait inside the pipeline schedule's P2P wait is pipeline wait,
any other is exposed communication (gloo and NCCL move data in the background; only what the main
thread blocks on is exposed). Then

    compute = fb - waits in fb      comm = communication waits      idle = pipeline waits
    optimizer = opt - waits in opt  other = rest - waits in the rest

and compute + comm + idle + optimizer + other = the step, exactly (:func:`split`). Compute
includes the host time of launching the operators (cost/host.py predicts it apart). A wait also
holds whatever the peer was still computing: on a loaded machine the ranks drift apart, and the
drift is charged to communication.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from meshwise.runtime._torch_private import timed_waits

PARTS = ("compute_s", "comm_s", "idle_s", "optimizer_s", "other_s")
WINDOWS = ("fb", "opt", "rest")


class StepClock:
    """``with StepClock(model) as clock: clock.reset(); model.step(x, y)``; then ``clock.fb_s``,
    ``clock.opt_s`` and ``clock.waits[(window, kind)]`` (kind ``comm`` or ``idle``) for the step
    just run. The wrappers are instance attributes, removed on exit."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.reset()
        self._waits = timed_waits(self._record)

    def reset(self) -> None:
        self.fb_s = self.opt_s = 0.0
        self.window = "rest"
        self.waits = {(w, k): 0.0 for w in WINDOWS for k in ("comm", "idle")}

    def _record(self, kind: str, seconds: float) -> None:
        self.waits[(self.window, kind)] += seconds

    def _timed(self, fn: Callable, attr: str, window: str) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            outer, self.window = self.window, window
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, attr, getattr(self, attr) + time.perf_counter() - start)
                self.window = outer
        return run

    def __enter__(self) -> "StepClock":
        m = self.model
        m._add_micro_batch_losses = self._timed(m._add_micro_batch_losses, "fb_s", "fb")
        m.optimizer.step = self._timed(m.optimizer.step, "opt_s", "opt")
        self._waits.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._waits.__exit__(*exc)
        self.model.__dict__.pop("_add_micro_batch_losses", None)
        self.model.optimizer.__dict__.pop("step", None)

    def parts(self, step_s: float) -> dict[str, float]:
        return split(step_s, self.fb_s, self.opt_s, self.waits)


def split(step_s: float, fb_s: float, opt_s: float, waits: dict[tuple[str, str], float]) -> dict[str, float]:
    """The step's parts (module docstring); they add up to ``step_s``. Each window's waits are
    capped at the window (timer granularity)."""
    fb_s = min(fb_s, step_s)
    opt_s = min(opt_s, step_s - fb_s)
    windows = {"fb": fb_s, "opt": opt_s, "rest": step_s - fb_s - opt_s}
    comm = idle = 0.0
    left = {}
    for w, length in windows.items():
        i = min(waits.get((w, "idle"), 0.0), length)
        c = min(waits.get((w, "comm"), 0.0), length - i)
        idle, comm, left[w] = idle + i, comm + c, length - i - c
    return {"compute_s": left["fb"], "comm_s": comm, "idle_s": idle, "optimizer_s": left["opt"],
            "other_s": left["rest"]}
