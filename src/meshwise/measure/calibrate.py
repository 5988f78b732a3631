"""``meshwise calibrate``: microbenchmark the machine it runs on into an accelerator profile.

One launch (``meshwise.launch``) of ``N`` local processes (gloo, one thread each, as ``measure`` and
``train`` run on CPU); every rank measures at once and the slowest rank's figure is kept. With more
ranks than cores only the first ``cores`` ranks run the per-rank benchmarks (a profile holds a
rank's speed on a core of its own; the cost model time-shares the cores itself, cost/estimate.py
``core_share``). Collectives are measured with all ``N``. A time the cost model adds to a step is
its typical one, so each pass below is the median of its repeats (of three bursts spread over the
per-rank benchmarks, calibrate_worker ``_per_rank``), and each collective the median of five runs.

- ``peak_*_flops_per_s``: one block's GEMMs at ``T = mbs * seq`` tokens, ``sum(2 T k n) / time``;
- ``op_overhead_s``, ``checkpoint_call_s``, ``selective_op_s`` (cost/host.py): one forward + backward
  on ``HOST_TOKENS`` tokens under each activation-checkpointing mode, less its own GEMMs and SDPA
  calls by their fits (``A`` the pass's, ``a`` one block forward's): ``(t_none - A) / ops``,
  ``(t_full - t_none) / blocks - a - F * op`` and
  ``((t_sel - t_none) / blocks - a - F * op - call) / (2 F)``, never below 0;
- ``efficiency_max``: one forward + backward of the whole model on ``T`` tokens, the slowest rank's
  median pass, ``model_flops / ((fwd_bwd_s - ops * op_overhead_s - memory_bound_s) * matmul rate)``
  with ``memory_bound_s`` from cost/host.py ``memory_bound_seconds``; above 1 the matmul rate is
  raised to the model's; ``efficiency_half_width = 0`` (one CPU point cannot fit a curve);
- ``tp_op_s`` (even ``N``): the forward + backward under tp=2 less the plain one and its timed TP
  waits, per operator; ``tp_sp_block_s``: sequence parallelism on less off, per block
  (:func:`tp_sp_block_seconds`); ``zb_split_block_s``: a stage's backward split as zero-bubble
  runs it less one backward, per block (:func:`split_backward_block_seconds`); ``pp_call_s`` (even
  ``N``): two GPipe stages' step less waits and plain passes, per stage call
  (:func:`pipeline_call_seconds`); ``optimizer_dtensor_s``: AdamW over FSDP2's DTensor shards less
  over plain tensors, per parameter tensor;
- ``thread_efficiency``: the calibrating process's matmul rate with all ``C`` cores' threads over
  one thread's, in five back-to-back pairs before the workers start and five after they exit,
  ``(second best of rate_C / rate_1 - 1) / (C - 1)``;
- ``hbm_bytes_per_s`` / ``dram_bytes_per_s``: a copy of 4 MiB (cache-resident) and of 128 MiB,
  ``2 * bytes / time``;
- ``intra_/inter_bytes_per_s``, ``_latency_s``: all-reduce and all-gather at a few sizes, each
  call timed between two compute slices as training issues it (``(compute + call) - compute``),
  fitted by least squares on relative error to cost/comm.py's ring formulas,
  ``2(n-1) alpha + 2(n-1)/n B / beta`` and ``(n-1) alpha + (n-1)/n B / beta``;
  ``reduce_scatter_ratio``: reduce-scatter over all-reduce at the same sizes (geometric mean);
  ``all_to_all_ratio``: all-to-all over the pairwise-exchange formula at the fitted constants (likewise);
  one machine is one node, ``inter`` = ``intra``;
- ``cp_step_s``, ``cp_score_s``, ``cp_score_dim_s`` (cost/context_parallel.py): the runtime's whole
  ring-attention call over ranks 0 and 1 per ring step at ``RING_SHAPES`` (sends included,
  ``cp_step_includes_sends = true``); one process times the bare blocks;
- ``sync_skew_ratio``, ``sync_skew_slice_s`` (more ranks than cores): slices of
  ``SKEW_SLICE_GEMMS`` GEMMs then a 4 KiB all-reduce against each alone, the median of
  ``SKEW_PASSES`` passes (:func:`sync_skew`; cost/host.py ``sync_skew_seconds``);
- ``loss_token_table``: the runtime's cross-entropy forward + backward over fp32 logits at 128 tokens
  x 256, 8,192 and 65,536 logits, per token (cost/host.py ``loss_seconds``); measure/plan_shapes.py
  tops it up, and the SDPA and ring tables, at a run's own shapes before the run;
- ``cores_per_node`` = ``os.cpu_count()``; ``comm_overlap = false`` (gloo's transfers need the
  cores the rank computes on); ``memory_bytes = 0.8 * RAM / N``.

Why each is measured this way, with the figures: docs/cost-model.md, "Host time", and docs/fidelity.md.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from meshwise.cost.compute import model_flops
from meshwise.cost.host import BLOCK_FORWARD_OPS as F
from meshwise.cost.host import (
    cpu_gemm_seconds,
    gemm_grid_efficiency,
    loss_seconds,
    score_kernel_seconds,
    sdpa_call_seconds,
)
from meshwise.cost.kernels import PASSES, rank_memory_bound_bytes
from meshwise.cost.rank_work import RankWork
from meshwise.errors import MeshwiseError
from meshwise.files import check_output_file, write_atomically
from meshwise.launch import launch_logged
from meshwise.measure.probe import bench_thread_speedups, probe
from meshwise.spec import AcceleratorSpec, ModelSpec, load_model
from meshwise.spec.cluster import DEVICE_LINK_KEYS
from meshwise.spec.host_keys import HOST_CALL_KEYS, HOST_FIXED_KEYS

DEFAULT_OUT = "meshwise-profile.toml"
MEMORY_SHARE = 0.8  # fraction of physical memory the ranks may use together
# quick: every other one (4 KiB to 16 MiB); up to the FSDP2 units of a 512-wide block (12 MB), whose transfers
# leave the cache: gloo's cost per byte there is not its cost at 4 MiB
COLLECTIVE_SIZES_BYTES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
COPY_BYTES = 4 << 20  # a copy the last-level cache holds (source + destination): activations' size
DRAM_COPY_BYTES = 128 << 20  # one it cannot: what the optimizer's first pass over the states streams
HOST_TOKENS = 4  # tokens of the host-time benchmark: few enough that the arithmetic is negligible
# the host-time keys a rank measures on a core of its own, in the order the profile writes them
RANK_HOST_KEYS = (
    *HOST_CALL_KEYS,
    *HOST_FIXED_KEYS,
    "cpu_gemm_flops_per_s",
    "cpu_gemm_call_s",
    "cpu_gemm_bytes_per_s",
    "gemm_reference_efficiency",
    "dram_bytes_per_s",
    "cp_step_s",
    "cp_score_s",
    "cp_score_dim_s",
    "cp_step_includes_sends",
    "cp_ring_table",
    "sdpa_call_s",
    "sdpa_score_s",
    "sdpa_score_dim_s",
    "sdpa_head_table",
    "loss_token_table",
)
PROFILE_KEYS = (
    "name",
    *DEVICE_LINK_KEYS,
    "reduce_scatter_ratio",
    "all_to_all_ratio",
    "efficiency_max",
    "efficiency_half_width",
    "comm_overlap",
    *RANK_HOST_KEYS,
    "moe_part_table",  # added at a run's shapes (measure/plan_shapes.py top_up), never by calibrate
    "thread_efficiency",
    "cores_per_node",
    "sync_skew_ratio",
    "sync_skew_slice_s",
    "probe_gemm_flops_per_s",
    "probe_op_s",
    "calibrated_unix_s",
    "calibrated_on",
    "source",
)


# ----------------------------------------------------------------------------- pure arithmetic
def collective_coefficients(kind: str, n: int, payload_bytes: float) -> tuple[float, float]:
    """(latency steps, bytes over the link) of one call, so that ``t = steps * alpha + bytes / beta``
    (cost/comm.py's ring formulas; ``payload_bytes`` is the full tensor, gathered for all-gather)."""
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * payload_bytes
    if kind in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n * payload_bytes
    raise ValueError(f"unknown collective kind {kind!r}")


GEMM_SIDES = (16, 64, 256, 1024, 2048)
GEMM_SIDES_QUICK = (16, 128, 1024, 2048)
GEMM_MAX_MNK = 1 << 30  # the grid's largest GEMM: 2 GFLOP (about 20 ms at 100 GFLOP/s)


def gemm_grid(quick: bool) -> list[tuple[int, int, int]]:
    """(M, N, K) of the GEMM benchmark: every combination of ``GEMM_SIDES`` up to ``GEMM_MAX_MNK``."""
    sides = GEMM_SIDES_QUICK if quick else GEMM_SIDES
    return [(m, n, k) for m in sides for n in sides for k in sides if m * n * k <= GEMM_MAX_MNK]


def _relative_least_squares(rows: list[list[float]]) -> list[float] | None:
    """Coefficients ``c`` minimising ``sum((row . c - 1)^2)``: each row a sample's features divided by
    its measured time (least squares on relative error); Gauss-Jordan on the normal equations, None
    when they are singular."""
    size = len(rows[0]) if rows else 0
    a = [[sum(r[i] * r[j] for r in rows) for j in range(size)] + [sum(r[i] for r in rows)] for i in range(size)]
    for i in range(size):
        pivot = max(range(i, size), key=lambda j: abs(a[j][i]))
        a[i], a[pivot] = a[pivot], a[i]
        if a[i][i] == 0:
            return None
        a[i] = [x / a[i][i] for x in a[i]]
        for j in range(size):
            if j != i:
                a[j] = [x - a[j][i] * y for x, y in zip(a[j], a[i])]
    return [a[i][size] for i in range(size)]


def fit_gemm(samples: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    """(flops_per_s, call_s, bytes_per_s, mean |relative error|) of cost/host.py's
    ``cpu_gemm_seconds`` fitted to ``(M, N, K, seconds)`` samples by least squares on relative
    error (each sample's equation divided by its time). Terms whose coefficient comes out negative
    are left out (bandwidth first, then the fixed cost) and the rest refitted; ``bytes_per_s`` 0
    means no bandwidth term."""

    def solve(cols: list[int]) -> list[float] | None:
        rows = [[(2 * m * n * k, 1.0, 4.0 * (m * k + k * n + m * n))[c] / t for c in cols] for m, n, k, t in samples]
        return _relative_least_squares(rows)

    for cols in ([0, 1, 2], [0, 1], [0]):
        coef = solve(cols)
        if coef and all(c >= 0 for c in coef) and coef[0] > 0:
            full = dict(zip(cols, coef))
            g, call, inv_bw = full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0)
            errors = [
                abs((2 * m * n * k * g + call + 4.0 * (m * k + k * n + m * n) * inv_bw) / t - 1)
                for m, n, k, t in samples
            ]
            return 1.0 / g, call, (1.0 / inv_bw if inv_bw else 0.0), sum(errors) / len(errors)
    raise ValueError("no GEMM samples to fit")


RING_SHAPES = ((64, 16), (128, 16), (256, 16), (512, 16), (64, 64), (128, 64), (256, 64), (512, 64))
RING_HEADS, RING_KV_HEADS = 4, 2  # (local sequence, head width) above; GQA as the grid's models
# (tokens, vocab) of the loss's calls: logits the cache holds, a few times it, far beyond it (cost/host.py loss_seconds)
LOSS_SHAPES = ((128, 256), (128, 8192), (128, 65536))
SDPA_SHAPES = ((64, 16), (256, 16), (512, 16), (1024, 16), (64, 64), (256, 64), (512, 64), (1024, 64))


def fit_ring(samples: list[tuple[float, float, float]]) -> tuple[float, float, float, float]:
    """(call, per score element, per score element and head width, mean |relative error|) of a
    score-sized attention kernel, ``t = call + E * (score + d * dim)``: cost/context_parallel.py's
    ``ring_kernel_seconds`` per ring step (cp_*) and cost/host.py's ``sdpa_seconds`` per call
    (sdpa_*), fitted to ``(score elements E, head width d, seconds of a forward + backward)`` samples by least
    squares on relative error; a term whose coefficient comes out negative is left out (the
    per-width one first, then the fixed one) and the rest refitted."""

    def solve(cols: list[int]) -> list[float] | None:
        rows = [[(1.0, e, e * d)[c] / t for c in cols] for e, d, t in samples]
        return _relative_least_squares(rows)

    for cols in ([0, 1, 2], [0, 1], [1]):
        coef = solve(cols)
        if coef and all(c >= 0 for c in coef):
            full = dict(zip(cols, coef))
            step, score, dim = full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0)
            errors = [abs(score_kernel_seconds(step, score, dim, e, d) / t - 1) for e, d, t in samples]
            return step, score, dim, sum(errors) / len(errors)
    raise ValueError("no ring-attention samples to fit")


