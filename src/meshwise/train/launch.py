"""Where the workers come from.

- Under torchrun (``LOCAL_RANK`` and ``WORLD_SIZE`` set): this process is a worker; run it.
- Otherwise, with ``--nproc-per-node N`` > 1: start N local workers with torch's own elastic
  launcher (``torch.distributed.launcher.api.elastic_launch``, what torchrun runs: c10d rendezvous
  on a free local port, restarts up to ``--max-restarts``). Each worker runs
  ``python -m meshwise.train`` with the same arguments, so it is exactly a torchrun worker.
  Its bad-input message (one line) reaches this process through a file and is raised here once.
- With N = 1: the run stays in this process (a one-rank process group on a free local port).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from meshwise.errors import MeshwiseError

ERROR_DIR_ENV = "MESHWISE_ERROR_DIR"


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
    """One worker per GPU (on CPU, ``layout_choice.choose_cpu_processes`` decides)."""
    import torch

    return torch.cuda.device_count()


@contextmanager
def single_process_env() -> Iterator[None]:
    """The environment torchrun would give a one-rank job, for the duration of the run."""
    values = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
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


def report_error(message: str) -> bool:
    """In a worker: hand a bad-input message to the launching process. True when one is listening
    (then the worker stays silent and the launcher prints it once)."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return False
    (Path(folder) / f"rank-{os.environ.get('RANK', '0')}.txt").write_text(message)
    return True


def launch_local(argv: list[str], nproc: int, max_restarts: int) -> int:
    """Run ``meshwise train ARGV`` as ``nproc`` workers on this machine; returns the exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # the failure is reported here, in one line
    with tempfile.TemporaryDirectory(prefix="meshwise-") as errors:
        os.environ[ERROR_DIR_ENV] = errors
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                              max_restarts=max_restarts, monitor_interval=0.1)
        try:
            elastic_launch(config, sys.executable)("-m", "meshwise.train", *argv)
        except ChildFailedError as e:
            messages = sorted(Path(errors).glob("rank-*.txt"))
            if messages:
                raise MeshwiseError(messages[0].read_text()) from None
            rank, failure = e.get_first_failure()
            cause = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
            print(f"meshwise: error: worker rank {rank} failed ({cause}); its output is above", file=sys.stderr)
            return 1
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
    return 0


def init_process_group(backend: str, timeout_s: float = 600.0) -> None:
    """The default process group, on torchrun's store, under a key prefix per restart attempt.

    torchrun's c10d rendezvous keeps one TCPStore for the whole job (shared with the agent) and
    restarted workers reuse it: without a per-attempt prefix, a restarted gloo group reads the
    previous attempt's peer addresses and fails to connect. ``TORCHELASTIC_RESTART_COUNT`` gives
    each attempt its own key space.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"meshwise/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
