"""Pipeline parallelism with ``torch.distributed.pipelining``.

The blocks are split into pp*vpp chunks by :func:`meshwise.layout.stage_layers` (embedding on the
first chunk, final norm + head + loss on the last); chunk c runs on pipeline rank
:func:`meshwise.layout.chunk_rank` (round robin, or a V for zero-bubble with vpp=2).
Schedules: gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B, interleaved-1f1b ->
ScheduleInterleaved1F1B, zero-bubble -> ScheduleZBVZeroBubble (vpp=2, V placement) or
ScheduleInterleavedZeroBubble (otherwise). Micro-batches per step = the layout's accum.
Evaluation runs the schedule's ``eval``, except under ScheduleZBVZeroBubble (see
:func:`build_eval_schedule`).

Stage shapes are given statically (so torch runs no metadata-inference pass): token ids
(mbs, seq) into the first chunk, hidden states (mbs, seq/tp if SP else seq, hidden) between
chunks, logits (mbs, seq, vocab) out of the last. The schedule's loss function returns each
micro-batch's summed cross-entropy divided by the replica's tokens per step, with
``scale_grads=False``, so the gradients equal those of the replica's token mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from meshwise.layout import Layout, rank_chunks, stage_layers
from meshwise.runtime._torch_private import PipelineSchedule, forward_only_schedule
from meshwise.spec import ModelSpec


def chunk_bounds(spec: ModelSpec, layout: Layout, chunk: int) -> tuple[int, int]:
    """(first block index, number of blocks) of ``chunk``."""
    counts = stage_layers(spec.layers, layout.stages)
    return sum(counts[:chunk]), counts[chunk]


def my_chunks(layout: Layout, pp_rank: int) -> list[int]:
    return rank_chunks(pp_rank, layout.pp, layout.vpp, layout.schedule)


def _io_meta(
    spec: ModelSpec, layout: Layout, seq: int, chunk: int, act_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta tensors with the shapes a chunk receives and sends, per micro-batch."""
    hidden_seq = seq // layout.tp if layout.sp else seq
    # requires_grad marks the hidden states as differentiable, so their gradients flow back.
    hidden = torch.empty(layout.mbs, hidden_seq, spec.hidden, dtype=act_dtype, device="meta", requires_grad=True)
    inp = torch.empty(layout.mbs, seq, dtype=torch.long, device="meta") if chunk == 0 else hidden
    out = (
        torch.empty(layout.mbs, seq, spec.vocab, dtype=act_dtype, device="meta", requires_grad=True)
        if chunk == layout.stages - 1
        else hidden
    )
    return inp, out


def build_stages(
    chunks: list[torch.nn.Module],
    chunk_ids: list[int],
    spec: ModelSpec,
    layout: Layout,
    pp_mesh: DeviceMesh,
    device: torch.device,
    seq: int,
    act_dtype: torch.dtype,
) -> list[PipelineStage]:
    stages = []
    for module, chunk in zip(chunks, chunk_ids):
        inp, out = _io_meta(spec, layout, seq, chunk, act_dtype)
        stages.append(
            PipelineStage(
                module, chunk, layout.stages, device, input_args=(inp,), output_args=(out,), group=pp_mesh.get_group()
            )
        )
    return stages


def build_schedule(
    stages: list[PipelineStage],
    layout: Layout,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PipelineSchedule:
    kwargs = {"n_microbatches": n_microbatches, "loss_fn": loss_fn, "scale_grads": False}
    if layout.schedule == "gpipe":
        return ScheduleGPipe(stages[0], **kwargs)
    if layout.schedule == "1f1b":
        return Schedule1F1B(stages[0], **kwargs)
    if layout.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, **kwargs)
    if layout.schedule == "zero-bubble":
        if layout.vpp == 2:
            return ScheduleZBVZeroBubble(stages, **kwargs)
        return ScheduleInterleavedZeroBubble(stages, **kwargs)
    raise ValueError(f"unknown schedule {layout.schedule!r}")


def build_eval_schedule(
    schedule: PipelineSchedule,
    stages: list[PipelineStage],
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PipelineSchedule:
    """The schedule whose ``eval`` computes held-out losses: ``schedule`` itself, or for
    ScheduleZBVZeroBubble (whose ``eval`` fails in torch 2.13) its forwards alone, in its order."""
    if isinstance(schedule, ScheduleZBVZeroBubble):
        return forward_only_schedule(ScheduleZBVZeroBubble, stages, n_microbatches, loss_fn)
    return schedule
