"""One rank of benchmarks/step_overhead.py: per point, in three interleaved rounds, four timed steps
of the layout (compute = the forward + backward window less its timed waits, as
benchmarks/_cpu_grid_worker.py splits it), then the same rank's work without the parallel
runtime: its blocks (``layers / pp``, embedding and head included) run forward + backward over its
micro-batches as a plain model, on every rank at once and on each rank alone. Writes
``<out>/<i>/rank<r>.json``: ``{"compute_s": [...], "bare_both_s": [...], "bare_alone_s": [...]}``."""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from _cpu_grid_worker import Point
from meshwise.files import write_atomically
from meshwise.launch import init_process_group
from meshwise.layout import parse
from meshwise.runtime.mesh import end_process_group, exit_worker
from meshwise.runtime.model import build_model, loss_sum
from meshwise.spec import load_model

ROUNDS, STEPS = 3, 4


def bare_work(text: str, world: int):
    """The plain forward + backward of one rank's share of the point ``text`` (no TP or CP split)."""
    model_file, layout_text, gb, seq = text.split("|")
    layout = parse(layout_text, world)
    spec = load_model(model_file)
    net = build_model(replace(spec, layers=spec.layers // layout.pp), seed=0)
    tokens = torch.randint(0, spec.vocab, (layout.mbs, int(seq) + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    microbatches = int(gb) // (layout.dp * layout.mbs)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(microbatches):
            loss_sum(net(x), y).backward()
        net.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    run()
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--point", action="append", required=True, help="MODEL_FILE|LAYOUT|GLOBAL_BATCH|SEQ")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    init_process_group("gloo", 900.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    for i, text in enumerate(args.point):
        found: dict[str, list[float]] = {"compute_s": [], "bare_both_s": [], "bare_alone_s": []}
        run = bare_work(text, world)
        for _ in range(ROUNDS):
            point = Point(text, world)
            for _ in range(STEPS):
                point.timed_step()
            found["compute_s"] += [parts["compute_s"] for _, parts in point.steps]
            del point
            gc.collect()
            run()  # untimed: the freed step's memory is touched afresh (timed, it read up to 1.37x)
            for _ in range(STEPS):
                dist.barrier()
                found["bare_both_s"].append(run())
            for who in range(world):
                for _ in range(STEPS // 2):
                    dist.barrier()
                    if rank == who:
                        found["bare_alone_s"].append(run())
        folder = Path(args.out) / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / f"rank{rank}.json", json.dumps(found))
    end_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(main())
