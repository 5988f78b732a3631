"""Fit the GPU time model's components, each on its own published data, and report each one's error.

Nothing here reads an end-to-end training run: the published runs (benchmarks/fidelity.py) are the
test set. The data, one source per row, lie in src/meshwise/catalog/components_*.csv:

- GEMMs by shape and dtype (components_gemm_xla.csv: OpenXLA's H100 table; components_gemm.csv: A100
  cuBLAS squares, DeepGEMM's FP8 table): ``efficiency``, ``k_half`` and ``kernel_floor_s`` of
  cost/kernels.py ``gemm_seconds``, fitted by minimising the mean |log(predicted / published time)|;
  Blackwell's (b200, gb200) ``efficiency`` per row alone, on Transformer Engine's B300 layer tables
  (components_te_linears.csv: bf16, MXFP8 for the block-scaled ``fp8`` row, per-tensor FP8 for
  ``fp8-tensor``), the H100's depth, floor and tile held (benchmarks/fp8_components.py reads the table);
  timings by shape on B200, GB200 and GH200 (components_gemm.csv) check the bf16 rows at the table clock;
- fused attention by sequence, head width and causality (components_attention.csv: FlashAttention-3
  paper's H100 figures for FlashAttention-2 and cuDNN): ``top * s / (s + s_half)`` per direction;
  Blackwell's: the H100 curves scaled to FlashAttention-4's B200 figures (cuDNN; Triton's level for
  FlashAttention-2), as the A100's are to its one point;
- the MI300X's GEMM rows (components_gemm.csv, ``mi300x``: torch.matmul and the MAMF table for bf16,
  hipblaslt-bench for per-tensor FP8): ``efficiency`` alone, the H100's depth, floor and tile held;
- grouped GEMMs by rows per expert (components_grouped_gemm.csv: DeepGEMM's grouped table):
  ``GROUPED_ROWS_HALF`` of cost/moe_block.py, the rows at which a grouped GEMM keeps half of the
  tile/wave GEMM's throughput beyond what that model already loses, fitted as the GEMM rows are;
  on Blackwell, torch's grouped kernels (torchao's B200 tables, bf16 and MXFP8): the ``efficiency`` of
  the rows ``gemm.grouped-bf16`` and ``gemm.grouped-fp8`` alone, the dense rows' depth held; on Hopper in
  bf16 (grouped_gemm's cuBLAS loop and CUTLASS grouped kernel at 512 rows per expert) a check, no fit;
- collectives by payload and group size (components_collectives.csv: OpenXLA's H100 NVLink table):
  the intra-node ``latency_s`` and ``bytes_per_s`` of cost/comm.py ``collective_seconds``;
- memory-bound kernels and scale-out links (components_links.csv), and the clock held under sustained
  dense math (components_clocks.csv, ``sustained_clock``): single published figures, no fit.

    python benchmarks/fit_components.py           # fitted values and each component's error
    python benchmarks/fit_components.py --check   # also: the catalog's values are these fits (exit 1 if not)
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

from meshwise.catalog import read_catalog
from meshwise.cost import fp8, kernels, moe_block
from meshwise.cost.fit import (
    fit_gemm_efficiency,
    fit_gemm_points,
    fit_link,
    fit_saturating,
    golden,
    log_errors,
    mean_log,
)
from meshwise.spec import TrainSpec, load_cluster
from meshwise.spec.gpu_keys import ATTENTION_FIELDS

CATALOG = Path(__file__).resolve().parents[1] / "src/meshwise/catalog"
GPUS = {"h100": "h100", "a100": "a100-80gb"}


def read(name: str) -> list[dict[str, str]]:
    with open(CATALOG / name, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


# ------------------------------------------------------------------------------------------- GEMM
def gemm_points(gpu: str, dtype: str) -> list[tuple[int, int, int, int, float]]:
    rows = [
        r
        for r in read("components_gemm_xla.csv") + read("components_gemm.csv")
        if r["gpu"] == gpu and r["dtype"] == dtype
    ]
    return [(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r["tflops"]) * 1e12) for r in rows]


def fit_gemm(gpu: str, dtype: str = "bf16", floor: float | None = None, tile: tuple | None = None) -> dict:
    """(efficiency, k_half, kernel_floor_s, tile) minimising the mean |log error| on ``gpu``'s ``dtype`` points."""
    base = replace(load_cluster(GPUS[gpu], 8).accelerator, sustained_clock=1.0)  # the tables: short kernels
    peak = base.peak_bf16_flops_per_s * (2 if dtype.startswith("fp8") else 1)
    elem = 1 if dtype.startswith("fp8") else 2
    return fit_gemm_points(base, gemm_points(gpu, dtype), dtype, peak, elem, floor, tile)


