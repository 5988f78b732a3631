"""The device mesh of a layout: dims ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, outermost first.

Rank r sits at coordinates (pp, dp_replicate, dp_shard, cp, tp) in row-major order, so the ranks of
one TP group are consecutive (one node), then the cp ring, the sharding group, the replicas, the stages.
The layout is validated before any process group exists.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshwise.layout import MESH_DIMS, Layout, validate
from meshwise.spec import ModelSpec

DEVICE_FOR_BACKEND = {"gloo": "cpu", "nccl": "cuda"}


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_type(backend: str) -> str:
    """gloo -> cpu, nccl -> cuda."""
    return DEVICE_FOR_BACKEND[backend]


def world_size_from_env() -> int:
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def build_mesh(
    layout: Layout, model: ModelSpec, global_batch: int, *, backend: str | None = None, timeout_s: float = 600.0
) -> DeviceMesh:
    """Validate, then (if needed) start the default process group and build the 5-D mesh.

    Raises MeshwiseError before touching torch.distributed when the layout cannot run here.
    """
    validate(layout, model, world_size_from_env(), global_batch)
    backend = backend or (dist.get_backend() if dist.is_initialized() else default_backend())
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    kind = device_type(backend)
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    shape = layout.mesh_shape
    return init_device_mesh(kind, tuple(shape[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS)


# How long the main thread sleeps after destroying the group, so gloo's threads can take the GIL.
GLOO_RELEASE_S = 0.2


def end_process_group() -> None:
    """Destroy the default process group at the end of a run, safely for the interpreter's exit.

    torch 2.13's gloo backend keeps its worker threads after ``destroy_process_group``, and a worker
    thread may still hold the last collectives (a barrier keeps the collectives before it), tensors
    included. When the thread drops such a tensor it must take the GIL; if the interpreter is shutting
    down by then, the thread exits inside a C++ destructor and the process aborts ("terminate called
    without an active exception", SIGABRT), after the run's work is done. The sleep releases the GIL
    while the interpreter is alive so the threads finish; ``exit_worker`` removes the race entirely.
    """
    if not dist.is_initialized():
        return
    gloo = "gloo" in str(dist.get_backend())
    dist.destroy_process_group()
    if gloo:
        time.sleep(GLOO_RELEASE_S)


def exit_worker(code: int) -> None:
    """End a worker process now with ``code``: flush stdout and stderr, then ``os._exit`` without the
    interpreter's shutdown, which is where gloo's threads can abort it (see ``end_process_group``).
    For the processes torchrun or a test starts, after their results are written and closed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":  # without a device (meshwise verify's fake tensors): cuda:0
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return torch.device(mesh.device_type)


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's replica index in 0..dp-1: dp_replicate coordinate * shard + dp_shard coordinate."""
    return mesh.get_local_rank("dp_replicate") * mesh["dp_shard"].size() + mesh.get_local_rank("dp_shard")
