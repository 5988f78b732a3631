"""One layout's estimate: memory of the largest rank, step time, collectives, throughput.

Step time = compute + exposed communication + pipeline bubble + optimizer step, for the slowest
pipeline rank (the pipeline runs at the pace of its slowest stage). Compute comes from
cost/kernels.py (per operation) for accelerators that declare the GPU fields, else from the flat
efficiency curve, plus on CPU ranks the operator launches and the memory-bound bytes
(cost/host.py). Overlap assumed per collective kind and runtime (``TrainSpec.runtime``;
docs/cost-model.md has the table):

- TP collectives: exposed (DTensor, and Megatron-LM by default, issue them between the GEMMs that
  need them); under ``megatron`` with ``overlap_tp_comm`` (``--tp-comm-overlap``, with SP) hidden
  behind the block's compute except a ``1 / tp`` share (the first chunk of each ring pipeline).
- Pipeline sends: exposed (receives wait inside the bubble or behind the matching send).
- The cp ring's K/V sends hide behind attention compute, its dK/dV sends do not (cost/context_parallel.py).
- DP gradient reduction (zero 0/1) overlaps with the backward of the last micro-batch (unless
  ``TrainSpec.overlap_dp_comm`` is off, as in Megatron-LM 2021); ZeRO-2/3 all-gathers and
  reduce-scatters overlap with the compute of their own micro-batch. What exceeds the window is
  exposed, and never less than one unit's (one block's) share. ZeRO-1's parameter all-gather after
  the optimizer step is exposed under ``meshwise``; ``megatron``'s distributed optimizer overlaps it
  with the first micro-batch's forward.
- Bubble = pipeline.bubble_fraction x the *mean* stage's (compute + TP time): the slowest stage
  sets the steady state (its busy time is counted in full), warm-up and cool-down pass through
  every stage at its own pace (stage imbalance from the embedding and head), plus one P2P
  latency per stage boundary crossed while filling and draining.
- More ranks than cores (a CPU profile's ``cores_per_node``): the profile is a rank's speed on a
  core of its own; compute, optimizer and FSDP2 copies are multiplied by ``host.core_share``
  (``max(1, ranks / cores)``: time-sharing). A stage idle in the bubble gives its core to the other
  ranks, so compute and bubble shrink back by ``min(core_share, 1 / busy fraction)``.
- Optimizer: AdamW/SGD are memory-bound: reads and writes weights, moments (and master) and reads
  gradients once: ``P_local * (2*o + 2*w + g) / HBM bandwidth``, plus on host-bound ranks (CPU)
  the launch cost of its per-tensor operators (cost/host.py ``optimizer_host_seconds``).

Throughput: tokens/s = global_batch * seq / step_s; model (hardware) TFLOP/s per GPU = model
(hardware) FLOPs / (world * step_s); MFU and HFU divide those by the device's peak.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, TypeVar

from meshwise.cost import (
    comm,
    compute,
    experts,
    fp8,
    host,
    host_moe,
    kernels,
    megatron_memory,
    memory,
    moe_block,
    mtp,
    pipeline,
)
from meshwise.cost.comm import Collective
from meshwise.cost.context_parallel import (
    cp_collectives,
    cp_exposed,
    cp_named,
    cp_world_dim,
    dtensor_parameters,
    fsdp_wrapped,
    local_train,
    ring_kernel_seconds,
    tp_overlap_on,
    weights_layout,
)
from meshwise.cost.memory import Memory, RankShape
from meshwise.cost.rank_work import RankWork
from meshwise.layout import Layout
from meshwise.spec import AcceleratorSpec, ClusterSpec, ModelSpec, TrainSpec

T = TypeVar("T")

DEFAULT_HEADROOM = 0.10  # fraction of device memory kept free (allocator fragmentation, CUDA context)


class StageParts(NamedTuple):
    """One pipeline rank's step, less its data-parallel collectives (:func:`_stage_seconds`)."""

    compute_s: float
    tp_s: float  # exposed TP seconds, with the world group's (:func:`_world_collectives`)
    pp_s: float  # pipeline and expert-parallel sends
    cp_s: float  # exposed cp ring seconds
    tp_ops: list[Collective]  # the TP group's; the world group's are named by the layout (:func:`world_dim`)
    pp_ops: list[Collective]
    ep_ops: list[Collective]
    kv_ops: list[Collective]  # cp K/V
    cp_grad_ops: list[Collective]  # cp dK/dV


@dataclass(frozen=True)
class StepTime:
    step_s: float
    compute_s: float
    comm_exposed_s: float
    bubble_s: float
    optimizer_s: float
    fixed_s: float = 0.0  # per step, outside the other parts: zeroing, gradient norm, loss (CPU ranks)
    moe_block_s: tuple[tuple[str, float], ...] = ()  # the slowest rank's MoE parts per step (moe_block.step_parts)

    def as_json(self) -> dict:
        out = {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "comm_exposed_s": self.comm_exposed_s,
            "bubble_s": self.bubble_s,
            "optimizer_s": self.optimizer_s,
            "fixed_s": self.fixed_s,
        }
        if self.moe_block_s:
            out["moe_block_s"] = dict(self.moe_block_s)
        return out


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    global_batch: int
    fits: bool
    memory: Memory  # the largest rank
    rank_memory: tuple[Memory, ...]  # one per distinct pipeline rank (memory.rank_shapes)
    time: StepTime
    comm: tuple[Collective, ...]  # the slowest pipeline rank's collectives
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    rank_pp: tuple[tuple[int, ...], ...] = ()  # the pipeline ranks each of rank_memory stands for

    def as_json(self) -> dict:
        ranks = [{"pp_ranks": list(p), **mm.as_json()} for p, mm in zip(self.rank_pp, self.rank_memory)]
        return {
            "layout": self.layout.to_json(self.global_batch),
            "fits": self.fits,
            "memory": self.memory.as_json(),
            **({"rank_memory": ranks} if ranks else {}),
            "time": self.time.as_json(),
            "comm": [c.as_json() for c in self.comm],
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
        }


def _tp_collectives(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, cluster: ClusterSpec
) -> list[Collective]:
    """Per micro-batch, as the runtime issues them (docs/runtime.md; Korthikanti et al. 2022 Sec. 4.2):

    sp off: 2 all-reduces of ``T h e`` per block forward and 2 backward, 1 for the head's input
    gradient, and after the embedding an all-gather (its table is split on the hidden dimension) or,
    for a tied one (split on the vocabulary with the head), an all-reduce. sp on: the same points as
    reduce-scatters (forward out of a row-wise region) and all-gathers (into a column-wise region),
    mirrored in backward; the head's input is gathered, the embedding's output gradient too, and an
    untied embedding's output is gathered (then split on the sequence), a tied one's
    reduce-scattered. Activation checkpointing re-runs the forward's
    collectives except the last reduction (1 all-reduce, or 2 all-gathers + 1 reduce-scatter, per
    block). The last chunk gathers the logits (``T V e``); Megatron's loss stays vocabulary-parallel
    (megatron-core ``vocab_parallel_cross_entropy``: three all-reduces of ``T`` float32 values). Under
    SP the norm weights' gradients are partial sums: one all-reduce of ``h e`` each, per micro-batch
    under ZeRO-2/3, else per step.
    A MoE block's MLP runs whole on every TP rank (runtime/tensor_parallel.py): under SP its input
    is gathered and its output's gradient too (a slice forward), and nothing is reduced (no
    reduce-scatter out, none of the input gradient), without SP no all-reduce: 2 fewer reductions
    per MoE block (measured: tiny-moe dp=2,ep=2,tp=2 reduce-scatters 12 per micro-batch, not 18)."""
    t = layout.tp
    if t == 1 or model.states_only:
        return []
    link = cluster.link_for(t, 1)
    tokens = train.seq_len * layout.mbs
    payload = tokens * model.hidden * train.activation_bytes
    blocks, first, last = shape.blocks, int(shape.has_embedding), int(shape.has_head)
    recompute = layout.ac != "none"
    moe_blocks = round(shape.expert_params / (model.experts * model._mlp(model.expert_ffn_hidden))) if model.moe else 0
    out: list[Collective] = []
    rowwise = first if model.tied_embeddings else 0  # the embedding's forward reduces (tied) or gathers
    colwise = first - rowwise
    if layout.sp:
        gathers = 4 * blocks + last + first + colwise + (2 * blocks if recompute else 0)
        scatters = 4 * blocks - 2 * moe_blocks + rowwise + last + (blocks if recompute else 0)
        # under per-tensor float8 the inputs gathered into the QKV and first MLP projections (forward and
        # recompute) travel in float8 (cost/fp8.py tp_float8_gathers)
        in_fp8 = fp8.tp_float8_gathers(train, blocks, moe_blocks, recompute)
        out.append(comm.collective("all_gather", "tp", t, payload, (gathers - in_fp8) * m, link))
        if in_fp8:
            out.append(comm.collective("all_gather", "tp", t, tokens * model.hidden, in_fp8 * m, link))
        out.append(comm.collective("reduce_scatter", "tp", t, payload, scatters * m, link))
        norms = 2 * blocks + last
        fsdp = fsdp_wrapped(layout)
        per_mb = fsdp and layout.zero >= 2 and layout.pp == 1
        per_step = m if per_mb else 1
        # FSDP2 reduces each micro-batch's gradients as computed (ZeRO-2/3 without PP), else it
        # accumulates them unsharded in its reduce dtype (float32 under bf16-mixed; found by
        # `meshwise verify` on pp=4,dp=2,zero=1,tp=8) and the norm weights' gradients are summed in it
        elem = memory.reduce_bytes(train) if fsdp and not per_mb else train.grad_bytes
        out.append(comm.collective("all_reduce", "tp", t, model.hidden * elem, norms * per_step, link))
    else:
        reduces = rowwise + 4 * blocks - 2 * moe_blocks + last + (blocks if recompute else 0)
        out.append(comm.collective("all_reduce", "tp", t, payload, reduces * m, link))
        if colwise:
            out.append(comm.collective("all_gather", "tp", t, payload, colwise * m, link))
    if last and train.runtime == "megatron":  # vocab_parallel_cross_entropy: max, target logit, sum of exps
        out.append(comm.collective("all_reduce", "tp", t, tokens * 4, 3 * m, link))
    elif last:
        out.append(comm.collective("all_gather", "tp", t, tokens * model.vocab * train.activation_bytes, m, link))
    return out


