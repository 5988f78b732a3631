"""meshwise train on a mixture of experts, as a user runs it: a checkpoint saved under ep=2 resumes
under other layouts (ep=1 with ZeRO-3 on 2 processes, ep=2 carved from the cp ranks of cp=2 on 2
processes, and one process): DCP reshards the experts.

The reference runs 6 steps of tiny-moe under dp=2,ep=2 (2 processes), checkpointing at step 3;
each resumed run's steps 4-6 must match the reference's within 1e-4 (relative).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from _cli import meshwise_here, meshwise_launch

pytestmark = pytest.mark.integration

STEPS = 6
COMMON = [
    "--model",
    "tiny-moe",
    "--seq-len",
    "16",
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    "3",
    "--keep",
    "5",
    "--eval-every",
    "6",
    "--schedule.eval_batches",
    "1",
    "--prompt=",
    "--schedule.global_batch",
    "8",
]


def _train(folder: Path, layout: str, nproc: str, *extra: str) -> subprocess.CompletedProcess:
    args = [
        "train",
        *COMMON,
        "--layout",
        layout,
        "--nproc-per-node",
        nproc,
        "--checkpoint-dir",
        "ck",
        "--metrics",
        "m.jsonl",
        *extra,
    ]
    if nproc == "1":  # one process starts no worker: in this one (tests/_cli.py)
        return meshwise_here(*args, cwd=folder)
    return meshwise_launch(*args, cwd=folder, env={"OMP_NUM_THREADS": "1"})  # the launcher here, the workers not


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def test_ep_checkpoint_resumes_under_other_ep(tmp_path) -> None:
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    r = _train(ref_dir, "dp=2,ep=2", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    ref = _losses(ref_dir / "m.jsonl")
    assert sorted(ref) == list(range(1, STEPS + 1))
    for layout, nproc in (("dp=2,zero=3", "2"), ("cp=2,ep=2", "2"), ("dp=1", "1")):
        run = tmp_path / layout.replace(",", "_").replace("=", "")
        (run / "ck").mkdir(parents=True)
        shutil.copytree(ref_dir / "ck" / "step-3", run / "ck" / "step-3")
        r = _train(run, layout, nproc, "--resume", "auto")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert "Resumed from ck/step-3 (step 3" in r.stdout
        got = _losses(run / "m.jsonl")
        assert sorted(got) == [4, 5, 6]
        worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
        assert worst < 1e-4, (layout, worst, got, ref)
