"""meshwise tune's inputs: every bad one is one line and exit status 2 before anything is launched;
and a trial of one rank in this process: over --memory-limit it is recorded with its peak, a CUDA
out-of-memory error (raised by a fake) is caught and recorded, neither ends the tune."""

from __future__ import annotations

from pathlib import Path

import pytest

from _cli import meshwise_here
from meshwise.tune.memory_limit import memory_bytes

PROFILE = str(Path(__file__).parents[1] / "data" / "tune_profile_2p.toml")
BASE = ["tune", "--model", "tiny", "--seq-len", "32", "--layout.profile", PROFILE, "--nproc-per-node", "1"]


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--layout", "dp=1"], "--layout: 'dp=1': tune chooses the layout"),
        (["--trials", "0"], "--trials: 0 must be at least 1"),
        (["--trial-steps", "0"], "--trial-steps: 0 must be at least 1"),
        (["--budget-minutes", "-1"], "--budget-minutes: -1.0 must be a positive"),
        (["--budget-minutes", "nan"], "--budget-minutes: nan must be a positive"),
        (["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
        (["--memory-limit", "0GB"], "--memory-limit: '0GB' is not a size"),
        (["--emit", "jax"], "--emit: 'jax' is not one of"),
        (["--price-per-gpu-hour", "2"], "--price-per-gpu-hour: needs --tokens"),
        (["--tokens", "0"], "--tokens: 0.0 must be"),
        (["--resume"], "--resume: "),
        (["--model", "no-such-model"], "model"),
        (["--global-batch", "0"], "global_batch"),
        (["--trials", "x"], "--trials"),
    ],
)
def test_bad_input_is_one_line_before_any_launch(tmp_path, extra, field):
    r = meshwise_here(*BASE, "--out", str(tmp_path / "tune"), *extra, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert field in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "tune" / "trials.jsonl").exists()


def test_out_holding_a_tune_is_refused_without_resume(tmp_path):
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "trials.jsonl").write_text('{"tune": 1, "inputs": {"model": "small"}}\n')
    r = meshwise_here(*BASE, "--out", "tune", cwd=tmp_path)
    assert r.returncode == 2 and "holds a tune's results; --resume continues it" in r.stderr
    r = meshwise_here(*BASE, "--out", "tune", "--resume", cwd=tmp_path)
    assert r.returncode == 2 and "was tuned with model = 'small', not 'tiny'" in r.stderr
    (tmp_path / "tune" / "trials.jsonl").write_text(
        '{"tune": 1, "inputs": {"model": "tiny", "global_batch": 8, "seq_len": 32, "world": 2, "local_world": 2}}\n'
    )
    r = meshwise_here(*BASE, "--out", "tune", "--resume", cwd=tmp_path)
    assert r.returncode == 2 and "was tuned with world = 2, not 1" in r.stderr


def test_memory_sizes():
    assert memory_bytes("2GB") == 2_000_000_000 and memory_bytes("512MiB") == 512 * 2**20
    assert memory_bytes("3e9") == 3_000_000_000 and memory_bytes(None) == 0


def test_help_lists_train_and_tune_options(tmp_path):
    r = meshwise_here("tune", "--help", cwd=tmp_path)
    assert r.returncode == 0
    for option in ("--trials", "--budget-minutes", "--memory-limit", "--resume", "--model.name", "--emit"):
        assert option in r.stdout
    assert "--checkpoint.resume" in r.stdout  # train's option stays; its --resume alias is the tune's


# --------------------------------------------------------------------- a trial in this process
@pytest.fixture
def one_rank():
    """A one-rank gloo process group in this process, as ``tune --nproc-per-node 1`` runs."""
    from meshwise import launch
    from meshwise.runtime.mesh import end_process_group

    with launch.single_process_env():
        launch.init_process_group("gloo", 60)
        try:
            yield
        finally:
            end_process_group()


def _trial(limit_bytes: int, best_s: float | None = None, steps: int = 3):
    from meshwise.layout import parse
    from meshwise.train import loop
    from meshwise.tune.command import resolve
    from meshwise.tune.worker import Limits, TrialPlan, run_trial

    _, cfg = resolve(["--model", "tiny", "--seq-len", "32"])
    prep = loop.preflight(cfg)
    plan = TrialPlan(parse("dp=1,mbs=8", 1), 0.01, 0, best_s, 0.02)
    return run_trial(cfg, prep, plan, Limits(1, steps, limit_bytes), None)


