"""Expert parallelism: each MoE block's experts sharded over the EP group, ZeRO over the rest.

The EP group is the one :func:`meshwise.layout.expert_mesh_shape` defines: ``dp_shard`` x ``cp``
(adjacent mesh dims, every rank of them holding the same dense weights) read as
(``dp_shard_mod_ep``, ``ep``), the EP ranks innermost, so under context parallelism the cp ranks
of a sequence are in one EP group first. The expert weights become DTensors sharded on the expert
dimension over ``ep`` (``Shard(0)``); the block's all-to-alls run on that group
(:mod:`meshwise.runtime.moe`). Data parallelism then treats them like the dense weights, over the
expert data-parallel ranks that remain (``dp_replicate`` x ``dp_shard_mod_ep``): replicated under
zero 0, else ``fully_shard`` on their second dimension (so the two shardings never split the same
dimension), each grouped-experts module its own unit.

Gradients: the experts of EP rank j receive the token gradients of all ``ep`` ranks of its group
(data-parallel or context-parallel ones alike), so they scale them by 1/ep (runtime/moe.py) and
the expert data-parallel reduction averages over its own dp * cp / ep ranks: the same average
over the dp * cp ranks that the dense weights get. (FSDP2's ``set_gradient_divide_factor`` would
do it in the reduction; with it the HSDP case dp=4,zero=1,shard=2,ep=2 got wrong expert
gradients, with a one-rank reduce-scatter group.)
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from meshwise.layout import MESH_DIMS, Layout, expert_mesh_shape
from meshwise.runtime import _torch_private
from meshwise.runtime.moe import GroupedExperts

EP_DIMS = ("pp", "dp_replicate", "dp_shard_mod_ep", "ep", "tp")


def expert_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """The 5-D mesh of :func:`meshwise.layout.expert_mesh_shape`, over the same ranks as ``mesh``:
    the whole mesh flattened (row-major) and unflattened into the expert dims, which carves the EP
    group out of ``dp_shard`` x ``cp`` without slicing a flattened dim from the root mesh."""
    shape = expert_mesh_shape(layout)
    world = _torch_private.flatten_mesh(mesh, MESH_DIMS, "ep_world")
    return _torch_private.unflatten_mesh(world, "ep_world", tuple(shape[d] for d in EP_DIMS), EP_DIMS)


def grouped_experts(model: nn.Module) -> list[GroupedExperts]:
    return [m for m in model.modules() if isinstance(m, GroupedExperts)]


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard every grouped-experts module's weights on the expert dimension over ``ep_mesh``."""
    for experts in grouped_experts(model):
        for name, p in list(experts.named_parameters(recurse=False)):
            setattr(experts, name, nn.Parameter(distribute_tensor(p, ep_mesh, [Shard(0)], src_data_rank=None)))
        experts.group = ep_mesh.get_group()


def expert_dp_mesh(emesh: DeviceMesh, layout: Layout, flat: bool) -> DeviceMesh:
    """The expert data-parallel ranks: 1-D (``flat``: replication, or FSDP), or 2-D for HSDP."""
    if layout.replicate == 1:
        return emesh["dp_shard_mod_ep"]
    if flat:
        return _torch_private.flatten_mesh(emesh, ("dp_replicate", "dp_shard_mod_ep"), "edp")
    return emesh["dp_replicate", "dp_shard_mod_ep"]
