"""``meshwise calibrate`` on a CUDA device: the GPU op model's constants (cost/kernels.py) measured on
this machine and fitted by the code that fits them on published tables (cost/fit.py, the one owner
of each fit; benchmarks/fit_components.py), written as a profile that ``plan --gpu FILE`` reads.

Parts, each with a time budget (``Sizes.budget_s``; progress printed as each ends):

- **GEMMs** (bf16; fp8 where the device runs it, compute capability 8.9 on): the shapes the plan
  prices for ``--model`` (the block's four linears forward, input- and weight-gradient, and the
  head, at micro-batches of 1 and 2 sequences, under TP 1, 2, 4 and 8), with a grid of squares
  and deep GEMMs that pins the kernel floor and the tile depth; **grouped GEMMs** by rows per
  expert (``torch._grouped_mm``, bf16), at the plan's ``T k / E`` and a ladder of 16 to 2,048 rows,
  fitted with the dense ones (``gemm_seconds`` with ``batch`` = experts). Fitted: ``gemm.<dtype> =
  {efficiency, k_half}`` (fp8's as ``gemm.fp8-tensor``: per-tensor kernels, cost/fp8.py), ``kernel_floor_s`` (bf16's, held for fp8, as fit_components does),
  ``gemm_tile_m/_n``;
- **attention** (torch SDPA: FlashAttention-2 on CUDA), forward non-causal and causal and backward,
  sequences of 512 to 16k over 16k tokens, head widths 64 and 128: ``attention.meshwise`` curves
  ``top * s / (s + s_half)`` and ``head64``;
- **memory-bound passes**: a 1 GiB copy, ``hbm_efficiency`` = its bandwidth over the datasheet's;
- **sustained clock**: the largest plan GEMM cold and after ``hold_s`` seconds back to back;
- **collectives** (NCCL, every visible GPU): all-reduce and all-gather at the plan's payloads
  (a block's bf16 weights, its fp32 gradients, a micro-batch's activations) and a ladder of
  4 KiB to 256 MiB, ``intra_bytes_per_s`` and ``intra_latency_s``; on one GPU they need two or more
  and the catalog's links are kept (the profile's source says so).

Everything the device does not measure (peak FLOP/s, HBM datasheet bandwidth, the scale-out link,
Megatron's cuDNN attention) is the catalog entry's whose name the device's matches; the profile
names it. ``toy``: the same parts at toy sizes, on the CPU where there is no CUDA device, so that
CI checks the plumbing (its figures describe nothing).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from meshwise.cost import kernels
from meshwise.cost.fit import fit_gemm_points, fit_link, fit_saturating, gemm_pairs, log_errors
from meshwise.errors import MeshwiseError
from meshwise.files import write_atomically
from meshwise.launch import launch_logged
from meshwise.measure import gpu_bench
from meshwise.measure.calibrate import check_args
from meshwise.spec import AcceleratorSpec, ClusterSpec, LinkSpec, ModelSpec, load_cluster, load_model
from meshwise.spec.gpu_keys import ATTENTION_FIELDS

HEAD_WIDTHS = (64, 128)
LINK_BOUNDS = ((0.1, 500.0), (0.05, 2000.0))  # latency in us, bus bandwidth in GB/s: PCIe to NVLink 5


@dataclass(frozen=True)
class Sizes:
    """How big each part's work is, and its time budget in seconds."""

    mbs: tuple[int, ...]
    tp: tuple[int, ...]
    grid: tuple[int, ...]  # sides of the square / deep GEMM grid
    expert_rows: tuple[int, ...]  # rows per expert of the grouped GEMMs
    attention_seqs: tuple[int, ...]
    attention_tokens: int
    attention_heads: int
    copy_bytes: int
    hold_s: float
    link_bytes: tuple[int, ...]
    budget_s: dict[str, float]


