"""Does float8 training follow the default precision's loss? ``meshwise train --model small`` for 100
steps (the embedded corpus, seeds 0; global batch 4 x 64 tokens by default, a quarter of the
preset's 8 x 128: float8 GEMMs are slow on CPU), once in the runtime's own precision (fp32 on CPU)
and once with ``--precision fp8`` (torchao tensorwise), and in ``--also`` precisions. Printed per
precision: the mean training loss of the last 10 steps and the final eval loss, each with its
difference from the default (the target is within 5%).

    python benchmarks/fp8_loss.py [--steps 100] [--global-batch 4] [--seq-len 64] [--also fp8-rowwise]
        > benchmarks/results/fp8-loss-cpu-DATE.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(precision: str, args: argparse.Namespace, out: Path) -> list[dict]:
    metrics = out / f"{precision}.jsonl"
    cmd = [sys.executable, "-m", "meshwise.cli", "train", "--model", "small", "--steps", str(args.steps),
           "--precision", precision, "--nproc-per-node", str(args.nproc), "--layout", args.layout,
           "--global-batch", str(args.global_batch), "--seq-len", str(args.seq_len), "--checkpoint-dir", "",
           "--metrics", str(metrics), "--prompt", "", "--eval-every", "50"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ))
    print(f"{precision}: {time.perf_counter() - start:.0f} s wall ({' '.join(cmd[3:])})", flush=True)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def summary(rows: list[dict]) -> tuple[float, float]:
    steps = [r for r in rows if "loss" in r]
    last = steps[-10:]
    evals = [r["eval_loss"] for r in steps if r.get("eval_loss") is not None]
    return sum(r["loss"] for r in last) / len(last), evals[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--layout", default="auto")
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--also", nargs="*", default=[], help="more precisions, e.g. fp8-rowwise")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshwise-fp8-loss-") as tmp:
        results = {prec: summary(run(prec, args, Path(tmp))) for prec in ("auto", "fp8", *args.also)}
    base_train, base_eval = results["auto"]
    print(f"\nsmall, {args.steps} steps of {args.global_batch} x {args.seq_len} tokens, {args.nproc} process(es), "
          f"layout {args.layout}")
    print(f"{'precision':<14}{'train loss (last 10)':>22}{'vs default':>12}{'eval loss':>12}{'vs default':>12}")
    for prec, (train, ev) in results.items():
        name = "default (fp32)" if prec == "auto" else prec
        print(f"{name:<14}{train:>22.4f}{(train - base_train) / base_train:>+12.2%}{ev:>12.4f}"
              f"{(ev - base_eval) / base_eval:>+12.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
