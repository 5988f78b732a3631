"""Start the measurement workers through torch's own launcher and collect their records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from meshwise.errors import MeshwiseError


def run_workers(nproc: int, layouts: list[str], model: str, global_batch: int, seq_len: int | None, steps: int,
                timeout_s: float = 900) -> list[list[dict]]:
    """Measure each layout on ``nproc`` local processes (one launch for all); returns, per layout,
    the records of every rank."""
    with tempfile.TemporaryDirectory(prefix="meshwise-measure-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "meshwise.measure.worker", "--model", model, "--global-batch", str(global_batch),
               "--steps", str(steps), "--out", out]
        for text in layouts:
            cmd += ["--layout", text]
        if seq_len:
            cmd += ["--seq-len", str(seq_len)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        results = []
        for i in range(len(layouts)):
            files = sorted((Path(out) / str(i)).glob("rank*.json"))
            if len(files) != nproc:
                errors = [line for line in proc.stderr.splitlines() if "meshwise: error:" in line]
                if errors:
                    raise MeshwiseError(errors[0].split("meshwise: error: ", 1)[1])
                tail = "\n".join(proc.stderr.splitlines()[-30:])
                raise RuntimeError(f"measurement of {layouts[i]!r} failed (exit {proc.returncode}):\n{tail}")
            results.append(sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"]))
        return results