def _dp_collectives(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, cluster: ClusterSpec
) -> tuple[list[Collective], list[Collective]]:
    """Data parallelism's collectives, over dp x cp under context parallelism (``context``)."""
    per_mb, per_step = _dp_collectives_of(model, train, weights_layout(layout), shape, m, cluster)
    return cp_named(per_mb, layout), cp_named(per_step, layout)


def _dp_exposed_s(
    train: TrainSpec,
    accel: AcceleratorSpec,
    layout: Layout,
    shape: RankShape,
    m: int,
    compute_s: float,
    dp_ops: tuple[list[Collective], list[Collective]],
) -> float:
    """Seconds of the rank's data-parallel collectives (``dp_ops``: per micro-batch, per step) on the
    critical path: per micro-batch beside that micro-batch's compute (when the runtime overlaps), the
    per-step reductions beside the backward, the per-step gathers beside the forward under Megatron's
    overlap and exposed otherwise (:func:`_exposed`)."""
    dp_mb_ops, dp_step_ops = dp_ops
    rf = compute.recompute_factor(layout.ac)
    units = max(shape.units, 1)
    window_s = compute_s / m if train.overlap_dp_comm and accel.comm_overlap else 0.0
    dp_s = _exposed(dp_mb_ops, window_s, units, m)
    if dp_step_ops:
        grad_ops = [op for op in dp_step_ops if op.kind != "all_gather"]
        dp_s += _exposed(grad_ops, window_s * (rf - 1) / rf, units)
        gathers = [op for op in dp_step_ops if op.kind == "all_gather"]
        if train.runtime == "megatron" and train.overlap_dp_comm and accel.comm_overlap:
            dp_s += _exposed(gathers, window_s / rf, units)
        else:
            dp_s += sum(op.seconds_per_step for op in gathers)
    return dp_s


def lower_bound_with_dp_s(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, stage_cache: dict | None = None
) -> float:
    """:func:`lower_bound_step_s`'s tighter bound with the data-parallel collectives' exposed seconds
    added as :func:`estimate` adds them: every part of the step but the host work beside the kernels
    (FSDP2's, the gradient sums'), the optimizer and the fixed seconds (all >= 0), so it is below the
    step in floating point too. On ranks sharing cores (CPU) it is :func:`lower_bound_step_s`."""
    if host.core_share(cluster.accelerator, cluster.gpus_per_node) > 1:
        return lower_bound_step_s(model, cluster, train, layout, stage_cache=stage_cache)
    m = layout.accum(train.global_batch)
    shapes, parts, bubble_s = _stages_of(stage_cache, model, cluster, train, layout)
    busy_s = []
    for shape, st in zip(shapes, parts):
        dp_s = _dp_exposed_s(
            train,
            cluster.accelerator,
            layout,
            shape,
            m,
            st.compute_s,
            _dp_of(stage_cache, model, train, layout, shape, m, cluster),
        )
        busy_s.append(st.compute_s + st.tp_s + st.pp_s + dp_s + st.cp_s)
    return max(busy_s) + bubble_s


def dp_unhidden_seconds(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    shapes: tuple[RankShape, ...],
    m: int,
    stage_cache: dict | None = None,
) -> list[float]:
    """Per rank shape (``shapes``: the layout's) at ``m`` micro-batches, data-parallel seconds that no compute hides more
    than once: the sum of its collectives where they all run per micro-batch or all per step (as
    _dp_collectives_of makes them), else the larger sum. :func:`_dp_exposed_s` hides each repetition
    behind at most its window, and one kind's windows sum to at most the rank's compute (m x
    compute / m per micro-batch; (rf - 1) / rf + 1 / rf of compute / m per step), so the rank's
    exposed DP seconds are at least this less its compute. Reads no ac (``stage_cache``: the plan's
    per-rank memo)."""
    out = []
    for shape in shapes:
        per_mb, per_step = _dp_of(stage_cache, model, train, layout, shape, m, cluster)
        mb_s = sum(op.seconds_per_step for op in per_mb)
        step_s = sum(op.seconds_per_step for op in per_step)
        out.append(mb_s + step_s if not (mb_s and step_s) else max(mb_s, step_s))
    return out


def lower_bound_dp_floor_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    least: tuple[float, list[float]],
    stage_cache: dict | None = None,
) -> float:
    """A floor of :func:`lower_bound_with_dp_s` + :func:`optimizer_seconds` over every layout with the
    stage seconds of ``layout`` (:func:`rank_fields`, dp, :func:`reduces_per_micro_batch`), given
    ``least``: their least optimizer seconds and, per rank shape, their least
    :func:`dp_unhidden_seconds` + optimizer seconds. A rank's stage plus exposed DP seconds is at
    least max(compute, unhidden) + tp + pp + cp, so the floor is the largest over ranks of
    max(compute + least optimizer, least unhidden + optimizer) + tp + pp + cp, plus the bubble; less
    1e-9 of it (the bound adds in another order). On ranks sharing cores it is
    :func:`lower_bound_step_s` + the least optimizer seconds."""
    opt_s, unhidden_s = least
    if host.core_share(cluster.accelerator, cluster.gpus_per_node) > 1:
        return lower_bound_step_s(model, cluster, train, layout, stage_cache) + opt_s
    _, parts, bubble_s = _stages_of(stage_cache, model, cluster, train, layout)
    busy_s = max(max(st.compute_s + opt_s, u) + st.tp_s + st.pp_s + st.cp_s for st, u in zip(parts, unhidden_s))
    return (busy_s + bubble_s) * (1 - 1e-9)


def _stages_of(
    cache: dict | None, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout
) -> tuple[tuple[RankShape, ...], list[StageParts], float]:
    """The layout's rank shapes, their :func:`_stage_of` and the bubble over them (:func:`_bubble_seconds`),
    kept in ``cache`` (when given) by the fields they read: :func:`rank_fields`, dp and
    :func:`reduces_per_micro_batch`, so the bounds of a structure's sharding groups share them."""
    key = ("stages", *rank_fields(layout), reduces_per_micro_batch(layout), layout.dp)
    found = cache.get(key) if cache is not None else None
    if found is None:
        shapes = memory.rank_shapes(model, layout)
        times = _times_of(cache, model, cluster, train, layout, shapes)  # the compute-only bound's, mostly kept
        parts = [_stage_of(cache, model, cluster, train, layout, shape, t) for shape, t in zip(shapes, times)]
        stages = [st.compute_s + st.tp_s + st.cp_s for st in parts]
        m = layout.accum(train.global_batch)
        counts = _shape_counts(cache, model, layout)
        found = (shapes, parts, _bubble_seconds(model, cluster, train, layout, m, stages, counts))
        if cache is not None:
            cache[key] = found
    return found


