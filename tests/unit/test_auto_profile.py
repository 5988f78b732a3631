"""This machine's cached calibration (measure/auto_profile.py): key, location, staleness, use.
No test here calibrates: ``calibrate`` is replaced by a stub that writes the catalog's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshwise.catalog import read_catalog
from meshwise.measure import auto_profile
from meshwise.measure import calibrate as calibrate_mod
from meshwise.measure.calibrate import format_toml


def _catalog_profile(name: str = "cpu-test") -> str:
    return format_toml({"name": name, **read_catalog("accelerators.toml")["cpu"]})


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """An empty cache folder and a stub calibration that records its calls."""
    monkeypatch.setenv(auto_profile.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(auto_profile.PROFILE_ENV, "")  # restored after the test (for_workers sets it)
    calls: list[tuple] = []

    def fake(nproc, model, out, seq, quick=False, note=""):
        calls.append((nproc, model, seq, quick))
        Path(out).write_text(_catalog_profile(f"measured-{nproc}"))

    monkeypatch.setattr(calibrate_mod, "calibrate", fake)
    return calls


def test_the_key_names_host_cores_torch_and_process_count() -> None:
    key = auto_profile.machine_key(2, host="box", arch="x86_64", cores=2, torch="2.13.0")
    assert key == f"cpu-v{auto_profile.CALIBRATION_VERSION}-box-x86_64-2c-torch2.13.0-2p"
    others = [
        auto_profile.machine_key(4, host="box", arch="x86_64", cores=2, torch="2.13.0"),
        auto_profile.machine_key(2, host="other", arch="x86_64", cores=2, torch="2.13.0"),
        auto_profile.machine_key(2, host="box", arch="x86_64", cores=8, torch="2.13.0"),
        auto_profile.machine_key(2, host="box", arch="x86_64", cores=2, torch="2.14.0+cpu"),
    ]
    assert len({key, *others}) == 5
    assert auto_profile.machine_key(1, host="a/b c", arch="x", cores=1, torch="1").count("/") == 0


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(auto_profile.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert auto_profile.cache_dir() == tmp_path / "xdg" / "meshwise"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert auto_profile.cache_dir() == tmp_path / "home" / ".cache" / "meshwise"
    monkeypatch.setenv(auto_profile.CACHE_ENV, str(tmp_path / "mine"))
    assert auto_profile.cache_dir() == tmp_path / "mine"


def test_first_use_calibrates_once_then_reads_the_cache(empty_cache: list[tuple]) -> None:
    lines: list[str] = []
    path = auto_profile.ensure(2, say=lines.append)
    assert empty_cache == [(2, auto_profile.MODEL, auto_profile.SEQ_LEN, True)]
    assert path == auto_profile.cache_path(2) and path.is_file() and len(lines) in (2, 3)  # 3: a busy-machine warning
    assert auto_profile.ensure(2, say=lines.append) == path
    assert len(empty_cache) == 1  # cached: not measured again
    auto_profile.ensure(4, say=lines.append)  # another process count is another calibration
    assert [c[0] for c in empty_cache] == [2, 4]
    assert auto_profile.ensure(2, say=lines.append, fresh=True) == path  # asked afresh: measured again
    assert [c[0] for c in empty_cache] == [2, 4, 2]


def test_a_damaged_or_foreign_file_is_measured_again(empty_cache: list[tuple]) -> None:
    path = auto_profile.cache_path(2)
    path.parent.mkdir(parents=True)
    path.write_text("name = 'half-writ")  # not TOML
    assert auto_profile.cached(2) is None
    auto_profile.ensure(2, say=lambda _: None)
    assert len(empty_cache) == 1 and auto_profile.cached(2) == path
    # another torch version's file sits beside it under its own key, never read for this one
    other = path.with_name(path.name.replace(f"torch{auto_profile.torch_version()}", "torch0.0.1"))
    other.write_text(_catalog_profile("old"))
    assert auto_profile.cached(2) == path


def test_workers_read_the_launch_profile_else_the_cache_else_the_catalog(
    empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshwise.train.layout_choice import live_cluster

    assert auto_profile.resolved(2) == ""
    assert live_cluster(2, 2, "cpu").cluster.accelerator.name == "cpu"  # nothing cached: the catalog
    assert empty_cache == []  # a worker never calibrates
    path = auto_profile.for_workers(2)
    assert auto_profile.resolved(2) == path
    assert live_cluster(2, 2, "cpu").cluster.accelerator.name == "measured-2"


def test_more_processes_than_cores_take_the_cores_profile_s_per_rank_figures(
    empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One per-rank speed per machine: a 4-process profile on 2 cores keeps its own links and takes
    the 2-process profile's per-rank figures (measured first if missing)."""
    import os

    from meshwise.spec import load_cluster

    def fake(nproc, model, out, seq, quick=False, note=""):
        empty_cache.append((nproc,))
        table = {"name": f"measured-{nproc}", **read_catalog("accelerators.toml")["cpu"]}
        table.update(peak_fp32_flops_per_s=nproc * 1e9, op_overhead_s=nproc * 1e-6, intra_latency_s=nproc * 1e-4)
        Path(out).write_text(format_toml(table))

    monkeypatch.setattr(calibrate_mod, "calibrate", fake)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    four = load_cluster(str(auto_profile.ensure(4, say=lambda _: None)), 4, 4)
    assert [c[0] for c in empty_cache] == [4, 2]
    assert four.accelerator.peak_fp32_flops_per_s == 2e9 and four.accelerator.op_overhead_s == pytest.approx(2e-6)
    assert four.intra.latency_s == pytest.approx(4e-4)
    two = load_cluster(str(auto_profile.ensure(2, say=lambda _: None)), 2, 2)
    assert two.accelerator.peak_fp32_flops_per_s == 2e9 and len(empty_cache) == 2


