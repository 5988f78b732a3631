"""The torch side of ``meshwise verify``: one rank of a layout, built by the real runtime and
traced through one training step on fake devices (imports torch).

The rank joins a process group of the layout's full world size on torch's ``fake`` backend (every
collective returns at once) and builds its part with :func:`meshwise.parallelize`: the same mesh,
tensor/sequence parallelism, activation checkpointing, FSDP2 and pipeline chunks as a real run,
with the mixed-precision policy of the target device type (bf16 parameters, fp32 reductions on
GPU), its tensors created under ``FakeTensorMode`` (shapes, dtypes and storage sizes, no memory).
The step is :meth:`ParallelModel.step` itself (every micro-batch; the pipeline schedule runs
under the fake group, its receives returning empty buffers of the right shapes), then clipping and
the optimizer step. The optimizer's states are created before the traced step (as the warm-up
step of ``meshwise measure`` creates them), so the step is a steady-state one.

For a GPU target the tensors are fake ``cuda`` tensors: the trace process has loaded the fake
CUDA device (:mod:`meshwise.measure.fake_cuda`, before torch) and ``torch.cuda``'s streams, events
and RNG state are its stand-ins while the trace runs; where the device is missing (no C++
compiler) the GPU's policy is applied on CPU tensors and the record says so (``device_note``).
Two kernels would otherwise differ from a GPU's: attention (on fake cuda the runtime calls the
flash kernel itself, :func:`meshwise.runtime.model.causal_attention`: output and log-sum-exp, as
the CPU's flash kernel keeps) and RMSNorm, whose CPU path (a composite) keeps float32 copies of its
input for backward while the CUDA build's fused kernel keeps the input as it is and the float32
inverse RMS: for a GPU target the trace stands in a function that keeps what the CUDA kernel keeps
(:class:`_CudaRmsNorm`). ``MemTracker`` attributes the storages to categories at the step's peak
(on the traced device type only: the host's token ids and step counts are not a GPU's memory; on
cuda it rounds each storage up to 512 B as CUDA's allocator does), and :class:`CollectiveTrace`
counts every collective, as ``measure`` does.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from meshwise.layout import MESH_DIMS, Layout
from meshwise.measure import fake_cuda
from meshwise.measure._torch_tools import peak_by_category, peak_moments, tracker_for
from meshwise.measure.comm_trace import CollectiveTrace
from meshwise.measure.rank_trace import RankTrace
from meshwise.measure.worker import canonical_dim
from meshwise.runtime import _torch_private, parallelize
from meshwise.runtime.moe import GroupedExperts, all_to_all_autograd


def _warm_optimizer(pm) -> None:
    """Create the optimizer's states (zero gradients, one step), as a first real step would."""
    for p in pm.parameters():
        p.grad = torch.zeros_like(p)
    pm.optimizer.step()
    pm.optimizer.zero_grad(set_to_none=True)


def trace_device(precision_of: str) -> str:
    """The device a trace's tensors are on: fake ``cuda`` for a GPU target where this process has
    the fake CUDA device (:mod:`meshwise.measure.fake_cuda`, loaded by ``_trace_preload``), else cpu."""
    return "cuda" if precision_of == "cuda" and fake_cuda.active() else "cpu"


