"""This machine's CPU profile, measured once and cached: what ``train`` and ``measure`` use on CPU
when no profile is given (``--gpu cpu`` still means the catalog's values).

The first use runs a quick ``meshwise calibrate`` (:func:`meshwise.measure.calibrate.calibrate`
with ``quick``: the same figures, fewer repetitions, smaller tensors) at the run's process count
and writes the profile, a plain TOML file, to

    <cache>/cpu-v<CALIBRATION_VERSION>-<host>-<arch>-<cores>c-torch<version>-<n>p.toml

where ``<cache>`` is ``$MESHWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/meshwise``, else
``~/.cache/meshwise``. The name is the cache key: another host, core count, torch version or
process count is another file; a file that does not load as a profile is measured again and
overwritten (meshwise wrote it; nothing in it is executed or unpickled). Bumping
``CALIBRATION_VERSION`` when the calibration changes makes every older file stale.

With more processes than cores, the per-rank figures (a rank's speed on a core of its own, see
``calibrate``) are those of this machine's ``cores``-process profile (measured first if missing),
the links those of the run's own process count: a machine has one speed per rank, and two
calibrations minutes apart on a shared machine read it differently (docs/fidelity.md, run E).

A calibration knows its age. Shared and cloud hosts drift (this 2-core machine read the same step
at 45 ms, then 87 ms, within the hour), so before a cached profile is used, ``ensure`` re-checks it
(measure/probe.py: a few GEMMs and an operator-overhead chain, about a second once torch is
loaded) against the probe the calibration recorded: beyond ``DRIFT_BOUND`` either way the machine
is calibrated again; within it, one line says how old the calibration is and how far the machine
moved. ``MESHWISE_RECHECK=0`` skips the re-check; a profile without a probe is used as it is.
A calibration that starts while other threads hold half the cores or more warns that its figures
may be slow (:func:`busy_text`: the threads runnable now, not the last minute's load average).

Workers started by ``train`` find the file through ``$MESHWISE_AUTO_PROFILE`` (set by the
launching process); workers under a plain ``torchrun`` read the cache but never calibrate (that
would start a calibration per rank): without a cached file they use the catalog's ``cpu``.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import statistics
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

from meshwise.errors import MeshwiseError
from meshwise.measure import calibrate as calibration  # the module: tests stand in for its calibrate
from meshwise.measure import plan_shapes, probe
from meshwise.measure.calibrate import with_per_rank_of, write_profile
from meshwise.spec import load_cluster

CACHE_ENV = "MESHWISE_CACHE_DIR"
PROFILE_ENV = "MESHWISE_AUTO_PROFILE"  # the resolved file, for the workers of a launch
CALIBRATION_VERSION = 19  # 19: gloo's all-to-all as a ratio to the pairwise exchange (cost/comm.py);
# 18: the loss's calls timed by vocabulary (cost/host.py loss_seconds);
# 17: the pipeline schedule's host cost per stage call;
# 16: zero-bubble's split backward, per block;
# 15: host passes, attention calls, FSDP2's, DTensor's and the optimizer's passes
#     the median, not the best; sequence parallelism's cost per block;
# 14: the matmul rate, the model's pass and the host passes, medians of 3 bursts;
# 13: the sync-skew ratio, the median of five passes of its benchmark;
# 12: the threads' speed-up timed with no peer process (after the workers);
# 11: the threads' speed-up, the second best of its paired timings;
# 10: the optimizer's DTensor cost per tensor; DTensor's per-operator cost
#     net of its collectives' measured waits;
# 9: SDPA's calls read off their measured table (cost/host.py); FSDP2's
#    cost per byte; the forward + backward's median pass; the wait for peers
#    with more ranks than cores;
# 8: whole ring calls with their sends; host time net of its GEMMs;
#    collectives' median run; gloo's reduce-scatter as a share of an all-reduce;
# 7: ring attention's kernels (cost/context_parallel.py);
# 6: a probe to re-check against, FSDP2's per-call and per-parameter costs;
# 5: the efficiency net of the memory-bound term (cost/host.py);
# 4: more ranks than cores take the cores-process profile's per-rank figures;
# 3: per-rank figures with one rank per core; 2: best of single timed calls
# (1: averaged over 50 ms windows)
RECHECK_ENV = "MESHWISE_RECHECK"
DRIFT_BOUND = 0.25  # a machine this much slower or faster than at its calibration is calibrated again
MODEL = "small"  # whose block shapes are timed: the default model of `meshwise train`
SEQ_LEN = 128  # the default `--data.seq_len`


def cache_dir() -> Path:
    """``$MESHWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/meshwise``, else ``~/.cache/meshwise``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshwise"