# Blackwell's GEMM rows: (catalog row, TE recipe, its peak key). The B300 stands in for the B200 and GB200
# (the same bf16 and float8 dense peaks per GPU in the datasheets; the rows are fractions of each part's peak).
BLACKWELL_ROWS = (
    ("bf16", "bf16", "peak_bf16_flops_per_s"),
    ("fp8", "mxfp8", "peak_mxfp8_flops_per_s"),
    ("fp8-tensor", "fp8-current", "peak_fp8_flops_per_s"),
)
BLACKWELL = ("b200", "gb200")


def blackwell_base():
    """The B200's op-model fields without its rows: SMs and the H100's tile, floor and HBM fraction."""
    return replace(load_cluster("b200", 8).accelerator, gemm=(), sustained_clock=1.0)


def fit_blackwell_gemm(row: str) -> dict:
    """``row``'s efficiency on TE's B300 table: the pre-quantized passes (bf16: with its four fprop GEMMs)."""
    from fp8_components import groups

    recipe, peak_key = next((r, k) for name, r, k in BLACKWELL_ROWS if name == row)
    data = groups("b300", recipe, "prequant") + (groups("b300", "bf16", "autocast", ops=True) if row == "bf16" else [])
    peak = getattr(load_cluster("b300", 8).accelerator, peak_key)
    k_half = kernels.gemm_row(load_cluster("h100", 8).accelerator, "bf16")[1]
    return fit_gemm_efficiency(blackwell_base(), data, row, peak, 2 if row == "bf16" else 1, k_half)


def blackwell_burst_factor() -> float:
    """How much faster the table's shortest burst ran than the fit through all of bf16's timings: attention's
    output GEMM (100 calls in 31 ms; the others 107-143 ms) at its own efficiency over the bf16 fit's. B200
    lowers its clock within ~50-110 ms of back-to-back kernels (flashinfer PR #2899: components_clocks.csv),
    so the rows are put at the unthrottled clock (x this factor) and ``sustained_clock`` takes the clock down."""
    from fp8_components import groups

    short = [g for g in groups("b300", "bf16", "autocast", ops=True) if g[1] < 0.5e-3]
    peak = load_cluster("b300", 8).accelerator.peak_bf16_flops_per_s
    k_half = kernels.gemm_row(load_cluster("h100", 8).accelerator, "bf16")[1]
    alone = fit_gemm_efficiency(blackwell_base(), short, "bf16", peak, 2, k_half)["efficiency"]
    return alone / fit_blackwell_gemm("bf16")["efficiency"]


# The catalog entry whose bf16 row a GPU's published GEMM timings check (components_gemm.csv): GH200's GPU is a
# Hopper of 132 SMs at 989 TFLOP/s bf16, the h200 entry's row.
CHECKED_ROWS = {"b200": "b200", "gb200": "gb200", "gh200": "h200"}


