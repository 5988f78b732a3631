"""Faults on a real multi-process run (2 CPU workers of a micro model, started by meshwise's own
launcher): preemption, a restart without --resume, a dead launcher, a stalled rank, a full disk,
and what a fresh run may delete. Plus: a running job opens nothing beyond loopback.

The bounds in seconds below are the promises themselves (workers gone within 10 s of their
launcher; a stalled rank ends the run within its --timeout plus start-up slack), not benchmarks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli import meshwise_here, meshwise_launch

MICRO = "[model]\nlayers = 2\nhidden = 32\nheads = 2\nkv_heads = 2\nffn_hidden = 64\nvocab = 256\nmax_seq = 32\n"
STEPS = 10
COMMON = [
    "--model",
    "micro.toml",
    "--seq-len",
    "16",
    "--eval-every",
    "0",
    "--prompt=",
    "--layout",
    "dp=2",
    "--nproc-per-node",
    "2",
    "--metrics",
    "m.jsonl",
    "--checkpoint-dir",
    "ck",
]


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshwise.cli", "train", *COMMON, *args]


def _run(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(*args), cwd=folder, env=_env(env), capture_output=True, text=True, timeout=300)


def _losses(folder: Path) -> dict[int, float]:
    """step -> loss; a step logged twice (before a stop and after the resume) must agree."""
    out: dict[int, float] = {}
    for rec in map(json.loads, (folder / "m.jsonl").read_text().splitlines()):
        assert out.setdefault(rec["step"], rec["loss"]) == rec["loss"], rec
    return out


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _start_long_run(folder: Path, *args: str) -> tuple[subprocess.Popen, list[int]]:
    """A run that trains for long; returns once both workers have logged steps."""
    proc = subprocess.Popen(
        _cmd("--steps", "100000", "--checkpoint-every", "100000", *args),
        cwd=folder,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        metrics = folder / "m.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            return proc, _children(proc.pid)
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run did not start training within 180 s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    folder = tmp_path_factory.mktemp("reference")
    (folder / "micro.toml").write_text(MICRO)
    # no fault: the launcher in this process, the workers new processes (tests/_cli.py)
    r = meshwise_launch(
        "train", *COMMON, "--steps", str(STEPS), "--checkpoint-every", "100", cwd=folder, env={"OMP_NUM_THREADS": "1"}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    losses = _losses(folder)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def test_sigterm_saves_the_current_step_and_the_resume_is_bit_identical(reference, tmp_path) -> None:
    """Rank 0 SIGTERMs the launcher before step 4 (faults ``term@4``): the launcher forwards it, the
    workers finish their step, save it, and the run ends with one line and status 143."""
    (tmp_path / "micro.toml").write_text(MICRO)
    r = _run(tmp_path, "--steps", str(STEPS), "--checkpoint-every", "100", env={"MESHWISE_FAULTS": "term@4"})
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    m = re.fullmatch(
        r"meshwise: error: stopped by SIGTERM after step (\d+): checkpoint ck/step-\1 written; "
        r"--resume auto continues from it",
        lines[0],
    )
    assert m, lines[0]
    stopped = int(m.group(1))
    assert stopped >= 4 and max(_losses(tmp_path)) == stopped
    assert (tmp_path / "ck" / f"step-{stopped}" / "meshwise.json").is_file()
    r = _run(tmp_path, "--steps", str(STEPS), "--checkpoint-every", "100", "--resume", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Resumed from ck/step-{stopped} (step {stopped}," in r.stdout
    assert _losses(tmp_path) == reference  # every step, bit for bit


def test_max_restarts_without_resume_resumes_its_own_run(reference, tmp_path) -> None:
    """Attempt 0 loses a worker to SIGKILL before step 7; attempt 1 continues from step-5 (not from
    step 1, not deleting anything), and every loss equals the uninterrupted run's."""
    (tmp_path / "micro.toml").write_text(MICRO)
    r = _run(
        tmp_path,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        "5",
        "--max-restarts",
        "1",
        env={"MESHWISE_FAULTS": "kill@7"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Resumed from ck/step-5 (step 5," in r.stdout
    steps = [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6] + list(range(6, STEPS + 1))  # appended, not truncated
    assert _losses(tmp_path) == reference


def test_loopback_only_and_workers_exit_when_the_launcher_is_killed(tmp_path) -> None:
    (tmp_path / "micro.toml").write_text(MICRO)
    proc, workers = _start_long_run(tmp_path)
    try:
        assert len(workers) == 2
        ours = {proc.pid, *workers}
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
        mine = [line for line in listening if any(f"pid={p}," in line for p in ours)]
        assert mine, listening  # gloo's own sockets at least
        local = [line.split()[3] for line in mine]
        assert all(addr.startswith(("127.0.0.1:", "[::1]:")) for addr in local), mine
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "workers outlived their launcher by 10 s"
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def test_a_stopped_rank_ends_the_run_within_the_timeout_naming_it(tmp_path) -> None:
    (tmp_path / "micro.toml").write_text(MICRO)
    proc, workers = _start_long_run(tmp_path, "--timeout", "5")
    rank_of = {}
    for w in workers:
        env = Path(f"/proc/{w}/environ").read_bytes().split(b"\0")
        rank_of[w] = int(next(e for e in env if e.startswith(b"RANK=")).split(b"=")[1])
    stopped = next(w for w in workers if rank_of[w] == 1)
    try:
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took_s = time.monotonic() - t0
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (
        "meshwise: error: rank 1 stopped answering: a collective waited --timeout 5 s; the run was stopped"
    ), err
    assert took_s < 5 + 15, took_s  # the timeout plus slack, well inside torch's 30 s shutdown grace
    assert not any(_alive(w) for w in workers)


def test_full_disk_is_one_line_and_the_previous_checkpoint_loads(tmp_path) -> None:
    """A 1400 KiB tmpfs holds one checkpoint of the micro model (about 965 KB), not two."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1400k", "tmpfs", str(disk)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        (tmp_path / "micro.toml").write_text(MICRO)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "meshwise.cli",
                "train",
                "--model",
                "micro.toml",
                "--seq-len",
                "16",
                "--steps",
                "4",
                "--nproc-per-node",
                "1",
                "--checkpoint-dir",
                str(disk),
                "--checkpoint-every",
                "2",
                "--keep",
                "2",
                "--prompt=",
                "--eval-every",
                "0",
            ],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 1, r.stderr[-3000:]
        err = r.stderr.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert (
            f"--checkpoint.dir: no space left in {disk} while saving step 4: it needs about 1.0 MB (the size of step-2)"
            in err
        ), err
        assert "the partial step-4.tmp was removed and the last complete one is step-2" in err, err
        assert sorted(p.name for p in disk.iterdir()) == ["step-2"]
        r = meshwise_here(
            "export", "--checkpoint", str(disk / "step-2"), "--out", str(tmp_path / "m.safetensors"), cwd=tmp_path
        )  # one process: in this one (tests/_cli.py)
        assert r.returncode == 0, r.stderr
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_fresh_run_refuses_checkpoints_and_overwrite_removes_only_meshwises_own(tmp_path, capsys) -> None:
    from meshwise.cli import main

    (tmp_path / "micro.toml").write_text(MICRO)
    ck = tmp_path / "ck"
    for name in ("step-notes", "step-by-step-notes", "step-7", "step-8.tmp"):  # the user's, not meshwise's
        (ck / name).mkdir(parents=True)
        (ck / name / "mine.txt").write_text("keep me")
    args = [
        "train",
        "--model",
        str(tmp_path / "micro.toml"),
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        str(ck),
        "--prompt=",
        "--eval-every",
        "0",
    ]
    assert main(args) == 0  # nothing of meshwise's there: a fresh run may start
    assert main(args) == 2  # now step-2 is meshwise's: refused
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds checkpoints (latest step-2)" in err
    assert main(args + ["--checkpoint.overwrite", "true"]) == 0
    assert sorted(p.name for p in ck.iterdir()) == [
        "step-2",
        "step-7",
        "step-8.tmp",
        "step-by-step-notes",
        "step-notes",
    ]
    assert all(
        (ck / n / "mine.txt").read_text() == "keep me"
        for n in ("step-notes", "step-by-step-notes", "step-7", "step-8.tmp")
    )


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_sigterm_stops_at_once_without_saving(tmp_path, nproc) -> None:
    """``term2@3``: SIGTERM, then another 1.5 s later, to the launcher (2 workers) or to the one
    process (1): the run ends at once with one line; no checkpoint of the interrupted step."""
    (tmp_path / "micro.toml").write_text(MICRO)
    args = ["--steps", str(STEPS), "--checkpoint-every", "100", "--nproc-per-node", str(nproc)]
    r = _run(tmp_path, *args, *(["--layout", "dp=1"] if nproc == 1 else []), env={"MESHWISE_FAULTS": "term2@3"})
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    err = r.stderr.strip()
    assert err == "meshwise: error: second SIGTERM: stopped at once, without saving", err
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())


def test_a_save_slower_than_the_grace_ends_in_one_line_naming_the_latest_complete(tmp_path) -> None:
    """SIGTERM before step 4 with a 3 s grace (``--stop-grace 3``, the launcher's SIGKILL 3 s later),
    and the save of step 4 stalls in its writer (faults ``term+slowsave@4``, a slow file system): the
    workers give the save up before the SIGKILL and the run ends in one line that says the grace was
    too short and names step-3, which stays complete and loadable."""
    (tmp_path / "micro.toml").write_text(MICRO)
    r = _run(
        tmp_path,
        "--steps",
        "1000",
        "--checkpoint-every",
        "3",
        "--stop-grace",
        "3",
        env={"MESHWISE_FAULTS": "term+slowsave@4"},
    )
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.fullmatch(
        r"meshwise: error: stopped by SIGTERM after step 4: the 3 s grace \(--stop-grace\) was too "
        r"short for the save of step 4 \(still writing after [\d.]+ s; step-4\.tmp is partial\); the "
        r"latest complete checkpoint is ck/step-3; --resume auto continues from it",
        lines[0],
    ), lines[0]
    assert (tmp_path / "ck" / "step-3" / "meshwise.json").is_file()
    assert not (tmp_path / "ck" / "step-4").exists()
    from meshwise.train.checkpoint import resolve_resume

    assert resolve_resume("auto", str(tmp_path / "ck"))[0] == tmp_path / "ck" / "step-3"


def test_checkpoint_every_auto_measures_its_saves_and_a_kill_loses_at_most_one_interval(tmp_path) -> None:
    """``--checkpoint-every auto`` with a high ``--failure-rate`` (2000 per device-hour: one failure every
    0.9 s on 2 processes): each attempt prints its first save's staging and write and the interval it
    chose; a worker SIGKILLed before step 15 and again before step 30 (faults ``kill@15,kill@30``)
    resumes each time from a checkpoint at most one interval (the one in force) behind."""
    (tmp_path / "micro.toml").write_text(MICRO)
    r = _run(
        tmp_path,
        "--steps",
        "40",
        "--checkpoint-every",
        "auto",
        "--failure-rate",
        "2000",
        "--max-restarts",
        "2",
        env={"MESHWISE_FAULTS": "kill@15,kill@30"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    every, kills, resumed = None, iter([15, 30]), []
    for line in r.stdout.splitlines():
        m = re.match(
            r"Checkpoint interval \((auto|re-derived, the save was slower)\): every (\d+) steps \([\d.e+-]+ s\): "
            r"the save of step \d+ took [\d.e+-]+ s \(staging [\d.e+-]+ s, write [\d.e+-]+ s; ",
            line,
        )
        if m:
            every = int(m.group(2))
        m = re.match(r"Resumed from ck/step-(\d+) ", line)
        if m:
            assert every is not None, r.stdout  # the attempt that was killed had measured a save
            lost = next(kills) - 1 - int(m.group(1))
            assert 0 <= lost <= every, (lost, every, r.stdout)
            resumed.append(lost)
            every = None  # the next attempt measures its own
    assert len(resumed) == 2, r.stdout
    assert max(_losses(tmp_path)) == 40