def _dp_of(
    cache: dict | None,
    model: ModelSpec,
    train: TrainSpec,
    layout: Layout,
    shape: RankShape,
    m: int,
    cluster: ClusterSpec,
) -> tuple[list[Collective], list[Collective]]:
    """:func:`_dp_collectives`, kept in ``cache`` (when given: the plan's per-rank memo) by the fields it
    reads: every layout field but mbs (only through ``m``, where :func:`dp_reads_m`), ac and sp, and the
    rank's pipeline position. The lists are shared: callers only read them."""
    if cache is None:
        return _dp_collectives(model, train, layout, shape, m, cluster)
    degrees = (layout.dp, layout.zero, layout.shard, layout.cp, layout.tp, layout.pp, layout.vpp, layout.schedule)
    rank = (shape.pp_rank, shape.chunk_blocks, m if dp_reads_m(train, layout) else 0)
    key = ("dp", *degrees, layout.ep, layout.ep_folds_tp, *rank)
    return _memo(cache, key, _dp_collectives, model, train, layout, shape, m, cluster)


def dp_reads_m(train: TrainSpec, layout: Layout) -> bool:
    """Whether the data-parallel collectives read the micro-batch count: a count per micro-batch
    (ZeRO-2/3, :func:`_dp_ops`) or torch's interleaved runtime's regathered chunks (:func:`_regathered`)."""
    return layout.zero >= 2 or (train.runtime != "megatron" and memory.evicts_chunks(layout))


def _dp_collectives_of(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, cluster: ClusterSpec
) -> tuple[list[Collective], list[Collective]]:
    """(per-micro-batch collectives, per-step collectives) of data parallelism for one rank, one call
    per FSDP2 unit (docs/runtime.md):

    zero 0: all-reduce of the gradients once per step (accumulation skips the sync).
    zero 1: all-gather of the weights at the first forward, reduce-scatter at the last backward.
    zero 2: per micro-batch an all-gather (kept to backward) and a reduce-scatter.
    zero 3: per micro-batch two all-gathers (forward, backward) and a reduce-scatter (ZeRO Sec. 7: 3 Psi).
    Under PP the schedule defers every reduction and re-shard to the end of the step: one
    reduce-scatter (all-reduce for zero 0) per unit per step; all-gathers once per step, except
    ZeRO-3's forward ones (every micro-batch) and its first backward.
    HSDP adds an all-reduce of each reduce-scattered shard across ``dp_replicate``. Under EP the
    experts are units of their own (one per MoE block) over the dp / ep ranks left (dim ``edp``;
    ``layout`` is context.weights_layout's, so under cp they are the dp * cp / ep ranks left)."""
    if layout.dp == 1:
        return [], []
    dim = "dp" if layout.replicate == 1 else "dp_shard"
    experts = shape.expert_params if layout.ep > 1 else 0.0
    dense = shape.params - experts + (fsdp_padding(model, layout, shape) if layout.zero else 0.0)
    # torch's interleaved runtime (not Megatron's, whose published runs the time model is fitted on)
    torch_evicts = memory.evicts_chunks(layout) and train.runtime != "megatron"
    regathered = _regathered(model, layout, shape, m) if torch_evicts else (0.0, 0)
    # per-tensor float8 gathers the linear layers (all but the model's ends) in float8 (cost/fp8.py)
    gather = (
        fp8.gather_bytes_per_param(train, 1 - shape.root_params / shape.params if shape.params else 0.0)
        if train.fp8
        else None
    )
    bucket = _megatron_bucket_params(train, layout)
    calls = math.ceil(dense / bucket) if bucket else shape.units
    per_mb, per_step = _dp_ops(
        train, layout, m, cluster, (dense, calls), _Group(layout.shard, dim, layout.tp), regathered, gather
    )
    if not experts:
        return per_mb, per_step
    moe_units = round(experts / (model.expert_params / model.moe_layers))
    # over the expert data-parallel ranks (layout: the weights' one, cp folded into shard): shard / ep,
    # folded over tp shard * tp / ep, ep apart (consecutive EP groups)
    folded = layout.ep_folds_tp
    # Megatron's expert TP (its default: the TP size) holds 1/tp of each expert on a rank (cost/moe_block.py)
    expert_tp = layout.tp if train.runtime == "megatron" and not folded else 1
    e_mb, e_step = _dp_ops(
        train,
        layout,
        m,
        cluster,
        (shape.expert_params / (layout.ep * expert_tp), moe_units)
        if not bucket
        else (shape.expert_params / (layout.ep * expert_tp), math.ceil(experts / (layout.ep * expert_tp) / bucket)),
        _Group(layout.expert_dp, "edp", layout.ep if folded else layout.tp * layout.ep),
        gather_bytes=fp8.gather_bytes_per_param(train, 1.0) if train.fp8 else None,
    )
    return per_mb + e_mb, per_step + e_step


def _megatron_bucket_params(train: TrainSpec, layout: Layout) -> float:
    """Parameters per gradient bucket of Megatron-Core's data parallelism (0: one call per unit instead):
    ``max(40e6, 1e6 * dp)`` (megatron/core/distributed/distributed_data_parallel.py, its default
    ``bucket_size``: larger DP groups get larger buckets, so each ring's chunks stay bandwidth-bound), for
    its DDP and distributed optimizer (zero 0 and 1) without a pipeline. Each bucket is one reduce-scatter
    (all-reduce) and, under the distributed optimizer, one all-gather. Under PP Megatron keeps one bucket on
    every stage but the first and per model chunk after the first: left at one call per unit."""
    if train.runtime != "megatron" or layout.zero > 1 or layout.pp > 1:
        return 0.0
    return max(40e6, 1e6 * layout.dp * layout.cp)


def _regathered(model: ModelSpec, layout: Layout, shape: RankShape, m: int) -> tuple[float, int]:
    """(parameters with their FSDP2 padding, units) the interleaved runtime gathers again in a step,
    beyond once per unit: each chunk it reshards and comes back to (pipeline.interleaved_gathers;
    meshwise verify, Llama 3 405B pp=16, vpp=4: 10 all-gathers on dp where 8 units gather once)."""
    counts = pipeline.interleaved_gathers(layout.pp, layout.vpp, m, shape.pp_rank)
    last = len(shape.chunk_blocks) - 1
    params, units = 0.0, 0
    for j, (n, blocks) in enumerate(zip(counts, shape.chunk_blocks)):
        if n <= 1:
            continue
        embedding, head = shape.has_embedding and j == 0, shape.has_head and j == last
        root = shape.root_params if (embedding or head) else 0.0
        chunk = dataclasses.replace(
            shape,
            chunk_blocks=(blocks,),
            has_embedding=embedding,
            has_head=head,
            root_params=root,
            params=blocks * shape.block_params + root,
            root_units=int(bool(root)),
            expert_params=shape.expert_params * blocks / max(shape.blocks, 1),
        )
        experts = chunk.expert_params if layout.ep > 1 else 0.0
        params += (n - 1) * (chunk.params - experts + fsdp_padding(model, layout, chunk))
        units += (n - 1) * chunk.units
    return params, units


