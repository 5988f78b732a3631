"""meshwise tune with several processes, as a user runs it: one launch for every trial, a resume
after a finished tune and after a SIGTERM, and two torchrun "nodes" on loopback.

Each test is short (tiny model, 2 processes, a few steps per trial); run them one at a time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli import meshwise_launch, run_nodes
from meshwise.launch import free_port
from meshwise.layout import parse
from meshwise.spec import load_cluster
from meshwise.train import config as config_mod
from meshwise.train.layout_choice import THREADS_ENV

pytestmark = pytest.mark.integration

PROFILE = str(Path(__file__).parents[1] / "data" / "tune_profile_2p.toml")
COMMON = [
    "--model",
    "tiny",
    "--seq-len",
    "64",
    "--global-batch",
    "8",
    "--layout.profile",
    PROFILE,
    "--trial-warmup",
    "1",
    "--trial-steps",
    "3",
]


def _trials(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()[1:]]


def test_two_process_tune_over_a_field_then_resume(tmp_path) -> None:
    r = meshwise_launch(
        "tune",
        *COMMON,
        "--nproc-per-node",
        "2",
        "--out",
        "t",
        "--trials",
        "3",
        "--json",
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    # the refit may end the tune before --trials: once no untried layout can beat the measured best
    assert len(summary["field"]) >= 3 and 1 <= len(summary["trials"]) <= 3
    # a trial is a layout measured; the run-off measures tried ones again, within the steps of 3 trials
    first = [t["layout"] for t in _trials(tmp_path / "t") if t["status"] != "run-off"]
    assert first == [t["layout"] for t in summary["trials"]] and len(set(first)) == len(first)
    assert summary["trials_used"] == len(first) and {t["layout"] for t in summary["runoff"]} <= set(first)
    assert summary["steps_used"] <= summary["step_budget"] == 3 * (1 + 3)
    assert all(t["steps_s"] and t["parts"] and t["peak_bytes"] > 0 for t in summary["trials"])
    assert set(summary["dropped"]) <= set(summary["field"]) - set(first)
    decided = summary["runoff"] or [t for t in summary["trials"] if t["status"] == "measured"]
    assert summary["pick"] == min(decided, key=lambda t: t["measured_step_s"])["layout"]
    cfg = config_mod.load(str(tmp_path / "t" / "train.toml"))  # a train config, ready to run
    assert cfg.layout.choice == summary["pick"] and cfg.layout.profile.endswith("profile.toml")
    load_cluster(str(tmp_path / "t" / "profile.toml"), 2, 2)  # what plan --gpu reads

    r = meshwise_launch(
        "tune",
        *COMMON,
        "--nproc-per-node",
        "2",
        "--out",
        "t",
        "--trials",
        "5",
        "--resume",
        "--emit",
        "deepspeed",
        "--tokens",
        "1e9",
        "--price-per-gpu-hour",
        "2",
        "--report",
        "t.html",
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = _trials(tmp_path / "t")
    after = [t["layout"] for t in rows if t["status"] != "run-off"]  # a run-off measures tried layouts again
    assert after[: len(first)] == first and len(set(after)) == len(after) <= 5
    assert f"({len(first)} resumed)" in r.stdout and "Pick: " in r.stdout
    assert "Budget: 1B tokens in " in r.stdout and "GPU-hours on 2 device(s), cost " in r.stdout
    pick = next(line for line in r.stdout.splitlines() if line.startswith("Pick: ")).split()[1]
    if parse(pick).pp == 1 and parse(pick).tp == 1:
        assert '"train_micro_batch_size_per_gpu"' in r.stdout  # the pick as DeepSpeed configuration
    else:  # DeepSpeed's JSON has no tp or pp: one line, the tune stands
        assert "meshwise: note: --emit deepspeed: " in r.stderr
    assert "data:image/png" in (tmp_path / "t.html").read_text()


def test_sigterm_mid_tune_then_resume_repeats_no_finished_trial(tmp_path) -> None:
    # --exhaustive 3: three trials whatever the refit says, so the signal finds one running (the
    # second) and the resume has one left that no trial ran
    cmd = [
        sys.executable,
        "-m",
        "meshwise.cli",
        "tune",
        *COMMON,
        "--nproc-per-node",
        "2",
        "--out",
        "t",
        "--exhaustive",
        "3",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # trials of up to 60 steps (seconds each): the signal comes during the second
    proc = subprocess.Popen(
        [*cmd, "--trial-steps", "60"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    results = tmp_path / "t" / "trials.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= 2:  # one finished trial
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-3000:]
    assert "tune --resume continues" in err, err[-2000:]
    finished = [t["layout"] for t in _trials(tmp_path / "t")]
    assert 1 <= len(finished) < 3
    done = subprocess.run([*cmd, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    after = [t["layout"] for t in _trials(tmp_path / "t")]
    assert after[: len(finished)] == finished and len(set(after)) == len(after) == 3


def test_two_nodes_on_loopback_pick_as_one_launch(tmp_path) -> None:
    """Two torchrun agents of one process each (c10d rendezvous on 127.0.0.1) against one launch of
    two processes: one trial each, so the pick is the field's first, which both must agree on."""
    one = meshwise_launch(
        "tune",
        *COMMON,
        "--nproc-per-node",
        "2",
        "--out",
        "one",
        "--trials",
        "1",
        "--json",
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "tune-two-nodes",
        "-m",
        "meshwise.tune",
        *COMMON,
        "--out",
        "two",
        "--trials",
        "1",
        "--json",
    ]
    # one thread per rank, as the one launch gives each of its 2 processes on this machine's cores
    env = {**os.environ, "OMP_NUM_THREADS": "1", THREADS_ENV: "1"}
    outs = run_nodes(cmd, tmp_path, env)
    two = json.loads(next(line for o in outs for line in o.splitlines() if line.startswith("{")))
    single = json.loads(next(line for line in one.stdout.splitlines() if line.startswith("{")))
    assert two["pick"] == single["pick"] and two["field"] == single["field"]
