"""Fits of the GPU time model's component constants: one owner of each fit, for the published tables
(benchmarks/fit_components.py) and for the timings ``meshwise calibrate`` takes on a CUDA device
(measure/calibrate_cuda.py).

Pure Python. Every fit minimises the mean |log(predicted / measured time)| one parameter at a time
by golden-section search (:func:`coordinate_fit`):

- GEMMs: ``efficiency``, ``k_half`` and ``kernel_floor_s`` of :func:`kernels.gemm_seconds`, over
  the output tiles ``TILES`` (:func:`fit_gemm_points`); where a table times GEMMs only in groups
  (a layer's passes), ``efficiency`` alone on the groups' summed times (:func:`fit_gemm_efficiency`);
- fused attention: ``top * s / (s + s_half)`` of peak per direction (:func:`fit_saturating`);
- collectives: a link's ``latency_s`` and ``bytes_per_s`` in :func:`comm.collective_seconds`
  (:func:`fit_link`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from meshwise.cost import comm, kernels
from meshwise.spec import AcceleratorSpec, LinkSpec

TILES = ((128, 128), (128, 256), (256, 128))
# (kind, ranks, payload bytes, seconds) of one collective; (batch, M, N, K, FLOP/s) of one GEMM
CollectivePoint = tuple[str, int, float, float]
GemmPoint = tuple[int, int, int, int, float]
# the (M, N, K) of GEMMs timed together, and their summed seconds
GemmGroup = tuple[tuple[tuple[int, int, int], ...], float]


def golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 40) -> float:
    """The argument in [lo, hi] minimising ``f`` (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2


def coordinate_fit(
    loss: Callable[[list[float]], float], start: list[float], bounds: list[tuple[float, float]], sweeps: int = 6
) -> list[float]:
    """Minimise ``loss(params)`` one parameter at a time (golden sections), ``sweeps`` times over."""
    params = list(start)
    for _ in range(sweeps):
        for i, (lo, hi) in enumerate(bounds):
            params[i] = golden(lambda v: loss(params[:i] + [v] + params[i + 1 :]), lo, hi)
    return params


def log_errors(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(mean, worst) |predicted / measured - 1| over (predicted, measured) pairs."""
    errs = [abs(p / m - 1) for p, m in pairs]
    return sum(errs) / len(errs), max(errs)


def mean_log(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean |log(predicted / measured)|: the loss every fit here minimises."""
    return sum(abs(math.log(p / m)) for p, m in pairs) / len(pairs)


def gemm_pairs(
    accel: AcceleratorSpec, points: Sequence[GemmPoint], dtype: str, peak: float, elem: int
) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of each GEMM point by :func:`kernels.gemm_seconds` on ``accel``."""
    out = []
    for b, m, n, k, flops in points:
        seconds = kernels.gemm_seconds(m, n, k, accel, peak, elem, b, dtype)
        out.append((seconds, 2.0 * b * m * n * k / flops))
    return out


def fit_gemm_points(
    base: AcceleratorSpec,
    points: Sequence[GemmPoint],
    dtype: str,
    peak: float,
    elem: int,
    floor: float | None = None,
    tile: tuple[int, int] | None = None,
) -> dict:
    """(efficiency, k_half, kernel_floor_s, tile) minimising the mean |log error| of ``points`` on ``base``
    (its ``sm_count`` and HBM; ``floor`` / ``tile`` given: held, not fitted), with the fit's errors."""
    best = None
    for tm, tn in [tile] if tile else TILES:

        def accel_of(p: list[float], tm: int = tm, tn: int = tn) -> AcceleratorSpec:
            return replace(
                base,
                gemm=((dtype, p[0], p[1]),),
                gemm_tile_m=tm,
                gemm_tile_n=tn,
                kernel_floor_s=p[2] if floor is None else floor,
            )

        loss = lambda p: mean_log(gemm_pairs(accel_of(p), points, dtype, peak, elem))  # noqa: E731
        p = coordinate_fit(loss, [0.8, 100.0, 4e-6], [(0.3, 1.0), (0.0, 2000.0), (0.0, 2e-5)])
        if best is None or loss(p) < best[0]:
            best = (loss(p), p, (tm, tn), gemm_pairs(accel_of(p), points, dtype, peak, elem))
    _, p, tile, pairs = best
    return {
        "efficiency": p[0],
        "k_half": p[1],
        "kernel_floor_s": p[2] if floor is None else floor,
        "tile": tile,
        "errors": log_errors(pairs),
        "points": len(points),
    }


def gemm_group_pairs(
    accel: AcceleratorSpec, groups: Sequence[GemmGroup], dtype: str, peak: float, elem: int
) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of each group: the sum of :func:`kernels.gemm_seconds` over its shapes."""
    return [
        (sum(kernels.gemm_seconds(m, n, k, accel, peak, elem, 1, dtype) for m, n, k in shapes), seconds)
        for shapes, seconds in groups
    ]


def fit_gemm_efficiency(
    base: AcceleratorSpec, groups: Sequence[GemmGroup], dtype: str, peak: float, elem: int, k_half: float
) -> dict:
    """``dtype``'s ``efficiency`` on ``base`` (its tile, SMs and ``kernel_floor_s``; ``k_half`` held: shapes
    all deeper than 4,096 cannot tell the tile's fixed depth from its rate) minimising the mean |log error| of
    the groups' summed times, with the fit's errors."""

    def accel_of(eff: float) -> AcceleratorSpec:
        return replace(base, gemm=((dtype, eff, k_half),))

    eff = golden(lambda v: mean_log(gemm_group_pairs(accel_of(v), groups, dtype, peak, elem)), 0.2, 1.0)
    pairs = gemm_group_pairs(accel_of(eff), groups, dtype, peak, elem)
    return {"efficiency": eff, "k_half": k_half, "errors": log_errors(pairs), "points": len(groups)}


def fit_saturating(points: Sequence[tuple[float, float]]) -> tuple[float, float, tuple[float, float]]:
    """(top, s_half) of ``top * s / (s + s_half)`` over ``(s, fraction of peak)`` points, and its errors."""
    loss = lambda p: mean_log([(kernels._saturating(p[0], p[1], s), y) for s, y in points])  # noqa: E731
    top, half = coordinate_fit(loss, [0.5, 300.0], [(0.05, 1.0), (0.0, 5000.0)])
    return top, half, log_errors([(kernels._saturating(top, half, s), y) for s, y in points])


def link_pairs(points: Sequence[CollectivePoint], latency_s: float, bytes_per_s: float) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of each collective by :func:`comm.collective_seconds` on one link."""
    link = LinkSpec(bytes_per_s, latency_s)
    return [(comm.collective_seconds(k, n, b, link), s) for k, n, b, s in points]


def fit_link(
    points: Sequence[CollectivePoint],
    latency_us: tuple[float, float] = (0.1, 50.0),
    bytes_gb_per_s: tuple[float, float] = (50.0, 900.0),
) -> dict:
    """A link's ``latency_s`` and ``bytes_per_s`` (within the bounds, in us and GB/s) minimising the
    mean |log error| of ``points``, with the fit's errors (all points; payloads of 64 MB or more)."""
    start = [min(max(5.0, latency_us[0]), latency_us[1]), min(max(300.0, bytes_gb_per_s[0]), bytes_gb_per_s[1])]
    latency, busbw = coordinate_fit(
        lambda p: mean_log(link_pairs(points, p[0] * 1e-6, p[1] * 1e9)), start, [latency_us, bytes_gb_per_s]
    )
    large = [p for p in points if p[2] >= 64e6]
    return {
        "latency_s": latency * 1e-6,
        "bytes_per_s": busbw * 1e9,
        "errors": log_errors(link_pairs(points, latency * 1e-6, busbw * 1e9)),
        "errors_large": log_errors(link_pairs(large, latency * 1e-6, busbw * 1e9)) if large else (0.0, 0.0),
        "points": len(points),
    }