def fit_alpha_beta(samples: list[tuple[str, int, float, float]]) -> tuple[float, float]:
    """(latency_s, bytes_per_s) fitted to ``(kind, n, payload_bytes, seconds)`` samples.

    Minimises ``sum(((steps * alpha + bytes * g) - t) / t)^2`` over ``alpha >= 0`` and
    ``g = 1 / beta > 0``: relative error, so the small messages fix the latency and the large ones
    the bandwidth. A 2 x 2 normal-equation solve; a negative alpha is refitted as 0.
    """
    rows = []
    for kind, n, payload, seconds in samples:
        if seconds <= 0:
            raise ValueError(f"non-positive time {seconds} for {kind} of {payload} bytes")
        steps, moved = collective_coefficients(kind, n, payload)
        rows.append((steps / seconds, moved / seconds))
    if not rows:
        raise ValueError("no collective samples to fit")
    saa = sum(a * a for a, _ in rows)
    sab = sum(a * b for a, b in rows)
    sbb = sum(b * b for _, b in rows)
    sa = sum(a for a, _ in rows)
    sb = sum(b for _, b in rows)
    det = saa * sbb - sab * sab
    alpha = (sa * sbb - sb * sab) / det if det > 0 else -1.0
    g = (saa * sb - sab * sa) / det if det > 0 else -1.0
    if alpha < 0 or g <= 0:
        alpha, g = 0.0, sb / sbb  # bandwidth only
    return alpha, 1.0 / g


