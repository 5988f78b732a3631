"""Every private torch API meshwise touches, in one place (torch 2.13).

- ``replicate``: FSDP2-based replication (``torch.distributed._composable.replicate_with_fsdp``),
  the data-parallel path for ``zero=0``: it accepts DTensor (TP) parameters, which DDP does not,
  and ``torch.distributed.pipelining`` stages already treat it as an ``FSDPModule``.
- ``flatten_mesh``: ``DeviceMesh._flatten`` joins several mesh dims into one (the whole DP group
  of an HSDP mesh, for replication).
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate as _replicate
from torch.distributed.device_mesh import DeviceMesh


def replicate(module: nn.Module, mesh: DeviceMesh, **kwargs) -> nn.Module:
    """Replicate ``module`` over the 1-D ``mesh``; gradients are all-reduced (averaged) in backward."""
    return _replicate(module, mesh=mesh, **kwargs)


def flatten_mesh(mesh: DeviceMesh, dims: tuple[str, ...], name: str) -> DeviceMesh:
    """One 1-D mesh over the ranks of ``dims`` (row-major), named ``name``."""
    return mesh[dims]._flatten(name)