FULL = Sizes(
    mbs=(1, 2),
    tp=(1, 2, 4, 8),
    grid=(256, 512, 1024, 2048, 4096, 8192),
    expert_rows=(16, 32, 64, 128, 256, 512, 1024, 2048),
    attention_seqs=(512, 1024, 2048, 4096, 8192, 16384),
    attention_tokens=16384,
    attention_heads=16,
    copy_bytes=1 << 30,
    hold_s=8.0,
    link_bytes=tuple(4 << (2 * i) for i in range(0, 12, 1) if (4 << (2 * i)) <= 1 << 28),
    budget_s={"gemm_bf16": 25.0, "grouped": 10.0, "gemm_fp8": 15.0, "attention": 20.0, "links": 20.0},
)
TOY = Sizes(
    mbs=(1,),
    tp=(1, 2),
    grid=(16, 64),
    expert_rows=(4, 16),
    attention_seqs=(16, 32, 64),
    attention_tokens=64,
    attention_heads=2,
    copy_bytes=1 << 20,
    hold_s=0.05,
    link_bytes=(4 << 10, 64 << 10),
    budget_s={"gemm_bf16": 5.0, "grouped": 2.0, "gemm_fp8": 2.0, "attention": 5.0, "links": 10.0},
)


def slug(name: str) -> str:
    """A device name as a file-name word: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def catalog_name(device_name: str) -> str | None:
    """The catalog entry (or alias) the device's name holds, the longest run of its words that
    names one (``NVIDIA H100 80GB HBM3`` -> ``h100-80gb``, an alias of ``h100``); None if none does."""
    words = slug(device_name).split("-")
    runs = sorted(
        {"-".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}, key=len, reverse=True
    )
    for run in runs:
        try:
            load_cluster(run, 1, 1)
        except MeshwiseError:
            continue
        return run
    return None


def plan_linears(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """``(N, K)`` of the linears cost/kernels.py prices on one TP rank: the block's QKV, output, MLP-in
    and MLP-out (``block_seconds``) and the head (``head_seconds``)."""
    h, width = model.hidden, kernels._mlp_width(model)
    mlp_in = (1 if model.mlp == "gelu" else 2) * width / tp
    linears = (((h + 2 * model.kv_dim) / tp, h), (h, h / tp), (mlp_in, h), (h, width / tp), (model.vocab / tp, h))
    return [(max(1, round(n)), max(1, round(k))) for n, k in linears]


def plan_gemm_shapes(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int, int]]:
    """``(1, M, N, K)`` of the GEMMs the plan prices for one micro-batch of ``tokens``: each of
    :func:`plan_linears` forward ``(T, N, K)``, input-gradient ``(T, K, N)`` and weight-gradient
    ``(K, N, T)``, each shape once."""
    shapes = [s for n, k in plan_linears(model, tp) for s in ((1, tokens, n, k), (1, tokens, k, n), (1, k, n, tokens))]
    return list(dict.fromkeys(shapes))


def grid_shapes(sizes: Sizes, tokens: int) -> list[tuple[int, int, int, int]]:
    """Squares of each grid side, and ``(T, side, side)``: the floor (small) and the tile depth (deep)."""
    return list(dict.fromkeys([(1, s, s, s) for s in sizes.grid] + [(1, tokens, s, s) for s in sizes.grid]))


def grouped_shapes(model: ModelSpec, sizes: Sizes, tokens: int) -> list[tuple[int, int, int, int]]:
    """``(experts, rows per expert, N, K)`` of an expert's MLP-in GEMM: the model's experts at the plan's
    ``T k / E`` rows and the ladder ``Sizes.expert_rows`` (a dense model: 8 experts of a quarter of
    its MLP width)."""
    experts = model.experts if model.moe else 8
    n = model.expert_ffn_hidden if model.moe else max(16, model.ffn_hidden // 4 // 16 * 16)
    plan_rows = max(1, tokens * (model.experts_per_token if model.moe else 2) // experts)
    rows = sorted({plan_rows, *sizes.expert_rows})
    return [(experts, r, 2 * n if model.mlp != "gelu" else n, model.hidden) for r in rows]


def attention_cases(sizes: Sizes) -> list[tuple[str, bool, int, int]]:
    return [
        (direction, causal, seq, d)
        for d in HEAD_WIDTHS[::-1]
        for seq in sizes.attention_seqs
        for direction, causal in (("forward", False), ("forward", True), ("backward", False))
    ]


def link_sizes(model: ModelSpec, seq: int, sizes: Sizes) -> list[int]:
    """Payload bytes of the collectives: the ladder, and the plan's: one block's bf16 weights (FSDP's
    all-gather), its fp32 gradients (DDP's all-reduce), one sequence's bf16 activations (TP's)."""
    if sizes is TOY:
        return list(sizes.link_bytes)
    plan = [int(2 * model.layer_params), int(4 * model.layer_params), int(2 * seq * model.hidden)]
    return sorted({*sizes.link_bytes, *(p for p in plan if p <= 1 << 30)})


# ---------------------------------------------------------------------------------------- the fits
def gemm_fields(base: AcceleratorSpec, samples: dict[str, list], peak_bf16: float, peak_fp8: float) -> dict:
    """``gemm.<dtype>`` rows, ``kernel_floor_s`` and the tile fitted (cost/fit.py ``fit_gemm_points``,
    sustained clock 1: the timings are short bursts, as the tables are) on the bf16 GEMMs with the
    grouped ones, then fp8's with bf16's floor and tile; with each fit's errors and the grouped
    GEMMs' own under the joint fit."""
    short = replace(base, sustained_clock=1.0)
    as_points = lambda rows: [(b, m, n, k, 2.0 * b * m * n * k / t) for b, m, n, k, t in rows]  # noqa: E731
    bf16_points = as_points(samples["gemm_bf16"] + samples["grouped"])
    bf16 = fit_gemm_points(short, bf16_points, "bf16", peak_bf16, 2)
    fitted = replace(
        short,
        gemm=(("bf16", bf16["efficiency"], bf16["k_half"]),),
        gemm_tile_m=bf16["tile"][0],
        gemm_tile_n=bf16["tile"][1],
        kernel_floor_s=bf16["kernel_floor_s"],
    )
    out = {"bf16": bf16}
    if samples["grouped"]:
        out["grouped_errors"] = log_errors(gemm_pairs(fitted, as_points(samples["grouped"]), "bf16", peak_bf16, 2))
    if samples.get("gemm_fp8"):
        out["fp8"] = fit_gemm_points(
            short, as_points(samples["gemm_fp8"]), "fp8", peak_fp8, 1, floor=bf16["kernel_floor_s"], tile=bf16["tile"]
        )
    return out


def attention_fields(samples: list[tuple[str, bool, int, int, float, float]], peak: float) -> dict | None:
    """``attention.meshwise``'s curves (cost/fit.py ``fit_saturating``, as fit_components fits the
    FlashAttention-3 paper's figures): forward, forward causal and backward at head width 128,
    ``head64`` the mean ratio of width 64's rate to 128's; None without a full set."""
    rate = {(d, c, s, w): flops / t / peak for d, c, s, w, t, flops in samples}
    curves = {}
    for name, direction, causal in (
        ("forward", "forward", False),
        ("forward_causal", "forward", True),
        ("backward", "backward", False),
    ):
        points = [(s, y) for (d, c, s, w), y in rate.items() if (d, c, w) == (direction, causal, 128)]
        if len(points) < 2:
            return None
        curves[name] = fit_saturating(points)
    ratios = [y / rate[(d, c, s, 128)] for (d, c, s, w), y in rate.items() if w == 64 and (d, c, s, 128) in rate]
    if not ratios:
        return None
    return {
        "kernel": "sdpa",
        "forward": curves["forward"][0],
        "forward_seq_half": curves["forward"][1],
        "forward_causal": curves["forward_causal"][0],
        "forward_causal_seq_half": curves["forward_causal"][1],
        "backward": curves["backward"][0],
        "backward_seq_half": curves["backward"][1],
        "head64": min(1.0, sum(ratios) / len(ratios)),
        "errors": max((c[2] for c in curves.values()), key=lambda e: e[0]),
    }


def link_fields(rows: list[list]) -> dict:
    """The intra-node link (cost/fit.py ``fit_link``, bounds ``LINK_BOUNDS``) from the collective rows."""
    points = [(str(kind), int(n), float(b), float(t)) for kind, n, b, t in rows]
    return fit_link(points, *LINK_BOUNDS)


# ------------------------------------------------------------------------------------ the measuring
def _part(name: str, budget_s: float | None, run, say, phase_s: dict[str, float]):
    """Run one part with its deadline (``budget_s`` from now; None: no bound), print and keep its seconds."""
    start = time.perf_counter()
    result = run(start + budget_s if budget_s is not None else float("inf"))
    phase_s[name] = time.perf_counter() - start
    count = f"{len(result)} timed, " if isinstance(result, list) else ""
    say(f"calibrate: {name}: {count}{phase_s[name]:.1f} s" + (f" (budget {budget_s:.0f} s)" if budget_s else ""))
    return result


def measure_parts(
    model: ModelSpec, seq: int, device: gpu_bench.Device, sizes: Sizes, timer: gpu_bench.Timer, say
) -> dict[str, Any]:
    """Every part's timings on ``device`` (module docstring), each within its budget."""
    dev, budget, phase_s = device.kind, sizes.budget_s, {}
    tokens = [mbs * seq for mbs in sizes.mbs]
    plan = list(
        dict.fromkeys(
            s
            for t in tokens
            for tp in sizes.tp
            if model.heads % tp == 0 and model.kv_heads % tp == 0
            for s in plan_gemm_shapes(model, t, tp)
        )
    )
    grid = [s for s in grid_shapes(sizes, tokens[0]) if s not in plan]
    shapes = grid[: len(sizes.grid)] + plan + grid[len(sizes.grid) :]  # squares (the floor) first, deep ones last
    samples: dict[str, Any] = {"phase_s": phase_s}
    samples["gemm_bf16"] = _part(
        "GEMMs bf16", budget["gemm_bf16"], lambda d: gpu_bench.bench_gemms(shapes, "bf16", dev, timer, d), say, phase_s
    )
    samples["grouped"] = _part(
        "grouped GEMMs bf16",
        budget["grouped"],
        lambda d: gpu_bench.bench_gemms(grouped_shapes(model, sizes, tokens[0]), "bf16", dev, timer, d),
        say,
        phase_s,
    )
    fp8_shapes = shapes if sizes is not TOY else [(1, s, s, s) for s in sizes.grid]  # a CPU's float8 GEMMs are slow
    samples["gemm_fp8"] = (
        _part(
            "GEMMs fp8",
            budget["gemm_fp8"],
            lambda d: gpu_bench.bench_gemms(fp8_shapes, "fp8", dev, timer, d),
            say,
            phase_s,
        )
        if device.fp8
        else []
    )
    samples["attention"] = _part(
        "attention (SDPA forward, backward)",
        budget["attention"],
        lambda d: gpu_bench.bench_attention(
            attention_cases(sizes), sizes.attention_tokens, sizes.attention_heads, dev, timer, d
        ),
        say,
        phase_s,
    )
    samples["copy_bytes_per_s"] = _part(
        "memory-bound (copy)", None, lambda d: gpu_bench.bench_copy(sizes.copy_bytes, dev, timer), say, phase_s
    )
    largest = max(plan, key=lambda s: s[1] * s[2] * s[3])[1:]
    samples["sustained_clock"] = _part(
        "sustained clock",
        None,
        lambda d: gpu_bench.bench_sustained_clock(largest, dev, timer, sizes.hold_s),
        say,
        phase_s,
    )
    return samples


def measure_links(model: ModelSpec, seq: int, device: gpu_bench.Device, sizes: Sizes, say) -> list[list] | None:
    """The collective rows (calibrate_gpu_links) over every visible GPU (two CPU processes at toy
    sizes); None on one GPU, which has nothing to measure."""
    nproc = device.count if device.kind == "cuda" else 2
    if nproc < 2:
        say("calibrate: collectives need >= 2 GPUs; this machine has 1: the catalog's links are kept")
        return None
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    if device.kind == "cuda":
        torch.cuda.empty_cache()  # the ranks need the memory this process's benchmarks left cached
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="meshwise-calibrate-links-") as tmp:
        argv = ["--sizes", ",".join(map(str, link_sizes(model, seq, sizes))), "--out", tmp]
        launch_logged("meshwise.measure.calibrate_gpu_links", argv, nproc, Path(tmp) / "logs", "collective benchmark")
        rows = json.loads((Path(tmp) / "links.json").read_text())
    say(f"calibrate: collectives ({nproc} ranks): {len(rows)} timed, {time.perf_counter() - start:.1f} s")
    return rows


# -------------------------------------------------------------------------------------- the profile
def reference(device: gpu_bench.Device, samples: dict[str, Any]) -> tuple[str | None, AcceleratorSpec, Any]:
    """(catalog name, accelerator, cluster of one node) the profile starts from: the catalog entry the
    device's name matches, else one made of the device's own figures (its best GEMM rate as peak,
    its copy bandwidth as HBM, a PCIe 4.0 x16 link of 25 GB/s assumed)."""
    name = catalog_name(device.name)
    if name is not None:
        cluster = load_cluster(name, 8)
        return name, cluster.accelerator, cluster
    rates = [2.0 * b * m * n * k / t for b, m, n, k, t in samples["gemm_bf16"]] or [1e12]
    accel = AcceleratorSpec(
        slug(device.name), device.memory_bytes, max(rates), max(rates), float(samples["copy_bytes_per_s"])
    )
    link = LinkSpec(25e9, 10e-6)
    return (
        None,
        accel,
        ClusterSpec(accelerator=accel, gpus_per_node=max(1, device.count), nodes=1, intra=link, inter=link),
    )


def profile_table(
    device: gpu_bench.Device, samples: dict[str, Any], links: list[list] | None, what: str
) -> dict[str, Any]:
    """The profile (accelerators.toml's keys, ``gemm.*`` and ``attention.*`` as inline tables) from the
    timings; ``what`` says what was calibrated (model, sequence)."""
    name, base, cluster = reference(device, samples)
    copy = float(samples["copy_bytes_per_s"])
    # the GEMM fits' memory term: the measured bandwidth
    base = replace(base, sm_count=device.sm_count, hbm_bytes_per_s=copy, hbm_efficiency=1.0)
    hbm_datasheet = cluster.accelerator.hbm_bytes_per_s
    peak = cluster.accelerator.peak_bf16_flops_per_s
    peak_fp8 = cluster.accelerator.peak_fp8_flops_per_s or 2 * peak
    gemm = gemm_fields(base, samples, peak, peak_fp8)
    attention = attention_fields(samples["attention"], peak)
    link = link_fields(links) if links else None
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    table: dict[str, Any] = {
        "name": f"{cluster.accelerator.name if name else slug(device.name)}-calibrated",
        "memory_bytes": device.memory_bytes,
        "peak_bf16_flops_per_s": peak,
        **({"peak_fp8_flops_per_s": peak_fp8} if device.fp8 and gemm.get("fp8") else {}),
        "peak_fp32_flops_per_s": cluster.accelerator.peak_fp32_flops_per_s,
        "hbm_bytes_per_s": hbm_datasheet,
        "gpus_per_node": cluster.gpus_per_node,
        "intra_bytes_per_s": link["bytes_per_s"] if link else cluster.intra.bytes_per_s,
        "intra_latency_s": link["latency_s"] if link else cluster.intra.latency_s,
        "inter_bytes_per_s": cluster.inter.bytes_per_s,
        "inter_latency_s": cluster.inter.latency_s,
        "sm_count": device.sm_count,
        "gemm_tile_m": gemm["bf16"]["tile"][0],
        "gemm_tile_n": gemm["bf16"]["tile"][1],
        "gemm.bf16": {"efficiency": gemm["bf16"]["efficiency"], "k_half": gemm["bf16"]["k_half"]},
        **(
            {"gemm.fp8-tensor": {"efficiency": gemm["fp8"]["efficiency"], "k_half": gemm["fp8"]["k_half"]}}
            if gemm.get("fp8")
            else {}
        ),
        "kernel_floor_s": gemm["bf16"]["kernel_floor_s"],
        "sustained_clock": float(samples["sustained_clock"]),
        **({"attention.meshwise": {k: v for k, v in attention.items() if k != "errors"}} if attention else {}),
        **{
            f"attention.{r[0]}": dict(zip(("kernel", *ATTENTION_FIELDS), r[1:]))
            for r in cluster.accelerator.attention
            if r[0] != "meshwise" or not attention
        },
        "hbm_efficiency": max(1e-3, min(1.0, copy / hbm_datasheet)),
        "calibrated_on": f"meshwise calibrate on {device.name}, {when}",
        "source": _source(name, device, samples, gemm, attention, link, copy, what),
    }
    return table


def _source(name, device, samples, gemm, attention, link, copy, what) -> str:
    """The profile's ``source``: what was measured, each fit's error on its own timings, what was kept."""
    parts = [
        f"meshwise calibrate on {device.name} ({what})",
        f"GEMMs bf16 ({len(samples['gemm_bf16'])} shapes with {len(samples['grouped'])} grouped) fitted with "
        f"mean |error| {gemm['bf16']['errors'][0]:.0%}",
    ]
    if "grouped_errors" in gemm:
        parts.append(f"grouped GEMMs under that fit: mean |error| {gemm['grouped_errors'][0]:.0%}")
    if gemm.get("fp8"):
        parts.append(
            f"GEMMs fp8 ({gemm['fp8']['points']} shapes) fitted with mean |error| {gemm['fp8']['errors'][0]:.0%}"
        )
    if attention:
        parts.append(
            f"SDPA attention ({len(samples['attention'])} calls) fitted with mean |error| up to "
            f"{attention['errors'][0]:.0%}"
        )
    parts.append(f"copy {copy / 1e9:.0f} GB/s; sustained clock {samples['sustained_clock']:.3f} of the cold GEMM's")
    parts.append(
        f"collectives ({link['points']} by kind and size) fitted with mean |error| {link['errors'][0]:.0%}"
        if link
        else "collectives not measured (they need >= 2 GPUs): the catalog's links"
    )
    parts.append(
        f"peak FLOP/s, datasheet HBM, scale-out link{', cuDNN attention' if name else ''}: "
        + (f"the catalog's {name}" if name else "not in the catalog: the device's own best rates")
    )
    return "; ".join(parts)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return f"{value:.6g}" if value != 0 else "0.0"


def format_profile(table: dict[str, Any]) -> str:
    """The profile as TOML: one key a line, ``gemm.<dtype>`` and ``attention.<runtime>`` as inline tables."""
    lines = ["# A GPU profile measured by `meshwise calibrate`; use it as `meshwise plan --gpu FILE`."]
    lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def calibrate_gpu(
    model: ModelSpec,
    model_ref: str,
    out: str,
    seq: int,
    toy: bool,
    say=print,
    timer: gpu_bench.Timer | None = None,
    device: gpu_bench.Device | None = None,
) -> dict[str, Any]:
    """Measure this machine's first CUDA device (``toy``: at toy sizes, on the CPU without one), fit,
    write the profile to ``out``; returns its table with ``phase_s`` (seconds per part, not written).
    ``timer`` and ``device`` stand in for the device's own in tests."""
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu" and not toy:
        raise MeshwiseError(
            "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
            "--toy runs the GPU calibration's steps on the CPU at toy sizes"
        )
    device = device or gpu_bench.this_device(kind)
    sizes = TOY if toy else FULL
    timer = timer or gpu_bench.Timer(device.kind, reps=3 if toy else 10)
    say(
        f"calibrate: {device.name} ({device.sm_count} SMs, {device.memory_bytes / 2**30:.1f} GiB, "
        f"fp8 {'yes' if device.fp8 else 'no'}, {device.count} visible), {model_ref} at {seq} tokens"
        + (" (toy sizes: plumbing only)" if toy else "")
    )
    start = time.perf_counter()
    samples = measure_parts(model, seq, device, sizes, timer, say)
    links = measure_links(model, seq, device, sizes, say)
    table = profile_table(device, samples, links, f"{model_ref} at {seq} tokens" + (", toy sizes" if toy else ""))
    write_atomically(out, format_profile(table))
    say(f"calibrate: measured and fitted in {time.perf_counter() - start:.1f} s")
    return {**table, "phase_s": samples["phase_s"]}


def gpu_path(device: str, toy: bool) -> bool:
    """Whether ``calibrate --device`` (auto, cpu, cuda) runs this GPU calibration: cuda, toy, or auto
    where torch sees a CUDA device."""
    if device == "cuda" or toy:
        return True
    if device == "cpu":
        return False
    import torch  # torch: calibrate --device cpu imports this module and runs without torch

    return torch.cuda.is_available()


def run_gpu_calibration(model_ref: str, out: str, seq_len: int | None, toy: bool) -> int:
    """``meshwise calibrate`` on the GPU path: arguments checked before any work, then
    :func:`calibrate_gpu`; prints the fitted constants."""
    model = load_model(model_ref)
    if model.states_only:
        raise MeshwiseError("--model: calibration needs a model shape, not a bare parameter count")
    seq = check_args(1, out, seq_len if seq_len is not None else min(model.max_seq, 4096), model)
    table = calibrate_gpu(model, model_ref, out, seq, toy)
    bf16 = table["gemm.bf16"]
    print(
        f"{out}: GEMM bf16 efficiency {bf16['efficiency']:.3f}, k_half {bf16['k_half']:.0f}, floor "
        f"{table['kernel_floor_s'] * 1e6:.1f} us; HBM {table['hbm_efficiency']:.3f} of the datasheet; sustained clock "
        f"{table['sustained_clock']:.3f}; link {table['intra_bytes_per_s'] / 1e9:.0f} GB/s + "
        f"{table['intra_latency_s'] * 1e6:.1f} us"
    )
    for clause in table["source"].split("; "):
        print(f"  {clause}")
    return 0