def table_clock_gemm_check() -> dict[tuple[str, str], tuple[int, float, float]]:
    """The catalog's bf16 rows at their table clock against published timings by shape on B200, GB200 and
    GH200 (components_gemm.csv, ``CHECKED_ROWS``), per GPU and source: {(gpu, source): (points, mean signed
    time error, worst |error|)}; negative: the model is faster."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in read("components_gemm.csv"):
        if r["gpu"] in CHECKED_ROWS and r["dtype"] == "bf16":
            accel = replace(load_cluster(CHECKED_ROWS[r["gpu"]], 8).accelerator, sustained_clock=1.0)
            b, m, n, k = (int(r[x]) for x in "bmnk")
            t = kernels.gemm_seconds(m, n, k, accel, accel.peak_bf16_flops_per_s, 2, b)
            out.setdefault((r["gpu"], r["source"]), []).append(t * float(r["tflops"]) * 1e12 / (2 * b * m * n * k) - 1)
    return {key: (len(e), sum(e) / len(e), max(map(abs, e))) for key, e in out.items()}


# CDNA3's GEMM rows: (catalog row, components_gemm.csv dtype, its peak key). One published shape each.
CDNA_ROWS = (("bf16", "bf16", "peak_bf16_flops_per_s"), ("fp8-tensor", "fp8", "peak_fp8_flops_per_s"))


def fit_cdna_gemm(row: str) -> dict:
    """The MI300X ``row``'s efficiency on its published shapes (components_gemm.csv, ``mi300x``): its 304 CUs,
    the H100's tile, floor and depth (``k_half`` of the H100's row of the same kind) held, the table's clock."""
    dtype, peak_key = next((d, k) for name, d, k in CDNA_ROWS if name == row)
    base = replace(load_cluster("mi300x", 8).accelerator, gemm=(), sustained_clock=1.0)
    k_half = kernels.gemm_row(load_cluster("h100", 8).accelerator, "bf16" if dtype == "bf16" else "fp8")[1]
    groups = [(((m, n, k),), 2.0 * b * m * n * k / flops) for b, m, n, k, flops in gemm_points("mi300x", dtype)]
    elem = 2 if dtype == "bf16" else 1
    return fit_gemm_efficiency(base, groups, row, getattr(base, peak_key), elem, k_half)


def blackwell_attention_scale(fa2: dict, cudnn: dict) -> dict[str, float]:
    """{runtime: factor on the H100 curves}: FlashAttention-4's B200 figures for cuDNN (megatron) and Triton's
    (meshwise: torch's FlashAttention-2, which FlashAttention-3's paper has at Triton's level on H100), each
    over the H100 curve's forward top, as fractions of each part's peak."""
    peak = load_cluster("b200", 8).accelerator.peak_bf16_flops_per_s
    point = {
        r["kernel"]: float(r["tflops"]) * 1e12 / peak for r in read("components_attention.csv") if r["gpu"] == "b200"
    }
    return {"meshwise": point["triton"] / fa2["forward"], "megatron": point["cudnn"] / cudnn["forward"]}


# ------------------------------------------------------------------------------------ grouped GEMM
def _grouped_pairs(rows_half: float | None) -> list[tuple[float, float]]:
    """(predicted, published) seconds of each grouped GEMM: the fp8 tile/wave GEMM of ``groups``
    batches, over ``rows / (rows + rows_half)`` (none: the GEMM model alone)."""
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)  # the table: short kernels
    peak = accel.peak_bf16_flops_per_s * 2
    out = []
    for r in read("components_grouped_gemm.csv"):
        if r["gpu"] != "h100" or r["dtype"] != "fp8":
            continue
        g, m, n, k = int(r["groups"]), int(r["m"]), int(r["n"]), int(r["k"])
        factor = 1.0 if rows_half is None else m / (m + rows_half)
        out.append(
            (
                kernels.gemm_seconds(m, n, k, accel, peak, 1, g, "fp8") / factor,
                2.0 * g * m * n * k / (float(r["tflops"]) * 1e12),
            )
        )
    return out


def fit_grouped() -> dict:
    """``GROUPED_ROWS_HALF`` minimising the mean |log error| of the grouped table's times."""
    half = golden(lambda v: mean_log(_grouped_pairs(v)), 0.0, 1000.0)
    return {
        "rows_half": half,
        "errors": log_errors(_grouped_pairs(half)),
        "without": log_errors(_grouped_pairs(None)),
        "points": len(_grouped_pairs(None)),
    }


