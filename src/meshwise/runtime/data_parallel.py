"""Data parallelism by ZeRO level, all on FSDP2's machinery (one wrapping unit per block, plus the root).

- ``zero=0`` (replication): ``replicate`` (FSDP2-based, see ``_torch_private``) over the whole DP
  group; gradients are all-reduced (averaged) once per step, on the last micro-batch.
- ``zero=1`` (optimizer states sharded): ``fully_shard`` with ``reshard_after_forward=False``, and
  gradient reduction plus resharding deferred to the last micro-batch. Within a step the parameters
  stay unsharded (one all-gather per step, at the first forward) and gradients accumulate
  unsharded (full size, as in ZeRO-1); at the last backward they are reduce-scattered, each rank
  updates its shard of the parameters and optimizer states, and the next step all-gathers them.
  This is exact ZeRO-1 arithmetic with ZeRO-1's communication volume (reduce-scatter + all-gather
  instead of all-reduce), and it composes with TP and PP where ``ZeroRedundancyOptimizer`` (plain
  tensors only) does not.
- ``zero=2``: ``fully_shard(reshard_after_forward=False)``, gradients reduce-scattered every
  micro-batch and accumulated sharded.
- ``zero=3``: ``fully_shard(reshard_after_forward=True)``: parameters re-gathered in backward.
- HSDP (``shard < dp``): the same ``fully_shard`` on the 2-D mesh (dp_replicate, dp_shard):
  shard within dp_shard, all-reduce the reduced shards across dp_replicate.
- Context parallelism (``cp > 1``): the cp ranks hold the same weights and see different tokens,
  so they join the data-parallel group for the weights: FSDP shards over dp_shard x cp flattened
  (``dp_shard_cp``, as torchtitan does), replication spans dp_replicate x dp_shard x cp, and the
  gradient average runs over dp * cp ranks (each rank's loss is the mean over its own tokens).

Gradients are averaged over the DP group, so each replica's loss must be its own token mean.
Under pipeline parallelism, ``torch.distributed.pipelining`` itself defers every FSDP2 module's
reduction to the end of the step (``PipelineStage.backward_maybe_with_nosync``), whatever the level.
On GPU the policy is bf16 parameters with fp32 gradient reduction. Under expert parallelism the
grouped experts are wrapped first, over the expert data-parallel ranks
(:mod:`meshwise.runtime.expert_parallel`).
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard

from meshwise.layout import Layout
from meshwise.runtime import _torch_private
from meshwise.runtime.expert_parallel import expert_dp_mesh, grouped_experts
from meshwise.runtime.model import Transformer


def mixed_precision(device_type: str) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 reductions on GPU; plain fp32 on CPU."""
    if device_type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def replicate_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """A 1-D mesh over the whole DP group (dp_replicate x dp_shard, x cp under context parallelism)."""
    if layout.cp > 1:
        dims = tuple(d for d, n in (("dp_replicate", layout.replicate), ("dp_shard", layout.shard)) if n > 1)
        return _torch_private.flatten_mesh(mesh, (*dims, "cp"), "dp_cp") if dims else mesh["cp"]
    if layout.shard == 1:
        return mesh["dp_replicate"]
    if layout.replicate == 1:
        return mesh["dp_shard"]
    return _torch_private.flatten_mesh(mesh, ("dp_replicate", "dp_shard"), "dp")


def shard_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """1-D dp_shard mesh (FSDP), or 2-D (dp_replicate, dp_shard) for HSDP; dp_shard x cp flattened
    under context parallelism."""
    if layout.cp > 1:
        shard = _torch_private.flatten_mesh(mesh, ("dp_shard", "cp"), "dp_shard_cp")
        return shard if layout.replicate == 1 else mesh["dp_replicate", "dp_shard_cp"]
    if layout.replicate == 1:
        return mesh["dp_shard"]
    return mesh["dp_replicate", "dp_shard"]