def _padding(rows: float, row_elems: float, n: int) -> float:
    """Elements FSDP2 adds to one parameter: it chunks dim 0 (``rows``) into ``n`` equal shards,
    padding it to a multiple of n (torch.distributed.fsdp, FSDPParam)."""
    return (-(-rows // n) * n - rows) * row_elems


def fsdp_padding(model: ModelSpec, layout: Layout, shape: RankShape) -> float:
    """Elements FSDP2's dim-0 padding adds to the rank's dense parameters over ``layout.shard``
    ranks (the weights' layout: context.weights_layout), each parameter's first dimension after TP:
    Q/K/V (heads·d/t, kv/t rows, and their biases), O and the MLP's down projection (h rows),
    gate/up (f/t rows), norms (h; q/k norms d); in a MoE block (not split by TP) the router (E
    rows), the shared expert (f_s and h rows) and its gate (1 row); the embedding (V rows, V/t
    tied), the head (V/t) and the final norm; routed experts without expert parallelism (E rows;
    under it they are their own units, sharded on their width: runtime/data_parallel.py). MLA
    attention and learned positions are taken as unpadded."""
    if layout.shard == 1 or model.states_only:
        return 0.0
    return _fsdp_padding(model, layout.shard, layout.tp, layout.ep == 1, shape)


@lru_cache(maxsize=65536)
def _fsdp_padding(model: ModelSpec, n: int, t: int, experts_in_block: bool, shape: RankShape) -> float:
    h = model.hidden
    q, kv = model.heads * model.head_dim, model.kv_dim
    attention = 0.0
    if not model.mla:
        attention = _padding(q / t, h, n) + 2 * _padding(kv / t, h, n) + _padding(h, q / t, n)
        if model.qkv_bias:
            attention += _padding(q / t, 1, n) + 2 * _padding(kv / t, 1, n)
    norm_elems = 2 if model.norm == "layernorm" else 1
    norms = model.norms_per_layer * _padding(h, norm_elems, n) + (
        2 * _padding(model.head_dim, 1, n) if model.qk_norm else 0
    )
    gated = model.mlp != "gelu"
    dense_mlp = (1 + gated) * _padding(model.ffn_hidden / t, h, n) + _padding(h, model.ffn_hidden / t, n)
    moe_mlp = _padding(model.experts, h, n)
    if model.shared_ffn_hidden:
        moe_mlp += (1 + gated) * _padding(model.shared_ffn_hidden, h, n) + _padding(h, model.shared_ffn_hidden, n)
    if model.shared_expert_gate:
        moe_mlp += _padding(1, h, n)
    if model.moe and experts_in_block:  # the experts are in the block's unit, sharded on dim 0 (E) like the rest
        moe_mlp += (2 + gated) * _padding(model.experts, model.expert_ffn_hidden * h, n)
    moe_blocks = round(shape.expert_params / (model.expert_params / model.moe_layers)) if model.moe else 0
    out = shape.blocks * (attention + norms) + (shape.blocks - moe_blocks) * dense_mlp + moe_blocks * moe_mlp
    if shape.has_embedding:
        out += _padding(
            model.vocab / t if model.tied_embeddings and t > 1 else model.vocab,
            h / (1 if model.tied_embeddings else t),
            n,
        )
    if shape.has_head:
        out += _padding(h, norm_elems, n) + (
            _padding(model.vocab / t, h, n) if not (model.tied_embeddings and shape.has_embedding) else 0.0
        )
    return out


class _Group(NamedTuple):
    """A data-parallel group: its ranks, its mesh dimension's name and the stride between its ranks."""

    ranks: int
    dim: str
    stride: int


def _dp_ops(
    train: TrainSpec,
    layout: Layout,
    m: int,
    cluster: ClusterSpec,
    sharded: tuple[float, int],
    group: _Group,
    regathered: tuple[float, int] = (0.0, 0),
    gather_bytes: float | None = None,
) -> tuple[list[Collective], list[Collective]]:
    """_dp_collectives for ``sharded`` (parameters, units) over the ``group`` (x replicas); under PP,
    ``regathered`` (parameters, units) gathered again in the step (_regathered); ``gather_bytes``:
    bytes per parameter all-gathered (the weights', unless float8 is gathered)."""
    params, units = sharded
    n, dim, stride = group
    replicas = layout.replicate
    if n * replicas == 1:
        return [], []
    gather_bytes = train.weight_bytes if gather_bytes is None else gather_bytes
    grad = params * memory.reduce_bytes(train) / units
    weight = params * gather_bytes / units
    if layout.zero == 0:
        link = cluster.link_for(n * replicas, stride)
        return [], [comm.collective("all_reduce", "dp" if dim != "edp" else dim, n * replicas, grad, units, link)]
    link = cluster.link_for(n, stride)
    if layout.pp > 1:
        gathers_step = units * (m + 1) if layout.zero == 3 else units
        if regathered[1]:
            weight = (params + regathered[0]) * gather_bytes / (units + regathered[1])
            gathers_step = units + regathered[1]
        per_mb: list[Collective] = []
        per_step = [
            comm.collective("all_gather", dim, n, weight, gathers_step, link),
            comm.collective("reduce_scatter", dim, n, grad, units, link),
        ]
        reductions, target = 1, per_step
    elif layout.zero == 1:
        per_mb = []
        per_step = [
            comm.collective("all_gather", dim, n, weight, units, link),
            comm.collective("reduce_scatter", dim, n, grad, units, link),
        ]
        reductions, target = 1, per_step
    else:
        gathers = 2 if layout.zero == 3 else 1
        per_mb = [
            comm.collective("all_gather", dim, n, weight, gathers * units * m, link),
            comm.collective("reduce_scatter", dim, n, grad, units * m, link),
        ]
        per_step, reductions, target = [], m, per_mb
    if n == 1:
        target.clear()
    if replicas > 1:
        rep_link = cluster.link_for(replicas, stride * n)
        target.append(comm.collective("all_reduce", "dp_replicate", replicas, grad / n, units * reductions, rep_link))
    return per_mb, per_step


def _pp_collectives(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, cluster: ClusterSpec
) -> list[Collective]:
    """Per micro-batch, every chunk boundary that crosses ranks carries the activations forward and
    their gradient back (``T h e``, the local sequence shard under SP): this rank sends
    ``shape.sends_per_mb`` messages and receives as many."""
    if layout.pp == 1 or model.states_only:
        return []
    link = cluster.link_for(2, layout.tp * layout.cp * layout.dp)
    message = train.seq_len * layout.mbs * model.hidden * train.activation_bytes / (layout.tp if layout.sp else 1)
    sends = m * shape.sends_per_mb
    return [
        comm.collective("send", "pp", 2, message, sends, link),
        comm.collective("recv", "pp", 2, message, sends, link),
    ]


def world_dim(layout: Layout) -> str:
    """The name a collective over every rank goes by: the one mesh dimension larger than 1, if
    only one is, or the weights' dp x cp group if it spans the world (``context``), else ``world``."""
    sizes = {"pp": layout.pp, "tp": layout.tp, "cp": layout.cp}
    if layout.replicate > 1 and layout.shard > 1:
        sizes.update(dp_replicate=layout.replicate, dp_shard=layout.shard)
    else:
        sizes["dp"] = layout.dp
    big = [d for d, n in sizes.items() if n > 1]
    return big[0] if len(big) == 1 else cp_world_dim(layout)


def _world_collectives(layout: Layout, cluster: ClusterSpec) -> list[Collective]:
    """Once per step on every rank: the squared gradient norm and the reported loss (float64 each)."""
    n = layout.world_size
    if n == 1:
        return []
    return [comm.collective("all_reduce", world_dim(layout), n, 8, 2, cluster.link_for(n, 1))]


def rank_collectives(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, shape: RankShape
) -> list[Collective]:
    """Every collective one rank of ``shape`` issues in a step, summed per kind and mesh dimension."""
    m = layout.accum(train.global_batch)
    local = local_train(train, layout)
    per_mb, per_step = _dp_collectives(model, train, layout, shape, m, cluster)
    kv, grads = cp_collectives(model, local, layout, shape, m, cluster)
    return _merge(
        per_mb
        + per_step
        + _tp_collectives(model, local, layout, shape, m, cluster)
        + kv
        + grads
        + experts.ep_collectives(model, local, layout, shape, m, cluster)
        + _pp_collectives(model, local, layout, shape, m, cluster)
        + _world_collectives(layout, cluster)
    )


def _merge(ops: list[Collective]) -> list[Collective]:
    """Sum collectives of the same kind and dimension."""
    merged: dict[tuple[str, str], Collective] = {}
    for op in ops:
        key = (op.kind, op.dim)
        if key in merged:
            prev = merged[key]
            op = Collective(
                op.kind,
                op.dim,
                prev.bytes_per_step + op.bytes_per_step,
                prev.count_per_step + op.count_per_step,
                prev.seconds_per_step + op.seconds_per_step,
            )
        merged[key] = op
    return list(merged.values())


def _exposed(ops: list[Collective], window_s: float, units: int, times: int = 1) -> float:
    """Exposed seconds of ``ops`` repeated ``times``, each repetition hidden behind ``window_s`` of compute."""
    per = sum(op.seconds_per_step for op in ops) / times
    return times * max(per - window_s, per / units) if per else 0.0


def _p2p_latency_s(model: ModelSpec, train: TrainSpec, layout: Layout, cluster: ClusterSpec) -> float:
    """One stage-to-stage send of one micro-batch's activations: what filling (and draining) the
    pipeline waits for at each boundary."""
    link = cluster.link_for(2, layout.tp * layout.cp * layout.dp)
    message = train.seq_len * layout.mbs * model.hidden * train.activation_bytes / (layout.tp if layout.sp else 1)
    return comm.collective_seconds("send", 2, message, link)


def rank_memories(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout) -> tuple[Memory, ...]:
    """Memory of each distinct pipeline rank (memory.rank_shapes order)."""
    m = layout.accum(train.global_batch)
    capacity = cluster.accelerator.memory_bytes
    per_rank = megatron_memory.rank_memory if train.runtime == "megatron" else memory.rank_memory
    return tuple(per_rank(model, train, layout, s, m, capacity) for s in memory.rank_shapes(model, layout))


def fits(total_bytes: float, cluster: ClusterSpec, headroom: float = DEFAULT_HEADROOM) -> bool:
    return total_bytes <= cluster.accelerator.memory_bytes * (1 - headroom)


def _efficiency(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """Achieved fraction of peak: the accelerator's curve at the model's hidden size.

    On Narayanan et al.'s Table 1 the achieved fraction follows the hidden size h (44% at h=2304,
    52% at h >= 20480) and not h/tp (18.4B at h/tp=768 reaches what 1.7B does at 2304), so the curve
    is read at h; TP's cost is charged as communication instead."""
    accel = cluster.accelerator
    return accel.efficiency_max if model.states_only else accel.efficiency(model.hidden)


def compute_seconds(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, shape: RankShape
) -> float:
    """Seconds of one step's FLOPs on one rank of ``shape``, at the calibrated efficiency, plus the
    host time of launching its operators and, on CPU ranks, its memory-bound bytes over the copy
    bandwidth (cost/host.py; both 0 on GPU profiles)."""
    m = layout.accum(train.global_batch)
    accel = cluster.accelerator
    if accel.has_op_model and not model.states_only:
        total = _op_model_blocks_s(model, accel, train, layout, shape)
        if model.moe:  # the MLPs of a mixture of experts, dense blocks' and MoE blocks' (cost/moe_block.py)
            total += _op_model_mlps_s(model, accel, train, layout, shape)
        if shape.has_head:  # multi-token-prediction modules beside the head (cost/mtp.py)
            total += mtp.mtp_seconds(model, accel, local_train(train, layout), layout)
        return m * total
    tokens_mb = train.seq_len // layout.cp * layout.mbs  # each local token attends over the whole sequence
    if model.states_only:
        flops = 6.0 * shape.params * tokens_mb * m
    else:
        blocks_fwd = shape.blocks * compute.tp_rank_flops_per_token(
            model, train.seq_len, layout.tp, compute.tp_divides_moe(layout.ep_folds_tp, train.runtime)
        )
        head_fwd = compute.head_forward_flops_per_token(model) if shape.has_head else 0.0
        flops = tokens_mb * m * (compute.recompute_factor(layout.ac) * blocks_fwd + 3 * head_fwd / layout.tp)
    # the attention kernels timed on their own (cost/context_parallel.py, cost/host.py) hold the attention core
    if layout.cp > 1:
        ring_s = ring_kernel_seconds(model, accel, local_train(train, layout), layout, shape.blocks, m)
    else:
        ring_s = host.sdpa_seconds(model, accel, train.seq_len, layout.mbs, layout.tp, layout.ac, shape.blocks, m)
    if ring_s:
        flops -= (
            tokens_mb
            * m
            * compute.recompute_factor(layout.ac)
            * shape.blocks
            * compute.attention_core_flops_per_token(model, train.seq_len)
            / layout.tp
        )
    peak = cluster.accelerator.peak_flops_per_s(train.precision)
    launch_s = memory_s = moe_s = 0.0
    if model.moe and not model.states_only and host.is_host_bound(accel):  # MoE blocks from their parts
        flops -= (
            tokens_mb * m * compute.recompute_factor(layout.ac) * shape.blocks * host_moe.moe_replaced_flops(model, 1.0)
        )
        moe_s = m * _cpu_moe_block_s(model, accel, layout, shape, tokens_mb)
    if not model.states_only:
        launch_s = host.host_seconds(
            accel, shape.blocks, shape.has_embedding, shape.has_head, layout.ac, m, layout.tp, layout.sp
        ) + host.split_backward_seconds(accel, layout.schedule, layout.pp, shape.blocks, m)
    if not model.states_only and host.is_host_bound(accel):
        memory_s = host.memory_bound_seconds(model, accel, local_train(train, layout), rank_work(layout, shape), m)
    share = host.core_share(accel, cluster.gpus_per_node)
    eff = _efficiency(model, cluster, layout) * host.gemm_shape_factor(model, accel, tokens_mb, layout.tp)
    fp8_s = 0.0
    if train.fp8 and not model.states_only:
        # the linear layers' FLOPs at the float8 GEMM peak, their casts over HBM (cost/fp8.py)
        linear_flops, cast_bytes = _linear_work(model, local_train(train, layout), layout, shape, m)
        flops -= linear_flops
        rate = fp8.gemm_peak_flops_per_s(accel, train) * fp8.FLAT_FP8_EFFICIENCY * eff
        fp8_s = linear_flops / rate + cast_bytes / fp8.hbm_bytes_per_s(accel)
    return share * (flops / (peak * eff) + fp8_s + launch_s + memory_s + ring_s + moe_s)


def _cpu_moe_block_s(
    model: ModelSpec, accel: AcceleratorSpec, layout: Layout, shape: RankShape, tokens: float
) -> float:
    """One micro-batch of the rank's MoE blocks on a CPU rank (cost/host_moe.py): their parts, the
    forward again under full recompute, less what the dense path charged them for an MLP."""
    parts = _cpu_moe_parts(model, accel, layout, tokens)
    again = parts.forward_s if layout.ac == "full" else 0.0
    dense_s = host_moe.dense_mlp_seconds(model, accel, tokens, layout.tp, layout.ac)
    return moe_block.moe_blocks_of(model, shape.expert_params) * (parts.total_s + again - dense_s)


def _cpu_moe_parts(model: ModelSpec, accel: AcceleratorSpec, layout: Layout, tokens: float) -> host_moe.CpuMoeParts:
    """cost/host_moe.py's parts for a micro-batch of ``tokens`` (each TP rank routes them all unless EP
    folds over TP)."""
    return host_moe.cpu_moe_parts(
        model, accel, moe_block.routed_tokens(tokens, layout.tp, layout.ep_folds_tp), layout.ep
    )


def _op_model_blocks_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, layout: Layout, shape: RankShape
) -> float:
    """kernels.rank_seconds of the rank: one micro-batch, every block (less a mixture of experts' MLPs)
    and the model's ends, on the op model."""
    return kernels.rank_seconds(
        model, accel, local_train(train, layout), rank_work(layout, shape), layout.cp, layout.accum(train.global_batch)
    )


def rank_work(layout: Layout, shape: RankShape) -> RankWork:
    """One micro-batch's work on the rank of ``shape`` under ``layout``."""
    return RankWork(layout.mbs, layout.tp, layout.sp, layout.ac, shape.blocks, shape.has_embedding, shape.has_head)


def _op_model_mlps_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, layout: Layout, shape: RankShape
) -> float:
    """moe_block.rank_mlp_seconds of the rank: one micro-batch of a mixture of experts' MLPs."""
    return moe_block.rank_mlp_seconds(
        model,
        accel,
        local_train(train, layout),
        layout.mbs,
        layout.tp,
        layout.ep,
        layout.ep_folds_tp,
        layout.ac,
        shape.blocks,
        moe_block.moe_blocks_of(model, shape.expert_params),
    )


def _moe_split(
    model: ModelSpec,
    accel: AcceleratorSpec,
    local: TrainSpec,
    layout: Layout,
    shape: RankShape,
    m: int,
    a2a_s: float,
    ranks_per_node: int = 1,
) -> tuple[tuple[str, float], ...]:
    """The rank's MoE parts per step (cost/moe_block.py ``step_parts``) on the op model; on a CPU rank
    cost/host_moe.py's, times the ranks per core; else none. ``a2a_s``: the EP all-to-alls' seconds
    per step (dispatch and combine)."""
    if not model.moe or model.states_only or not (accel.has_op_model or host.is_host_bound(accel)):
        return ()
    if not accel.has_op_model:
        parts = _cpu_moe_parts(model, accel, layout, local.seq_len * layout.mbs).as_json()
        calls = moe_block.moe_blocks_of(model, shape.expert_params) * m * host.core_share(accel, ranks_per_node)
        host_s = calls * parts.pop("dispatch_host_s")  # the all-to-alls' own host work, where timed
        return tuple((k, calls * v) for k, v in parts.items()) + (("dispatch_combine_s", a2a_s + host_s),)
    parts = moe_block.moe_parts(model, accel, local, layout.mbs, layout.tp, layout.ep, layout.ep_folds_tp)
    return moe_block.step_parts(parts, moe_block.moe_blocks_of(model, shape.expert_params) * m, a2a_s)


def _all_to_all_s(ops: list[Collective], skew_s: float) -> float:
    """The EP all-to-alls' seconds per step, with their share (by calls) of the wait for peers the
    scheduler has not run (cost/host.py ``sync_skew_seconds``, more ranks than cores)."""
    a2a = [op for op in ops if op.kind == "all_to_all" and op.dim == "ep"]
    if not a2a:  # a dense model or ep=1: every estimate passes through here
        return 0.0
    if not skew_s:
        return sum(op.seconds_per_step for op in a2a)
    calls = sum(op.count_per_step for op in ops if op.kind != "recv")
    share = sum(op.count_per_step for op in a2a) / calls if calls else 0.0
    return sum(op.seconds_per_step for op in a2a) + skew_s * share


def _linear_work(model: ModelSpec, local: TrainSpec, layout: Layout, shape: RankShape, m: int) -> tuple[float, float]:
    """(FLOPs, cast bytes) of the rank's linear layers in a step (the flat path's float8 part): 6 FLOPs
    per matmul parameter and token (8 with full recompute), casts as cost/fp8.py counts them."""
    tokens = local.seq_len * layout.mbs
    t, h = layout.tp, model.hidden
    width = kernels._mlp_width(model)
    mlp_in = (2 if model.mlp == "swiglu" else 1) * width / t
    flops = casts = 0.0
    for n, k in (((h + 2 * model.kv_dim) / t, h), (h, h / t), (mlp_in, h), (h, width / t)):
        flops += 2 * tokens * n * k * compute.recompute_factor(layout.ac)
        f, b = fp8.linear_cast_bytes(local, tokens, n, k)
        casts += f * (2 if layout.ac == "full" else 1) + b
    return m * shape.blocks * flops, m * shape.blocks * casts


def lower_bound_compute_s(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, stage_cache: dict | None = None
) -> float:
    """The cheaper lower bound of :func:`estimate`'s step, reading no ZeRO field: the slowest rank's
    compute plus the bubble's share of the mean rank's. :func:`lower_bound_step_s` on ranks sharing
    cores (CPU: ``host.core_share`` > 1, where the bubble speeds compute up)."""
    m = layout.accum(train.global_batch)
    counts = _shape_counts(stage_cache, model, layout)
    times = _times_of(stage_cache, model, cluster, train, layout, memory.rank_shapes(model, layout))
    mean_s = sum(c * t for c, t in zip(counts, times)) / sum(counts)
    return max(times) + pipeline.bubble_fraction(layout.schedule, layout.pp, layout.vpp, m) * mean_s


def lower_bound_step_s(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, stage_cache: dict | None = None
) -> float:
    """A step no shorter than :func:`estimate`'s, without its data-parallel collectives (their exposed
    seconds are never negative): the slowest rank's compute + TP + pipeline/expert + cp seconds, the
    bubble over the mean stage with its P2P latencies, as :func:`estimate` adds them (so the bound
    is below the step in floating point too). It reads the layout's dp only through tp, cp and pp,
    its ZeRO stage only through :func:`reduces_per_micro_batch` and none of ``shard``; add :func:`optimizer_seconds` for
    the whole step less the DP collectives. On ranks sharing cores (CPU: ``host.core_share`` > 1)
    it is :func:`lower_bound_compute_s`."""
    if host.core_share(cluster.accelerator, cluster.gpus_per_node) > 1:
        return lower_bound_compute_s(model, cluster, train, layout, stage_cache)
    _, parts, bubble_s = _stages_of(stage_cache, model, cluster, train, layout)
    return max(st.compute_s + st.tp_s + st.pp_s + st.cp_s for st in parts) + bubble_s


def lower_bound_experts_s(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, stage_cache: dict | None = None
) -> float:
    """Between :func:`lower_bound_step_s`'s compute-only bound and its tighter one, for a mixture of
    experts: the slowest rank's compute plus its expert-parallel collectives (experts.ep_collectives,
    on the critical path), plus the bubble over the mean compute. The tighter bound adds the same
    collectives' seconds to the same compute, with the pipeline sends and the exposed TP and cp
    seconds (all >= 0), and takes its bubble over stages no shorter than the compute, so this is
    below it in floating point too. It reads no ZeRO field nor ``shard``. On ranks sharing cores
    (where the tighter bound is compute plus bubble) it is the compute-only bound."""
    m = layout.accum(train.global_batch)
    shapes = memory.rank_shapes(model, layout)
    counts = _shape_counts(stage_cache, model, layout)
    times = _times_of(stage_cache, model, cluster, train, layout, shapes)
    mean_s = sum(c * t for c, t in zip(counts, times)) / sum(counts)
    bubble_s = pipeline.bubble_fraction(layout.schedule, layout.pp, layout.vpp, m) * mean_s
    if host.core_share(cluster.accelerator, cluster.gpus_per_node) > 1:
        return max(times) + bubble_s
    local = local_train(train, layout)
    ep_s = [
        experts.exposed_s(_comm_of(stage_cache, "ep", model, local, layout, s, m, cluster), t, train)
        for s, t in zip(shapes, times)
    ]
    return max(t + e for t, e in zip(times, ep_s)) + bubble_s


def rank_fields(layout: Layout) -> tuple:
    """The fields of a layout that a rank's stage seconds read but its data-parallel ones (dp, ZeRO,
    shard): the degrees and schedule, mbs, ac, ep and whether ep folds over tp. The per-rank memo's
    keys (and plan/bounds.py's) start with them."""
    return (
        layout.tp,
        layout.sp,
        layout.cp,
        layout.pp,
        layout.vpp,
        layout.schedule,
        layout.mbs,
        layout.ac,
        layout.ep,
        layout.ep_folds_tp,
    )


def _times_of(
    cache: dict | None,
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    shapes: tuple[RankShape, ...],
) -> list[float]:
    """:func:`_compute_of` of every rank shape of ``layout`` (memory.rank_shapes), kept in ``cache`` (when
    given) by the fields their keys read together (the shapes follow tp, pp, vpp and the schedule), so
    the two bounds that read them (:func:`lower_bound_step_s`, :func:`lower_bound_experts_s`) share them."""
    key = None
    if cache is not None:
        key = ("times", *rank_fields(layout), layout.dp)
        found = cache.get(key)
        if found is not None:
            return found
    times = [_compute_of(cache, model, cluster, train, layout, s) for s in shapes]
    if cache is not None:
        cache[key] = times
    return times


def _stage_of(
    cache: dict | None,
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    shape: RankShape,
    compute_s: float | None = None,
) -> StageParts:
    """:func:`_stage_seconds`, kept in ``cache`` (when given) by the fields it reads: no sharding group,
    the ZeRO stage only where it moves the TP group's norm reductions (:func:`reduces_per_micro_batch`),
    so a structure's sharding groups and ZeRO stages mostly share it. The world group's collective costs
    the same on every layout of a plan (every rank, 2 x 8 bytes) and only its name reads the layout
    (:func:`world_dim`): its seconds are in ``tp_s``, its name is not in ``tp_ops``. ``compute_s``: the
    rank's :func:`_compute_of` where the caller holds it."""
    if cache is None:
        return _stage_seconds(model, cluster, train, layout, shape, compute_s)
    key = (*rank_fields(layout), reduces_per_micro_batch(layout), layout.dp, shape.pp_rank, shape.chunk_blocks)
    return _memo(cache, key, _stage_seconds, model, cluster, train, layout, shape, compute_s, cache)


def reduces_per_micro_batch(layout: Layout) -> bool:
    """Whether FSDP2 reduces each micro-batch's gradients as computed (ZeRO-2/3 without PP): the one
    ZeRO field a rank's stage seconds read (the TP group's norm-weight reductions, :func:`_tp_collectives`)."""
    return layout.zero >= 2 and layout.pp == 1


def _compute_of(
    cache: dict | None, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, shape: RankShape
) -> float:
    """:func:`compute_seconds`, kept in ``cache`` (when given; :func:`_stage_of`'s, under keys of their
    own) by the fields it reads: dp and mbs (the micro-batch count), tp, sp, ac, cp, and the rank's
    blocks, model ends and (for a bare parameter count) parameters, and the schedule only as
    zero-bubble or not (its split backward, cost/host.py); bounds and estimates of layouts that
    differ in ZeRO or another schedule (or, for a dense model, in ep) share it. On the op model its
    two per-micro-batch parts are kept apart, each by the fields it reads (the blocks' by no ep, dp
    nor schedule), and multiplied by the micro-batch count as compute_seconds does."""
    if cache is None:
        return compute_seconds(model, cluster, train, layout, shape)
    accel = cluster.accelerator
    if accel.has_op_model and not model.states_only:  # compute_seconds' op-model path, its parts cached apart
        work = (layout.tp, layout.sp, layout.cp, layout.mbs, layout.ac)
        rank = (shape.blocks, shape.has_embedding, shape.has_head)
        total = _memo(cache, ("blocks", *work, *rank), _op_model_blocks_s, model, accel, train, layout, shape)
        if model.moe:
            experts = (shape.blocks, shape.expert_params, layout.ep, layout.ep_folds_tp)
            key = ("mlps", layout.tp, layout.cp, layout.mbs, layout.ac, *experts)
            total += _memo(cache, key, _op_model_mlps_s, model, accel, train, layout, shape)
        if shape.has_head and train.mtp_layers:  # cost/mtp.py, by the fields it reads
            key = ("mtp", *work, layout.ep, layout.ep_folds_tp)
            total += _memo(cache, key, mtp.mtp_seconds, model, accel, local_train(train, layout), layout)
        return layout.accum(train.global_batch) * total
    work = (layout.tp, layout.sp, layout.cp, layout.mbs, layout.ac, layout.dp)
    rank = (shape.blocks, shape.has_embedding, shape.has_head, shape.params)
    zero_bubble = layout.schedule == "zero-bubble" and layout.pp > 1
    key = ("compute", *work, *rank, layout.ep > 1 and layout.ep_folds_tp, zero_bubble, layout.ep if model.moe else 1)
    return _memo(cache, key, compute_seconds, model, cluster, train, layout, shape)


def _memo(cache: dict, key: tuple, compute: Callable[..., T], *args: object) -> T:
    """``compute(*args)``, kept in ``cache`` under ``key`` (the fields of its arguments it reads)."""
    found = cache.get(key)
    if found is None:
        found = cache[key] = compute(*args)
    return found


def _stage_seconds(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    shape: RankShape,
    compute_s: float | None = None,
    cache: dict | None = None,
) -> StageParts:
    """One rank's :class:`StageParts` (``compute_s``: its :func:`_compute_of` where the caller holds it;
    ``cache``: the plan's per-rank memo); its compute holds the pipeline schedule's own host work per
    stage call (cost/host.py ``pipeline_call_seconds``). The rank's own setting (:func:`local_train`)
    and micro-batches follow from ``train`` and ``layout``."""
    accel = cluster.accelerator
    local, m = local_train(train, layout), layout.accum(train.global_batch)
    if compute_s is None:
        compute_s = _compute_of(cache, model, cluster, train, layout, shape)
    if accel.pp_call_s and not model.states_only:  # 0 without pp (host.pipeline_call_seconds)
        compute_s += host.pipeline_call_seconds(accel, layout.pp, len(shape.chunk_blocks), m) * host.core_share(
            accel, cluster.gpus_per_node
        )
    tp_ops = _comm_of(cache, "tp", model, local, layout, shape, m, cluster)
    world_ops = _comm_of(cache, "world", model, local, layout, shape, m, cluster)
    pp_ops = _comm_of(cache, "pp", model, local, layout, shape, m, cluster)
    ep_ops = _comm_of(cache, "ep", model, local, layout, shape, m, cluster)  # exposed (critical path)
    kv_ops, cp_grad_ops = cp_collectives(model, local, layout, shape, m, cluster)
    # a profile whose ring steps were timed with their sends holds them in compute (cost/context_parallel.py)
    cp_s = 0.0 if accel.cp_step_includes_sends else cp_exposed(model, train, kv_ops, cp_grad_ops, compute_s)
    tp_s = _tp_exposed(sum(op.seconds_per_step for op in tp_ops + world_ops), compute_s, train, layout)
    pp_s = sum(op.seconds_per_step for op in pp_ops if op.kind == "send") + experts.exposed_s(ep_ops, compute_s, train)
    return StageParts(compute_s, tp_s, pp_s, cp_s, tp_ops, pp_ops, ep_ops, kv_ops, cp_grad_ops)


def _comm_key(kind: str, layout: Layout, shape: RankShape, m: int) -> tuple:
    """What the collectives of ``kind`` (:func:`_comm_of`) read of the layout, the rank and its
    micro-batches, beyond the plan's model, cluster and setting (cp: the rank's own setting)."""
    if kind == "tp":  # _tp_collectives: the norms' reductions read whether FSDP2 wraps, per micro-batch or step
        fsdp = fsdp_wrapped(layout)
        per_mb = fsdp and layout.zero >= 2 and layout.pp == 1
        rank = (shape.blocks, shape.has_embedding, shape.has_head, shape.expert_params)
        return ("tp", layout.tp, layout.sp, layout.mbs, layout.ac, layout.cp, m, fsdp, per_mb, *rank)
    if kind == "ep":  # experts.ep_collectives
        fields = (layout.ep, layout.tp, layout.ep_folds_tp, layout.mbs, layout.ac, layout.cp, m)
        return ("ep", *fields, shape.expert_params, shape.has_head)
    if kind == "pp":  # _pp_collectives: the link spans tp x cp x dp
        return ("pp", layout.pp, layout.mbs, layout.sp, layout.tp, layout.cp, layout.dp, m, shape.sends_per_mb)
    # _world_collectives: world_dim's fields
    return ("world", layout.dp, layout.shard, layout.cp, layout.tp, layout.pp, layout.zero == 0)


def _comm_of(
    cache: dict | None,
    kind: str,
    model: ModelSpec,
    local: TrainSpec,
    layout: Layout,
    shape: RankShape,
    m: int,
    cluster: ClusterSpec,
) -> list[Collective]:
    """The rank's collectives of ``kind`` (tp, ep, pp or world), kept in ``cache`` (when given: the
    plan's per-rank memo) by the fields they read (:func:`_comm_key`), so the layouts that differ
    only elsewhere (ZeRO, the schedule, the other degrees) share them. The lists are shared: callers
    only read them. Eight arguments: :func:`_stage_seconds`' setting, the kind and the memo."""
    key = _comm_key(kind, layout, shape, m) if cache is not None else None
    found = cache.get(key) if cache is not None else None
    if found is None:
        if kind == "tp":
            found = _tp_collectives(model, local, layout, shape, m, cluster)
        elif kind == "ep":
            found = experts.ep_collectives(model, local, layout, shape, m, cluster)
        elif kind == "pp":
            found = _pp_collectives(model, local, layout, shape, m, cluster)
        else:
            found = _world_collectives(layout, cluster)
        if cache is not None:
            cache[key] = found
    return found


def _bubble_seconds(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    m: int,
    stages: list[float],
    counts: tuple[int, ...],
) -> float:
    """The schedule's bubble fraction of the mean stage's seconds, plus one P2P latency per stage
    boundary crossed while filling and draining."""
    mean_stage_s = sum(c * t for c, t in zip(counts, stages)) / sum(counts)
    bubble_s = pipeline.bubble_fraction(layout.schedule, layout.pp, layout.vpp, m) * mean_stage_s
    if layout.pp > 1 and not model.states_only:
        bubble_s += 2 * (layout.pp - 1) * _p2p_latency_s(model, train, layout, cluster)
    return bubble_s


def optimizer_seconds(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, shapes: tuple[RankShape, ...]
) -> float:
    """The optimizer step of the busiest rank (memory-bound; on CPU ranks plus its operator launches),
    times the ranks per core. Reads zero only as ``zero >= 1``."""
    accel = cluster.accelerator
    local_opt_params = max(
        s.params / (layout.shard * layout.cp) if layout.zero >= 1 else memory.held(s.params, s.expert_params, layout)
        for s in shapes
    )
    opt_bytes = local_opt_params * (2 * train.optimizer_bytes + 2 * train.weight_bytes + train.grad_bytes)
    optimizer_s = opt_bytes / accel.hbm_bytes_per_s
    if host.is_host_bound(accel) and accel.dram_bytes_per_s:  # CPU ranks: DRAM, then the cache (cost/host.py)
        optimizer_s = host.optimizer_memory_seconds(accel, local_opt_params, train.weight_bytes)
    if not model.states_only and host.is_host_bound(accel):  # CPU ranks only
        tensors = max(host.parameter_tensors(model, s.blocks, s.has_embedding, s.has_head) for s in shapes)
        optimizer_s += host.optimizer_host_seconds(accel, tensors, dtensor_parameters(layout))
    return optimizer_s * host.core_share(accel, cluster.gpus_per_node)


def _fsdp_host_s(model: ModelSpec, accel: AcceleratorSpec, dp_ops: list[Collective], shape: RankShape) -> float:
    """FSDP2's work on a CPU rank's own core per step (cost/host.py): its copies in and out of the
    flat buffers where nothing overlaps them (``comm_overlap = false``), and on host-bound ranks its
    per-call and per-tensor host work. 0 on GPU profiles."""
    copies = host.fsdp_copy_seconds(dp_ops, accel) if not accel.comm_overlap else 0.0
    if model.states_only or not host.is_host_bound(accel):
        return copies
    tensors = host.parameter_tensors(model, shape.blocks, shape.has_embedding, shape.has_head)
    return copies + host.fsdp_host_seconds(accel, dp_ops, tensors, shape.units)


def _accumulation_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int
) -> float:
    """The rank's gradient sums over its micro-batches on host-bound (CPU) ranks (cost/host.py
    ``grad_accumulation_seconds``): of its gradient shards where FSDP2 reduces each micro-batch's
    gradients as computed (ZeRO-2/3 without PP, _dp_collectives_of), else of the gradients it holds
    unsharded. 0 on GPU profiles."""
    if model.states_only or not host.is_host_bound(accel) or m < 2:
        return 0.0
    sharded = fsdp_wrapped(layout) and layout.zero >= 2 and layout.pp == 1
    grads = (
        shape.params / (layout.shard * layout.cp) if sharded else memory.held(shape.params, shape.expert_params, layout)
    )
    return host.grad_accumulation_seconds(accel, grads, train.grad_bytes, m)


