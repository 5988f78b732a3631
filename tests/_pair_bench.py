"""A worker module for tests/integration/test_calibrate_run.py (started by
``_dist_parity.launch_forked``): calibrate_worker.bench_pp_host on every rank of the launch with
only ranks 0 and 1 active, as a calibration with more ranks than cores runs it; each rank writes its
row to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from meshwise.launch import init_process_group
from meshwise.measure.calibrate_worker import bench_pp_host
from meshwise.runtime.mesh import end_process_group
from meshwise.spec import load_model


def main(argv: list[str]) -> int:
    init_process_group("gloo", 120.0)
    rank = dist.get_rank()
    row = bench_pp_host(load_model("tiny"), 1, rank < 2, calls=2)
    dist.barrier()
    (Path(argv[0]) / f"rank{rank}.json").write_text(json.dumps(row))
    end_process_group()
    return 0
