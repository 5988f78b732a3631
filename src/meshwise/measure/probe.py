"""A few seconds' look at this machine's speed, to tell whether a cached calibration still holds
(measure/auto_profile.py). Two figures on one thread, the best of several timings each:

- ``probe_gemm_flops_per_s``: fp32 GEMMs of sides ``PROBE_GEMM_SIDES`` (a small one, where the
  call's fixed cost shows, and a mid-size one), ``sum(2 n^3) / sum(best time)``;
- ``probe_op_s``: one forward + backward through ``PROBE_OPS`` tiny operators (4 elements, so the
  arithmetic is nothing and dispatch + autograd is everything), per operator.

``meshwise calibrate`` records both beside the profile (with ``calibrated_unix_s``); ``train`` and
``measure`` probe again before using a cached profile and compare.

Also here, as they time this process alone: one block's GEMMs (:func:`bench_matmul`, the
calibration workers' matmul rate) and the threads' speed-up over them
(:func:`bench_thread_speedups`, which ``meshwise calibrate`` times while none of its workers runs).
"""

from __future__ import annotations

import statistics
import time

from meshwise.spec import ModelSpec

PROBE_GEMM_SIDES = (64, 384)
PROBE_OPS = 32
PROBE_KEYS = ("probe_gemm_flops_per_s", "probe_op_s", "calibrated_unix_s")


def _timings(fn, repeats: int, min_s: float) -> list[float]:
    """Seconds per call of ``fn`` in each of ``repeats`` runs (a run calls it at least once, and
    again until ``min_s`` has passed)."""
    out = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        out.append(elapsed / calls)
    return out


def best_time(fn, repeats: int, min_s: float = 0.0) -> float:
    """Shortest of ``repeats`` timings of ``fn`` (each run at least once, repeated to ``min_s``).
    The benchmarks time single calls, many times: the shortest is the call no other process
    interrupted, so a busy machine changes the figures little (the machine's own speed is what a
    profile holds)."""
    return min(_timings(fn, repeats, min_s))


def typical_time(fn, repeats: int, min_s: float = 0.0) -> float:
    """Median of ``repeats`` timings of ``fn`` (each as :func:`best_time`'s): what a training step
    pays for the same work, as the calibration's forward + backward is timed (its median pass).
    Where a figure is a time the cost model adds to a step, a best-of figure reads it short: with
    two ranks at once on a 2-core VM the median host pass was 1.1-1.4x the best, the fully
    checkpointed one 1.2-1.6x."""
    return statistics.median(_timings(fn, repeats, min_s))


def probe(repeats: int = 15) -> dict[str, float]:
    """The probe figures now (``calibrated_unix_s``: this moment)."""
    import torch  # torch: tune's planning imports this (via calibrate) without torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        pairs = [(torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)) for n in PROBE_GEMM_SIDES]
        flops = sum(2.0 * n**3 for n in PROBE_GEMM_SIDES)
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
    ratios = (
        at_calibration["probe_gemm_flops_per_s"] / now["probe_gemm_flops_per_s"],
        now["probe_op_s"] / at_calibration["probe_op_s"],
    )
    return max(ratios, key=lambda r: max(r, 1 / r)) - 1


def block_gemm_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of each matmul of one block: Q, K, V, output projection, then the MLP's."""
    h, kv, f = model.hidden, model.kv_dim, model.ffn_hidden
    mlp = [(h, f), (h, f), (f, h)] if model.mlp == "swiglu" else [(h, f), (f, h)]
    return [(h, h), (h, kv), (h, kv), (h, h)] + mlp


def bench_matmul(model: ModelSpec, tokens: int, repeats: int) -> float:
    """FLOP/s of one block's GEMMs at ``tokens`` tokens, fp32."""
    import torch  # torch: tune's planning imports this (via calibrate) without torch

    gen = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randn(tokens, k, generator=gen), torch.randn(n, k, generator=gen)) for k, n in block_gemm_shapes(model)
    ]
    flops = sum(2.0 * tokens * w.shape[0] * w.shape[1] for _, w in pairs)

    def run() -> None:
        for x, w in pairs:
            torch.nn.functional.linear(x, w)

    run()
    return flops / best_time(run, 10 * repeats)


THREAD_PAIRS = 5  # (one thread, every core's threads) timings, back to back: five pairs


def bench_thread_speedups(model: ModelSpec, tokens: int, repeats: int, cores: int) -> list[float]:
    """The block GEMMs' rate with ``cores`` threads over one thread's, timed back to back in
    ``THREAD_PAIRS`` pairs: each pair shares its moment, so a disturbance slows both or is one
    pair of five (timed apart, the two rates read 0.25 to 0.70 per extra thread on this host).
    Run it in a process with no peer: a second process waiting on gloo or the store took a core
    from the all-threads timing (1.57-1.73x alone, 0.77-1.93x beside a waiting peer, 2-core VM). The caller's thread count is restored."""
    import torch  # torch: tune's planning imports this (via calibrate) without torch

    threads = torch.get_num_threads()
    out = []
    try:
        for _ in range(THREAD_PAIRS):
            torch.set_num_threads(1)
            one = bench_matmul(model, tokens, repeats)
            torch.set_num_threads(cores)
            out.append(bench_matmul(model, tokens, repeats) / one)
    finally:
        torch.set_num_threads(threads)
    return out