def fixed_seconds(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, shapes: tuple[RankShape, ...]
) -> float:
    """The step's fixed work on the busiest rank, times the ranks per core: on CPU ranks
    cost/host.py ``fixed_host_seconds``; 0 on GPU profiles."""
    accel = cluster.accelerator
    if model.states_only or not host.is_host_bound(accel):
        return 0.0
    tensors = max(host.parameter_tensors(model, s.blocks, s.has_embedding, s.has_head) for s in shapes)
    params = max(
        s.params / (layout.shard * layout.cp)
        if layout.zero >= 2  # the local gradients
        else memory.held(s.params, s.expert_params, layout)
        for s in shapes
    )
    return host.fixed_host_seconds(
        accel, tensors, dtensor_parameters(layout), params, train.grad_bytes
    ) * host.core_share(accel, cluster.gpus_per_node)


def _shape_counts(cache: dict | None, model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """How many pipeline ranks each of memory.rank_shapes stands for (for the mean stage), kept in
    ``cache`` (when given: a plan's, cost/plan_cache.py) by the fields it reads."""
    key = ("counts", layout.tp, layout.pp, layout.vpp, layout.schedule)
    counts = cache.get(key) if cache is not None else None
    if counts is None:
        distinct = memory.rank_shapes(model, layout)
        ident = [(s.chunk_blocks, s.has_embedding, s.has_head, s.sends_per_mb) for s in distinct]
        tally = [0] * len(distinct)
        for s in memory.all_rank_shapes(model, layout):
            tally[ident.index((s.chunk_blocks, s.has_embedding, s.has_head, s.sends_per_mb))] += 1
        counts = tuple(tally)
        if cache is not None:
            cache[key] = counts
    return counts


def _tp_exposed(tp_s: float, compute_s: float, train: TrainSpec, layout: Layout) -> float:
    """TP seconds on the critical path: all of them, or under TP overlap what the compute cannot hide
    and never less than the first of ``tp`` ring chunks."""
    if not tp_overlap_on(train, layout):
        return tp_s
    return max(tp_s - compute_s, tp_s / layout.tp)


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    layout: Layout,
    headroom: float = DEFAULT_HEADROOM,
    stage_cache: dict | None = None,
    memories: tuple[Memory, ...] | None = None,
) -> Estimate:
    """Estimate one (already validated) layout (``stage_cache``: a plan's per-rank memo, cost/plan_cache.py's
    ``PlanCache.stages``, shared with :func:`lower_bound_step_s` over one model, cluster and setting;
    ``memories``: :func:`rank_memories`' answer for the layout where the caller has it, as the search
    does from its peak cache)."""
    accel = cluster.accelerator
    m = layout.accum(train.global_batch)
    peak = accel.peak_flops_per_s(train.precision)
    shapes = memory.rank_shapes(model, layout)
    mems = rank_memories(model, cluster, train, layout) if memories is None else memories
    local = local_train(train, layout)
    share = host.core_share(accel, cluster.gpus_per_node)  # ranks per core (CPU, more ranks than cores)

    (busy, compute_s, tp_s, other_comm_s, shape, ops), stages = _busiest_rank(
        stage_cache, model, cluster, train, local, layout, shapes, m
    )
    bubble_s = _bubble_seconds(model, cluster, train, layout, m, stages, _shape_counts(stage_cache, model, layout))

    busy, compute_s, other_comm_s, bubble_s, skew_s = _time_shared(
        accel, cluster.gpus_per_node, share, (busy, compute_s, other_comm_s, bubble_s), ops
    )

    optimizer_s = optimizer_seconds(model, cluster, train, layout, shapes)
    fixed_s = fixed_seconds(model, cluster, train, layout, shapes)

    step_s = busy + bubble_s + optimizer_s + fixed_s
    tokens = train.tokens_per_step
    world = layout.world_size
    model_flops = compute.model_flops(model, train.seq_len, tokens)
    hw_flops = compute.hardware_flops(model, train.seq_len, tokens, layout.ac)
    model_tflops = model_flops / (world * step_s) / 1e12
    hw_tflops = hw_flops / (world * step_s) / 1e12
    largest = max(mems, key=lambda mm: mm.total)
    return Estimate(
        layout=layout,
        global_batch=train.global_batch,
        fits=fits(largest.total, cluster, headroom),
        memory=largest,
        rank_memory=mems,
        time=StepTime(
            step_s,
            compute_s,
            tp_s + other_comm_s,
            bubble_s,
            optimizer_s,
            fixed_s,
            _moe_split(model, accel, local, layout, shape, m, _all_to_all_s(ops, skew_s), cluster.gpus_per_node),
        ),
        comm=tuple(ops),
        tokens_per_s=tokens / step_s,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw_tflops,
        mfu=model_tflops * 1e12 / peak,
        hfu=hw_tflops * 1e12 / peak,
        rank_pp=memory.rank_groups(model, layout),
    )