def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def machine_key(
    nproc: int, host: str | None = None, arch: str | None = None, cores: int | None = None, torch: str | None = None
) -> str:
    """The cache key: calibration version, host, architecture, cores, torch version, process count
    (characters outside ``[A-Za-z0-9._+-]`` become ``_``)."""
    parts = (
        f"cpu-v{CALIBRATION_VERSION}",
        host if host is not None else socket.gethostname(),
        arch if arch is not None else platform.machine(),
        f"{cores if cores is not None else os.cpu_count()}c",
        f"torch{torch if torch is not None else torch_version()}",
        f"{nproc}p",
    )
    return re.sub(r"[^A-Za-z0-9._+-]", "_", "-".join(parts))


def cache_path(nproc: int) -> Path:
    return cache_dir() / f"{machine_key(nproc)}.toml"


def is_valid(path: Path) -> bool:
    """Whether ``path`` loads as a profile (a half-written or foreign file does not)."""
    try:
        load_cluster(str(path), 1, 1)
    except (MeshwiseError, OSError, ValueError):
        return False
    return True


def cached(nproc: int) -> Path | None:
    """The cached profile for ``nproc`` processes on this machine, if there is a valid one."""
    path = cache_path(nproc)
    return path if path.is_file() and is_valid(path) else None


