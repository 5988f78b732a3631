"""Start the measurement workers through meshwise's one launcher and collect their records."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from meshwise.errors import RunStopped
from meshwise.launch import launch_local


def run_workers(nproc: int, layouts: list[str], model: str, global_batch: int, seq_len: int | None, steps: int,
                timeout_s: float = 900) -> list[list[dict]]:
    """Measure each layout on ``nproc`` local processes (one launch for all); returns, per layout,
    the records of every rank. A worker's bad-input line is raised as MeshwiseError; a worker
    that dies is a RuntimeError carrying the tail of its log."""
    with tempfile.TemporaryDirectory(prefix="meshwise-measure-") as out:
        argv = ["--model", model, "--global-batch", str(global_batch), "--steps", str(steps), "--out", out,
                "--timeout", str(timeout_s)]
        for text in layouts:
            argv += ["--layout", text]
        if seq_len:
            argv += ["--seq-len", str(seq_len)]
        logs = Path(out) / "logs"
        try:
            launch_local("meshwise.measure.worker", argv, nproc, env={"OMP_NUM_THREADS": "1"}, log_dir=str(logs))
        except RunStopped as e:
            tail = "\n".join(line for f in sorted(logs.rglob("stderr.log")) for line in f.read_text().splitlines()[-15:])
            raise RuntimeError(f"measurement of {layouts} failed: {e}\n{tail}") from None
        results = []
        for i in range(len(layouts)):
            files = sorted((Path(out) / str(i)).glob("rank*.json"))
            results.append(sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"]))
        return results
