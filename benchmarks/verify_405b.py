"""Llama 3 405B on 16,384 H100 (8 per node; sequence 8,192; global batch 2,048), traced by
``meshwise verify`` on this machine: the Llama 3 paper's layout (Llama Team 2024, arXiv 2407.21783,
section 3.3: TP 8, PP 16, DP 128, interleaved, selective recompute) and two more from the planner's
top 5 (the first two that are not it), ``--ranks auto`` each (first, middle and last pipeline
stage). Prints, per layout, the seconds the trace took and every figure beside the plan.

A benchmark that prints, not a test (run it under the shared lock on a busy machine):

    .venv/bin/python benchmarks/verify_405b.py [--others 2] [--json FILE] \
        > benchmarks/results/verify-405b-fakecuda.txt
"""

from __future__ import annotations

import argparse
import json
import time

from meshwise.layout import parse
from meshwise.measure.verify import verify
from meshwise.plan import planner
from meshwise.spec import TrainSpec, load_cluster, load_model

PAPER = "dp=128,zero=2,tp=8,sp=on,pp=16,vpp=4,schedule=interleaved-1f1b,ac=selective"
WORLD, SEQ, BATCH = 16_384, 8_192, 2_048


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--others", type=int, default=2, help="layouts from the planner's top 5 besides the paper's")
    ap.add_argument("--json", default=None, help="also write every row here")
    args = ap.parse_args()
    model, cluster = load_model("llama3-405b"), load_cluster("h100", WORLD, 8)
    train = TrainSpec(global_batch=BATCH, seq_len=SEQ, precision="bf16-mixed")
    paper = parse(PAPER, WORLD)
    top = planner.plan(model, cluster, train, top=5).candidates
    layouts = [paper] + [e.layout for e in top if e.layout != paper][: args.others]
    out = []
    for layout in layouts:
        start = time.perf_counter()
        rows, records = verify(model, cluster, train, layout, _auto(layout))
        seconds = time.perf_counter() - start
        print(
            f"\n{layout.short()}: ranks {[r['rank'] for r in records]} traced in {seconds:.0f} s "
            f"({', '.join(str(round(r['trace_s'])) for r in records)} s each)",
            flush=True,
        )
        for r in rows:
            err = "-" if r.rel_error == float("inf") else f"{r.rel_error:+.2%}"
            print(f"  {r.rank:>6} {r.figure:<42} {r.predicted:>20,.0f} {r.measured:>20,.0f} {err:>9}")
        out.append({"layout": layout.format(), "seconds": seconds, "rows": [r.as_json() for r in rows]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _auto(layout):
    from meshwise.measure.verify import auto_ranks

    return auto_ranks(layout)


if __name__ == "__main__":
    raise SystemExit(main())
