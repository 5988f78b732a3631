"""Every private torch API meshwise touches, in one place (torch 2.13), except torch's memory
trackers (``torch.distributed._tools``), which only the measurement uses and which
``measure/_torch_tools.py`` wraps by subclassing.

- ``replicate``: FSDP2-based replication (``torch.distributed._composable.replicate_with_fsdp``),
  the data-parallel path for ``zero=0``: it accepts DTensor (TP) parameters, which DDP does not,
  and ``torch.distributed.pipelining`` stages already treat it as an ``FSDPModule``.
- ``flatten_mesh``: ``DeviceMesh._flatten`` joins several mesh dims into one (the whole DP group
  of an HSDP mesh, for replication).
- ``unflatten_mesh``: ``DeviceMesh._unflatten`` splits one mesh dim into several (the whole mesh,
  flattened, into ``pp, dp_replicate, dp_shard_mod_ep, ep, tp``, for expert parallelism).
- ``all_to_all_autograd``: ``_functional_collectives.all_to_all_single_autograd``, the
  differentiable all-to-all of expert parallelism (the public ``torch.distributed.nn.functional``
  one is deprecated in its favour).
- ``forward_only_schedule``: a schedule's lowered ``pipeline_order_with_comms`` and
  ``_ComputationType`` (``torch.distributed.pipelining.schedules``), to evaluate under
  ``ScheduleZBVZeroBubble``, whose own ``eval`` fails in torch 2.13.
- ``PipelineSchedule``: the schedules' common base class ``_PipelineSchedule``, for type hints.
- ``split_backward``: a stage's backward as the zero-bubble schedules run it, input gradients
  first, then the weights' (``torch.distributed.pipelining._backward``), which ``meshwise
  calibrate`` times against a plain backward.
- ``TorchDispatchMode`` (``torch.utils._python_dispatch``), ``unbox_process_group`` and
  ``resolve_process_group`` (``c10d``'s boxed groups and group names): how ``measure/comm_trace.py``
  sees every collective and the ranks of its group.
- ``fake_process_group``, ``fake_tensor_mode`` and ``meshes_outside_fake``: what ``meshwise
  verify`` traces a rank of any world size with: the ``fake`` backend with its ``FakeStore``
  (``torch.testing._internal.distributed.fake_pg``), ``FakeTensorMode``
  (``torch._subclasses.fake_tensor``), and DeviceMesh construction taken out of the fake mode
  (``unset_fake_temporarily``): a mesh finds its coordinates with ``nonzero`` on its rank table,
  which fake tensors cannot answer. ``static_pipeline_warmup``: the schedules' first-step P2P
  vote (``_PipelineSchedule._warmup_p2p``, whose result is read with ``.item()``) replaced by its
  outcome for stages built with static shapes (``InferenceMode.STATIC``), as every meshwise stage is.
- ``fsdp_param_groups`` and ``fsdp_held``: FSDP2's per-unit state (``FSDPParamGroup``,
  ``FSDPParam``; ``torch.distributed.fsdp._fully_shard``), read for what each tensor FSDP2 holds
  is: the sharded parameter, its gathered copies, the sharded, unsharded and accumulated
  gradients, and the all-gather, reduce-scatter and all-reduce buffers (``meshwise verify``
  categorises memory by it).
- ``flash_attention``: ``aten._scaled_dot_product_flash_attention``, called directly on fake cuda
  tensors (runtime/model.causal_attention).
- ``cxx11_abi``, ``has_kernel`` and ``aten_op_names``: ``torch._C``'s ABI flag and dispatcher
  queries, with which ``measure/fake_cuda.py`` builds and registers its fake CUDA device.
- ``timed_waits``: wraps ``Work.wait`` (``torch._C._distributed_c10d``), the functional
  collectives' module-level ``wait_tensor`` and pipelining's ``schedules._wait_batch_p2p``, so that
  ``measure/timing.py`` can time every blocking wait on a collective.
- ``float8_linear_type``: torchao's ``Float8Linear`` (``torchao.float8.float8_linear``; torchao
  calls the class not public), to recognise the linears ``convert_to_float8_training`` swapped in
  (:mod:`meshwise.runtime.float8`); ``float8_weight_plain``: the high-precision tensor inside
  torchao's ``WeightWithDynamicFloat8CastTensor`` (its ``_tensor``), the form FSDP2's float8
  all-gather keeps a weight in, for checkpoints.

Failing loudly: ``PRIVATE_NAMES`` lists every private torch name meshwise reads or patches here
(``measure/_torch_tools.PRIVATE_NAMES`` the trackers'), ``FSDP_LAZY_NAMES`` the FSDP2 attributes
that exist only after FSDP2's lazy initialisation or first gather (read with defaults for the step
before), and each replacement of a torch function counts its calls in ``OVERRIDE_CALLS``.
tests/unit/test_torch_canary.py asserts that every name resolves and every replacement is called
during a traced step; launch/torch_release.py names the torch the suite has run on (pyproject's
range) and warns in one line on any other.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch._C._distributed_c10d import Work
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._composable.replicate_with_fsdp import replicate as _replicate
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import schedules
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.distributed.pipelining._utils import InferenceMode
from torch.distributed.pipelining.schedules import _ComputationType as T
from torch.distributed.pipelining.schedules import _PipelineSchedule as PipelineSchedule
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "PipelineSchedule",
    "TorchDispatchMode",
    "all_to_all_autograd",
    "aten_op_names",
    "cxx11_abi",
    "fake_process_group",
    "fake_tensor_mode",
    "flash_attention",
    "flatten_mesh",
    "float8_linear_type",
    "float8_weight_plain",
    "fsdp_held",
    "fsdp_param_groups",
    "forward_only_schedule",
    "has_kernel",
    "meshes_outside_fake",
    "replicate",
    "resolve_process_group",
    "static_pipeline_warmup",
    "timed_waits",
    "unbox_process_group",
    "unflatten_mesh",
]

# (module, attribute path): every private torch name read or patched in this module
PRIVATE_NAMES = (
    ("torch.distributed._composable.replicate_with_fsdp", "replicate"),
    ("torch.distributed.device_mesh", "DeviceMesh._flatten"),
    ("torch.distributed.device_mesh", "DeviceMesh._unflatten"),
    ("torch.distributed._functional_collectives", "all_to_all_single_autograd"),
    ("torch.distributed._functional_collectives", "wait_tensor"),
    ("torch.distributed.pipelining.schedules", "_PipelineSchedule"),
    ("torch.distributed.pipelining.schedules", "_PipelineSchedule._warmup_p2p"),
    ("torch.distributed.pipelining.schedules", "_PipelineScheduleRuntime"),
    ("torch.distributed.pipelining.schedules", "_wait_batch_p2p"),
    *(
        ("torch.distributed.pipelining.schedules", f"_ComputationType.{t}")
        for t in ("FORWARD", "SEND_F", "RECV_F", "UNSHARD", "RESHARD")
    ),
    ("torch.distributed.pipelining._utils", "InferenceMode.STATIC"),
    ("torch.distributed.pipelining._backward", "stage_backward_input"),
    ("torch.distributed.pipelining._backward", "stage_backward_weight"),
    ("torch.utils._python_dispatch", "TorchDispatchMode"),
    ("torch._C._distributed_c10d", "ProcessGroup.unbox"),
    ("torch._C._distributed_c10d", "Work.wait"),
    ("torch.distributed.distributed_c10d", "_resolve_process_group"),
    ("torch.testing._internal.distributed.fake_pg", "FakeStore"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    ("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    ("torch.distributed.fsdp", "FSDPModule._get_fsdp_state"),
    ("torch.ops.aten", "_scaled_dot_product_flash_attention"),
    ("torch._C", "_GLIBCXX_USE_CXX11_ABI"),
    ("torch._C", "_dispatch_has_kernel_for_dispatch_key"),
    ("torch._C", "_dispatch_get_all_op_names"),
)
# FSDP2's per-unit state as fsdp_held reads it: (what holds them, attribute names); those marked
# lazy exist only after FSDP2's lazy initialisation or a unit's first all-gather
FSDP_NAMES = {
    "FSDPState": ("_fsdp_param_groups",),
    "FSDPParamGroup": ("fsdp_params", "comm_ctx", "_all_gather_result", "_partial_reduce_output", "_all_reduce_state"),
    "FSDPParam": (
        "mp_policy",
        "sharded_param",
        "_sharded_param_data",
        "all_gather_outputs",
        "_unsharded_inner_tensors",
        "unsharded_accumulated_grad",
    ),
}
FSDP_LAZY_NAMES = {"FSDPParam": ("_unsharded_param",), "FSDPCommContext": ("all_gather_state", "reduce_scatter_states")}
OVERRIDE_CALLS: Counter = Counter()  # calls of each torch function meshwise replaced (the canary reads it)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal flash attention's output on (b, heads, s, d), called as the aten op itself (``scale``:
    the scores' factor, None for 1/sqrt(d))."""
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=scale)[0]