def hopper_expert_gemm_check() -> list[tuple[str, float, float]]:
    """(layout, predicted, published) TFLOP/s of the H100 bf16 per-expert GEMMs of components_grouped_gemm.csv at
    the table's clock, as cost/moe_block.py prices each kernel: ``cublas-loop`` one tile/wave GEMM per expert in
    turn, ``grouped`` the tile/wave GEMM of every group over ``grouped_factor`` (a check, not a fit)."""
    accel = replace(load_cluster("h100", 8).accelerator, sustained_clock=1.0)
    peak, out = accel.peak_bf16_flops_per_s, []
    for r in read("components_grouped_gemm.csv"):
        if r["gpu"] != "h100" or r["dtype"] != "bf16":
            continue
        g, m, n, k = int(r["groups"]), int(r["m"]), int(r["n"]), int(r["k"])
        if r["layout"] == "cublas-loop":
            seconds = g * kernels.gemm_seconds(m, n, k, accel, peak, 2, 1, "bf16")
        else:
            seconds = kernels.gemm_seconds(m, n, k, accel, peak, 2, g, "bf16") / moe_block.grouped_factor(m)
        out.append((r["layout"], 2.0 * g * m * n * k / seconds / 1e12, float(r["tflops"])))
    return out


# Blackwell's grouped GEMMs (torch._grouped_mm, torch._scaled_grouped_mm): torchao's B200 tables, the rows
# ``gemm.grouped-bf16`` and ``gemm.grouped-fp8`` (MXFP8) of b200, b200-750w and gb200
BLACKWELL_GROUPED = (("bf16", "bf16", "peak_bf16_flops_per_s", 2), ("fp8", "mxfp8", "peak_mxfp8_flops_per_s", 1))
MSE_LOSS_BYTES = 10.0  # the fwd+bwd table's mse_loss per output element: out and labels read each way, grad written


def _blackwell_grouped_pairs(row: str, efficiency: float, layout: str = "fwd+bwd") -> list[tuple[float, float]]:
    """(predicted, published) seconds of torchao's B200 grouped GEMMs of ``layout`` (components_grouped_gemm.csv)
    with the ``grouped-<row>`` GEMM row at ``efficiency`` on the catalog's B200 at its sustained clock (triton's
    do_bench repeats each call for 100 ms after a 25 ms warm-up: the back-to-back regime that clock is for), over
    ``rows / (rows + GROUPED_ROWS_HALF)`` as cost/moe_block.py prices them. A fwd+bwd point is what a training
    step calls: the forward GEMM, its two backward GEMMs, in MXFP8 their casts as cost/fp8.py prices them
    (torchao's pattern), and the benchmark's loss over the output at HBM bandwidth; the 2d-3d and 2d-2d points
    are MXFP8 GEMM kernels alone (a check)."""
    dtype, peak_key, elem = next((d, k, e) for name, d, k, e in BLACKWELL_GROUPED if name == row)
    base = load_cluster("b200", 8).accelerator
    accel = replace(base, gemm=((f"grouped-{row}", efficiency, kernels.gemm_row(base, row)[1]),))
    peak, name, hbm = getattr(accel, peak_key), f"grouped-{row}", kernels.hbm_bytes_per_s(accel)
    train = TrainSpec(global_batch=1, seq_len=1, precision=dtype if dtype == "mxfp8" else "bf16-mixed")
    out = []
    for r in read("components_grouped_gemm.csv"):
        if r["gpu"] != "b200" or r["dtype"] != dtype or r["layout"] != layout:
            continue
        g, m, n, k = int(r["groups"]), int(r["m"]), int(r["n"]), int(r["k"])
        one = lambda a, b, c: kernels.gemm_seconds(a, b, c, accel, peak, elem, g, name)  # noqa: E731
        if layout == "fwd+bwd":
            seconds = (one(m, n, k) + one(m, k, n) + one(k, n, m)) / moe_block.grouped_factor(m)
            seconds += (sum(fp8.linear_cast_bytes(train, g * m, n, k)) + MSE_LOSS_BYTES * g * m * n) / hbm
            flops = 6.0 * g * m * n * k
        else:
            seconds = one(m, n, k) / moe_block.grouped_factor(k if layout == "2d-2d" else m)
            flops = 2.0 * g * m * n * k
        out.append((seconds, flops / (float(r["tflops"]) * 1e12)))
    return out


