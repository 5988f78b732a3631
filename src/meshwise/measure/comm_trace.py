"""Record the collectives a training step issues: kind, mesh dimension, count and bytes.

A ``TorchDispatchMode`` sees every ``c10d`` op (what DDP/FSDP2/pipelining call on process groups)
and every ``_c10d_functional`` op (what DTensor redistributions call) on this rank, forward and
backward. The group of each op is matched to a mesh dimension by its ranks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshwise.layout import MESH_DIMS
from meshwise.runtime._torch_private import TorchDispatchMode, resolve_process_group, unbox_process_group

# op name (namespace::name without overload) -> collective kind
KINDS = {
    "allreduce_": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "barrier": "barrier",
}


FLATTENED = ("dp_shard_cp", "dp_cp")  # flattened mesh dims named like the planner names them


@dataclass(frozen=True)
class CommKey:
    kind: str
    dim: str  # mesh dim name(s) joined by "+", or "world"/"other"
    dtype: str


def _tensors(x: object) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


class CollectiveTrace(TorchDispatchMode):
    """``with CollectiveTrace(mesh) as t: step()``; then ``t.calls`` and ``t.bytes`` per CommKey.
    ``named_groups`` names process groups that are no dimension of ``mesh`` (``{"ep": group}``),
    ``named_ranks`` groups of the given ranks (``{"edp": (1, 5)}``, whichever process group holds them).

    Bytes are the unsharded message size on this rank: the tensor of all-reduce, broadcast, send
    and recv, the gathered output of all-gather, the full input of reduce-scatter.
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        named_groups: dict[str, object] | None = None,
        named_ranks: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__()
        self.calls: Counter = Counter()
        self.bytes: Counter = Counter()
        self.sizes: dict[CommKey, Counter] = {}
        self._dims: dict[tuple[int, ...], str] = {}
        names = mesh.mesh_dim_names or ()
        for i, name in enumerate(names):
            if mesh.size(i) > 1:
                self._dims.setdefault(tuple(sorted(dist.get_process_group_ranks(mesh.get_group(i)))), name)
        for flat in FLATTENED:  # context parallelism's data-parallel group (runtime/data_parallel.py)
            try:
                group = mesh[flat].get_group()
            except (KeyError, RuntimeError, ValueError):
                continue
            self._dims.setdefault(tuple(sorted(dist.get_process_group_ranks(group))), flat)
        self._dims.setdefault(tuple(range(dist.get_world_size())), "world")
        self._mesh_dims = dict(self._dims)
        for dim, ranks in (named_ranks or {}).items():
            self._dims[tuple(sorted(ranks))] = dim
        self._by_name: dict[str, tuple[str, int]] = {}
        for dim, group in (named_groups or {}).items():  # groups outside the mesh, by name (the EP group)
            self._by_name[group.group_name] = (dim, dist.get_world_size(group))

    def mesh_dim_of(self, group: object) -> str:
        """The mesh dimension (or flattened one) whose ranks are those of the ProcessGroup ``group``."""
        ranks = tuple(sorted(dist.get_process_group_ranks(group)))
        return self._mesh_dims.get(ranks, f"group{len(ranks)}")

    def _dim(self, group: object) -> tuple[str, int]:
        """(mesh dim name, group size) of a ProcessGroup or a functional collective's group name."""
        if isinstance(group, torch.ScriptObject):  # c10d ops carry the group boxed
            try:
                group = unbox_process_group(group)
            except Exception:
                return "other", 1
        name = group if isinstance(group, str) else getattr(group, "group_name", None)
        if name in self._by_name:
            return self._by_name[name]
        try:
            pg = resolve_process_group(name)
            ranks = tuple(sorted(dist.get_process_group_ranks(pg)))
        except Exception:
            return "other", 1
        found = (self._dims.get(ranks, f"group{len(ranks)}"), len(ranks))
        self._by_name[name] = found
        return found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        name = func.overloadpacket.__name__
        if ns in ("c10d", "_c10d_functional") and name in KINDS:
            kind = KINDS[name]
            group = next(
                (a for a in args if not isinstance(a, (torch.Tensor, list, tuple, int, float)) and a is not None), None
            )
            if ns == "_c10d_functional":
                group = args[-1] if isinstance(args[-1], str) else group
            dim, size = self._dim(group)
            tensors = _tensors(list(args))
            # Unsharded message size: the largest tensor argument (all-gather output, reduce-scatter
            # input), except functional all-gather whose only tensor is the local shard.
            nbytes = max((t.numel() * t.element_size() for t in tensors), default=0)
            if ns == "_c10d_functional" and kind == "all_gather":
                nbytes *= size
            key = CommKey(kind, dim, str(tensors[0].dtype).removeprefix("torch.") if tensors else "-")
            self.calls[key] += 1
            self.bytes[key] += nbytes
            self.sizes.setdefault(key, Counter())[nbytes] += 1
        return func(*args, **kwargs)

    def table(self) -> list[str]:
        rows = []
        for key in sorted(self.calls, key=lambda k: (MESH_DIMS.index(k.dim) if k.dim in MESH_DIMS else 9, k.kind)):
            sizes = ", ".join(f"{n}x{b}B" for b, n in sorted(self.sizes[key].items()))
            rows.append(f"{key.kind:<15} {key.dim:<13} {self.calls[key]:>4} calls {self.bytes[key]:>10} B  ({sizes})")
        return rows