def cxx11_abi() -> int:
    """Whether torch was built with the C++11 ABI (for compiling against its libraries)."""
    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


def has_kernel(op_name: str, dispatch_key: str) -> bool:
    """Whether the dispatcher has a kernel for ``op_name`` (``aten::...``) at ``dispatch_key``."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op_name, dispatch_key)


def aten_op_names() -> list[str]:
    """Every operator name the dispatcher knows (``namespace::name``)."""
    return list(torch._C._dispatch_get_all_op_names())


def replicate(module: nn.Module, mesh: DeviceMesh, **kwargs) -> nn.Module:
    """Replicate ``module`` over the 1-D ``mesh``; gradients are all-reduced (averaged) in backward."""
    return _replicate(module, mesh=mesh, **kwargs)


def flatten_mesh(mesh: DeviceMesh, dims: tuple[str, ...], name: str) -> DeviceMesh:
    """One 1-D mesh over the ranks of ``dims`` (row-major), named ``name``."""
    return mesh[dims]._flatten(name)


def all_to_all_autograd(
    x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Rows of ``x`` in ``input_splits`` to each rank of ``group``; ``output_splits`` rows from each.
    Backward sends the gradients back the same way."""
    return all_to_all_single_autograd(x, output_splits, input_splits, group)


def settle(x: torch.Tensor) -> None:
    """Wait now for a functional collective's output (an ``AsyncCollectiveTensor``, which otherwise
    waits at its first use); the tensor and its autograd history stay as they are."""
    if hasattr(x, "trigger_wait"):
        x.trigger_wait()