def _busiest_rank(stage_cache, model, cluster, train, local, layout, shapes, m) -> tuple[tuple, list[float]]:
    """The busiest rank's (busy, compute + beside, tp, other comm seconds, shape, collectives) and
    every rank's compute + tp + cp seconds (the bubble reads them). Eight arguments: :func:`estimate`'s
    setting, the layout's rank shapes and its micro-batches."""
    accel = cluster.accelerator
    share = host.core_share(accel, cluster.gpus_per_node)
    worst = None
    stages: list[float] = []
    for shape in shapes:
        st = _stage_of(stage_cache, model, cluster, train, layout, shape)
        compute_s, tp_s, pp_s, cp_s = st.compute_s, st.tp_s, st.pp_s, st.cp_s
        tp_ops, pp_ops, ep_ops, kv_ops, cp_grad_ops = st.tp_ops, st.pp_ops, st.ep_ops, st.kv_ops, st.cp_grad_ops
        tp_ops = tp_ops + _comm_of(stage_cache, "world", model, local, layout, shape, m, cluster)
        dp_mb_ops, dp_step_ops = _dp_of(stage_cache, model, train, layout, shape, m, cluster)
        dp_s = _dp_exposed_s(train, accel, layout, shape, m, compute_s, (dp_mb_ops, dp_step_ops))
        # FSDP2's own work and the gradient sums: compute on the rank's core, beside the kernels
        beside_s = share * (
            _fsdp_host_s(model, accel, dp_mb_ops + dp_step_ops, shape)
            + _accumulation_s(model, accel, train, layout, shape, m)
        )
        busy = compute_s + beside_s + tp_s + pp_s + dp_s + cp_s
        stages.append(compute_s + tp_s + cp_s)
        if worst is None or busy > worst[0]:
            worst = (
                busy,
                compute_s + beside_s,
                tp_s,
                pp_s + dp_s + cp_s,
                shape,
                _merge(dp_mb_ops + dp_step_ops + tp_ops + pp_ops + ep_ops + kv_ops + cp_grad_ops),
            )
    return worst, stages


