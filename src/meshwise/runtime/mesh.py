"""The device mesh of a layout: dims ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``, outermost first.

Rank r sits at coordinates (pp, dp_replicate, dp_shard, tp) in row-major order, so the ranks of
one TP group are consecutive (one node), then the sharding group, then the replicas, then stages.
The layout is validated before any process group exists.
"""

from __future__ import annotations

import os
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


def build_mesh(layout: Layout, model: ModelSpec, global_batch: int, *, backend: str | None = None,
               timeout_s: float = 600.0) -> DeviceMesh:
    """Validate, then (if needed) start the default process group and build the 4-D mesh.

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


def mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's replica index in 0..dp-1: dp_replicate coordinate * shard + dp_shard coordinate."""
    return mesh.get_local_rank("dp_replicate") * mesh["dp_shard"].size() + mesh.get_local_rank("dp_shard")
