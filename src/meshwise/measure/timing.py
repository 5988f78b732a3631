"""Split a measured step into parts that add up to it: compute, exposed communication, pipeline
wait, optimizer, other.

Every timed step is cut by wall clock (:class:`StepClock`, wrappers on the model's
forward/backward pass over its micro-batches and on ``optimizer.step``) into three windows:
forward/backward ``fb``, optimizer ``opt`` and the rest (zeroing gradients, the gradient norm and
its all-reduce, the reported loss's all-reduce). One more step runs under torch.profiler
(:func:`profile_step`): on the rank's main thread, time inside collective calls and waits is
communication the step waited for (gloo and NCCL work in the background; only what the main thread
blocks on is exposed), time blocked in a pipeline receive is pipeline wait. The profiler slows the
operators it records, so it gives *fractions* of each window, applied to the unprofiled step
(:func:`split`):

    idle    = fb * idle_fb' / fb'             comm = fb * comm_fb' / fb' + rest * comm_rest' / rest'
    compute = fb - fb * (comm_fb' + idle_fb') / fb'   optimizer = opt   other = rest - rest * comm_rest' / rest'

(primes: the profiled step), so compute + comm + idle + optimizer + other = the step, exactly.
Compute includes the host time of launching the operators (cost/host.py predicts it apart).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from torch.profiler import ProfilerActivity, profile, record_function

# profiler event names (substrings) for blocking communication and for pipeline waits
COMM_MARKERS = ("c10d::", "_c10d_functional::", "wait_tensor", "ProcessGroup", "gloo:", "nccl:")
RECV_MARKERS = ("recv", "irecv", "PipelineStage", "_wait_batch_p2p")
FB_RANGE, OPT_RANGE = "meshwise::forward_backward", "meshwise::optimizer_step"
PARTS = ("compute_s", "comm_s", "idle_s", "optimizer_s", "other_s")


def _merged_length(spans: list[tuple[float, float]]) -> float:
    """Total length of a union of intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _clip(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``spans`` inside any of ``windows``."""
    out = []
    for a, b in spans:
        for lo, hi in windows:
            if min(b, hi) > max(a, lo):
                out.append((max(a, lo), min(b, hi)))
    return out


class StepClock:
    """Wall-clock windows of each step: ``with StepClock(model) as clock: model.step(x, y)``;
    ``clock.fb_s``, ``clock.opt_s`` are the forward/backward and optimizer seconds of the step
    just run. The wrappers (instance attributes) also open profiler ranges, removed on exit."""

    def __init__(self, model: Any) -> None:
        self.model, self.fb_s, self.opt_s = model, 0.0, 0.0

    def _timed(self, fn: Callable, attr: str, label: str) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with record_function(label):
                    return fn(*args, **kwargs)
            finally:
                setattr(self, attr, getattr(self, attr) + time.perf_counter() - start)
        return run

    def reset(self) -> None:
        self.fb_s = self.opt_s = 0.0

    def __enter__(self) -> "StepClock":
        m = self.model
        m._add_micro_batch_losses = self._timed(m._add_micro_batch_losses, "fb_s", FB_RANGE)
        m.optimizer.step = self._timed(m.optimizer.step, "opt_s", OPT_RANGE)
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.__dict__.pop("_add_micro_batch_losses", None)
        self.model.optimizer.__dict__.pop("step", None)


def profile_step(step: Callable[[], object]) -> dict[str, float]:
    """Run ``step`` (under a :class:`StepClock`) once under the profiler: the whole step, its
    forward/backward and optimizer windows, and the communication and pipeline-wait seconds in
    the forward/backward window and in the rest."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        total = time.perf_counter() - start
    comm: list[tuple[float, float]] = []
    idle: list[tuple[float, float]] = []
    fb: list[tuple[float, float]] = []
    opt: list[tuple[float, float]] = []
    for ev in prof.events():
        name = ev.name
        span = (ev.time_range.start / 1e6, ev.time_range.end / 1e6)
        if name == FB_RANGE:
            fb.append(span)
        elif name == OPT_RANGE:
            opt.append(span)
        elif any(m in name for m in RECV_MARKERS) and "send" not in name:
            idle.append(span)
        elif any(m in name for m in COMM_MARKERS):
            comm.append(span)
    fb_s, opt_s = _merged_length(fb), _merged_length(opt)
    idle_fb = _merged_length(_clip(idle, fb))
    comm_fb = max(0.0, _merged_length(_clip(comm + idle, fb)) - idle_fb)
    comm_all = max(0.0, _merged_length(comm + idle) - _merged_length(idle))
    comm_opt = _merged_length(_clip(comm, opt))
    return {"profiled_step_s": total, "fb_s": fb_s, "opt_s": opt_s, "comm_fb_s": comm_fb, "idle_fb_s": idle_fb,
            "comm_rest_s": max(0.0, comm_all - comm_fb - comm_opt), "rest_s": max(total - fb_s - opt_s, 0.0)}


def split(step_s: float, fb_s: float, opt_s: float, prof: dict[str, float]) -> dict[str, float]:
    """The step's parts (module docstring): they add up to ``step_s``."""
    fb_s = min(fb_s, step_s)
    opt_s = min(opt_s, step_s - fb_s)
    rest_s = step_s - fb_s - opt_s
    f_idle = prof["idle_fb_s"] / prof["fb_s"] if prof["fb_s"] > 0 else 0.0
    f_comm = prof["comm_fb_s"] / prof["fb_s"] if prof["fb_s"] > 0 else 0.0
    f_rest = min(1.0, prof["comm_rest_s"] / prof["rest_s"]) if prof["rest_s"] > 0 else 0.0
    idle_s = fb_s * min(f_idle, 1.0)
    comm_fb = fb_s * min(f_comm, 1.0 - min(f_idle, 1.0))
    comm_rest = rest_s * f_rest
    return {"compute_s": fb_s - idle_s - comm_fb, "comm_s": comm_fb + comm_rest, "idle_s": idle_s,
            "optimizer_s": opt_s, "other_s": rest_s - comm_rest}