def reduce_scatter_ratio(samples: list[tuple[str, int, float, float]]) -> float:
    """A reduce-scatter's time over an all-reduce's of the same tensor, geometric mean over the sizes
    both were timed at (cost/comm.py: gloo's reduce-scatter times like an all-reduce, not like the
    ring's half of one); 0 when no size has both."""
    times = {(kind, n, payload): seconds for kind, n, payload, seconds in samples}
    ratios = [
        seconds / times[("all_reduce", n, payload)]
        for (kind, n, payload), seconds in times.items()
        if kind == "reduce_scatter" and times.get(("all_reduce", n, payload), 0) > 0
    ]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 0.0


def collective_fit_error(samples: list[tuple[str, int, float, float]], latency_s: float, bytes_per_s: float) -> float:
    """Mean |relative error| of the fitted latency and bandwidth on the samples they were fitted to."""
    errors = []
    for kind, n, payload, seconds in samples:
        steps, moved = collective_coefficients(kind, n, payload)
        errors.append(abs((steps * latency_s + moved / bytes_per_s) / seconds - 1))
    return sum(errors) / len(errors)


def link_fit(result: dict[str, Any], nproc: int) -> tuple[float, float, float, float, str]:
    """``(latency_s, bytes_per_s, reduce_scatter_ratio, all_to_all_ratio, note)`` of the gloo link: the
    ring formula fitted to the workers' all-reduces and all-gathers; a reduce-scatter as a ratio to
    the all-reduce of its tensor, an all-to-all as a ratio to the pairwise-exchange formula at the
    fitted latency and bandwidth (cost/comm.py; geometric means over the sizes). On one process a
    copy through shared memory stands in."""
    if nproc <= 1:
        return (
            1e-6,
            float(result["copy_bytes_per_s"]),
            0.0,
            0.0,
            "one process: links not measured (copy bandwidth, 1 us)",
        )
    exchanges = [tuple(s) for s in result["collectives"] if s[0] == "all_to_all"]
    every = [tuple(s) for s in result["collectives"] if s[0] != "all_to_all"]
    rs_ratio = reduce_scatter_ratio(every)  # the ring formula is fitted to the others
    samples = [s for s in every if s[0] != "reduce_scatter"] if rs_ratio else every
    latency_s, link_bytes_per_s = fit_alpha_beta(samples)
    ratios = [
        seconds / ((n - 1) * latency_s + (n - 1) / n * payload / link_bytes_per_s)
        for _, n, payload, seconds in exchanges
        if seconds > 0
    ]
    a2a_ratio = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 0.0
    link_note = (
        f"collectives (all-reduce, all-gather between compute slices, {len(samples)} "
        f"by kind and size) fitted over gloo with mean |error| "
        f"{collective_fit_error(samples, latency_s, link_bytes_per_s):.0%}, a reduce-scatter "
        f"{rs_ratio:.2f} x the all-reduce of its tensor"
        + (f", an all-to-all {a2a_ratio:.2f} x the pairwise exchange" if a2a_ratio else "")
    )
    return latency_s, link_bytes_per_s, rs_ratio, a2a_ratio, link_note


