"""Compose one layout on PyTorch: per pipeline chunk TP/SP -> activation checkpointing -> (compile
per block, optional) -> DP/ZeRO,
then materialise, initialise from the seed, build the pipeline schedule and the optimizer.

One optimizer step is the same computation under every layout:
- the global batch is mbs * accum * dp sequences; replica r (its dp coordinate) takes rows
  [r * mbs * accum, (r+1) * mbs * accum) and runs them as ``accum`` micro-batches;
- each micro-batch's loss is its summed token cross-entropy divided by the replica's tokens per
  step, so the accumulated gradient is the replica's token mean, and the DP average (FSDP2 /
  replicate divide by dp) makes it the global token mean (every replica has as many tokens);
- gradients are clipped by the global norm (:mod:`meshwise.runtime.optim`), then AdamW steps;
- the returned loss is the global token mean: the last pipeline stage's replica losses, summed
  over the world in one all-reduce and divided by dp * cp * tp (every TP rank holds the same value).
  ``step`` returns it and the gradient norm as 0-dim float64 tensors on the mesh's device: the
  step path never waits for the host (no ``.item()``), so the caller reads both once, when it logs.
- context parallelism (cp > 1): ``step`` takes whole sequences and keeps this cp rank's two
  load-balanced chunks (:func:`meshwise.runtime.context_parallel.shard_sequence`); the rotary
  positions follow the chunks, attention runs around the cp ring, and each rank's loss is divided
  by its own tokens (replica tokens / cp), so the average over the dp * cp ranks that share the
  weights is the global token mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable
from meshwise.runtime import float8
from meshwise.runtime.activation_checkpointing import apply_activation_checkpointing
from meshwise.runtime.compile import check as check_compile
from meshwise.runtime.compile import compile_blocks
from meshwise.runtime.context_parallel import positions, ring_group, shard_sequence
from meshwise.runtime.data_parallel import apply_data_parallel, before_microbatch, reshard_after_forward_only
from meshwise.runtime.expert_parallel import apply_expert_parallel, expert_mesh
from meshwise.runtime.mesh import dp_rank, mesh_device
from meshwise.runtime.model import Attention, Transformer, canonical_name, init_weights, loss_sum, runtime_refusal
from meshwise.runtime.moe import set_aux_sequences
from meshwise.runtime.optim import OptimizerConfig, build_optimizer, clip_grad_norm, reduce_partial_grads
from meshwise.runtime.pipeline import build_eval_schedule, build_schedule, build_stages, chunk_bounds, my_chunks
from meshwise.runtime.tensor_parallel import apply_tensor_parallel
from meshwise.spec import ModelSpec


@dataclass(frozen=True)
class Pipeline:
    """This rank's pipeline stages, the schedule a training step runs over them and the one
    :meth:`ParallelModel.eval_loss` runs (:func:`meshwise.runtime.pipeline.build_eval_schedule`)."""

    schedule: object
    eval_schedule: object
    stages: list


@dataclass
class ParallelModel:
    """What ``parallelize`` returns: this rank's chunk modules, its pipeline (None without PP),
    the optimizer, :meth:`step` and :meth:`eval_loss`."""

    spec: ModelSpec
    layout: Layout
    mesh: DeviceMesh
    global_batch: int
    seq_len: int
    chunk_ids: list[int]
    modules: list[nn.Module]
    pipeline: Pipeline | None  # None without PP
    optimizer: torch.optim.Optimizer
    optim_config: OptimizerConfig
    float8_conversions: list[float8.Conversion] = field(default_factory=list)  # per chunk, under fp8 precisions
    float8_scales: bool = False  # FSDP2 all-gathers float8 weights: scales set before each step (_float8_scales)

    @property
    def accum(self) -> int:
        return self.layout.accum(self.global_batch)

    @property
    def stages(self) -> list:
        """This rank's pipeline stages ([] without PP)."""
        return self.pipeline.stages if self.pipeline else []

    @property
    def has_first(self) -> bool:
        return 0 in self.chunk_ids

    @property
    def has_last(self) -> bool:
        return self.layout.stages - 1 in self.chunk_ids

    @property
    def replica_rows(self) -> int:
        """Sequences per replica per step: mbs * accum."""
        return self.layout.mbs * self.accum

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules for p in m.parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters under their plain-model names."""
        return [(canonical_name(n), p) for m in self.modules for n, p in m.named_parameters()]

    def local_batch(self, global_tensor: torch.Tensor) -> torch.Tensor:
        """This replica's rows of a (global_batch, ...) tensor."""
        start = dp_rank(self.mesh) * self.replica_rows
        return global_tensor[start : start + self.replica_rows]

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on this replica's (mbs*accum, seq) token ids and targets.

        ``inputs`` are needed where the first chunk lives, ``targets`` where the last one does.
        Returns (global token-mean loss, gradient norm before clipping), both the same on every
        rank, as 0-dim float64 tensors: nothing here synchronises with the host.
        """
        self.optimizer.zero_grad(set_to_none=True)
        self._float8_scales()
        local = torch.zeros((), dtype=torch.float64, device=mesh_device(self.mesh))
        self._add_micro_batch_losses(local, inputs, targets, backward=True)
        reduce_partial_grads(self.parameters())
        grad_norm = clip_grad_norm(
            self.parameters(), self.optim_config.grad_clip, self.layout.dp * self.layout.cp * self.layout.tp
        )
        self.optimizer.step()
        return self._global_mean(local), grad_norm

    def _float8_scales(self) -> None:
        """FSDP2's float8 weights' scales from the weights as they are now, in one all-reduce: at the
        start of each step and evaluation, so weights restored or loaded since are scaled right.
        Not under verify's fake tensors: torchao's flatten of a weight holding a scale tests the
        scale's truth, which a fake tensor cannot answer, and the memory tracker flattens every
        weight; the traced step then all-reduces each weight's amax as FSDP2 gathers it."""
        if self.float8_scales:
            float8.after_optimizer_step(self.modules)

    @torch.no_grad()
    def eval_loss(self, batches: Iterable[tuple[torch.Tensor | None, torch.Tensor | None]]) -> float:
        """Global token-mean loss over held-out ``batches`` (each as :meth:`step` takes it), forward
        only, one all-reduce for all of them; FSDP2 parameters are resharded afterwards."""
        self._float8_scales()
        local = torch.zeros((), dtype=torch.float64, device=mesh_device(self.mesh))
        count = 0
        for inputs, targets in batches:
            self._add_micro_batch_losses(local, inputs, targets, backward=False)
            count += 1
        if count == 0:
            raise ValueError("eval_loss needs at least one batch")
        mean = self._global_mean(local)
        reshard_after_forward_only(self.modules)
        return mean.item() / count

    def _add_micro_batch_losses(
        self, local: torch.Tensor, inputs: torch.Tensor | None, targets: torch.Tensor | None, backward: bool
    ) -> None:
        """Add to ``local`` (float64) each of this rank's micro-batch losses, ``loss_sum / replica
        tokens``; with ``backward`` every micro-batch's backward runs too (the pipeline schedule's
        ``step``), without it forwards only (``eval``)."""
        device = local.device
        tokens = self.replica_rows * self.seq_len // self.layout.cp  # this rank's tokens per step
        if self.layout.cp > 1:
            cp_rank = self.mesh.get_local_rank("cp")
            inputs = None if inputs is None else shard_sequence(inputs, self.layout.cp, cp_rank)
            targets = None if targets is None else shard_sequence(targets, self.layout.cp, cp_rank)
        if self.pipeline is None:
            model = self.modules[0]
            mbs = self.layout.mbs
            for i in range(self.accum):
                if backward:
                    before_microbatch(model, self.layout, last=i == self.accum - 1)
                x = inputs[i * mbs : (i + 1) * mbs].to(device)
                y = targets[i * mbs : (i + 1) * mbs].to(device)
                loss = loss_sum(model(x), y) / tokens
                if backward:
                    loss.backward()
                local += loss.detach().double()
            return
        losses: list[torch.Tensor] = []
        args = (inputs.to(device),) if self.has_first else ()
        kwargs = {"target": targets.to(device), "losses": losses} if self.has_last else {}
        if backward:
            self.pipeline.schedule.step(*args, return_outputs=False, **kwargs)  # keep no logits per micro-batch
        else:
            self.pipeline.eval_schedule.eval(*args, **kwargs)
        for loss in losses:
            local += loss.detach().double()

    def _global_mean(self, local: torch.Tensor) -> torch.Tensor:
        """The world sum of ``local`` over dp * cp * tp (a 0-dim tensor): last-stage ranks hold their
        losses (a cp rank's over its tokens), once per TP rank; the other stages hold zero."""
        dist.all_reduce(local)
        return local / (self.layout.dp * self.layout.cp * self.layout.tp)


