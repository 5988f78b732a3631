"""meshwise train with several processes, as a user runs it: faults, reshaping, two nodes.

One uninterrupted reference run (dp=2,tp=2, 4 ranks, started by meshwise itself through torch's
elastic launcher, checkpoint every 5 steps) is shared by the fault and reshape tests:

- faults: the same run under ``torchrun --max-restarts 2``; attempt 0 loses a worker to SIGKILL
  before step 12, attempt 1 loses rank 0 to SIGKILL in the middle of saving step 15 (after the
  shards, before the commit). Both restarts must resume from step-10 (the crash left step-15
  uncommitted), and every loss the run logged must equal the reference bit for bit.
- reshape: the reference's step-10 checkpoint resumed under pp=2,cp=2,zero=1 and under one process;
  steps 11-20 must match the reference within 1e-4 (relative).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import meshwise_here, meshwise_launch, run_nodes
from _models import micro_model
from meshwise.launch import free_port

STEPS = 20
COMMON = [
    "--seq-len",
    "16",
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    "5",
    "--keep",
    "10",
    "--eval-every",
    "10",
    "--schedule.eval_batches",
    "1",
    "--prompt=",
    "--lr",
    "3e-3",
]  # lr: the loss falls by 0.5 in 20 steps


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}


def _losses(path: Path) -> list[tuple[int, float]]:
    """(step, loss) of every line, duplicates included (a restarted run appends to the file)."""
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    folder = tmp_path_factory.mktemp("reference")
    model = micro_model(folder)
    # the launcher in this process, the 4 workers new processes (tests/_cli.py)
    r = meshwise_launch(
        "train",
        "--model",
        model,
        *COMMON,
        "--layout",
        "dp=2,tp=2",
        "--nproc-per-node",
        "4",
        "--checkpoint-dir",
        "ck",
        "--metrics",
        "m.jsonl",
        cwd=folder,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    losses = dict(_losses(folder / "m.jsonl"))
    assert sorted(losses) == list(range(1, STEPS + 1))
    return folder, losses


def test_sigkill_and_crash_during_save_resume_bit_for_bit(reference, tmp_path) -> None:
    ref_folder, ref = reference
    model = micro_model(tmp_path)
    cmd = _torchrun(
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "-m",
        "meshwise.train",
        "--model",
        model,
        *COMMON,
        "--layout",
        "dp=2,tp=2",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
        "--metrics",
        "m.jsonl",
    )
    r = subprocess.run(
        cmd, cwd=tmp_path, env=_env({"MESHWISE_FAULTS": "kill@12,save@15"}), capture_output=True, text=True, timeout=400
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    resumed = re.findall(r"Resumed from (\S+) \(step (\d+)", out)
    assert [(Path(p).name, s) for p, s in resumed] == [("step-10", "10"), ("step-10", "10")], resumed
    logged = _losses(tmp_path / "m.jsonl")
    # attempt 0: 1..~11 (how far rank 0 logs before the peers notice the killed worker depends on
    # timing), attempt 1: 11..15 or so (then the crash in save 15), attempt 2: 11..20
    runs: list[list[int]] = []
    for step, _ in logged:
        if not runs or step <= runs[-1][-1]:
            runs.append([])
        runs[-1].append(step)
    assert [r[0] for r in runs] == [1, 11, 11], runs
    assert all(r == list(range(r[0], r[-1] + 1)) for r in runs), runs
    assert 11 <= runs[0][-1] <= 14 and 11 <= runs[1][-1] <= 15 and runs[2][-1] == STEPS, runs
    mismatched = [(s, loss, ref[s]) for s, loss in logged if loss != ref[s]]
    assert not mismatched, mismatched
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [f"step-{s}" for s in (10, 15, 20, 5)]


@pytest.mark.parametrize("layout,nproc", [("pp=2,cp=2,zero=1", "4"), ("dp=1", "1")])
def test_resume_under_another_layout_and_world_size(reference, tmp_path, layout, nproc) -> None:
    ref_folder, ref = reference
    model = micro_model(tmp_path)
    (tmp_path / "ck").mkdir()
    shutil.copytree(ref_folder / "ck" / "step-10", tmp_path / "ck" / "step-10")
    args = [
        "train",
        "--model",
        model,
        *COMMON,
        "--layout",
        layout,
        "--nproc-per-node",
        nproc,
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
        "--metrics",
        "m.jsonl",
    ]
    if nproc == "1":  # one process starts no worker: in this one (tests/_cli.py)
        r = meshwise_here(*args, cwd=tmp_path)
    else:  # the launcher in this process, the workers new processes
        r = meshwise_launch(*args, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Resumed from ck/step-10 (step 10" in r.stdout
    logged = _losses(tmp_path / "m.jsonl")
    assert [s for s, _ in logged] == list(range(11, STEPS + 1))
    worst = max(abs(loss - ref[s]) / abs(ref[s]) for s, loss in logged)
    assert worst < 1e-4, (layout, worst, logged)
    assert logged[-1][1] < ref[1] - 0.5  # and it is still training: the loss keeps falling


def test_two_nodes_on_one_machine_layout_auto(tmp_path) -> None:
    """Two torchrun agents (--nnodes 2, 2 processes each, c10d rendezvous on 127.0.0.1)."""
    model = micro_model(tmp_path)
    port = free_port()
    cmd = _torchrun(
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "two-nodes",
        "-m",
        "meshwise.train",
        "--model",
        model,
        "--seq-len",
        "16",
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--schedule.eval_batches",
        "1",
        "--prompt=",
        "--layout",
        "auto",
        "--checkpoint-dir",
        "ck",
        "--metrics",
        "m.jsonl",
    )
    outs = run_nodes(cmd, tmp_path, _env())
    out = "\n".join(outs)
    assert "Layout (auto, planner on 2 node(s) x 2 cpu):" in out
    nodes, tp_text = re.search(r"Placement: node of each rank \[([\d, ]+)\]; (TP groups[^\n]*)", out).groups()
    assert [int(n) for n in nodes.split(",")] == [0, 0, 1, 1]
    assert tp_text in ("TP groups: none (tp=1)", "TP groups inside one node: yes"), tp_text
    assert [s for s, _ in _losses(tmp_path / "m.jsonl")] == [1, 2, 3, 4]
    assert (tmp_path / "ck" / "step-4" / "meshwise.json").is_file()


def test_checkpoint_of_another_model_shape_is_refused(reference, tmp_path, capsys) -> None:
    from meshwise.cli import main

    ref_folder, _ = reference
    args = [
        "train",
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--nproc-per-node",
        "1",
        "--resume",
        str(ref_folder / "ck" / "step-10"),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--metrics",
        str(tmp_path / "m.jsonl"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("meshwise: error: checkpoint") and "layers=2" in err and "layers=4" in err, err
    assert "\n" not in err and not (tmp_path / "ck").exists() and not (tmp_path / "m.jsonl").exists()
