"""One rank of ``meshwise calibrate``'s collective benchmark on GPUs (NCCL; gloo on a CPU, where
the GPU calibration runs at toy sizes to check its plumbing): all-reduce and all-gather at the
payloads the plan moves, each the slowest rank's mean over ``--reps`` back-to-back calls after a
warm-up call. Rank 0 writes ``<out>/links.json``: ``[kind, ranks, payload bytes, seconds]`` rows
(payload: the all-reduced buffer, the gathered tensor), which calibrate_gpu fits with
cost/fit.py ``fit_link``."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshwise.files import write_atomically
from meshwise.launch import init_process_group

KINDS = ("all_reduce", "all_gather")


def _timed(kind: str, payload_bytes: int, device: str, reps: int) -> tuple[int, float]:
    """(payload bytes moved, the slowest rank's seconds per call)."""
    world = dist.get_world_size()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # gloo reduces float32
    elems = max(world, payload_bytes // dtype.itemsize // world * world)
    full = torch.ones(elems, device=device, dtype=dtype)
    shard = full[: elems // world].clone()
    call = (
        (lambda: dist.all_reduce(full)) if kind == "all_reduce" else (lambda: dist.all_gather_into_tensor(full, shard))
    )
    call()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    sync()
    seconds = torch.tensor([(time.perf_counter() - start) / reps], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return elems * dtype.itemsize, float(seconds.item())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True, help="payload bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init_process_group("nccl" if device == "cuda" else "gloo")
    rows = [
        [kind, dist.get_world_size(), *_timed(kind, size, device, args.reps)]
        for size in (int(x) for x in args.sizes.split(","))
        for kind in KINDS
    ]
    if dist.get_rank() == 0:
        write_atomically(Path(args.out) / "links.json", json.dumps(rows))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