def _probed(empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch, then: dict) -> list[dict]:
    """A stub calibration whose profile records the probe ``then``; returns the list the test fills
    with what the machine reads now (``probe`` is replaced: nothing is timed)."""
    from meshwise.measure import probe

    def fake(nproc, model, out, seq, quick=False, note=""):
        empty_cache.append((nproc,))
        Path(out).write_text(
            format_toml({"name": f"measured-{nproc}", **read_catalog("accelerators.toml")["cpu"], **then})
        )

    now: list[dict] = []
    monkeypatch.setattr(calibrate_mod, "calibrate", fake)
    monkeypatch.setattr(probe, "probe", lambda: now[-1])
    monkeypatch.setenv(auto_profile.RECHECK_ENV, "1")
    return now


THEN = {"probe_gemm_flops_per_s": 80e9, "probe_op_s": 5e-6, "calibrated_unix_s": 1_800_000_000}


def test_a_cached_calibration_is_rechecked_and_used_while_the_machine_holds(
    empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = _probed(empty_cache, monkeypatch, THEN)
    auto_profile.ensure(2, say=lambda _: None)
    now.append({"probe_gemm_flops_per_s": 72e9, "probe_op_s": 5.5e-6, "calibrated_unix_s": 1_800_002_400})
    lines: list[str] = []
    auto_profile.ensure(2, say=lines.append)
    assert len(empty_cache) == 1  # within 25%: not measured again
    assert lines == ["Calibration 40 min old, re-checked in " + lines[0].split("re-checked in ")[1]]
    assert "+11%" in lines[0]  # GEMMs 80/72 = 1.11x slower, operators 1.10x: the larger


@pytest.mark.parametrize("gemm, op", [(40e9, 5e-6), (80e9, 3.5e-6)])
def test_a_machine_that_moved_is_calibrated_again(
    empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch, gemm: float, op: float
) -> None:
    """Twice as slow at GEMMs (the 2x drift seen on shared hosts), or operators 30% faster: measured again."""
    now = _probed(empty_cache, monkeypatch, THEN)
    auto_profile.ensure(2, say=lambda _: None)
    now.append({"probe_gemm_flops_per_s": gemm, "probe_op_s": op, "calibrated_unix_s": 1_800_000_600})
    lines: list[str] = []
    auto_profile.ensure(2, say=lines.append)
    assert len(empty_cache) == 2
    assert lines[0].startswith("The machine reads " + ("+100%" if gemm < 80e9 else "-30%"))
    assert "10 min ago" in lines[0] and "again" in lines[1]


def test_the_recheck_can_be_switched_off_and_skips_a_profile_without_a_probe(
    empty_cache: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = _probed(empty_cache, monkeypatch, THEN)
    auto_profile.ensure(2, say=lambda _: None)
    now.append({"probe_gemm_flops_per_s": 10e9, "probe_op_s": 5e-5, "calibrated_unix_s": 1_800_000_600})
    monkeypatch.setenv(auto_profile.RECHECK_ENV, "0")
    auto_profile.ensure(2, say=lambda _: None)
    assert len(empty_cache) == 1
    monkeypatch.setenv(auto_profile.RECHECK_ENV, "1")
    _probed(empty_cache, monkeypatch, {})  # an older profile without a probe: used as it is
    auto_profile.ensure(1, say=lambda _: None)
    auto_profile.ensure(1, say=lambda _: None)
    assert [c[0] for c in empty_cache] == [2, 1]


def test_a_bad_probe_figure_in_a_profile_is_refused() -> None:
    from meshwise.errors import MeshwiseError
    from meshwise.spec.host_keys import host_fields

    assert host_fields(THEN, "x.toml") == {}  # accepted, not part of the accelerator's spec
    with pytest.raises(MeshwiseError, match="probe_op_s must be a positive number"):
        host_fields({**THEN, "probe_op_s": 0.0}, "x.toml")


def test_busy_is_what_runs_now_not_the_last_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The busy-machine warning counts the threads runnable at the start (less the calibrating one),
    not the 1-minute load average, which still holds a finished run's workers."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("57.0 23.6 12.4 1/287 16321\n")  # a 4-process run just ended: nothing else runs
    assert auto_profile.other_runnable_threads(samples=3, interval_s=0, path=str(loadavg)) == 0.0
    loadavg.write_text("0.2 0.1 0.1 3/287 16321\n")  # two other threads run now
    assert auto_profile.other_runnable_threads(samples=3, interval_s=0, path=str(loadavg)) == 2.0
    assert auto_profile.other_runnable_threads(path=str(tmp_path / "absent")) is None

    monkeypatch.setattr(auto_profile, "other_runnable_threads", lambda: 0.0)
    assert auto_profile.busy_text(2) == ("0 other runnable thread(s) on 2 cores", False)
    monkeypatch.setattr(auto_profile, "other_runnable_threads", lambda: 1.0)
    assert auto_profile.busy_text(2)[1] and not auto_profile.busy_text(4)[1]
    monkeypatch.setattr(auto_profile, "other_runnable_threads", lambda: None)
    monkeypatch.setattr(auto_profile.os, "getloadavg", lambda: (9.2, 1.0, 1.0))
    assert auto_profile.busy_text(2) == ("load average 9.2 on 2 cores", True)


def test_typical_time_is_the_median_run_where_best_time_is_the_shortest(monkeypatch: pytest.MonkeyPatch):
    """probe.typical_time reads the median of its runs (what a step pays), best_time the shortest
    (the machine's own speed); each run calls until min_s has passed, per call."""
    from meshwise.measure import probe

    clock = [0.0]
    runs = iter([3e-3, 1e-3, 9e-3, 2e-3, 5e-3] * 2)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])

    def call() -> None:
        clock[0] += next(runs)

    assert probe.typical_time(call, 5) == pytest.approx(3e-3)
    assert probe.best_time(call, 5) == pytest.approx(1e-3)
    pair = iter([1e-3, 1e-3, 4e-3])

    def half() -> None:
        clock[0] += next(pair)

    assert probe.typical_time(half, 2, min_s=2e-3) == pytest.approx(2.5e-3)  # runs of 2 x 1 ms and 1 x 4 ms