def unflatten_mesh(mesh: DeviceMesh, dim: str, sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
    """``mesh`` with dim ``dim`` split row-major into dims ``names`` of ``sizes`` (same ranks)."""
    return mesh._unflatten(dim, sizes, names)


def forward_only_schedule(schedule_cls, stages: list, n_microbatches: int, loss_fn):
    """A ``schedule_cls`` over ``stages`` whose lowered action order keeps its forwards and their
    sends, receives, unshards and reshards, and drops every backward-side action.

    torch 2.13's ``ScheduleZBVZeroBubble.eval`` still walks the backward actions, and where the V
    puts two adjacent stages on one rank it asserts ("can't steal_bwd_input if this stage doesn't
    have backward"). Each rank keeps its forward-side actions in their order, and forwards depend
    only on forwards, so the order stays runnable. A new instance, so no per-step state is shared
    with the training schedule; ``pipeline_order_with_comms`` is ``_PipelineScheduleRuntime``'s.
    """
    keep = {T.FORWARD, T.SEND_F, T.RECV_F, T.UNSHARD, T.RESHARD}
    runtime = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
    order = runtime.pipeline_order_with_comms
    for rank, actions in order.items():
        flat = [sub for a in actions for sub in (a.sub_actions or (a,))]
        order[rank] = [a for a in flat if a.computation_type in keep]
    return runtime


def split_backward(
    output: torch.Tensor, output_grad: torch.Tensor, inputs: list[torch.Tensor], params: list[nn.Parameter]
) -> None:
    """One stage's backward in two passes, as torch's zero-bubble schedules run it: the gradients of
    ``inputs`` (``stage_backward_input``, which also walks the autograd graph for the weights'
    groups), then the weights' (``stage_backward_weight``)."""
    _, groups = stage_backward_input([output], [output_grad], inputs, iter(params))
    stage_backward_weight(iter(params), groups)


def unbox_process_group(boxed: object) -> object:
    """The ``ProcessGroup`` a c10d op carries boxed as a ``torch.ScriptObject``."""
    return torch._C._distributed_c10d.ProcessGroup.unbox(boxed)


def resolve_process_group(name: str) -> object:
    """The ``ProcessGroup`` registered under ``name`` (what functional collectives carry)."""
    return dist.distributed_c10d._resolve_process_group(name)


def fake_process_group(rank: int, world_size: int) -> None:
    """Start the default process group as ``rank`` of ``world_size`` on torch's ``fake`` backend:
    every collective returns at once and moves nothing, so one process stands for any rank."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def fake_tensor_mode() -> object:
    """A ``FakeTensorMode``: tensors carry shape, dtype and device, and allocate nothing."""
    return FakeTensorMode(allow_non_fake_inputs=True)


@contextmanager
def meshes_outside_fake() -> Iterator[None]:
    """Build every DeviceMesh (and read its rank table) outside any fake mode while inside."""
    init, table = DeviceMesh.__init__, DeviceMesh.mesh

    def real_init(self, *args, **kwargs) -> None:
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    def real_table(self) -> torch.Tensor:
        with unset_fake_temporarily():
            return table.fget(self)

    DeviceMesh.__init__, DeviceMesh.mesh = real_init, property(real_table)
    try:
        yield
    finally:
        DeviceMesh.__init__, DeviceMesh.mesh = init, table


@contextmanager
def static_pipeline_warmup() -> Iterator[None]:
    """Skip the pipeline schedules' P2P warm-up vote; every stage gets the mode the vote gives for
    stages with static input and output shapes (the vote needs real data from the neighbours)."""
    vote = schedules._PipelineSchedule._warmup_p2p

    def static(self, stages, has_backward, p2p_done) -> None:
        OVERRIDE_CALLS["_PipelineSchedule._warmup_p2p"] += 1
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedules._PipelineSchedule._warmup_p2p = static
    try:
        yield
    finally:
        schedules._PipelineSchedule._warmup_p2p = vote


def fsdp_param_groups(modules: list[nn.Module]) -> list[object]:
    """Every FSDP2 parameter group (``FSDPParamGroup``) of the FSDP2 and ``replicate`` units in
    ``modules`` (each once)."""
    groups: dict[int, object] = {}
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                for group in sub._get_fsdp_state()._fsdp_param_groups:
                    groups.setdefault(id(group), group)
    return list(groups.values())


def fsdp_held(groups: list[object]) -> Iterator[tuple[str, torch.Tensor]]:
    """What the FSDP2 ``groups`` hold at this moment, as (what it is, tensor): ``"master"`` for a
    sharded parameter kept in another dtype than the one computed with (the float32 master under a
    ``param_dtype`` policy), else ``"params"``; ``"params"`` for the gathered (unsharded) copies;
    ``"grads"`` for the sharded gradient, an unsharded one not yet reduced, and the accumulator in
    the reduce dtype (``unsharded_accumulated_grad``); ``"buffers"`` for the all-gather output and
    the reduce-scatter, partial-reduce and all-reduce buffers."""
    for group in groups:
        for fp in group.fsdp_params:
            master = fp.mp_policy.param_dtype not in (None, fp.sharded_param.dtype)
            yield ("master" if master else "params"), fp._sharded_param_data
            for t in (*fp.all_gather_outputs, *fp._unsharded_inner_tensors):
                yield "params", t
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None:
                yield "params", unsharded
                if unsharded.grad is not None:
                    yield "grads", unsharded.grad
            if fp.sharded_param.grad is not None:
                yield "grads", fp.sharded_param.grad
            if fp.unsharded_accumulated_grad is not None:
                yield "grads", fp.unsharded_accumulated_grad
        ctx = group.comm_ctx  # its streams and states appear at FSDP2's lazy initialisation
        gather_state = getattr(ctx, "all_gather_state", None)
        for result in (group._all_gather_result, gather_state and gather_state.all_gather_result):
            if result is not None:
                yield "buffers", result.all_gather_output
        for state in getattr(ctx, "reduce_scatter_states", ()):
            yield "buffers", state.reduce_scatter_input
        if group._partial_reduce_output is not None:
            yield "buffers", group._partial_reduce_output
        if group._all_reduce_state is not None:
            yield "buffers", group._all_reduce_state.all_reduce_input


@contextmanager
def timed_waits(record: Callable[[str, float], None]) -> Iterator[None]:
    """While open, every blocking wait of this process on a collective calls ``record(kind,
    seconds)``: c10d ``Work.wait`` (FSDP2's and plain collectives, pipeline P2P) and the functional
    collectives' ``wait_tensor`` (DTensor); ``kind`` is ``"idle"`` inside pipelining's
    ``_wait_batch_p2p`` (a stage waiting on its neighbour), else ``"comm"``. Nested waits count once."""
    state = {"pipeline": 0, "depth": 0}
    originals = (Work.wait, funcol.wait_tensor, schedules._wait_batch_p2p)

    def timed(fn: Callable, name: str) -> Callable:
        def run(*args, **kwargs):
            OVERRIDE_CALLS[name] += 1
            if state["depth"]:
                return fn(*args, **kwargs)
            state["depth"] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                state["depth"] -= 1
                record("idle" if state["pipeline"] else "comm", time.perf_counter() - start)

        return run

    def pipeline_wait(*args, **kwargs):
        OVERRIDE_CALLS["_wait_batch_p2p"] += 1
        state["pipeline"] += 1
        try:
            return originals[2](*args, **kwargs)
        finally:
            state["pipeline"] -= 1

    Work.wait, funcol.wait_tensor, schedules._wait_batch_p2p = (
        timed(originals[0], "Work.wait"),
        timed(originals[1], "wait_tensor"),
        pipeline_wait,
    )
    try:
        yield
    finally:
        Work.wait, funcol.wait_tensor, schedules._wait_batch_p2p = originals


def float8_linear_type() -> type:
    """torchao's ``Float8Linear`` class (imported on first use: torchao is the ``fp8`` extra)."""
    from torchao.float8.float8_linear import Float8Linear  # optional: torchao is the fp8 extra

    return Float8Linear


def float8_weight_plain(value: object) -> object:
    """``value`` with a float8-cast weight (a DTensor of one, or one) replaced by the tensor it wraps;
    anything else unchanged. Nothing is imported: without torchao no such weight exists."""
    local = value.to_local() if isinstance(value, DTensor) else value
    if type(local).__name__ != "WeightWithDynamicFloat8CastTensor":
        return value
    if isinstance(value, DTensor):
        return DTensor.from_local(
            local._tensor,
            value.device_mesh,
            value.placements,
            run_check=False,
            shape=value.shape,
            stride=value.stride(),
        )
    return local._tensor
