"""One rank of benchmarks/cpu_time_grid.py: for each point of the launch in turn (each its own model,
layout, global batch and sequence length), build it, warm it up, time ``--steps`` steps, and free it
before the next: one model in the process at a time, as in ``meshwise train`` and ``measure`` (with
every point's model resident at once, the 2-process hidden-512 ZeRO-2 step read 0.75 s against 0.40 s
alone). Rounds interleave the points (benchmarks/cpu_time_grid.py: a machine whose speed drifts drifts
for all).

Each timed step starts at a barrier and is split into its parts (meshwise.measure.timing). Writes
``<out>/<i>/rank<r>.json`` per point: ``{"rank", "steps": [[step_s, parts], ...]}``. Timing only:
no memory tracker, no collective trace (``meshwise measure`` has those)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshwise.files import write_atomically
from meshwise.launch import init_process_group
from meshwise.layout import parse
from meshwise.measure.timing import StepClock
from meshwise.runtime import build_mesh, parallelize
from meshwise.runtime.mesh import end_process_group, exit_worker
from meshwise.spec import load_model

WARMUP_STEPS = 2


class Point:
    def __init__(self, text: str, world: int) -> None:
        model_file, layout_text, gb, seq = text.split("|")
        spec = load_model(model_file)
        self.layout = parse(layout_text, world)
        self.mesh = build_mesh(self.layout, spec, int(gb))
        self.model = parallelize(spec, self.layout, self.mesh, int(gb), seq_len=int(seq), seed=0)
        tokens = torch.randint(0, spec.vocab, (int(gb), int(seq) + 1), generator=torch.Generator().manual_seed(0))
        self.x, self.y = self.model.local_batch(tokens[:, :-1]), self.model.local_batch(tokens[:, 1:])
        for _ in range(WARMUP_STEPS):
            self.model.step(self.x, self.y)[0].item()
        self.steps: list[tuple[float, dict]] = []

    def timed_step(self) -> None:
        with StepClock(self.model) as clock:
            dist.barrier()
            clock.reset()
            start = time.perf_counter()
            loss = self.model.step(self.x, self.y)[0]
            with clock.window("fixed"):
                loss.item()
            step_s = time.perf_counter() - start
        self.steps.append((step_s, clock.parts(step_s)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--point", action="append", required=True, help="MODEL_FILE|LAYOUT|GLOBAL_BATCH|SEQ")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    init_process_group("gloo", 900.0)
    world = dist.get_world_size()
    for i, text in enumerate(args.point):
        p = Point(text, world)
        for _ in range(args.steps):
            p.timed_step()
        steps = p.steps
        del p
        gc.collect()
        folder = Path(args.out) / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / f"rank{dist.get_rank()}.json", json.dumps({"rank": dist.get_rank(), "steps": steps}))
    end_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    exit_worker(main())
