"""The CPU time model's components off the grid, each timed beside what cost/host.py prices it at:
the LM head's GEMMs and the loss (softmax / cross-entropy, forward + backward) at vocabularies of
256 to 128k, torch's causal SDPA (forward + backward) at sequences of 512 to 8k, and one ring step of context
parallelism's attention at cp=2 of the same sequences (a local half).

A host shared with other work moves by up to 2x within minutes, so no figure here is absolute:
every shape is timed once per round, rounds interleave the shapes (a machine that slows down slows
down for all), a shape's time is the median over rounds, and beside each the probe's reading
against the profile (measure/probe.py) says how far the machine was from its calibration. What
the model is judged on is ``measured / predicted`` and how that ratio moves with the shape: a ratio
that grows with the vocabulary or the sequence is a mispriced form, a flat one is the host.

    OMP_NUM_THREADS=1 python benchmarks/cpu_components.py --profile PROFILE.toml \
        --report benchmarks/results/cpu-components-$(hostname).txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from meshwise.cost import host
from meshwise.cost.context_parallel import ring_step_seconds
from meshwise.measure import auto_profile, probe
from meshwise.measure.calibrate import LOSS_SHAPES
from meshwise.measure.plan_shapes import ring_step, sdpa_call, time_loss
from meshwise.spec import ModelSpec, load_cluster

HIDDEN, TOKENS = 192, 256  # the grid's middle width (benchmarks/cpu_time_grid.py), one rank's tokens
VOCABS = (256, 8192, 32768, 65536, 131072)
SDPA_SEQS = (512, 1024, 2048, 4096, 8192)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32  # the grid's hidden-192 model per TP rank at tp=2 (6 heads / 2 ~ 4)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def grid_model(vocab: int) -> ModelSpec:
    return ModelSpec(
        name=f"h{HIDDEN}-v{vocab}",
        layers=4,
        hidden=HIDDEN,
        heads=6,
        kv_heads=2,
        ffn_hidden=512,
        vocab=vocab,
        mlp="swiglu",
        tied_embeddings=False,
        max_seq=8192,
    )


def head_case(vocab: int):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, generator=gen, requires_grad=True)
    w = torch.randn(vocab, HIDDEN, generator=gen, requires_grad=True)
    g = torch.randn(TOKENS, vocab, generator=gen)

    def run() -> None:
        F.linear(x, w).backward(g)
        x.grad = w.grad = None

    return run


def loss_case(vocab: int):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, vocab, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, (TOKENS,), generator=gen)

    def run() -> None:  # runtime/model.py loss_sum
        F.cross_entropy(logits.float(), targets, reduction="sum").backward()
        logits.grad = None

    return run


def sdpa_case(seq: int):
    """One causal attention call forward + backward (measure/plan_shapes.py ``sdpa_call``)."""
    return sdpa_call(seq, HEAD_DIM, HEADS, KV_HEADS)


def ring_case(local: int):
    """One ring step of context parallelism's attention (measure/plan_shapes.py ``ring_step``, as
    calibrate_worker ``bench_ring`` times it): forward then backward of one K/V block."""
    return ring_step(local, HEAD_DIM, HEADS, KV_HEADS)


def predictions(accel, loss_rows: tuple) -> dict[str, tuple[float, ...]]:
    """What the CPU time model charges for each case, by the terms cost/estimate.py adds; the loss
    three ways: its bytes over the cache bandwidth (calibration 17), over DRAM past the cache (the
    form without a table), and off a table timed at calibrate's ``LOSS_SHAPES`` (128 tokens)."""
    out = {}
    cache_only = replace(accel, dram_bytes_per_s=0.0, loss_token_table=())
    no_table = replace(accel, loss_token_table=())
    tabled = replace(accel, loss_token_table=loss_rows)
    for vocab in VOCABS:
        model = grid_model(vocab)
        eff = accel.efficiency_max * host.gemm_shape_factor(model, accel, TOKENS, 1)
        out[f"head gemm V={vocab}"] = (6.0 * TOKENS * vocab * HIDDEN / (accel.peak_fp32_flops_per_s * eff),)
        out[f"loss V={vocab}"] = tuple(host.loss_seconds(a, TOKENS, vocab) for a in (cache_only, no_table, tabled))
    for seq in SDPA_SEQS:
        out[f"sdpa s={seq}"] = (host.sdpa_call_seconds(accel, HEADS, seq, HEAD_DIM),)
    for seq in SDPA_SEQS:
        out[f"ring step s={seq}/2"] = (ring_step_seconds(accel, HEADS * (seq / 2) ** 2, HEAD_DIM),)
    return out


def cases() -> dict[str, object]:
    out = {}
    for vocab in VOCABS:
        out[f"head gemm V={vocab}"] = head_case(vocab)
        out[f"loss V={vocab}"] = loss_case(vocab)
    for seq in SDPA_SEQS:
        out[f"sdpa s={seq}"] = sdpa_case(seq)
    for seq in SDPA_SEQS:
        out[f"ring step s={seq}/2"] = ring_case(seq // 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", help="a CPU profile (default: this machine's cached 2-process calibration)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--report", help="also write the report to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = args.profile or str(auto_profile.cached(2) or auto_profile.cached(1) or "")
    if not path:
        print(
            "--profile: no cached calibration on this machine; give a profile (meshwise calibrate --out FILE)",
            file=sys.stderr,
        )
        return 2
    table = tomllib.loads(Path(path).read_text())
    accel = load_cluster(path, 1, 1).accelerator
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    say(f"{platform.node()}, {os.cpu_count()} cores, profile {path}; load at the start {load()}")
    loss_rows = tuple((float(t), float(v), time_loss(t, v) / t) for t, v in LOSS_SHAPES)
    say(
        "loss table timed at calibrate's shapes (tokens, vocab, us per token): "
        + ", ".join(f"({t:.0f}, {v:.0f}, {sec * 1e6:.1f})" for t, v, sec in loss_rows)
    )
    predicted, runs = predictions(accel, loss_rows), cases()
    times: dict[str, list[float]] = {name: [] for name in runs}
    drifts = []
    for r in range(args.rounds):
        for name, run in runs.items():
            run()  # warm: allocations, the kernel's first call
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        drifts.append(probe.drift(table, probe.probe()) if all(k in table for k in probe.PROBE_KEYS) else 0.0)
        say(f"round {r + 1}: load {load()}, the machine reads {drifts[-1]:+.0%} against the profile")
    say(
        f"\n{'component':<22} {'meas ms':>9} {'pred ms':>9} {'meas/pred':>9}  spread over rounds; "
        "the loss predicted three ways: cache bytes (v17) | DRAM past 4 MiB | table"
    )
    for name in runs:
        meas = statistics.median(times[name])
        spread = (max(times[name]) - min(times[name])) / meas
        ratios = " | ".join(f"{meas / p:.2f}" for p in predicted[name])
        say(f"{name:<22} {meas * 1e3:9.2f} {predicted[name][-1] * 1e3:9.2f} {ratios:>9}  {spread:.0%}")
    say(f"load at the end {load()}")
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
