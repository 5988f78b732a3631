"""Split a measured step into compute, exposed communication and pipeline idle with torch.profiler.

On the rank's main thread, time inside collective calls and waits is communication the step waited
for (gloo and NCCL work in the background; only what the main thread blocks on is exposed); time
blocked in a pipeline receive is idle (the bubble); the rest of the step is compute.
"""

from __future__ import annotations

import time
from typing import Callable

from torch.profiler import ProfilerActivity, profile

# profiler event names (substrings) for blocking communication and for pipeline waits
COMM_MARKERS = ("c10d::", "_c10d_functional::", "wait_tensor", "ProcessGroup", "gloo:", "nccl:")
RECV_MARKERS = ("recv", "irecv", "PipelineStage", "_wait_batch_p2p")


def _merged_length(spans: list[tuple[float, float]]) -> float:
    """Total length of a union of intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_step(step: Callable[[], object]) -> dict[str, float]:
    """Run ``step`` once under the profiler: {profiled_step_s, comm_s, idle_s, compute_s}."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        total = time.perf_counter() - start
    comm: list[tuple[float, float]] = []
    idle: list[tuple[float, float]] = []
    for ev in prof.events():
        name = ev.name
        span = (ev.time_range.start / 1e6, ev.time_range.end / 1e6)
        if any(m in name for m in RECV_MARKERS) and "send" not in name:
            idle.append(span)
        elif any(m in name for m in COMM_MARKERS):
            comm.append(span)
    idle_s = _merged_length(idle)
    comm_s = max(0.0, _merged_length(comm + idle) - idle_s)
    return {"profiled_step_s": total, "comm_s": comm_s, "idle_s": idle_s,
            "compute_s": max(0.0, total - comm_s - idle_s)}
