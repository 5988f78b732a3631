"""``--compile`` against eager: meshwise's step time with and without ``torch.compile`` per block.

One process with every core (gloo), the catalog's ``medium`` model by default, layout
``dp=1,mbs=B`` (no accumulation, no recompute). Both models are built in the same process from the
same seed; the compiled one is warmed up first (:func:`meshwise.runtime.compile.warm_up`; its
seconds are printed as the compile time). Then the two alternate: each round times ``--steps``
steps of one, then of the other (the order swaps every round), after one untimed step each.
Printed: min / median / max ms per step, and the speed-up eager median / compiled median.

A benchmark that prints, not a test: the figures depend on what else runs on the machine.

    .venv/bin/python benchmarks/compile_speed.py [--model medium] [--seq 256] [--batch 8] [--rounds 3] [--steps 3] \
        > benchmarks/results/compile-speed-cpu2core.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from meshwise.launch import free_port
from meshwise.layout import parse
from meshwise.runtime import build_mesh, end_process_group, parallelize
from meshwise.runtime.compile import warm_up
from meshwise.spec import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="medium")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(os.cpu_count() or 1)
    spec = load_model(args.model)
    layout = parse(f"dp=1,mbs={args.batch}", 1)
    mesh = build_mesh(layout, spec, args.batch, backend="gloo")
    data = torch.randint(0, spec.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1234))
    x, y = data[:, :-1], data[:, 1:]
    print(
        f"{args.model}, batch {args.batch} x {args.seq} tokens, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    runs = {
        "eager": parallelize(spec, layout, mesh, args.batch, seq_len=args.seq),
        "compiled": parallelize(spec, layout, mesh, args.batch, seq_len=args.seq, compile=True),
    }
    print(f"compile (warm-up forward/backward): {warm_up(runs['compiled'], x, y):.1f} s")
    for pm in runs.values():
        pm.step(x, y)  # untimed
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            start = time.perf_counter()
            for _ in range(args.steps):
                runs[name].step(x, y)
            times[name].append((time.perf_counter() - start) / args.steps)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps: ms/step min / median / max")
    for name, ts in times.items():
        ms = sorted(t * 1e3 for t in ts)
        print(f"  {name:9s} {ms[0]:8.1f} {statistics.median(ms):8.1f} {ms[-1]:8.1f}")
    print(
        f"  speed-up compiled vs eager (median): {statistics.median(times['eager']) / statistics.median(times['compiled']):.3f}"
    )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    end_process_group()


if __name__ == "__main__":
    main()
