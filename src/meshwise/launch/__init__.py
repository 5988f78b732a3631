"""Where the workers come from, for ``train``, ``measure`` and ``calibrate`` alike.

- Under a launcher (``LOCAL_RANK`` and ``WORLD_SIZE`` set, by torchrun or by :func:`launch_local`):
  this process is a worker.
- :func:`launch_local` starts N workers on this machine with torch's own elastic launcher
  (``torch.distributed.launcher.api.elastic_launch``, what torchrun runs; restarts up to
  ``max_restarts``). Nothing listens beyond loopback: the rendezvous is c10d over a *file* store,
  torch's shared TCPStore is switched off (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), the workers'
  process group meets in a ``FileStore`` in the run folder (one file per restart attempt), and gloo
  uses the loopback interface (``GLOO_SOCKET_IFNAME=lo``, unless set by the user).
- One error-passing protocol: a worker that stops on purpose (bad input, preemption, a stalled
  peer) writes ``{"status", "message"}`` to ``RUN_DIR/report-<rank>.json`` and stays silent; the
  launcher raises it once (:class:`MeshwiseError` for status 2, :class:`RunStopped` otherwise).
  A worker that dies without a report is named with its exit code or signal.

Beside it: ``allocator`` (a CPU rank's host allocator settings), ``guard`` (a worker's watch over
signals, its launcher and stalled peers) and ``torch_release`` (the torch release the suite ran on).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from meshwise.errors import MeshwiseError, RunStopped
from meshwise.launch.allocator import keep_freed_host_memory

RUN_DIR_ENV = "MESHWISE_RUN_DIR"  # the run folder: FileStores, heartbeats, reports
LAUNCHER_ENV = "MESHWISE_LAUNCHER"  # "1" when meshwise's launcher reads the workers' reports
_LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def in_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_gpus() -> bool:
    import torch

    return torch.cuda.is_available()


def default_nproc() -> int:
    """One worker per GPU (on CPU, ``train.layout_choice.choose_cpu_processes`` decides)."""
    import torch

    return torch.cuda.device_count()


def default_timeout_s() -> float:
    """Collective timeout: 300 s on CPU (gloo), 600 s on GPU (NCCL's own default)."""
    import torch

    return 600.0 if torch.cuda.is_available() else 300.0


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _loopback_env(run_dir: str) -> dict[str, str]:
    env = {RUN_DIR_ENV: run_dir, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "MASTER_ADDR": "127.0.0.1"}
    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@contextmanager
def single_process_env() -> Iterator[None]:
    """The environment a launcher would give a one-rank job, for the duration of the run."""
    with tempfile.TemporaryDirectory(prefix="meshwise-run-") as run_dir:
        values = {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0",
            "MASTER_PORT": "0",
            **_loopback_env(run_dir),
        }
        with _environ(values):
            yield


def report(status: int, message: str) -> bool:
    """In a worker: hand (status, one-line message) to meshwise's launcher. True when one is
    listening (then the worker stays silent and the launcher prints the message once)."""
    folder = os.environ.get(RUN_DIR_ENV)
    if not folder or os.environ.get(LAUNCHER_ENV) != "1":
        return False
    path = Path(folder) / f"report-{os.environ.get('RANK', '0')}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "message": message}))
    tmp.replace(path)
    return True


def _first_report(run_dir: str) -> dict | None:
    found = []
    for p in Path(run_dir).glob("report-*.json"):
        try:
            found.append((int(p.stem.split("-")[1]), json.loads(p.read_text())))
        except (ValueError, OSError):
            continue
    return min(found, key=lambda f: f[0])[1] if found else None


def _end_workers(run_dir: str) -> bool:
    """SIGKILL the workers of this run still alive (their pids are in their heartbeat files, see
    :mod:`meshwise.launch.guard`); True when there was one."""
    ended = False
    for p in Path(run_dir).glob("alive-*"):
        try:
            pid = int(p.read_text())
            os.kill(pid, signal.SIGKILL)
            ended = True
        except (OSError, ValueError):
            continue
    return ended


def _raise_report(found: dict) -> None:
    if found["status"] == 2:
        raise MeshwiseError(found["message"])
    raise RunStopped(found["message"], found["status"])


def launch_logged(module: str, argv: list[str], nproc: int, log_dir: Path, what: str, tail_lines: int = 10) -> None:
    """:func:`launch_local` for a measuring command (one thread per worker, output to ``log_dir``):
    a failed run becomes a RuntimeError naming ``what``, with the tail of each worker's stderr."""
    try:
        launch_local(module, argv, nproc, env={"OMP_NUM_THREADS": "1"}, log_dir=str(log_dir))
    except RunStopped as e:
        tail = "\n".join(
            line for f in sorted(log_dir.rglob("stderr.log")) for line in f.read_text().splitlines()[-tail_lines:]
        )
        raise RuntimeError(f"{what} failed: {e}\n{tail}") from None


def launch_local(
    module: str,
    argv: list[str],
    nproc: int,
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
    log_dir: str | None = None,
    stop_grace_s: float = 30.0,
) -> None:
    """Run ``python -m module ARGV`` as ``nproc`` workers on this machine and wait for them.

    ``log_dir``: the workers' stdout/stderr go to files there instead of this terminal.
    ``stop_grace_s``: on SIGTERM the elastic agent forwards it to the workers and SIGKILLs those
    still running this many seconds later (``LaunchConfig.shutdown_timeout``, torchrun's
    ``--shutdown-timeout``; torch's default 30 s), whole seconds rounded up. Raises
    :class:`MeshwiseError` / :class:`RunStopped` for a failed run (see the module docstring).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):  # each elastic module sets its own level
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)  # the failure is reported here, in one line
    handlers = {s: signal.getsignal(s) for s in _LAUNCHER_SIGNALS}  # the agent replaces them
    with (
        tempfile.TemporaryDirectory(prefix="meshwise-run-") as run_dir,
        _environ({**_loopback_env(run_dir), LAUNCHER_ENV: "1", **(env or {})}),
    ):
        logs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL) if log_dir else DefaultLogsSpecs()
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=str(uuid.uuid4()),
            rdzv_backend="c10d",
            rdzv_endpoint=str(Path(run_dir) / "rendezvous"),
            rdzv_configs={"store_type": "file"},
            local_addr="127.0.0.1",
            max_restarts=max_restarts,
            monitor_interval=0.1,
            logs_specs=logs,
            shutdown_timeout=math.ceil(stop_grace_s),
        )
        try:
            elastic_launch(config, sys.executable)("-m", module, *argv)
        except SignalException as e:
            sig = signal.Signals(e.sigval)
            if _end_workers(run_dir):  # a second signal cut the agent's graceful shutdown short
                raise RunStopped(f"second {sig.name}: stopped at once, without saving", 128 + sig.value) from None
            found = _first_report(run_dir)
            if found:
                _raise_report(found)
            raise RunStopped(f"stopped by {sig.name}; the workers were stopped", 128 + sig.value) from None
        except ChildFailedError as e:
            found = _first_report(run_dir)
            if found:
                _raise_report(found)
            rank, failure = e.get_first_failure()
            cause = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
            where = f"its log is in {log_dir}" if log_dir else "its output is above"
            raise RunStopped(f"worker rank {rank} failed ({cause}); {where}") from None
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)


def init_process_group(backend: str, timeout_s: float = 600.0) -> None:
    """The default process group for this worker.

    Started by :func:`launch_local` (``MESHWISE_RUN_DIR`` set): a ``FileStore`` in the run folder,
    one file per restart attempt (``TORCHELASTIC_RESTART_COUNT``), so a restarted group never reads
    the previous attempt's keys and nothing listens on a port. Under torchrun (several nodes): its
    ``env://`` store, under a key prefix per restart attempt, for the same reason.
    """
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        store = dist.FileStore(str(Path(run_dir) / f"store-{attempt}"), world)
        store.set_timeout(timeout)
    else:
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"meshwise/attempt-{attempt}", store)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elif (
        torch.get_num_threads() == 1
    ):  # a one-thread CPU rank: temporaries reused, not faulted in (launch/allocator.py)
        keep_freed_host_memory()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def check_nproc(nproc: int) -> None:
    if nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