def _wrap_experts(
    model: Transformer, emesh: DeviceMesh, layout: Layout, mp: MixedPrecisionPolicy
) -> set[torch.nn.Parameter]:
    """Each grouped-experts module its own unit over the expert data-parallel ranks (see
    meshwise.runtime.expert_parallel); its gradients are averaged over those dp/ep ranks, and the
    experts scale them by 1/ep themselves (runtime/moe.py). Replicated over one rank (zero 0 with
    dp = ep) they are not wrapped: a one-rank all-reduce changes nothing, and replicate's reduction
    left their gradients in its own buffer instead of ``.grad`` (measured: MemTracker filed them
    as temporaries). Returns those parameters, which the other units must ignore."""
    alone: set[torch.nn.Parameter] = set()
    for experts in grouped_experts(model):
        if layout.zero == 0 and expert_dp_mesh(emesh, layout, flat=True).size() == 1:
            alone |= set(experts.parameters())
        elif layout.zero == 0:
            _torch_private.replicate(experts, expert_dp_mesh(emesh, layout, flat=True), mp_policy=mp)
        else:
            fully_shard(
                experts,
                mesh=expert_dp_mesh(emesh, layout, flat=False),
                reshard_after_forward=layout.zero == 3,
                mp_policy=mp,
                shard_placement_fn=lambda p: Shard(1),
            )
    return alone


def ignore_logits_view_warning() -> None:
    """Silence torch 2.13's FSDP2 warning that a wrapped module "returned a view tensor", for meshwise's
    own model only (the one place it is filtered). FSDP2 registers its pre-backward hook on a root's
    output, and an in-place op on a view of it would drop the hook (``_fsdp_state.
    _register_pre_backward_hook``). Under TP the model's logits are such a view (the vocabulary-parallel
    head's output gathered by DTensor); their one consumer, ``model.loss_sum``, reads them out of place
    (flatten, float, cross entropy), so the hook runs and gradients are exact (the TP parity tests).
    A hand-written loop on ``meshwise.parallelize`` must not modify the logits in place either."""
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module \(FSDPTransformer\) returned a view tensor", category=UserWarning
    )


def apply_data_parallel(
    model: Transformer,
    mesh: DeviceMesh,
    layout: Layout,
    precision_of: str | None = None,
    emesh: DeviceMesh | None = None,
) -> None:
    """Wrap each block, then the root (a whole model or one pipeline chunk), for ``layout.zero``,
    with the mixed-precision policy of ``precision_of`` (default: the mesh's device type); under
    expert parallelism (``emesh`` from expert_parallel.expert_mesh) the experts first."""
    if layout.dp * layout.cp == 1:
        return
    ignore_logits_view_warning()
    mp = mixed_precision(precision_of or mesh.device_type)
    ignored = _wrap_experts(model, emesh, layout, mp) if layout.ep > 1 else set()
    units = list(model.layers.values())
    if layout.zero == 0:
        dp_mesh = replicate_mesh(mesh, layout)
        for unit in units:
            _torch_private.replicate(unit, dp_mesh, mp_policy=mp, ignored_params=ignored or None)
        _torch_private.replicate(model, dp_mesh, mp_policy=mp, ignored_params=ignored or None)
        return
    dp_mesh = shard_mesh(mesh, layout)
    reshard = layout.zero == 3
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


def reshard_after_forward_only(modules: list[torch.nn.Module]) -> None:
    """Free the parameters a forward without backward left unsharded (zero 1 and 2 keep them for
    the backward that an evaluation never runs)."""
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()


def before_microbatch(model: torch.nn.Module, layout: Layout, last: bool) -> None:
    """Gradient accumulation without PP: zero 0 and 1 reduce only on the last micro-batch."""
    if isinstance(model, FSDPModule) and layout.zero in (0, 1):
        model.set_requires_gradient_sync(last)
        if layout.zero == 1:
            model.set_reshard_after_backward(last)
