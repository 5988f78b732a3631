"""The component benchmarks of ``meshwise calibrate`` on a CUDA device (measure/calibrate_gpu.py fits
them): GEMMs in bf16 and fp8, grouped GEMMs by rows per expert, fused attention forward and
backward, a copy through device memory, and the clock a long GEMM run settles at.

Each benchmark builds its tensors on ``device`` and hands a closure to a :class:`Timer` with a key
naming the work (``("gemm", dtype, batch, m, n, k)``, ``("attention", direction, causal, seq,
head_dim, batch, heads)``, ``("copy", bytes)``), so that a test can run the same code on fake
tensors and answer with times of its own. A benchmark stops taking new shapes once its deadline
(``time.perf_counter()`` seconds) has passed: every part has a bounded budget.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshwise.measure.calibrate import physical_memory_bytes

Key = tuple[Any, ...]
GEMM_ALIGN = 16  # torch._scaled_mm's float8 GEMMs need every side a multiple of 16


@dataclass(frozen=True)
class Device:
    """What the calibration needs to know of the device it measures."""

    name: str  # torch.cuda.get_device_name(), or "cpu"
    kind: str  # torch device type: "cuda" or "cpu"
    sm_count: int  # streaming multiprocessors (cores on a CPU)
    memory_bytes: int  # what the device gives a program (CUDA's total memory)
    fp8: bool  # runs float8 GEMMs (compute capability 8.9 or later)
    count: int  # devices of this kind visible to the process


def this_device(kind: str) -> Device:
    """The first visible device of ``kind`` ("cuda" or "cpu"), as torch reports it."""
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    if kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        return Device(
            torch.cuda.get_device_name(0),
            "cuda",
            int(props.multi_processor_count),
            int(props.total_memory),
            torch.cuda.get_device_capability(0) >= (8, 9),
            torch.cuda.device_count(),
        )
    return Device("cpu", "cpu", os.cpu_count() or 1, physical_memory_bytes(), True, 1)


class Timer:
    """Seconds of one call of a closure: ``warmup`` calls, then the median of ``bursts`` bursts of
    ``reps`` calls each, timed by CUDA events on a CUDA device (by the host clock on a CPU)."""

    def __init__(self, kind: str, reps: int = 10, bursts: int = 3, warmup: int = 2) -> None:
        self.kind, self.reps, self.bursts, self.warmup = kind, reps, bursts, warmup

    def __call__(self, fn: Callable[[], Any], key: Key) -> float:
        import torch  # torch: calibrate --device cpu imports this module and runs without torch

        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.bursts):
            if self.kind == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(self.reps):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / self.reps)
            else:
                t0 = time.perf_counter()
                for _ in range(self.reps):
                    fn()
                times.append((time.perf_counter() - t0) / self.reps)
        return statistics.median(times)

    def hold(self, fn: Callable[[], Any], seconds: float) -> None:
        """Run ``fn`` back to back for ``seconds`` (the device warms to its sustained clock)."""
        import torch  # torch: calibrate --device cpu imports this module and runs without torch

        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(self.reps):
                fn()
            if self.kind == "cuda":
                torch.cuda.synchronize()


def _fp8_operands(m: int, n: int, k: int, device: str):
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm asks
    one = torch.ones((), device=device)
    return a, b, one


def gemm_closure(dtype: str, batch: int, m: int, n: int, k: int, device: str) -> Callable[[], Any]:
    """One GEMM of (M, N, K) in ``dtype`` (bf16: ``torch.mm``; fp8: ``torch._scaled_mm`` e4m3 with
    per-tensor scales into bf16), or ``batch`` > 1 of them as one grouped GEMM (``torch._grouped_mm``
    over ``batch`` experts of ``m`` rows each, bf16; where the device has no grouped kernel, one GEMM
    per expert, as runtime/moe.py runs them)."""
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    if batch > 1:
        x = torch.randn(batch * m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(batch, k, n, device=device, dtype=torch.bfloat16)
        offs = torch.arange(1, batch + 1, device=device, dtype=torch.int32) * m
        try:
            torch._grouped_mm(x, w, offs=offs)
            return lambda: torch._grouped_mm(x, w, offs=offs)
        except (
            RuntimeError,
            NotImplementedError,
        ):  # a device without the grouped kernel: one GEMM per expert, as runtime/moe.py runs
            rows = torch.split(x, m)
            return lambda: [r @ w[e] for e, r in enumerate(rows)]
    if dtype == "fp8":
        a, b, one = _fp8_operands(m, n, k, device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    return lambda: torch.mm(a, b)


def bench_gemms(
    shapes: Sequence[tuple[int, int, int, int]], dtype: str, device: str, timer: Timer, deadline: float
) -> list[tuple[int, int, int, int, float]]:
    """``(batch, m, n, k, seconds)`` of each ``(batch, m, n, k)`` timed before ``deadline`` (fp8:
    shapes whose sides are multiples of 16 only)."""
    out = []
    for b, m, n, k in shapes:
        if time.perf_counter() > deadline:
            break
        if dtype == "fp8" and (b > 1 or any(x % GEMM_ALIGN for x in (m, n, k))):
            continue
        out.append((b, m, n, k, timer(gemm_closure(dtype, b, m, n, k, device), ("gemm", dtype, b, m, n, k))))
    return out


def attention_flops(direction: str, causal: bool, batch: int, heads: int, seq: int, head_dim: int) -> float:
    """FLOPs of one fused attention call as the published tables count them (components_attention.csv):
    forward ``4 b h s^2 d``, half of it causal; backward 2.5x the forward."""
    forward = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return forward * (2.5 if direction == "backward" else 1.0)


def bench_attention(
    cases: Sequence[tuple[str, bool, int, int]], tokens: int, heads: int, device: str, timer: Timer, deadline: float
) -> list[tuple[str, bool, int, int, float, float]]:
    """``(direction, causal, seq, head_dim, seconds, FLOPs)`` of torch SDPA (the runtime's attention:
    FlashAttention-2 on a CUDA device) in bf16 on ``tokens // seq`` sequences of ``heads`` heads, for
    each ``(direction, causal, seq, head_dim)`` timed before ``deadline``; the backward alone, on a
    graph kept from one forward."""
    import torch  # torch: calibrate --device cpu imports this module and runs without torch
    import torch.nn.functional as F  # torch: calibrate --device cpu imports this module and runs without torch

    out = []
    for direction, causal, seq, head_dim in cases:
        if time.perf_counter() > deadline:
            break
        batch = max(1, tokens // seq)
        q, k, v = (
            torch.randn(
                batch, heads, seq, head_dim, device=device, dtype=torch.bfloat16, requires_grad=direction == "backward"
            )
            for _ in range(3)
        )
        if direction == "forward":
            fn = lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)  # noqa: E731
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            grad = torch.randn_like(o)
            fn = lambda o=o, g=grad, ins=(q, k, v): torch.autograd.grad(o, ins, g, retain_graph=True)  # noqa: E731
        seconds = timer(fn, ("attention", direction, causal, seq, head_dim, batch, heads))
        out.append(
            (direction, causal, seq, head_dim, seconds, attention_flops(direction, causal, batch, heads, seq, head_dim))
        )
    return out


def bench_copy(size_bytes: int, device: str, timer: Timer) -> float:
    """Bytes per second of a copy of ``size_bytes`` (STREAM copy: ``2 * bytes / time``, read + write),
    the memory-bound passes' bandwidth."""
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    src = torch.empty(size_bytes // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2.0 * size_bytes / timer(lambda: dst.copy_(src), ("copy", size_bytes))


def bench_sustained_clock(shape: tuple[int, int, int], device: str, timer: Timer, hold_s: float) -> float:
    """The largest GEMM's time on a cold device over its time after ``hold_s`` seconds of back-to-back
    GEMMs (at most 1): the share of the short-burst clock the device holds under sustained dense
    math (the component tables ran short bursts; cost/kernels.py ``sustained_clock``)."""
    m, n, k = shape
    fn = gemm_closure("bf16", 1, m, n, k, device)
    cold = timer(fn, ("gemm", "bf16", 1, m, n, k))
    timer.hold(fn, hold_s)
    hot = timer(fn, ("sustained", m, n, k, hold_s))
    return min(1.0, cold / hot)