def ensure(nproc: int, say=None, fresh: bool = False, shapes=None) -> Path:
    """The cached profile for ``nproc`` processes; measured now (quick calibration) if missing,
    invalid, no longer this machine's (:func:`still_holds`) or ``fresh`` is asked for (a benchmark
    that calibrates before each of its rounds). ``shapes``: the run's (measure/plan_shapes.py
    ``PlanShapes``, or a list of them), whose loss and attention are timed into the profile where
    its tables do not reach them (:func:`at_shapes`). ``say``: where the one line about a
    calibration goes (default: stderr)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    found = cached(nproc)
    if found and not fresh and still_holds(found, say):
        return at_shapes(found, shapes, say)
    return at_shapes(_calibrated(nproc, say, found), shapes, say)


def at_shapes(path: Path, shapes, say, top_up=None) -> Path:
    """The profile at ``path`` with its components timed at ``shapes`` where it lacks them
    (measure/plan_shapes.py ``top_up``, or the ``top_up`` given), rewritten in place."""
    if not shapes:
        return path
    table, said = tomllib.loads(path.read_text()), []
    for one in shapes if isinstance(shapes, (list, tuple)) else [shapes]:
        table, lines = (top_up or plan_shapes.top_up)(table, one)
        said += lines
    if said:
        write_profile(path, table)
        say("Profile topped up at the run's shapes: " + "; ".join(said))
    return path


def _calibrated(nproc: int, say, found: Path | None) -> Path:
    """A quick calibration for ``nproc`` processes, written to the cache (:func:`ensure`)."""
    path = cache_path(nproc)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MeshwiseError(
            f"{CACHE_ENV}: cannot create the cache folder {path.parent} ({e.strerror}); "
            "set it to a writable folder, or give a profile (--gpu FILE / --layout.profile FILE)"
        ) from None
    say(f"Calibrating this machine for {nproc} process(es) ({'again' if found else 'first use'}; cached in {path}) ...")
    cores = os.cpu_count() or 1
    busy_note, busy = busy_text(cores)
    start = time.perf_counter()
    table = (
        calibration.calibrate(
            nproc, MODEL, str(path), SEQ_LEN, quick=True, note=f"auto-calibration (quick), {busy_note} at the start"
        )
        or {}
    )
    phases = ", ".join(f"{k} {v:.1f}" for k, v in (table.get("phase_s") or {}).items())
    say(f"Calibrated in {time.perf_counter() - start:.1f} s" + (f" (seconds: {phases})." if phases else "."))
    if nproc > cores:  # one per-rank speed per machine: the cores-process profile's (module docstring)
        share_per_rank_figures(path, ensure(cores, say), cores)
    if busy:
        say(
            f"meshwise: warning: the machine was busy as calibrating started ({busy_note}): its figures may be "
            f"slower than the machine; delete {path} to measure again when it is quiet"
        )
    return path


def other_runnable_threads(samples: int = 10, interval_s: float = 0.03, path: str = "/proc/loadavg") -> float | None:
    """The median, over ``samples`` reads ``interval_s`` apart, of the threads the scheduler holds
    runnable now (``/proc/loadavg``'s fourth field, ``running/total``) less this one; None without
    that file. The 1-minute load average also counts what ended within the last minute: right after
    a 4-process run on this 2-core host it read 9 to 57 with nothing left running."""
    counts = []
    for i in range(samples):
        try:
            with open(path) as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return None
        if i + 1 < samples:
            time.sleep(interval_s)
    return float(statistics.median_high(counts))


def busy_text(cores: int) -> tuple[str, bool]:
    """(what the machine was running, whether that is busy): busy when other runnable threads take
    at least half the cores (:func:`other_runnable_threads`), else, where that is not known, when
    the 1-minute load average exceeds the cores."""
    others = other_runnable_threads()
    if others is not None:
        return f"{others:.0f} other runnable thread(s) on {cores} cores", others >= cores / 2
    load = os.getloadavg()[0]
    return f"load average {load:.1f} on {cores} cores", load > cores


def age_text(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def still_holds(path: Path, say) -> bool:
    """Whether the cached profile at ``path`` still describes this machine: its probe read again
    within ``DRIFT_BOUND`` (module docstring); says the calibration's age and the drift either way."""
    if os.environ.get(RECHECK_ENV, "1") == "0":
        return True
    table = tomllib.loads(path.read_text())
    if not all(k in table for k in probe.PROBE_KEYS):
        return True
    start = time.perf_counter()
    now = probe.probe()
    moved = probe.drift(table, now)
    age = age_text(max(0.0, now["calibrated_unix_s"] - table["calibrated_unix_s"]))
    if abs(moved) <= DRIFT_BOUND:
        say(
            f"Calibration {age} old, re-checked in {time.perf_counter() - start:.1f} s: the machine reads "
            f"{moved:+.0%} against it (recalibrated beyond ±{DRIFT_BOUND:.0%})"
        )
        return True
    say(
        f"The machine reads {moved:+.0%} against its calibration of {age} ago (bound ±{DRIFT_BOUND:.0%}): "
        "calibrating again"
    )
    return False


def share_per_rank_figures(path: Path, base: Path, cores: int) -> None:
    """Rewrite the profile at ``path`` with the per-rank figures of ``base``, this machine's
    ``cores``-process profile."""
    table = tomllib.loads(path.read_text())
    write_profile(path, with_per_rank_of(table, tomllib.loads(base.read_text()), f"from the {cores}-process profile"))


def for_workers(nproc: int, shapes=None) -> str:
    """Ensure the profile (at the run's ``shapes``, :func:`ensure`) and hand its path to the workers
    of this launch (``$MESHWISE_AUTO_PROFILE``)."""
    path = str(ensure(nproc, shapes=shapes))
    os.environ[PROFILE_ENV] = path
    return path


def resolved(nproc: int) -> str:
    """In a worker: the launch's profile, else a cached one, else "" (the catalog's ``cpu``)."""
    given = os.environ.get(PROFILE_ENV, "")
    if given and Path(given).is_file():
        return given
    found = cached(nproc)
    return str(found) if found else ""