def fit_blackwell_grouped(row: str) -> dict:
    """``gemm.grouped-<row>``'s efficiency on torchao's B200 fwd+bwd table (its depth the dense row's), its
    errors, and in MXFP8 the kernels-alone points' errors at that efficiency (a check)."""
    eff = golden(lambda v: mean_log(_blackwell_grouped_pairs(row, v)), 0.1, 1.0)
    pairs = _blackwell_grouped_pairs(row, eff)
    alone = _blackwell_grouped_pairs(row, eff, "2d-3d") + _blackwell_grouped_pairs(row, eff, "2d-2d")
    signed = sum(p / m - 1 for p, m in alone) / len(alone) if alone else 0.0
    return {"efficiency": eff, "errors": log_errors(pairs), "points": len(pairs), "alone": (len(alone), signed)}


# -------------------------------------------------------------------------------------- attention
def attention_points(kernel: str) -> list[dict]:
    return [r for r in read("components_attention.csv") if r["gpu"] == "h100" and r["kernel"] == kernel]


def _curve(rows: list[dict], peak: float) -> tuple[float, float, tuple[float, float]]:
    """(top, seq_half) of ``top * s / (s + s_half)`` (fractions of peak) over ``rows``, and its errors."""
    return fit_saturating([(int(r["seq"]), float(r["tflops"]) * 1e12 / peak) for r in rows])


def fit_attention(kernel: str) -> dict:
    """The runtime kernel's curves on head width 128; ``head64`` = the mean ratio of width 64 to 128."""
    peak = load_cluster("h100", 8).accelerator.peak_bf16_flops_per_s
    rows = attention_points(kernel)

    def pick(direction: str, causal: str, width: str) -> list[dict]:
        return [r for r in rows if (r["direction"], r["causal"], r["head_dim"]) == (direction, causal, width)]

    fwd = _curve(pick("forward", "false", "128"), peak)
    causal = _curve(pick("forward", "true", "128"), peak)
    bwd = _curve(pick("backward", "false", "128"), peak)
    by_key = {(r["direction"], r["causal"], r["seq"], r["head_dim"]): float(r["tflops"]) for r in rows}
    ratios = [v / by_key[(d, c, s, "128")] for (d, c, s, h), v in by_key.items() if h == "64"]
    head64 = sum(ratios) / len(ratios)
    curves = {"false": fwd, "true": causal}
    pairs = []  # every row, width 64 included, against the fitted curves (backward: non-causal rows)
    for r in rows:
        top, half, _ = bwd if r["direction"] == "backward" else curves[r["causal"]]
        width = head64 if r["head_dim"] == "64" else 1.0
        pairs.append((width * kernels._saturating(top, half, int(r["seq"])), float(r["tflops"]) * 1e12 / peak))
    return {
        "kernel": kernel,
        "forward": fwd[0],
        "forward_seq_half": fwd[1],
        "forward_causal": causal[0],
        "forward_causal_seq_half": causal[1],
        "backward": bwd[0],
        "backward_seq_half": bwd[1],
        "head64": head64,
        "errors": log_errors(pairs),
        "points": len(rows),
    }


def a100_attention_scale(fa2: dict) -> tuple[float, float]:
    """The A100's FlashAttention-2 as the H100 curves' shape scaled to its one published point (Azure:
    forward + backward, width 64, seq 8192, taken as non-causal): (scale, that point's throughput)."""
    row = next(r for r in read("components_attention.csv") if r["gpu"] == "a100")
    peak = load_cluster("a100-80gb", 8).accelerator.peak_bf16_flops_per_s
    seq, width = int(row["seq"]), fa2["head64"]
    f = width * kernels._saturating(fa2["forward"], fa2["forward_seq_half"], seq)
    b = width * kernels._saturating(fa2["backward"], fa2["backward_seq_half"], seq)
    both = (1 + kernels.FLASH_BACKWARD) / (1 / f + kernels.FLASH_BACKWARD / b)  # fraction of peak
    return float(row["tflops"]) * 1e12 / peak / both, float(row["tflops"])


# ------------------------------------------------------------------------------------ collectives
def collective_points() -> list[tuple[str, int, float, float]]:
    """(meshwise kind, ranks, meshwise payload bytes, seconds) for all-reduce, all-gather (XLA's result
    size: the gathered tensor, as meshwise's payload) and all-to-all; XLA's reduce-scatter rows imply
    rates beyond the NVLink link itself (2.1 GB over 8 ranks in 0.71 ms) and are left out."""
    out = []
    for r in read("components_collectives.csv"):
        if r["op"] == "reduce_scatter":  # the table's rates exceed NVLink's 450 GB/s per direction 3-7x: left out
            continue
        n, size = int(r["ranks"]), float(r["bytes"])
        out.append((r["op"], n, size, float(r["seconds"])))
    return out


