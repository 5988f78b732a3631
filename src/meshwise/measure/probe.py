"""A few seconds' look at this machine's speed, to tell whether a cached calibration still holds
(measure/auto_profile.py). Two figures on one thread, the best of several timings each:

- ``probe_gemm_flops_per_s``: fp32 GEMMs of sides ``PROBE_GEMM_SIDES`` (a small one, where the
  call's fixed cost shows, and a mid-size one), ``sum(2 n^3) / sum(best time)``;
- ``probe_op_s``: one forward + backward through ``PROBE_OPS`` tiny operators (4 elements, so the
  arithmetic is nothing and dispatch + autograd is everything), per operator.

``meshwise calibrate`` records both beside the profile (with ``calibrated_unix_s``); ``train`` and
``measure`` probe again before using a cached profile and compare.
"""

from __future__ import annotations

import math
import time

PROBE_GEMM_SIDES = (64, 384)
PROBE_OPS = 32
PROBE_KEYS = ("probe_gemm_flops_per_s", "probe_op_s", "calibrated_unix_s")


def best_time(fn, repeats: int, min_s: float = 0.0) -> float:
    """Shortest of ``repeats`` timings of ``fn`` (each run at least once, repeated to ``min_s``).
    The benchmarks time single calls, many times: the shortest is the call no other process
    interrupted, so a busy machine changes the figures little (the machine's own speed is what a
    profile holds)."""
    best = math.inf
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        best = min(best, elapsed / calls)
    return best


def probe(repeats: int = 15) -> dict[str, float]:
    """The probe figures now (``calibrated_unix_s``: this moment)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        pairs = [(torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)) for n in PROBE_GEMM_SIDES]
        flops = sum(2.0 * n ** 3 for n in PROBE_GEMM_SIDES)
        gemm_s = sum(best_time(lambda a=a, b=b: torch.mm(a, b), repeats, 0.002) for a, b in pairs)
        x = torch.ones(4, requires_grad=True)

        def chain() -> None:
            y = x
            for _ in range(PROBE_OPS // 2 - 1):  # forward ops; backward runs about as many
                y = y * 1.0001
            y.sum().backward()

        op_s = best_time(chain, repeats, 0.002) / PROBE_OPS
    finally:
        torch.set_num_threads(threads)
    return {"probe_gemm_flops_per_s": flops / gemm_s, "probe_op_s": op_s, "calibrated_unix_s": int(time.time())}


def drift(at_calibration: dict, now: dict) -> float:
    """How far the machine moved since its calibration: of the GEMM time ratio and the operator time
    ratio (now over then), the one farther from 1, less 1 (+0.5: 50% slower; -0.3: 30% faster)."""
    ratios = (at_calibration["probe_gemm_flops_per_s"] / now["probe_gemm_flops_per_s"],
              now["probe_op_s"] / at_calibration["probe_op_s"])
    return max(ratios, key=lambda r: max(r, 1 / r)) - 1