def trace_rank(target: RankTrace, device: str | None = None) -> dict:
    """``target``'s record (the schema of ``measure``'s workers, without times) after one traced step,
    plus ``device`` (of the returned loss), ``param_device``, ``activation_dtypes`` and
    ``activation_devices`` (what the step's matrix multiplies computed in and on) and
    ``step_returns`` (the types ``step`` returned). ``device``: the tensors' device type (default:
    :func:`trace_device`); ``cuda`` without the fake CUDA device in this process traces on cpu, and
    ``device_note`` says so."""
    spec, layout, rank, seq, precision_of = target.model, target.layout, target.rank, target.seq, target.precision_of
    world = layout.world_size
    note = None
    if device == "cuda" and not fake_cuda.active():
        device, note = (
            "cpu",
            (
                "the fake CUDA device is not loaded in this trace process (loaded before torch only); "
                "traced on the cpu device with the GPU's precision policy"
            ),
        )
    device = device or trace_device(precision_of)
    _torch_private.fake_process_group(rank, world)
    try:
        gpu = fake_cuda.python_cuda() if device == "cuda" else nullcontext()
        with _torch_private.meshes_outside_fake(), _torch_private.static_pipeline_warmup(), gpu:
            shape = layout.mesh_shape
            mesh = init_device_mesh(device, tuple(shape[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS)
            fake = _torch_private.fake_tensor_mode()
            pm = parallelize(
                spec,
                layout,
                mesh,
                target.global_batch,
                seq_len=seq,
                seed=0,
                tensor_mode=fake,
                precision_of=precision_of,
                precision=target.precision,
            )
            with fake:
                x = torch.randint(0, spec.vocab, (pm.replica_rows, seq))
                y = torch.randint(0, spec.vocab, (pm.replica_rows, seq))
                _warm_optimizer(pm)
                tracker = tracker_for(pm.modules, pm.optimizer, _held_by(pm), device)
                seen = _ActivationDtypes()
                kernels = _cuda_kernels() if precision_of == "cuda" else nullcontext()
                routing = _balanced_routing() if spec.moe else nullcontext()
                with CollectiveTrace(mesh) as trace, tracker, seen, kernels, routing:
                    loss, grad_norm = pm.step(x, y)
        return {
            "rank": rank,
            "pp_rank": mesh.get_local_rank("pp"),
            "layout": layout.format(),
            "global_batch": target.global_batch,
            "seq_len": seq,
            "world": world,
            "memory": tracker.peak_by_role,
            "memory_by_creation": peak_by_category(tracker),
            "peak_moments": peak_moments(tracker),
            "comm": _comm_rows(trace, layout),
            "time": None,
            "device": str(loss.device),
            "param_device": str(pm.parameters()[0].device),
            "activation_dtypes": sorted(seen.dtypes),
            "activation_devices": sorted(seen.devices),
            "float8_inputs": sorted(seen.float8_inputs),
            "step_returns": [type(loss).__name__, type(grad_norm).__name__],
            **({"device_note": note} if note else {}),
        }
    finally:
        dist.destroy_process_group()
        gc.collect()


def _comm_rows(trace: CollectiveTrace, layout: Layout) -> list[dict]:
    """The traced collectives per kind and canonical mesh dimension: calls and bytes per step."""
    comm: dict[tuple[str, str], list[int]] = {}
    for key, calls in trace.calls.items():
        entry = comm.setdefault((key.kind, canonical_dim(key.dim, layout)), [0, 0])
        entry[0] += calls
        entry[1] += trace.bytes[key]
    return [{"kind": k, "dim": d, "count_per_step": c, "bytes_per_step": b} for (k, d), (c, b) in sorted(comm.items())]


def _held_by(pm) -> Callable[[], Iterator[tuple[str, torch.Tensor]]]:
    """What the rank holds, by what it is (RoleMemTracker): FSDP2's parameters, gradients and
    buffers (_torch_private.fsdp_held), then any parameter and gradient FSDP2 does not manage."""
    groups = _torch_private.fsdp_param_groups(pm.modules)
    params = pm.parameters()

    def held() -> Iterator[tuple[str, torch.Tensor]]:
        yield from _torch_private.fsdp_held(groups)
        for p in params:
            yield "params", p
            if p.grad is not None:
                yield "grads", p.grad

    return held


class _ActivationDtypes(_torch_private.TorchDispatchMode):
    """The dtypes and devices of the matrix multiplies' outputs in the step: what the precision
    policy computes in, and where; and the float8 data types of their inputs (torchao's float8
    tensors, which carry their data in ``_data``) under an fp8 precision."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[str] = set()
        self.devices: set[str] = set()
        self.float8_inputs: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm) and isinstance(out, torch.Tensor):
            self.dtypes.add(str(out.dtype).removeprefix("torch."))
            self.devices.add(str(out.device))
            for a in args:
                data = getattr(a, "_data", None)
                if isinstance(data, torch.Tensor) and data.dtype.is_floating_point and data.element_size() == 1:
                    self.float8_inputs.add(str(data.dtype).removeprefix("torch."))
        return out


class _CudaRmsNorm(torch.autograd.Function):
    """RMSNorm keeping for backward what CUDA's fused kernel keeps: the input (its own dtype), the
    weight and the float32 inverse RMS. y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_w = (g * xhat).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
        gw = g * weight.float()
        grad_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


@contextmanager
def _cuda_kernels() -> Iterator[None]:
    """``F.rms_norm`` with a weight over the last dimension runs as :class:`_CudaRmsNorm` (patched on
    the module, not through a torch-function mode, so checkpointing's recompute in backward, which
    runs outside such modes, computes the same ops as the forward did). Each trace has its own process."""
    rms_norm = F.rms_norm

    def cuda_rms_norm(x, shape, weight=None, eps=None):
        if weight is not None and len(shape) == 1 and eps is not None:
            return _CudaRmsNorm.apply(x, weight, eps)
        return rms_norm(x, shape, weight, eps)

    F.rms_norm = cuda_rms_norm
    try:
        yield
    finally:
        F.rms_norm = rms_norm


def _balanced_forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """runtime.moe.GroupedExperts.forward with every expert given the same rows (the remainder to the
    first ones), the counts known from shapes: fake tensors hold no routing to read. The cost model
    prices the same balanced routing (cost/experts.py); the collectives are the runtime's own."""
    experts, rows = counts.numel(), routed.shape[0]
    per = [rows // experts + (1 if e < rows % experts else 0) for e in range(experts)]
    if self.group is None:
        return self.compute(routed, per)
    n = dist.get_world_size(self.group)
    local, me = experts // n, dist.get_rank(self.group)
    dist.all_to_all_single(torch.empty_like(counts), counts, group=self.group)  # the counts' exchange
    send = [sum(per[j * local : (j + 1) * local]) for j in range(n)]
    mine = per[me * local : (me + 1) * local]  # every rank routes as many rows to each of my experts
    recv = [sum(mine)] * n
    received = all_to_all_autograd(routed, recv, send, self.group)
    chunks = torch.split(received, mine * n)  # (source rank, local expert)
    grouped = torch.cat([chunks[j * local + e] for e in range(local) for j in range(n)])
    out = self.compute(grouped, [c * n for c in mine])
    back = torch.split(out, [c for c in mine for _ in range(n)])  # (local expert, source rank)
    back = torch.cat([back[e * n + j] for j in range(n) for e in range(local)])
    return all_to_all_autograd(back, send, recv, self.group)


@contextmanager
def _balanced_routing() -> Iterator[None]:
    """A MoE model traced with balanced routing (:func:`_balanced_forward`): ``torch.bincount`` (whose
    output size depends on the data, which fake tensors refuse) gives zeros of its ``minlength``, which
    the balanced experts ignore. Each trace has its own process."""
    bincount, forward = torch.bincount, GroupedExperts.forward

    def zeros(x, weights=None, minlength=0):
        return torch.zeros(minlength, dtype=torch.long, device=x.device)

    torch.bincount, GroupedExperts.forward = zeros, _balanced_forward
    try:
        yield
    finally:
        torch.bincount, GroupedExperts.forward = bincount, forward