def fit_collectives() -> dict:
    return fit_link(collective_points())


# -------------------------------------------------------------------------------------- the report
def fits() -> dict:
    h100 = fit_gemm("h100")
    a100 = fit_gemm("a100", tile=h100["tile"])
    fp8 = fit_gemm("h100", "fp8", floor=h100["kernel_floor_s"], tile=h100["tile"])
    fa2, cudnn = fit_attention("fa2"), fit_attention("cudnn")
    return {
        "gemm_h100_bf16": h100,
        "gemm_a100_bf16": a100,
        "gemm_h100_fp8": fp8,
        "attention_fa2": fa2,
        "attention_cudnn": cudnn,
        "grouped_gemm": fit_grouped(),
        "attention_a100": a100_attention_scale(fa2),
        "nvlink_h100": fit_collectives(),
        "gemm_blackwell": {row: fit_blackwell_gemm(row) for row, _, _ in BLACKWELL_ROWS},
        "blackwell_burst": blackwell_burst_factor(),
        "attention_blackwell": blackwell_attention_scale(fa2, cudnn),
        "grouped_blackwell": {row[0]: fit_blackwell_grouped(row[0]) for row in BLACKWELL_GROUPED},
        "gemm_cdna": {row: fit_cdna_gemm(row) for row, _, _ in CDNA_ROWS},
    }


def links_report() -> list[str]:
    out = []
    for r in read("components_links.csv"):
        out.append(
            f"  {r['gpu']:5s} {r['kind']:6s} {r['what']:38s} {float(r['gb_per_s']):7.1f} GB/s = "
            f"{float(r['gb_per_s']) / float(r['peak_gb_per_s']):.3f} of {r['peak_gb_per_s']} ({r['source']})"
        )
    return out


def clocks() -> dict[str, float]:
    """{gpu: sustained / table clock} (components_clocks.csv)."""
    return {r["gpu"]: float(r["sustained_mhz"]) / float(r["table_mhz"]) for r in read("components_clocks.csv")}