def profile_table(
    result: dict[str, Any], nproc: int, ram_bytes: int, name: str = "cpu-calibrated", note: str = ""
) -> dict[str, Any]:
    """The profile (catalog/accelerators.toml's keys) from the workers' ``result``:
    ``matmul_flops_per_s``, ``fwd_bwd_s``, ``model_flops``, ``copy_bytes_per_s``, ``collectives``
    (``[kind, n, payload_bytes, seconds]`` lists) and ``what`` (a description)."""
    latency_s, link_bytes_per_s, rs_ratio, a2a_ratio, link_note = link_fit(result, nproc)
    model_ops, gemm, ring = int(result["model_ops"]), gemm_fields(result), ring_fields(result)
    op_s, call_s, sel_s = host_constants(
        result["host_s"], model_ops, int(result["blocks"]), host_arithmetic_seconds(result, gemm, ring)
    )
    memory_s = calibration_memory_seconds(result)
    attention_s, attention_flops = calibration_attention(result, ring)
    arithmetic_s = max(
        float(result["fwd_bwd_s"]) - model_ops * op_s - memory_s - attention_s, 0.5 * float(result["fwd_bwd_s"])
    )
    peak, efficiency = arithmetic_rate(
        float(result["matmul_flops_per_s"]), float(result["model_flops"]) - attention_flops, arithmetic_s
    )
    tp_s = tp_op_seconds(result, latency_s, model_ops) if nproc > 1 else 0.0
    tp_sp_s = tp_sp_block_seconds(result) if nproc > 1 else 0.0
    zb_s = split_backward_block_seconds(result)
    pp_s = pipeline_call_seconds(result)
    fsdp_call_s, fsdp_param_s, fsdp_byte_s = 0.0, 0.0, 0.0
    if result.get("fsdp_host_s") and nproc > 1:
        fsdp_call_s, fsdp_param_s, fsdp_byte_s = fsdp_constants(
            result["fsdp_host_s"],
            float(result["host_s"]["none"]),
            int(result["model_tensors"]),
            int(result["blocks"]),
            float(result["copy_bytes_per_s"]),
        )
    optimizer_dtensor_s = optimizer_dtensor_seconds(result.get("optimizer_host_s", [])) if nproc > 1 else 0.0
    cores = int(result.get("cores", 1))
    skew_ratio, skew_slice_s = sync_skew(result.get("sync_skew", []), float(result["matmul_flops_per_s"]))
    thread_eff = thread_efficiency(result, peak, cores)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "name": name,
        "memory_bytes": int(MEMORY_SHARE * ram_bytes / nproc),
        "peak_bf16_flops_per_s": peak,
        "peak_fp32_flops_per_s": peak,
        "hbm_bytes_per_s": float(result["copy_bytes_per_s"]),
        **({"dram_bytes_per_s": float(result["dram_copy_bytes_per_s"])} if result.get("dram_copy_bytes_per_s") else {}),
        "gpus_per_node": nproc,
        "intra_bytes_per_s": link_bytes_per_s,
        "intra_latency_s": latency_s,
        "inter_bytes_per_s": link_bytes_per_s,
        "inter_latency_s": latency_s,
        **({"reduce_scatter_ratio": rs_ratio} if rs_ratio else {}),
        **({"all_to_all_ratio": a2a_ratio} if a2a_ratio else {}),
        "efficiency_max": efficiency,
        "efficiency_half_width": 0.0,
        "comm_overlap": False,
        "op_overhead_s": op_s,
        "checkpoint_call_s": call_s,
        "selective_op_s": sel_s,
        "tp_op_s": tp_s,
        "tp_sp_block_s": tp_sp_s,
        "zb_split_block_s": zb_s,
        "pp_call_s": pp_s,
        "fsdp_call_s": fsdp_call_s,
        "fsdp_param_s": fsdp_param_s,
        "fsdp_byte_s": fsdp_byte_s,
        "optimizer_dtensor_s": optimizer_dtensor_s,
        "thread_efficiency": thread_eff,
        "cores_per_node": cores,
        "sync_skew_ratio": skew_ratio,
        "sync_skew_slice_s": skew_slice_s,
        "calibrated_on": f"meshwise calibrate, {when}",
        **{k: v for k, v in gemm.items() if k != "note"},
        **{k: v for k, v in ring.items() if k != "note"},
        **({"cp_step_includes_sends": True} if result.get("ring_includes_sends") and "cp_step_s" in ring else {}),
        **({"loss_token_table": [[t, v, s / t] for t, v, s in result["loss"]]} if result.get("loss") else {}),
        "source": f"meshwise calibrate, {when}: {result['what']}; {link_note}; {gemm.get('note', '')}"
        f"{ring.get('note', '')}"
        f"memory_bytes = {MEMORY_SHARE} x RAM / {nproc}" + (f"; {note}" if note else ""),
    }


def thread_efficiency(result: dict[str, Any], peak: float, cores: int) -> float:
    """``(speed-up - 1) / (cores - 1)`` in [0.05, 1]: the second best of the paired timings,
    else (a result without pairs) the all-threads matmul rate over ``peak``; 1 on one core.
    A pair's speed-up falls when another process holds a core for its all-threads timing, the
    common disturbance on a shared host (the median of five read 0.22 to 0.86 per extra thread over
    13 calibrations on one 2-core VM, where training's two threads ran 1.7-1.85x one);
    it rises only when the one-thread timing is the disturbed one, which the second best leaves out.
    The profile holds the machine's own speed, as its best-of rates do (probe.best_time)."""
    if result.get("thread_speedups"):
        speedups = sorted(float(x) for x in result["thread_speedups"])
        speedup = speedups[-2] if len(speedups) > 1 else speedups[0]
    else:
        speedup = float(result.get("matmul_all_threads_flops_per_s", peak)) / peak
    return 1.0 if cores < 2 else min(1.0, max(0.05, (speedup - 1) / (cores - 1)))