def test_trial_over_memory_limit_is_recorded_with_its_peak(one_rank):
    fits = _trial(0)
    assert fits.status == "measured" and len(fits.steps_s) == 3 and fits.peak_bytes > 1e6
    over = _trial(fits.peak_bytes // 2)
    assert over.status == "over --memory-limit" and not over.fits and over.steps_s == []
    assert over.peak_bytes == pytest.approx(fits.peak_bytes, rel=0.2)


def test_trial_slower_than_the_best_beyond_the_noise_stops_after_three_steps(one_rank):
    stopped = _trial(0, best_s=1e-6, steps=5)
    assert stopped.status == "stopped early" and len(stopped.steps_s) == 3 and stopped.parts["compute_s"] > 0
    kept = _trial(0, best_s=1e3, steps=5)  # a best far slower: no stop
    assert kept.status == "measured" and len(kept.steps_s) == 5


def test_runoff_interleaves_the_contenders(one_rank):
    from dataclasses import replace

    from meshwise.layout import parse
    from meshwise.train import loop
    from meshwise.tune.command import resolve
    from meshwise.tune.worker import Limits, TrialPlan, run_runoff

    _, cfg = resolve(["--model", "tiny", "--seq-len", "32"])
    plans = [TrialPlan(parse(text, 1), 0.01, 0, 0.01, 0.0) for text in ("dp=1,mbs=8", "dp=1,mbs=4")]
    trials = run_runoff(cfg, loop.preflight(cfg), plans, Limits(1, 4, 0), None)
    assert [t.layout for t in trials] == [p.layout.format() for p in plans]
    # two passes at least; ended there when the leader is the profile's faster (a tie: the first)
    assert 2 <= len(trials[0].steps_s) == len(trials[1].steps_s) <= 4
    assert all(t.status == "run-off" and t.parts["compute_s"] > 0 for t in trials)
    bounded = [replace(p, predicted_step_s=s, max_steps=1) for p, s in zip(plans, (0.01, 0.02), strict=True)]
    assert [len(t.steps_s) for t in run_runoff(cfg, loop.preflight(cfg), bounded, Limits(1, 4, 0), None)] == [1, 1]


def test_cuda_out_of_memory_is_caught_and_recorded(one_rank, monkeypatch):
    """torch raises torch.cuda.OutOfMemoryError from the allocator; a fake raises it mid-trial."""
    import torch

    from meshwise.tune import worker

    freed = []

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(worker, "_measure", out_of_memory)
    monkeypatch.setattr(worker, "_free", lambda device_type: freed.append(device_type))
    trial = _trial(0)
    assert trial.status == "out of memory" and not trial.fits and trial.binds == "memory"
    assert freed  # its memory was freed before the tune went on


def test_cuda_path_reads_the_allocator_peak_and_empties_the_cache(one_rank, monkeypatch):
    """The CUDA branch of a trial on this CPU build, torch.cuda's memory calls faked: the allocator's
    peak is reset before the trial, read after the out-of-memory error, agreed over the ranks on the
    cuda device, and the cache emptied before the next trial."""
    import torch

    from meshwise.layout import parse
    from meshwise.train import loop
    from meshwise.tune import worker
    from meshwise.tune.command import resolve

    _, cfg = resolve(["--model", "tiny", "--seq-len", "32"])
    prep = loop.preflight(cfg)  # on this CPU, before the fake makes CUDA look available
    calls: list[str] = []
    peak_bytes = 5 << 30

    def out_of_memory(*args, **kwargs):
        calls.append("trial")
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: calls.append("peak") or peak_bytes)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(worker, "_agree", lambda values, device: calls.append(f"agree {device}") or values)
    monkeypatch.setattr(worker, "_measure", out_of_memory)
    plan = worker.TrialPlan(parse("dp=1,mbs=8", 1), 0.01, 0, None, 0.02)
    trial = worker.run_trial(cfg, prep, plan, worker.Limits(1, 3, 0), None)
    assert trial.status == "out of memory" and trial.peak_bytes == peak_bytes and trial.steps_s == []
    assert calls[:3] == ["reset", "trial", "peak"] and "agree cuda" in calls
    assert calls.index("empty") < calls.index("agree cuda") and calls[-1] == "empty"


def test_report_page_has_the_chart_and_every_trial(tmp_path):
    pytest.importorskip("matplotlib")
    from meshwise.report.tune_report import write_tune_report

    path = tmp_path / "tune.html"
    write_tune_report(
        path,
        "meshwise tune",
        ("#", "layout"),
        [("1", "dp=2,mbs=4"), ("2", "pp=2,mbs=2")],
        [(0.10, 0.08, 0.11), (0.20, 0.25, 0.19)],
        ["pick: dp=2,mbs=4"],
    )
    text = path.read_text()
    assert text.count("data:image/png;base64,") == 1 and "pp=2,mbs=2" in text and "pick: dp=2,mbs=4" in text


def test_choosing_and_refitting_import_no_torch():
    """The field, the trials, the refit and the loop are planning: pure Python, as plan/ is."""
    import subprocess
    import sys

    code = (
        "import sys\nimport meshwise.tune.command, meshwise.tune.driver, meshwise.tune.tuner\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