def check_catalog(f: dict) -> list[str]:
    """Where the catalog's values differ from these fits by more than rounding (1%)."""
    bad = []
    for gpu, ratio in clocks().items():
        names = {"a100": ["a100-40gb", "a100-80gb"], "b200": list(BLACKWELL), "b200-750w": ["b200-750w"]}.get(
            gpu, ["h100", "h200", "h100-hbm2e"]
        )
        for name in names:
            got = load_cluster(name, 8).accelerator.sustained_clock
            if abs(got - ratio) > 0.001:
                bad.append(f"{name} sustained_clock: catalog {got}, components_clocks.csv {ratio:.3f}")
            table_mhz = next(float(r["table_mhz"]) for r in read("components_clocks.csv") if r["gpu"] == gpu)
            if read_catalog("accelerators.toml")[name].get("table_clock_mhz") != table_mhz:
                bad.append(f"{name} table_clock_mhz: catalog differs from components_clocks.csv {table_mhz:g}")
    close = lambda a, b: abs(a - b) <= 0.01 * max(abs(b), 1e-9) + 1e-9  # noqa: E731
    for gpu, key, dtype in (
        ("h100", "gemm_h100_bf16", "bf16"),
        ("a100-80gb", "gemm_a100_bf16", "bf16"),
        ("h100", "gemm_h100_fp8", "fp8"),
    ):
        accel = load_cluster(gpu, 8).accelerator
        eff, k_half = kernels.gemm_row(accel, dtype)
        want = f[key]
        if not (
            close(eff, want["efficiency"])
            and abs(k_half - want["k_half"]) <= 2
            and close(accel.kernel_floor_s, want["kernel_floor_s"])
        ):
            bad.append(
                f"{gpu} gemm.{dtype}: catalog {eff:.3f}, {k_half:.0f}, {accel.kernel_floor_s:.2e}; fit "
                f"{want['efficiency']:.3f}, {want['k_half']:.0f}, {want['kernel_floor_s']:.2e}"
            )
    accel = load_cluster("h100", 8).accelerator
    rows = {r[0]: r for r in accel.attention}
    for runtime, key in (("meshwise", "attention_fa2"), ("megatron", "attention_cudnn")):
        got = rows[runtime][2:]
        want = [f[key][k] for k in ATTENTION_FIELDS]
        if not all(abs(g - w) <= 0.01 * w + 1.0 * (i % 2 == 1 and i < 6) for i, (g, w) in enumerate(zip(got, want))):
            bad.append(f"h100 attention.{runtime}: catalog {got}, fit {[round(w, 3) for w in want]}")
    for name in (*BLACKWELL, "b200-750w"):
        accel = load_cluster(name, 8).accelerator
        for row, fit in f["gemm_blackwell"].items():
            got = {r[0]: r[1:] for r in accel.gemm}.get(row)
            want = fit["efficiency"] * f["blackwell_burst"]
            if got is None or not close(got[0], want) or abs(got[1] - fit["k_half"]) > 2:
                bad.append(f"{name} gemm.{row}: catalog {got}, fit x burst factor {want:.3f}, {fit['k_half']:.0f}")
        h100_rows = {r[0]: r for r in load_cluster("h100", 8).accelerator.attention}
        for r in accel.attention:
            scale = f["attention_blackwell"][r[0]]
            want = [v * scale if i in (0, 2, 4) else v for i, v in enumerate(h100_rows[r[0]][2:])]
            if not all(abs(g - w) <= 0.01 * w for g, w in zip(r[2:], want)):
                bad.append(f"{name} attention.{r[0]}: catalog {r[2:]}, the H100's x {scale:.3f}: {want}")
    for name in (*BLACKWELL, "b200-750w"):
        rows = {r[0]: r[1:] for r in load_cluster(name, 8).accelerator.gemm}
        for row, fit in f["grouped_blackwell"].items():
            got = rows.get(f"grouped-{row}")
            if got is None or not close(got[0], fit["efficiency"]):
                bad.append(f"{name} gemm.grouped-{row}: catalog {got}, fit {fit['efficiency']:.3f}")
    rows = {r[0]: r[1:] for r in load_cluster("mi300x", 8).accelerator.gemm}
    for row, fit in f["gemm_cdna"].items():
        got = rows.get(row)
        if got is None or not close(got[0], fit["efficiency"]) or abs(got[1] - fit["k_half"]) > 2:
            bad.append(f"mi300x gemm.{row}: catalog {got}, fit {fit['efficiency']:.3f}, {fit['k_half']:.0f}")
    grouped = f["grouped_gemm"]["rows_half"]
    if abs(moe_block.GROUPED_ROWS_HALF - grouped) > 0.5:
        bad.append(f"moe_block.GROUPED_ROWS_HALF: code {moe_block.GROUPED_ROWS_HALF}, fit {grouped:.1f}")
    link = load_cluster("h100", 8).intra
    nv = f["nvlink_h100"]
    if not (close(link.bytes_per_s, nv["bytes_per_s"]) and abs(link.latency_s - nv["latency_s"]) <= 0.05e-6):
        bad.append(f"h100 intra link: catalog {link}, fit {nv['bytes_per_s']:.3e} B/s, {nv['latency_s']:.2e} s")
    return bad