def gemm_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The GEMM grid's profile keys (cost/host.py ``cpu_gemm_seconds``, ``gemm_shape_factor``) and
    a note on the fit's own error, from ``gemm_grid`` (``[M, N, K, seconds]``) and
    ``gemm_reference_shapes`` (the calibration model's GEMMs); {} without a grid."""
    if not result.get("gemm_grid"):
        return {}
    rate, call_s, bytes_per_s, error = fit_gemm([tuple(x) for x in result["gemm_grid"]])
    reference = gemm_grid_efficiency(
        _gemm_model(rate, call_s, bytes_per_s), [tuple(x) for x in result["gemm_reference_shapes"]]
    )
    return {
        "cpu_gemm_flops_per_s": rate,
        "cpu_gemm_call_s": call_s,
        "cpu_gemm_bytes_per_s": bytes_per_s,
        "gemm_reference_efficiency": min(1.0, reference),
        "note": f"GEMM grid of {len(result['gemm_grid'])} shapes (16 to 2048 per side) fitted with mean |error| "
        f"{error:.0%}; ",
    }


def _fitted(**fields: Any):
    """An accelerator holding only some fitted constants, for cost/host.py's readers of them
    (``cpu_gemm_seconds``, ``sdpa_call_seconds``) on calibrate's own fits."""
    return AcceleratorSpec("fit", 1, 1.0, 1.0, 1.0, **fields)


def _gemm_model(rate: float, call_s: float, bytes_per_s: float):
    """An accelerator holding only the fitted GEMM model (cost/host.py ``cpu_gemm_seconds`` reads it)."""
    return _fitted(cpu_gemm_flops_per_s=rate, cpu_gemm_call_s=call_s, cpu_gemm_bytes_per_s=bytes_per_s)


def ring_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The attention kernels' keys, ring attention's (cost/context_parallel.py ``ring_kernel_seconds``) and
    SDPA's (cost/host.py ``sdpa_call_seconds``), and a note on each fit's own error, from ``ring`` and
    ``sdpa`` (``[score elements, head width, seconds]`` per shape, ``RING_HEADS`` query heads of one
    sequence); {} without them. The cost model reads the timings themselves where it can: the
    ring's as timed (``cp_ring_table``), SDPA's per query head (``sdpa_head_table``: ``[sequence,
    head width, max(t - call, t / 10) / RING_HEADS]``, ``call`` the fitted line's), so that a call
    of any batch and head count adds its heads' share to one call cost."""
    out: dict[str, Any] = {"note": ""}
    for key, prefix, what in (("ring", "cp", "ring-attention blocks"), ("sdpa", "sdpa", "SDPA calls")):
        if result.get(key):
            call, score, dim, error = fit_ring([tuple(x) for x in result[key]])
            out |= {
                f"{prefix}_{'step' if prefix == 'cp' else 'call'}_s": call,
                f"{prefix}_score_s": score,
                f"{prefix}_score_dim_s": dim,
            }
            if (
                prefix == "cp"
            ):  # the cost model reads the timings themselves (cost/context_parallel.py ring_step_seconds)
                out["cp_ring_table"] = [[float(x) for x in row] for row in result[key]]
            elif len(result[key]) >= 2:
                out["sdpa_head_table"] = [
                    [math.sqrt(e / RING_HEADS), float(d), max(t - call, t / 10) / RING_HEADS] for e, d, t in result[key]
                ]
            out["note"] += f"{what} ({len(result[key])} shapes) fitted with mean |error| {error:.0%}; "
    return out if len(out) > 1 else {}


def _sdpa_call_seconds(fields: dict[str, Any], heads: float, seq: float, head_dim: float) -> float:
    """One SDPA call over ``heads`` query heads of ``seq`` tokens by ``fields`` (:func:`ring_fields`'
    keys), as the cost model reads them (cost/host.py ``sdpa_call_seconds``)."""
    accel = _fitted(
        sdpa_call_s=fields["sdpa_call_s"],
        sdpa_score_s=fields["sdpa_score_s"],
        sdpa_score_dim_s=fields["sdpa_score_dim_s"],
        sdpa_head_table=tuple(tuple(r) for r in fields.get("sdpa_head_table", ())),
    )
    return sdpa_call_seconds(accel, heads, seq, head_dim)


def calibration_attention(result: dict[str, Any], fields: dict[str, Any]) -> tuple[float, float]:
    """(seconds, FLOPs) of the calibration forward + backward's attention core when the SDPA
    constants were fitted (cost/host.py ``sdpa_seconds``), from ``sdpa_model`` (``[query heads,
    sequence, head width, attention-core FLOPs of the forward + backward]``): the efficiency is then
    solved over the rest, as the cost model charges the two apart. (0, 0) without them."""
    if "sdpa_score_s" not in fields or not result.get("sdpa_model"):
        return 0.0, 0.0
    heads, seq, head_dim, flops = (float(x) for x in result["sdpa_model"])
    per_call = _sdpa_call_seconds(fields, heads, seq, head_dim)
    return int(result["blocks"]) * per_call, flops


def fsdp_constants(
    fsdp_host_s: dict[str, list[float]], plain_s: float, tensors: int, blocks: int, copy_bytes_per_s: float
) -> tuple[float, float, float]:
    """(fsdp_call_s, fsdp_param_s, fsdp_byte_s) from the FSDP2 benchmark (calibrate_worker.bench_fsdp_host):
    per wrapping ``[seconds, calls, bytes, plain seconds]`` of a forward + backward net of its waits.
    By cost/host.py's model each wrapping's seconds less its model's plain pass are
    ``calls * (call + tensors / units * param) + bytes * byte``, with ``units`` = blocks + 1 wrapped
    per block (``blocks``, ``wide``) and ceil(blocks / 2) + 1 per pair (``pairs``): three equations,
    three unknowns, solved on relative error, each at least 0 (a negative one left out and the rest
    refitted). Without the ``wide`` wrapping (or where no fit stays at or above 0) the bytes cost
    their copy in and out, ``byte = 2 / copy bandwidth``, and the two calibration-model wrappings
    give the other two (one of them negative: the other refitted alone)."""
    units = {"blocks": blocks + 1, "pairs": -(-blocks // 2) + 1, "wide": blocks + 1}
    rows = []
    for mode in ("blocks", "pairs", "wide"):
        if mode in fsdp_host_s:
            row = list(fsdp_host_s[mode])  # older results: no bytes, no plain pass of their own
            seconds, calls = row[:2]
            moved = row[2] if len(row) > 2 else 0.0
            plain = row[3] if len(row) > 3 else plain_s
            rows.append((calls, calls * tensors / units[mode], moved, seconds - plain))
    if len(rows) == 3 and all(extra > 0 for *_, extra in rows):
        for cols in ([0, 1, 2], [0, 2], [1, 2], [2]):
            coef = _relative_least_squares([[row[c] / row[3] for c in cols] for row in rows])
            if coef and all(c >= -1e-9 * max(map(abs, coef)) for c in coef):  # 0 within rounding
                full = {col: max(c, 0.0) for col, c in zip(cols, coef)}
                return full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0)
    byte = 2.0 / copy_bytes_per_s
    (a1, b1, m1, y1), (a2, b2, m2, y2) = rows[:2]
    y1, y2 = y1 - m1 * byte, y2 - m2 * byte
    det = a1 * b2 - a2 * b1
    call = (y1 * b2 - y2 * b1) / det if det else -1.0
    param = (a1 * y2 - a2 * y1) / det if det else -1.0
    if call >= 0 and param >= 0:
        return call, param, byte
    if call < 0:  # per tensor alone
        return 0.0, max(0.0, (b1 * y1 + b2 * y2) / (b1 * b1 + b2 * b2)), byte
    return max(0.0, (a1 * y1 + a2 * y2) / (a1 * a1 + a2 * a2)), 0.0, byte


def tp_op_seconds(result: dict[str, Any], latency_s: float, model_ops: int) -> float:
    """``tp_op_s``: the tp=2 pass less the plain one and its collectives' own seconds, per operator
    (at least 0; 0 where not measured). The collectives' seconds are the time blocked on them where
    timed (``tp_waits_s``), else, in a result without them, their fitted latency once per call (with more
    ranks than cores as fitted on the TP pairs, which ran alone)."""
    if not result.get("tp_host_s"):
        return 0.0
    if "tp_waits_s" in result:
        comm_s = float(result["tp_waits_s"])
    else:
        alone = result.get("tp_collectives_alone")
        alone = [tuple(s) for s in alone or () if s[0] != "all_to_all"]
        comm_s = int(result["tp_collectives"]) * (fit_alpha_beta(alone)[0] if alone else latency_s)
    return max(0.0, (float(result["tp_host_s"]) - float(result["host_s"]["none"]) - comm_s) / model_ops)


def tp_sp_block_seconds(result: dict[str, Any]) -> float:
    """``tp_sp_block_s``: the tp=2 pass with sequence parallelism less the one without, each net of
    the time blocked on its collectives (the SP all-gathers and reduce-scatters are communication,
    charged apart), per block (the embedding's and the final norm's redistributions ride on the
    blocks'): ``((sp - sp waits) - (no sp - its waits)) / blocks``, at least 0; 0 where not
    measured."""
    if not result.get("tp_sp_host_s") or not result.get("tp_host_s"):
        return 0.0
    sp_net = float(result["tp_sp_host_s"]) - float(result.get("tp_sp_waits_s", 0.0))
    plain_net = float(result["tp_host_s"]) - float(result.get("tp_waits_s", 0.0))
    return max(0.0, (sp_net - plain_net) / int(result["blocks"]))


def split_backward_block_seconds(result: dict[str, Any]) -> float:
    """``zb_split_block_s``: the calibration model's blocks as a pipeline stage, forward then the
    backward split as the zero-bubble schedules run it (input gradients, then weights'), less the
    same with one backward, per block (calibrate_worker.bench_split_backward ``[plain, split]``):
    ``(split - plain) / blocks``, at least 0; 0 where not measured."""
    row = result.get("split_backward_s") or []
    if len(row) < 2:
        return 0.0
    return max(0.0, (float(row[1]) - float(row[0])) / int(result["blocks"]))


def pipeline_call_seconds(result: dict[str, Any]) -> float:
    """``pp_call_s``: what the pipeline schedule adds to each stage call (one micro-batch's forward
    or backward of one chunk) on top of the stage's own work, from calibrate_worker.bench_pp_host's
    rows ``[GPipe step less its waits, the same stage's plain passes, stage calls]``, one per rank:
    the ranks' median ``(step - plain) / calls``, at least 0; 0 where not measured (one
    process). The median, not the slowest rank: each row is a difference of two passes
    some 25 ms long, and of two ranks' the larger read 1.5 ms per call where six runs of the
    benchmark on each rank read 0.3-1.3 ms (about 0.6 ms typical) on a 2-core x86 host."""
    rows = result.get("pp_host_s") or []
    if not rows:
        return 0.0
    return max(0.0, statistics.median((float(step) - float(plain)) / int(calls) for step, plain, calls in rows))


def optimizer_dtensor_seconds(row: list[float]) -> float:
    """``optimizer_dtensor_s`` from calibrate_worker.bench_optimizer_host's ``[DTensor step, plain
    step, tensors]``: what an AdamW step costs more per parameter tensor when the parameters are
    DTensors, ``(dtensor - plain) / tensors``, at least 0; 0 without the row."""
    if len(row) < 3 or row[2] <= 0:
        return 0.0
    return max(0.0, (row[0] - row[1]) / row[2])


def sync_skew(rows: list[list[float]], flops_per_s: float) -> tuple[float, float]:
    """(sync_skew_ratio, sync_skew_slice_s) from calibrate_worker.bench_sync_skew's rows ``[slice
    FLOPs, slice alone, slice then all-reduce(, pass)]`` (seconds per iteration, every rank at once):
    per pass, the wait beyond the slice and the all-reduce apart, ``(both - alone) - both at no
    slice``, against the slice's own-core seconds ``FLOPs / flops_per_s`` (the rank's matmul rate on
    a core of its own), least squares through the origin, at least 0; the ratio is the median of the
    passes' (rows without a pass are one pass). The slice cap is the longest slice
    timed. (0, 0) without rows."""
    passes: dict[float, list[list[float]]] = {}
    for row in rows:
        passes.setdefault(row[3] if len(row) > 3 else 0.0, []).append(row)
    ratios, slices = [], []
    for one in passes.values():
        base = next((both for flops, _, both, *_ in one if flops == 0), None)
        points = [
            (flops / flops_per_s, max(both - alone - base, 0.0))
            for flops, alone, both, *_ in one
            if flops > 0 and base is not None
        ]
        if points:
            ratios.append(max(sum(own * wait for own, wait in points) / sum(own * own for own, _ in points), 0.0))
            slices.append(max(own for own, _ in points))
    if not ratios:
        return 0.0, 0.0
    return statistics.median(ratios), max(slices)


def arithmetic_rate(matmul_flops_per_s: float, model_flops: float, arithmetic_s: float) -> tuple[float, float]:
    """(peak, efficiency) with ``peak * efficiency = model_flops / arithmetic_s``: the matmul rate
    and the model's fraction of it; the model's own rate above the GEMM benchmark's (a busy machine
    slowed the shorter benchmark) is the peak, at efficiency 1."""
    peak = max(matmul_flops_per_s, model_flops / arithmetic_s)
    return peak, model_flops / (arithmetic_s * peak)


def calibration_memory_seconds(result: dict[str, Any]) -> float:
    """Seconds of the calibration's memory-bound passes as the cost model prices them (cost/host.py
    ``memory_bound_seconds``): the bytes over the copy bandwidth, the loss's own bytes replaced by
    its measured calls (``loss_token_table``) where the result holds them and the loss's shape
    (``loss_logits``: tokens, vocab)."""
    copy = float(result["copy_bytes_per_s"])
    moved = float(result.get("memory_bound_bytes", 0.0))
    if not (result.get("loss") and result.get("loss_logits")):
        return moved / copy
    tokens, vocab = (float(x) for x in result["loss_logits"])
    rows = tuple((t, v, sec / t) for t, v, sec in result["loss"])
    accel = _fitted(loss_token_table=rows)
    return (moved - tokens * vocab * PASSES["meshwise"]["loss_bytes"]) / copy + loss_seconds(accel, tokens, vocab)


def calibration_memory_bound_bytes(model: ModelSpec, seq: int) -> float:
    """Bytes the calibration's forward + backward (one sequence of ``seq`` tokens, the whole model,
    no TP, fp32) moves through memory-bound operations (cost/kernels.py ``rank_memory_bound_bytes``)."""
    whole = RankWork(1, 1, False, "none", model.layers, True, True)
    return rank_memory_bound_bytes(model, "meshwise", 4, seq, whole, model.vocab)


def with_memory_bound_term(table: dict[str, Any], model: ModelSpec, seq: int) -> dict[str, Any]:
    """A profile calibrated before the memory-bound term (calibration version < 5) as version 5
    derives it: its arithmetic time ``model_flops / (peak * efficiency)`` on ``model`` at ``seq``
    tokens, less :func:`calibration_memory_bound_bytes` over its copy bandwidth, refitted by
    :func:`arithmetic_rate` (the host time was already subtracted). For saved profiles (replay)."""
    flops = model_flops(model, seq, seq)
    old_s = flops / (float(table["peak_fp32_flops_per_s"]) * float(table["efficiency_max"]))
    memory_s = calibration_memory_bound_bytes(model, seq) / float(table["hbm_bytes_per_s"])
    peak, efficiency = arithmetic_rate(float(table["peak_fp32_flops_per_s"]), flops, max(old_s - memory_s, 0.5 * old_s))
    return table | {
        "peak_fp32_flops_per_s": peak,
        "peak_bf16_flops_per_s": peak,
        "efficiency_max": efficiency,
        "source": f"{table.get('source', '')}; memory-bound term subtracted (calibration version 5)",
    }


# a rank's own speed (on a core of its own): what every process count of one machine shares
PER_RANK_KEYS = ("peak_bf16_flops_per_s", "peak_fp32_flops_per_s", "hbm_bytes_per_s", "efficiency_max", *RANK_HOST_KEYS)


def with_per_rank_of(table: dict[str, Any], base: dict[str, Any], why: str) -> dict[str, Any]:
    """``table`` (a profile of more ranks than cores) with ``base``'s per-rank figures (a profile
    of at most one rank per core on the same machine): one speed per machine, its links kept."""
    merged = table | {k: base[k] for k in PER_RANK_KEYS if k in base}
    merged["source"] = f"{table.get('source', '')}; per-rank figures {why}"
    return merged


def host_arithmetic_seconds(result: dict[str, Any], gemm: dict[str, Any], ring: dict[str, Any]) -> tuple[float, float]:
    """(whole pass, one block's forward) seconds of the host benchmark's own GEMMs and attention
    calls (``HOST_TOKENS`` tokens), by the GEMM grid's and the SDPA calls' fits (``host_block_gemms``
    and ``host_head_gemms``: ``[M, N, K]`` of one block and of the head; ``host_sdpa``: ``[query
    heads, sequence, head width]``): at four tokens
    they still pay their fixed costs and move their weights, about a quarter of that pass on a
    2-core x86 host, which the per-operator cost must not absorb. (0, 0) without the fits."""
    if "cpu_gemm_flops_per_s" not in gemm or not result.get("host_block_gemms"):
        return 0.0, 0.0
    fitted = _gemm_model(gemm["cpu_gemm_flops_per_s"], gemm["cpu_gemm_call_s"], gemm["cpu_gemm_bytes_per_s"])
    blocks = float(result["blocks"])
    block_s = sum(cpu_gemm_seconds(fitted, *s) for s in result["host_block_gemms"])  # forward + backward
    head_s = sum(cpu_gemm_seconds(fitted, *s) for s in result.get("host_head_gemms", []))
    attention_s = 0.0
    if "sdpa_call_s" in ring and result.get("host_sdpa"):
        heads, seq, head_dim = (float(x) for x in result["host_sdpa"])
        attention_s = _sdpa_call_seconds(ring, heads, seq, head_dim)
    return blocks * (block_s + attention_s) + head_s, (block_s + attention_s) / 3.0


def host_constants(
    host_s: dict[str, float], model_ops: int, blocks: int, arithmetic_s: tuple[float, float] = (0.0, 0.0)
) -> tuple[float, float, float]:
    """(op_overhead_s, checkpoint_call_s, selective_op_s) from the forward + backward seconds of the
    host benchmark under each mode (``{"none": t, "full": t, "selective": t}``) less its arithmetic
    (``arithmetic_s``: :func:`host_arithmetic_seconds`, the whole pass's and one block forward's,
    which a recompute runs again), by cost/host.py's model: none = ops * op; full adds
    blocks * (F * op + call); selective adds blocks * (F * op + call + 2 F * sel). Each is at
    least 0, and the per-operator cost at least half of ``none / ops``."""
    whole_s, block_forward_s = arithmetic_s
    op = max(host_s["none"] - whole_s, 0.5 * host_s["none"]) / model_ops
    call = max(0.0, (host_s["full"] - host_s["none"]) / blocks - block_forward_s - F * op)
    sel = max(0.0, ((host_s["selective"] - host_s["none"]) / blocks - block_forward_s - F * op - call) / (2 * F))
    return op, call, sel


def format_toml(table: dict[str, Any]) -> str:
    """The profile as TOML, keys in catalog order (strings JSON-escaped: valid TOML basic strings)."""
    lines = ["# An accelerator profile measured by `meshwise calibrate`; use it as `meshwise plan --gpu FILE`."]
    for key in (k for k in PROFILE_KEYS if k in table):  # a key left out keeps its default
        value = table[key]
        if isinstance(value, bool):
            lines.append(f"{key} = {str(value).lower()}")
        elif isinstance(value, str):
            lines.append(f"{key} = {json.dumps(value)}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        elif isinstance(value, (list, tuple)):  # a measured table: rows of numbers
            rows = ", ".join("[" + ", ".join(f"{x:.6g}" for x in row) + "]" for row in value)
            lines.append(f"{key} = [{rows}]")
        else:
            lines.append(f"{key} = {value:.6g}" if value != 0 else f"{key} = 0.0")
    return "\n".join(lines) + "\n"


def write_profile(path: str | Path, table: dict[str, Any]) -> None:
    """Write atomically: a temporary file beside ``path``, then a rename."""
    write_atomically(path, format_toml(table))


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------------------ orchestration
def check_args(nproc: int, out: str, seq_len: int | None, model: ModelSpec) -> int:
    """Refuse bad input in one line before anything starts; returns the sequence length."""
    if nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
    if not out.endswith(".toml"):
        raise MeshwiseError(f"--out: {out!r} must end in .toml (plan --gpu reads a profile by that suffix)")
    check_output_file("--out", out, parent_must_exist=True)
    seq = seq_len if seq_len is not None else model.max_seq
    if not 1 <= seq <= model.max_seq:
        raise MeshwiseError(f"--seq-len: {seq} must be in [1, {model.max_seq}] (the model's max_seq)")
    return seq


def calibrate(
    nproc: int = 2,
    model_ref: str = "small",
    out: str = DEFAULT_OUT,
    seq_len: int | None = None,
    quick: bool = False,
    note: str = "",
) -> dict[str, Any]:
    """Measure with ``nproc`` local gloo processes, write the profile to ``out``; returns its table.
    ``quick``: fewer repetitions and smaller tensors; ``note``: appended to the profile's source."""
    model = load_model(model_ref)
    if model.states_only:
        raise MeshwiseError("--model: calibration needs a model shape, not a bare parameter count")
    seq = check_args(nproc, out, seq_len, model)
    start = time.perf_counter()  # the threads at two moments, before the workers start and after they exit:
    speedups = thread_speedups_alone(model, seq, quick)  # a host busy for a second spoils one of them
    threads_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="meshwise-calibrate-") as tmp:
        argv = ["--model", model_ref, "--seq-len", str(seq), "--out", tmp] + (["--quick"] if quick else [])
        launch_logged("meshwise.measure.calibrate_worker", argv, nproc, Path(tmp) / "logs", "calibration workers")
        result_file = Path(tmp) / "result.json"
        if not result_file.is_file():
            raise RuntimeError("calibration workers wrote no result")
        result = json.loads(result_file.read_text())
    start = time.perf_counter()
    speedups += thread_speedups_alone(model, seq, quick)
    result |= {
        "thread_speedups": speedups,
        "phase_s": {**result.get("phase_s", {}), "threads": threads_s + time.perf_counter() - start},
    }
    table = profile_table(result, nproc, physical_memory_bytes(), note=note) | probe()
    write_profile(out, table)
    return {**table, "phase_s": result.get("phase_s", {})}  # seconds per benchmark (not written)


def thread_speedups_alone(model: ModelSpec, seq: int, quick: bool) -> list[float]:
    """The paired speed-ups of all cores' threads over one (probe.bench_thread_speedups),
    timed by this process while no worker of its own runs; [] on one core. Calibration 12: inside
    the launch rank 0 timed them beside peers waiting on gloo, and read 0.05 per extra thread in
    three of one day's two-process calibrations on a 2-core VM (1.57-1.73x alone)."""
    cores = os.cpu_count() or 1
    return bench_thread_speedups(model, seq, 2 if quick else 3, cores) if cores > 1 else []