def _build_chunk(
    spec: ModelSpec,
    layout: Layout,
    mesh: DeviceMesh,
    chunk: int,
    seed: int,
    device: torch.device,
    seq_len: int,
    compile: bool = False,
    emesh: DeviceMesh | None = None,
    tensor_mode: AbstractContextManager | None = None,
    precision_of: str | None = None,
    precision: str | None = None,
) -> tuple[Transformer, float8.Conversion | None]:
    """One pipeline chunk of the model, parallelized. Twelve arguments: :func:`parallelize`'s, and the
    chunk's index and expert mesh."""
    with torch.device("meta"):
        model = Transformer(spec)
    if layout.stages > 1:
        first, count = chunk_bounds(spec, layout, chunk)
        model.keep_only(first, count, first=chunk == 0, last=chunk == layout.stages - 1)
    conversion = None
    if float8.is_float8(precision):  # on the meta model, before TP (torchtitan's order)
        conversion = float8.convert(
            model, precision, layout.tp, _float8_all_gather(layout, precision), emulate=device.type == "cpu"
        )
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], layout.sp, precision)
    if layout.ep > 1:
        apply_expert_parallel(model, emesh["ep"])
    apply_activation_checkpointing(model, layout.ac)
    if compile:
        compile_blocks(
            model, tensor_parallel=layout.tp > 1
        )  # after TP and recompute, before DP (see meshwise.runtime.compile)
    with tensor_mode or nullcontext():
        apply_data_parallel(model, mesh, layout, precision_of, emesh)
        model.to_empty(device=device)
        model.tie_weights()
        init_weights(model, spec, seed)
        if layout.cp > 1:  # a tensor like the weights: a fake one under verify's mode
            ring = ring_group(mesh["cp"])
            model.positions = positions(seq_len // layout.cp, layout.cp, ring.rank, device)
    if layout.cp > 1:
        for module in model.modules():
            if isinstance(module, Attention):
                module.ring = ring
    return model, conversion


def _float8_all_gather(layout: Layout, precision: str | None) -> bool:
    """FSDP2 all-gathers float8 weights (see meshwise.runtime.float8)."""
    return float8.fsdp_float8_all_gather(precision, layout.zero, layout.shard * layout.cp)


def parallelize(
    model_spec: ModelSpec,
    layout: Layout,
    mesh: DeviceMesh,
    global_batch: int,
    *,
    seq_len: int | None = None,
    seed: int = 0,
    optim: OptimizerConfig = OptimizerConfig(),
    compile: bool = False,
    tensor_mode: AbstractContextManager | None = None,
    precision_of: str | None = None,
    precision: str | None = None,
) -> ParallelModel:
    """Build this rank's part of ``model_spec`` under ``layout`` on ``mesh`` (from ``build_mesh``;
    eleven arguments: four, and seven keyword-only options that train, measure and verify set apart);
    ``compile`` compiles each block with ``torch.compile`` (:mod:`meshwise.runtime.compile`).
    ``tensor_mode`` (``meshwise verify``'s FakeTensorMode) is entered where tensors are created:
    materialisation, FSDP2's wrapping, initialisation and the pipeline stages (TP and recompute
    wrap the meta model outside it). ``precision_of`` names the device type whose precision
    policy applies (default: the mesh's): verify traces a GPU rank's bf16 policy on CPU tensors.
    ``precision`` ``fp8`` or ``fp8-rowwise`` trains the blocks' linears in float8 with torchao
    (:mod:`meshwise.runtime.float8`); None or any other name: the device's own precision."""
    seq_len = seq_len or model_spec.max_seq
    check_runnable(layout, model_spec, mesh.size(), global_batch, seq_len)
    float8.check(precision, precision_of or mesh.device_type)
    if compile:
        check_compile(layout)
    refusal = runtime_refusal(model_spec, seq_len)
    if refusal:
        raise MeshwiseError(refusal)
    device = mesh_device(mesh)
    chunk_ids = my_chunks(layout, mesh.get_local_rank("pp")) if layout.pp > 1 else [0]
    precision_of = precision_of or mesh.device_type
    emesh = expert_mesh(mesh, layout) if layout.ep > 1 else None
    built = [
        _build_chunk(
            model_spec, layout, mesh, c, seed, device, seq_len, compile, emesh, tensor_mode, precision_of, precision
        )
        for c in chunk_ids
    ]
    modules = [m for m, _ in built]
    cp_group = mesh["cp"].get_group() if layout.cp > 1 else None
    for m in modules:  # the MoE auxiliary loss averages over the replica's sequences, as the loss does
        set_aux_sequences(m, layout.mbs * layout.accum(global_batch), cp_group)
    params = [p for m in modules for p in m.parameters()]
    optimizer = build_optimizer(params, optim)
    pipeline = None
    if layout.pp > 1:
        with tensor_mode or nullcontext():
            pipeline = _pipeline(
                modules, chunk_ids, model_spec, layout, mesh, device, seq_len, global_batch, precision_of
            )
    return ParallelModel(
        spec=model_spec,
        layout=layout,
        mesh=mesh,
        global_batch=global_batch,
        seq_len=seq_len,
        chunk_ids=chunk_ids,
        modules=modules,
        pipeline=pipeline,
        optimizer=optimizer,
        optim_config=optim,
        float8_conversions=[c for _, c in built if c is not None],
        float8_scales=_float8_all_gather(layout, precision) and tensor_mode is None,
    )


def _pipeline(
    modules: list[nn.Module],
    chunk_ids: list[int],
    model_spec: ModelSpec,
    layout: Layout,
    mesh: DeviceMesh,
    device: torch.device,
    seq_len: int,
    global_batch: int,
    precision_of: str,
) -> Pipeline:
    """The pipeline of this rank's chunks. Nine arguments: the chunks and their ids,
    and :func:`parallelize`'s setting the stages are built in."""
    # bf16 activations come from FSDP2's mixed-precision policy, applied only when dp * cp > 1.
    act_dtype = torch.bfloat16 if precision_of == "cuda" and layout.dp * layout.cp > 1 else torch.float32
    stages = build_stages(modules, chunk_ids, model_spec, layout, mesh["pp"], device, seq_len // layout.cp, act_dtype)
    tokens = layout.mbs * layout.accum(global_batch) * seq_len // layout.cp  # this rank's, per step

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_sum(logits, targets) / tokens

    schedule = build_schedule(stages, layout, layout.accum(global_batch), loss_fn)
    eval_schedule = build_eval_schedule(schedule, stages, layout.accum(global_batch), loss_fn)
    return Pipeline(schedule, eval_schedule, stages)