def main(argv: list[str]) -> int:
    f = fits()
    print("Component fits (each on its own published data; mean / worst |error| against that data):")
    for key in ("gemm_h100_bf16", "gemm_a100_bf16", "gemm_h100_fp8"):
        g = f[key]
        print(
            f"  {key:16s} efficiency {g['efficiency']:.3f}, k_half {g['k_half']:.0f}, kernel_floor_s "
            f"{g['kernel_floor_s']:.2e}, tile {g['tile'][0]}x{g['tile'][1]}: {g['points']} points, time error "
            f"mean {g['errors'][0]:.1%}, worst {g['errors'][1]:.1%}"
        )
    for key in ("attention_fa2", "attention_cudnn"):
        a = f[key]
        print(
            f"  {key:16s} forward {a['forward']:.3f}/{a['forward_seq_half']:.0f}, causal {a['forward_causal']:.3f}/"
            f"{a['forward_causal_seq_half']:.0f}, backward {a['backward']:.3f}/{a['backward_seq_half']:.0f}, "
            f"head64 {a['head64']:.3f}: {a['points']} points, error mean {a['errors'][0]:.1%}, "
            f"worst {a['errors'][1]:.1%}"
        )
    gg = f["grouped_gemm"]
    print(
        f"  grouped_gemm     rows_half {gg['rows_half']:.1f}: {gg['points']} points, time error mean "
        f"{gg['errors'][0]:.1%}, worst {gg['errors'][1]:.1%} (the GEMM model alone: mean {gg['without'][0]:.1%}, "
        f"worst {gg['without'][1]:.1%})"
    )
    scale, point = f["attention_a100"]
    print(
        f"  attention_a100   the H100 FlashAttention-2 curves x {scale:.3f} (one point: {point} TFLOP/s; exact by "
        f"construction)"
    )
    for row, g in f["gemm_blackwell"].items():
        print(
            f"  gemm_b300_{row:10s} efficiency {g['efficiency']:.3f} (k_half {g['k_half']:.0f}, the H100's floor and "
            f"tile held): {g['points']} timings, time error mean {g['errors'][0]:.1%}, worst {g['errors'][1]:.1%}; "
            f"unthrottled x {f['blackwell_burst']:.3f} = {g['efficiency'] * f['blackwell_burst']:.3f}"
        )
    for (gpu, source), (n, signed, worst) in table_clock_gemm_check().items():
        print(
            f"  check {gpu:5s} bf16 the {CHECKED_ROWS[gpu]} row at its table clock against {n} timing(s) ({source}): "
            f"time error mean {signed:+.1%}, worst {worst:.1%} (components_gemm.csv; a check, not a fit)"
        )
    for layout, predicted, published in hopper_expert_gemm_check():
        print(
            f"  check h100 bf16  {layout} experts at 512 rows (groupedgemm37): {published:.1f} TFLOP/s published, "
            f"{predicted:.1f} priced ({predicted / published - 1:+.0%}; a check, not a fit)"
        )
    for row, g in f["gemm_cdna"].items():
        print(
            f"  gemm_mi300x_{row:10s} efficiency {g['efficiency']:.3f} (k_half {g['k_half']:.0f}, the H100's floor and "
            f"tile held): {g['points']} shape(s), time error mean {g['errors'][0]:.1%}, worst {g['errors'][1]:.1%}"
        )
    for row, g in f["grouped_blackwell"].items():
        print(
            f"  grouped_b200_{row:5s} efficiency {g['efficiency']:.3f} (torch's grouped GEMMs, at the sustained clock): "
            f"{g['points']} fwd+bwd timings, time error mean {g['errors'][0]:.1%}, worst {g['errors'][1]:.1%}"
            + (f"; its {g['alone'][0]} GEMM kernels alone read {g['alone'][1]:+.1%} (a check)" if g["alone"][0] else "")
        )
    sc = f["attention_blackwell"]
    print(
        f"  attention_b200   the H100 curves x {sc['megatron']:.3f} (cuDNN), x {sc['meshwise']:.3f} (FlashAttention-2 "
        f"at Triton's level): FlashAttention-4's figures, one point each"
    )
    nv = f["nvlink_h100"]
    print(
        f"  nvlink_h100      latency {nv['latency_s'] * 1e6:.2f} us, bandwidth {nv['bytes_per_s'] / 1e9:.0f} GB/s: "
        f"{nv['points']} points, error mean {nv['errors'][0]:.1%}, worst {nv['errors'][1]:.1%}; payloads >= 64 MB: "
        f"mean {nv['errors_large'][0]:.1%}, worst {nv['errors_large'][1]:.1%}"
    )
    print("Single published figures (no fit):")
    print("\n".join(links_report()))
    for gpu, ratio in clocks().items():
        print(f"  {gpu:5s} sustained clock {ratio:.3f} of the tables' clock (components_clocks.csv)")
    if "--check" in argv:
        bad = check_catalog(f)
        print("catalog matches the fits" if not bad else "catalog differs from the fits:\n  " + "\n  ".join(bad))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