def _time_shared(
    accel, gpus_per_node: int, share: float, times: tuple, ops
) -> tuple[float, float, float, float, float]:
    """(busy, compute, other comm, bubble, skew seconds) with more ranks than cores (``share`` > 1): the
    peers' skew at every collective (cost/host.py), and compute time-shared but sped up by the bubble."""
    busy, compute_s, other_comm_s, bubble_s = times
    skew_s = 0.0
    if share > 1:  # peers not yet run by the scheduler: waits at every collective and send (cost/host.py)
        skew_s = host.sync_skew_seconds(
            accel, gpus_per_node, compute_s / share, sum(op.count_per_step for op in ops if op.kind != "recv")
        )
        busy, other_comm_s = busy + skew_s, other_comm_s + skew_s
    if share > 1 and bubble_s > 0:
        # More ranks than cores: compute is time-shared (x share). A stage waiting in the bubble
        # sleeps and its core goes to the other ranks, which compute faster by 1 / (the busy
        # fraction), at most by the share (a core each).
        speedup = min(share, (busy + bubble_s) / busy)
        busy -= compute_s * (1 - 1 / speedup)
        compute_s, bubble_s = compute_s / speedup, bubble_s / speedup
    return busy, compute_s, other_comm_s, bubble_s, skew_s
