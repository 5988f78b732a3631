"""Does the cost model rank layouts as the machine does? Two CPU ranks, one calibrated profile.

Calibrates this machine (``meshwise.measure.calibrate``, or reads ``--profile``), predicts the step
time of two-rank layouts of a small untied model (DP with ZeRO 0/2/3, TP with SP off/on, PP 1F1B
and GPipe), measures them in one torchrun launch (``measure.run.run_workers``: the median of
``--steps`` timed steps, slowest rank), and prints both rankings with the Spearman rank correlation

    rho = 1 - 6 * sum(d_i^2) / (n (n^2 - 1))   (d_i: rank difference of layout i)

(computed as the Pearson correlation of the ranks, tied predictions sharing their average rank).

A benchmark that prints, not a test: the figures depend on the machine and on what else runs on it.

    .venv/bin/python benchmarks/rank_cpu_layouts.py [--profile FILE] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from meshwise.cost.estimate import estimate
from meshwise.layout import parse
from meshwise.measure.calibrate import calibrate
from meshwise.measure.run import run_workers
from meshwise.spec import TrainSpec, load_cluster, load_model

# Untied embeddings: the runtime runs pp > 1 only without tied weights.
MODEL_TOML = """\
name = "bench-cpu"
layers = 4
hidden = 256
heads = 8
kv_heads = 4
ffn_hidden = 704
mlp = "swiglu"
vocab = 256
tied_embeddings = false
max_seq = 256
source = "benchmarks/rank_cpu_layouts.py: an untied byte model of 3,082,496 parameters"
"""
GLOBAL_BATCH = 8
SEQ_LEN = 256
LAYOUTS = (
    "dp=2,zero=0",
    "dp=2,zero=2",
    "dp=2,zero=3",
    "dp=2,zero=0,mbs=4",
    "tp=2,sp=off",
    "tp=2,sp=on",
    "pp=2,schedule=1f1b",
    "pp=2,schedule=gpipe",
)


def ranks(values: list[float]) -> list[float]:
    """Rank of each value, 1 = smallest; tied values share their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of the ranks (= 1 - 6 sum d^2 / (n (n^2 - 1)) when nothing ties)."""
    ra, rb = ranks(a), ranks(b)
    n = len(ra)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", help="a calibrated profile .toml (default: calibrate now)")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="meshwise-rank-") as tmp:
        model_file = Path(tmp) / "bench-cpu.toml"
        model_file.write_text(MODEL_TOML)
        profile = args.profile or str(Path(tmp) / "profile.toml")
        if not args.profile:
            calibrate(2, str(model_file), profile, SEQ_LEN)
        cluster = load_cluster(profile, 2, 2)
        model = load_model(str(model_file))
        train = TrainSpec(GLOBAL_BATCH, SEQ_LEN, precision="fp32")
        predicted = [estimate(model, cluster, train, parse(t, 2)) for t in LAYOUTS]
        records = run_workers(2, list(LAYOUTS), str(model_file), GLOBAL_BATCH, SEQ_LEN, args.steps)
    acc = cluster.accelerator
    print(
        f"profile: {acc.name}, matmul {acc.peak_fp32_flops_per_s / 1e9:.1f} GFLOP/s, efficiency "
        f"{acc.efficiency_max:.2f}, copy {acc.hbm_bytes_per_s / 1e9:.1f} GB/s, link {cluster.intra.bytes_per_s / 1e9:.2f}"
        f" GB/s + {cluster.intra.latency_s * 1e6:.0f} us"
    )
    print(f"model: {model.describe()}; global batch {GLOBAL_BATCH} x {SEQ_LEN} tokens, fp32, 2 ranks\n")
    pred_s = [e.time.step_s for e in predicted]
    meas_s = [max(r["time"]["step_s"] for r in recs) for recs in records]
    pr, mr = ranks(pred_s), ranks(meas_s)
    print(
        f"{'layout':<22} {'pred s':>8} {'rank':>4} {'meas s':>8} {'rank':>4}  {'pred: compute/comm/bubble/opt':<32}"
        f" meas: compute/comm/idle (rank 0)"
    )
    for i, text in enumerate(LAYOUTS):
        t, m = predicted[i].time, records[i][0]["time"]
        print(
            f"{text:<22} {pred_s[i]:8.3f} {pr[i]:4g} {meas_s[i]:8.3f} {mr[i]:4g}  "
            f"{t.compute_s:.3f}/{t.comm_exposed_s:.3f}/{t.bubble_s:.3f}/{t.optimizer_s:.3f}".ljust(76)
            + f" {m['compute_s']:.3f}/{m['comm_s']:.3f}/{m['idle_s']:.3f}"
        )
    print(
        "\npredicted ranking: " + " < ".join(LAYOUTS[i] for i in sorted(range(len(LAYOUTS)), key=lambda i: pred_s[i]))
    )
    print("measured ranking:  " + " < ".join(LAYOUTS[i] for i in sorted(range(len(LAYOUTS)), key=lambda i: meas_s[i])))
    print(f"Spearman rank correlation: {spearman(pred_s, meas_s):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
