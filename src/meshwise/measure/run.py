"""Start the measurement workers through meshwise's one launcher and collect their records."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from meshwise.launch import launch_logged


def run_workers(
    nproc: int,
    layouts: list[str],
    model: str,
    global_batch: int,
    seq_len: int | None,
    steps: int,
    timeout_s: float = 900,
    precision: str | None = None,
) -> list[list[dict]]:
    """Measure each layout on ``nproc`` local processes (one launch for all); returns, per layout,
    the records of every rank. ``precision``: a float8 format the workers train in (None: the
    device's own, fp32 on CPU, bf16-mixed on CUDA). A worker's bad-input line is raised as MeshwiseError; a worker
    that dies is a RuntimeError carrying the tail of its log."""
    with tempfile.TemporaryDirectory(prefix="meshwise-measure-") as out:
        argv = [
            "--model",
            model,
            "--global-batch",
            str(global_batch),
            "--steps",
            str(steps),
            "--out",
            out,
            "--timeout",
            str(timeout_s),
        ]
        for text in layouts:
            argv += ["--layout", text]
        if seq_len:
            argv += ["--seq-len", str(seq_len)]
        if precision:
            argv += ["--precision", precision]
        launch_logged("meshwise.measure.worker", argv, nproc, Path(out) / "logs", f"measurement of {layouts}", 15)
        results = []
        for i in range(len(layouts)):
            files = sorted((Path(out) / str(i)).glob("rank*.json"))
            results.append(sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"]))
        return results
