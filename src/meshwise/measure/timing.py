"""Split a measured step into parts, each timed on the rank's main thread: compute, exposed
communication, pipeline wait, optimizer and fixed; then check their sum against the step, timed
on its own.

:class:`StepClock` times four kinds of window by wrappers: the forward/backward pass over the
micro-batches (``fb``), ``optimizer.step`` (``opt``), and the step's fixed work (``fixed``:
zeroing gradients, redistributing partial gradients, the gradient norm and its clipping, the
loss's all-reduce, and the loss read the caller times with :meth:`StepClock.window`). Inside every
window it times each blocking wait on a collective (``runtime._torch_private.timed_waits``: c10d
``Work.wait``, the functional collectives' ``wait_tensor``): a wait inside the pipeline schedule's
P2P wait is pipeline wait, any other is exposed communication (gloo and NCCL move data in the
background; only what the main thread blocks on is exposed). Then

    compute = fb - waits in fb      comm = communication waits      idle = pipeline waits
    optimizer = opt - waits in opt  fixed = fixed - waits in fixed

Each part is timed, none is a remainder: ``untimed = step - (sum of the parts)`` is what no
window saw (Python between the windows, the timer itself), and :func:`check_sum` fails a split
whose untimed share exceeds ``SUM_TOLERANCE`` of the step (a window missed, or counted twice).
Compute includes the host time of launching the operators (cost/host.py predicts it apart). A
wait also holds whatever the peer was still computing: on a loaded machine the ranks drift apart,
and the drift is charged to communication.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from meshwise.runtime._torch_private import timed_waits

PARTS = ("compute_s", "comm_s", "idle_s", "optimizer_s", "fixed_s")
WINDOWS = ("fb", "opt", "fixed", "rest")
SUM_TOLERANCE = 0.05  # the largest share of the step the timed parts may leave unseen
# the step's fixed work: meshwise.runtime.parallelize's module functions, and ParallelModel's methods
_FIXED_FUNCTIONS = ("reduce_partial_grads", "clip_grad_norm")


class StepClock:
    """``with StepClock(model) as clock: clock.reset(); model.step(x, y)``; then ``clock.seconds``
    (window -> seconds) and ``clock.waits[(window, kind)]`` (kind ``comm`` or ``idle``) for the step
    just run. The wrappers are instance attributes (and, for the gradient norm's functions,
    meshwise.runtime.parallelize's module attributes), removed on exit. A window opened inside
    another counts once, in the outer one."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.reset()
        self._waits = timed_waits(self._record)
        self._saved: dict[str, Callable] = {}

    def reset(self) -> None:
        self.seconds = dict.fromkeys(WINDOWS, 0.0)
        self.current = "rest"
        self.waits = {(w, k): 0.0 for w in WINDOWS for k in ("comm", "idle")}

    @property
    def fb_s(self) -> float:
        return self.seconds["fb"]

    @property
    def opt_s(self) -> float:
        return self.seconds["opt"]

    def _record(self, kind: str, seconds: float) -> None:
        self.waits[(self.current, kind)] += seconds

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[None]:
        """Time the block as window ``name`` (unless a window is already open)."""
        if self.current != "rest":
            yield
            return
        self.current = name
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.current = "rest"

    def _timed(self, fn: Callable, window: str) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self.window(window):
                return fn(*args, **kwargs)

        return run

    def __enter__(self) -> StepClock:
        # by its full name: the package meshwise.runtime re-exports a function called parallelize
        module = importlib.import_module("meshwise.runtime.parallelize")

        m = self.model
        m._add_micro_batch_losses = self._timed(m._add_micro_batch_losses, "fb")
        m._global_mean = self._timed(m._global_mean, "fixed")
        m.optimizer.step = self._timed(m.optimizer.step, "opt")
        m.optimizer.zero_grad = self._timed(m.optimizer.zero_grad, "fixed")
        for name in _FIXED_FUNCTIONS:
            self._saved[name] = getattr(module, name)
            setattr(module, name, self._timed(self._saved[name], "fixed"))
        self._waits.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        module = importlib.import_module("meshwise.runtime.parallelize")

        self._waits.__exit__(*exc)
        for name, fn in self._saved.items():
            setattr(module, name, fn)
        self._saved.clear()
        for attr in ("_add_micro_batch_losses", "_global_mean"):
            self.model.__dict__.pop(attr, None)
        for attr in ("step", "zero_grad"):
            self.model.optimizer.__dict__.pop(attr, None)

    def parts(self, step_s: float) -> dict[str, float]:
        return split(step_s, self.seconds, self.waits)


def split(step_s: float, seconds: dict[str, float], waits: dict[tuple[str, str], float]) -> dict[str, float]:
    """The step's timed parts (module docstring) and ``untimed_s``, the step less their sum. A
    window's waits are capped at the window (timer granularity); waits outside every window count
    as communication."""
    out = dict.fromkeys(PARTS, 0.0)
    names = {"fb": "compute_s", "opt": "optimizer_s", "fixed": "fixed_s"}
    for w in WINDOWS:
        length = seconds.get(w, 0.0) if w != "rest" else math.inf
        idle = min(waits.get((w, "idle"), 0.0), length)
        comm = min(waits.get((w, "comm"), 0.0), length - idle)
        out["idle_s"] += idle
        out["comm_s"] += comm
        if w in names:
            out[names[w]] = length - idle - comm
    out["untimed_s"] = step_s - sum(out[p] for p in PARTS)
    return out


def check_sum(step_s: float, parts: dict[str, float], tolerance: float = SUM_TOLERANCE) -> str:
    """ "" when the timed parts add up to the independently timed step within ``tolerance`` of it,
    else one line saying by how much they miss."""
    total = sum(parts[p] for p in PARTS)
    if step_s > 0 and abs(step_s - total) <= tolerance * step_s:
        return ""
    return (
        f"the timed parts add up to {total:.4f} s, the step took {step_s:.4f} s "
        f"({(total - step_s) / step_s if step_s else float('inf'):+.1%}; bound {tolerance:.0%})"
    )
