"""The torch side of ``meshwise calibrate``: one rank's microbenchmarks (see
:mod:`meshwise.measure.calibrate` for what each measures and how the profile is derived)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from meshwise.cost.compute import attention_core_flops_per_token, model_flops
from meshwise.cost.host import linear_gemm_shapes, ops_per_microbatch, parameter_tensors
from meshwise.files import write_atomically
from meshwise.launch import init_process_group
from meshwise.layout import parse
from meshwise.measure.calibrate import (
    COLLECTIVE_SIZES_BYTES,
    COPY_BYTES,
    DRAM_COPY_BYTES,
    HOST_TOKENS,
    LOSS_SHAPES,
    RING_HEADS,
    RING_KV_HEADS,
    RING_SHAPES,
    SDPA_SHAPES,
    calibration_memory_bound_bytes,
    gemm_grid,
)
from meshwise.measure.comm_trace import CollectiveTrace
from meshwise.measure.plan_shapes import ring_step, time_loss
from meshwise.measure.probe import bench_matmul, block_gemm_shapes
from meshwise.measure.probe import best_time as _best_time
from meshwise.measure.probe import typical_time as _typical_time
from meshwise.runtime._torch_private import split_backward, timed_waits
from meshwise.runtime.activation_checkpointing import apply_activation_checkpointing
from meshwise.runtime.context_parallel import RingGroup, ring_attention
from meshwise.runtime.mesh import end_process_group
from meshwise.runtime.model import Transformer, build_model, causal_attention, init_weights, loss_sum
from meshwise.runtime.optim import OptimizerConfig, build_optimizer
from meshwise.runtime.pipeline import build_schedule, build_stages, chunk_bounds
from meshwise.runtime.tensor_parallel import apply_tensor_parallel
from meshwise.spec import ModelSpec, load_model


def bench_gemm_grid(quick: bool, repeats: int) -> list[list[float]]:
    """``[M, N, K, seconds]`` of one fp32 GEMM ``X (M x K) @ W^T`` (``torch.nn.functional.linear``,
    as the model calls it) per shape of ``calibrate.gemm_grid``: the best of several timings."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for m, n, k in gemm_grid(quick):
        x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
        torch.nn.functional.linear(x, w)
        best_s = _best_time(lambda: torch.nn.functional.linear(x, w), (2 if quick else 3) * repeats, 0.002)
        out.append([m, n, k, best_s])
    return out


def bench_ring(repeats: int) -> list[list[float]]:
    """``[score elements, head width, seconds]`` of one ring step (plan_shapes ``ring_step``) per (local
    sequence, head width) of ``calibrate.RING_SHAPES``, ``RING_HEADS`` query heads over
    ``RING_KV_HEADS`` K/V heads: the median of several timings (probe.typical_time: a step pays the
    kernel's typical time)."""
    out = []
    for seq, d in RING_SHAPES:
        step = ring_step(seq, d, RING_HEADS, RING_KV_HEADS)
        step()
        out.append([float(RING_HEADS * seq * seq), float(d), _typical_time(step, 3 * repeats, 0.002)])
    return out


def _attention_inputs(seq: int, d: int, gen):
    """(q, k, v, output gradient) of one sequence: ``RING_HEADS`` query heads over ``RING_KV_HEADS``
    K/V heads of width ``d``, q, k, v requiring gradients."""
    q = torch.randn(1, RING_HEADS, seq, d, generator=gen).requires_grad_()
    k, v = (torch.randn(1, RING_KV_HEADS, seq, d, generator=gen).requires_grad_() for _ in range(2))
    return q, k, v, torch.randn(1, RING_HEADS, seq, d, generator=gen)


def bench_ring_calls(repeats: int, group) -> list[list[float]]:
    """``[score elements per ring step, head width, seconds per ring step]`` of the runtime's whole
    ring-attention call (meshwise.runtime.context_parallel ``ring_attention``, forward + backward,
    fp32) over a ring of the two ranks of ``group``, per (local sequence, head width) of
    ``calibrate.RING_SHAPES``: the median of several lock-step timings, halved (two ring steps per
    call). Unlike :func:`bench_ring` it holds what a step pays around the blocks: the K/V and dK/dV
    sends and receives on this host's gloo (their CPU work shares the rank's core), the
    accumulators, the positions and the concatenations."""
    ranks = dist.get_process_group_ranks(group)
    me = ranks.index(dist.get_rank())
    ring = RingGroup(group, me, 2, ranks[(me + 1) % 2], ranks[(me - 1) % 2])
    gen = torch.Generator().manual_seed(me)
    out = []
    for seq, d in RING_SHAPES:
        q, k, v, grad = _attention_inputs(seq, d, gen)

        def call() -> None:
            ring_attention(q, k, v, ring).backward(grad)

        call()
        out.append(
            [float(RING_HEADS * seq * seq), float(d), _lockstep_time(call, 3 * repeats, 1, group, typical=True) / 2]
        )
    return out


def bench_sdpa(repeats: int) -> list[list[float]]:
    """``[score elements, head width, seconds]`` of one causal attention call forward + backward
    (meshwise.runtime.model ``causal_attention``: torch's SDPA, as a block calls it; fp32) per
    (sequence, head width) of ``calibrate.SDPA_SHAPES``, ``RING_HEADS`` query heads over
    ``RING_KV_HEADS`` K/V heads, one sequence: the median of several timings (probe.typical_time)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for seq, d in SDPA_SHAPES:
        q, k, v, grad = _attention_inputs(seq, d, gen)

        def call() -> None:
            causal_attention(q, k, v).backward(grad)

        call()
        out.append([float(RING_HEADS * seq * seq), float(d), _typical_time(call, 3 * repeats, 0.002)])
    return out


def bench_loss(shapes, repeats: int) -> list[list[float]]:
    """``[tokens, vocab, seconds]`` of the loss (runtime/model.py ``loss_sum``: cross-entropy over
    fp32 logits, forward + backward) per (tokens, vocab) of ``shapes``: the median of several
    timings (probe.typical_time)."""
    return [[float(t), float(v), time_loss(t, v, repeats)] for t, v in shapes]


FORWARD_BACKWARD_RUNS = 7  # per repeat: the median of these single passes


def bench_forward_backward(model: ModelSpec, seq: int, repeats: int) -> float:
    """Seconds of one forward + backward of the whole model on one sequence of ``seq`` tokens: the
    median of ``FORWARD_BACKWARD_RUNS * repeats`` passes, every active rank running its own at once
    (the phase starts at a barrier). The median, not the best: a step pays a pass at its typical
    speed beside the other ranks, and the slowest rank sets it (on a 2-core VM the slower rank's
    median read 1.05-1.35x the best pass of one process alone, its best 1.0-1.2x)."""
    net = build_model(model, seed=0)
    tokens = torch.randint(0, model.vocab, (1, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def run() -> None:
        net.zero_grad(set_to_none=True)
        loss_sum(net(x), y).backward()

    run()
    times = []
    for _ in range(FORWARD_BACKWARD_RUNS * repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_split_backward(model: ModelSpec, repeats: int) -> list[float]:
    """``[seconds of a plain pass, seconds of a split pass]``: the calibration model's blocks as a
    middle pipeline stage (hidden states in, hidden states out) on ``HOST_TOKENS`` tokens, forward
    then backward, the backward either in one pass or as the zero-bubble schedules run it, input
    gradients then weights' (runtime._torch_private ``split_backward``); each the median of
    ``5 * repeats`` passes, in three alternating rounds (the median round). Host time: the
    arithmetic is negligible at four tokens."""
    stage = build_model(model, seed=0).keep_only(0, model.layers, first=False, last=False)
    params = list(stage.parameters())
    x0 = torch.randn(1, HOST_TOKENS, model.hidden, generator=torch.Generator().manual_seed(0))

    def plain() -> None:
        stage.zero_grad(set_to_none=True)
        out = stage(x0.clone().requires_grad_())
        out.backward(torch.ones_like(out))

    def split() -> None:
        stage.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out = stage(x)
        split_backward(out, torch.ones_like(out), [x], params)

    plain()
    split()
    rounds = [[_typical_time(plain, 5 * repeats), _typical_time(split, 5 * repeats)] for _ in range(3)]
    return [statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)]


def bench_host(model: ModelSpec, repeats: int) -> dict[str, float]:
    """Seconds of one forward + backward on ``HOST_TOKENS`` tokens under each checkpointing mode
    (the runtime's own wrappers): host time, the arithmetic being negligible; the median pass, as
    the forward + backward's (probe.typical_time)."""
    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    out: dict[str, float] = {}
    for mode in ("none", "full", "selective"):
        net = build_model(model, seed=0)
        apply_activation_checkpointing(net, mode)

        def run() -> None:
            net.zero_grad(set_to_none=True)
            loss_sum(net(x), y).backward()

        run()
        out[mode] = _typical_time(run, 5 * repeats)
    return out


def runs_tp2(model: ModelSpec) -> bool:
    """Whether ``model`` splits over tp=2 (heads, KV heads, MLP width and vocabulary even)."""
    return all(x % 2 == 0 for x in (model.heads, model.kv_heads, model.ffn_hidden, model.vocab))


def bench_tp_host(model: ModelSpec, repeats: int, active: bool, calls: int = 5) -> dict[bool, tuple[float, int, float]]:
    """Per sequence-parallel mode (False, True): (seconds of one forward + backward on
    ``HOST_TOKENS`` tokens of ``model`` under tp=2 (the runtime's TP plan, with SP off or on) on
    every ``active`` pair of ranks at once, the TP collectives one such micro-batch issues, the
    seconds of it spent blocked on them (``timed_waits``: the transfers are communication, not
    DTensor's work)), both of the pass whose time less its waits is the median, as the plain pass
    is timed. Every pass starts at a barrier: the ranks must issue
    the same collectives. Inactive ranks build the model (mesh creation is collective) and pass the
    same barriers."""
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("pairs", "tp"))
    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    out: dict[bool, tuple[float, int, float]] = {}
    for sp in (False, True):
        with torch.device("meta"):
            net = Transformer(model)
        apply_tensor_parallel(net, mesh["tp"], sp=sp)
        net.to_empty(device="cpu")
        net.tie_weights()
        init_weights(net, model, 0)

        def run() -> None:
            net.zero_grad(set_to_none=True)
            loss_sum(net(x), y).backward()

        if not active:
            for _ in range(repeats * calls):
                dist.barrier()
            out[sp] = (0.0, 0, 0.0)
            continue
        with CollectiveTrace(mesh) as trace:
            run()
        passes = _passes_with_waits(run, repeats * calls)
        seconds, waits = sorted(passes, key=lambda p: p[0] - p[1])[len(passes) // 2]
        out[sp] = (seconds, sum(trace.calls.values()), waits)
    return out


PP_MICROBATCHES = 4  # micro-batches of the pipeline benchmark's GPipe step


def bench_pp_host(model: ModelSpec, repeats: int, active: bool, calls: int = 10) -> list[float]:
    """``[seconds of a GPipe step less its waits, seconds of the same stage's plain passes, stage
    calls]`` on this rank: the calibration model split in two pipeline stages over each ``active``
    pair of ranks (the runtime's own stages and schedule, runtime/pipeline.py), ``PP_MICROBATCHES``
    micro-batches of ``HOST_TOKENS`` tokens (host time: the arithmetic is negligible), against the
    same stage module's forward + backward over as many micro-batches with no schedule, timed just
    after it: of ``repeats * calls`` such pairs, the one whose difference is the median, every pass
    started at a barrier (``timed_waits``: a P2P receive's wait is the peer's work, not this
    rank's). ``[]`` on an inactive rank, which passes the same barriers."""
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("pairs", "pp"))
    count = repeats * calls
    dist.barrier()
    if not active:
        for _ in range(2 * count):  # the active ranks' two timed passes per pair
            dist.barrier()
        return []
    layout, m = parse("pp=2,schedule=gpipe,mbs=1", 2), PP_MICROBATCHES
    rank = mesh.get_local_rank("pp")
    first, blocks = chunk_bounds(model, layout, rank)
    stage = build_model(model, seed=0).keep_only(first, blocks, first=rank == 0, last=rank == 1)
    stages = build_stages([stage], [rank], model, layout, mesh["pp"], torch.device("cpu"), HOST_TOKENS, torch.float32)
    schedule = build_schedule(stages, layout, m, loss_sum)
    tokens = torch.randint(0, model.vocab, (m, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    hidden = torch.randn(1, HOST_TOKENS, model.hidden, generator=torch.Generator().manual_seed(0))

    def step() -> None:
        stage.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x, return_outputs=False)
        else:
            schedule.step(target=y, losses=[], return_outputs=False)

    def plain() -> None:
        stage.zero_grad(set_to_none=True)
        for i in range(m):
            if rank == 0:
                out = stage(x[i : i + 1])
                out.backward(torch.ones_like(out))
            else:
                loss_sum(stage(hidden.clone().requires_grad_()), y[i : i + 1]).backward()

    step()
    plain()
    pairs = []  # each step beside the plain passes just after it: the host's drift cancels in the pair
    for _ in range(count):
        ((seconds, waits),) = _passes_with_waits(step, 1)
        ((plain_s, _),) = _passes_with_waits(plain, 1)
        pairs.append((seconds - waits, plain_s))
    return [*sorted(pairs, key=lambda p: p[0] - p[1])[len(pairs) // 2], 2 * m]


def _passes_with_waits(run, count: int) -> list[tuple[float, float]]:
    """(seconds, of them blocked on collectives) of ``count`` passes of ``run``, each started at a
    barrier (the ranks must issue the same collectives); the waits timed by ``timed_waits``."""
    blocked = [0.0]
    passes = []
    with timed_waits(lambda kind, seconds: blocked.__setitem__(0, blocked[0] + seconds)):
        for _ in range(count):
            dist.barrier()
            blocked[0], start = 0.0, time.perf_counter()
            run()
            passes.append((time.perf_counter() - start, blocked[0]))
    return passes


FSDP_WIDE_HIDDEN = 512  # the wide wrapping's least hidden size: a block's unit of ~14 MB, past a core's L2


def wide_model(model: ModelSpec) -> ModelSpec:
    """The calibration model widened (hidden and MLP width by ``max(2, ceil(FSDP_WIDE_HIDDEN / hidden))``,
    heads kept): the same parameter tensors and FSDP2 calls, several times the bytes."""
    f = max(2, -(-FSDP_WIDE_HIDDEN // model.hidden))
    return replace(
        model,
        name=f"{model.name}-wide",
        hidden=model.hidden * f,
        ffn_hidden=model.ffn_hidden * f,
        head_dim=model.head_dim * f if model.head_dim else 0,
        param_count=None,
    )


def _shard_blocks(net, mesh, per_unit: int) -> None:
    """``fully_shard`` over every ``per_unit`` consecutive blocks, then the root, parameters
    resharded after forward (ZeRO-3), as the runtime wraps a model (runtime/data_parallel.py)."""
    blocks = list(net.layers.values())
    for i in range(0, len(blocks), per_unit):
        fully_shard(blocks[i : i + per_unit], mesh=mesh, reshard_after_forward=True)
    fully_shard(net, mesh=mesh, reshard_after_forward=True)


def bench_fsdp_host(model: ModelSpec, repeats: int) -> dict[str, list[float]]:
    """FSDP2's own host cost on every rank at once (``fully_shard`` over all ranks, parameters
    resharded after forward, as ZeRO-3): per wrapping, ``[seconds, collective calls, bytes, plain
    seconds]``: one forward + backward on ``HOST_TOKENS`` tokens with every blocking wait on a
    collective taken out (``timed_waits``: the transfer is communication, not FSDP2's work), and
    the same pass of the same model unwrapped. Three wrappings: ``blocks`` (one unit per block,
    then the root, as the runtime wraps) and ``pairs`` (one unit per two consecutive blocks, then
    the root) of the calibration model: every parameter tensor is gathered and reduced as often in
    both, the calls differ; ``wide``: ``blocks`` of :func:`wide_model`, the same tensors and calls
    over several times the bytes. So the cost per call, per tensor per call and per byte can be told
    apart (calibrate.fsdp_constants). (The whole model as one unit would not do: its one large
    buffer pays page faults per byte that the runtime's units do not.)"""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    out: dict[str, list[float]] = {}
    for mode, spec, per_unit in (("blocks", model, 1), ("pairs", model, 2), ("wide", wide_model(model), 1)):
        net = build_model(spec, seed=0)

        def run() -> None:
            net.zero_grad(set_to_none=True)
            loss_sum(net(x), y).backward()

        def timed() -> float:
            return statistics.median(seconds - waits for seconds, waits in _passes_with_waits(run, 5 * repeats))

        run()
        plain_s = timed()
        _shard_blocks(net, mesh, per_unit)
        with CollectiveTrace(mesh) as trace:
            run()
        keys = [key for key in trace.calls if key.kind in ("all_gather", "reduce_scatter")]
        out[mode] = [
            timed(),
            float(sum(trace.calls[k] for k in keys)),
            float(sum(trace.bytes[k] for k in keys)),
            plain_s,
        ]
    return out


def bench_optimizer_host(model: ModelSpec, repeats: int) -> list[float]:
    """``[seconds of a DTensor step, seconds of a plain step, parameter tensors]``: one step of the
    runtime's AdamW (runtime/optim.py) over ``model``'s parameters as FSDP2 shards them over every
    rank (``fully_shard`` per block, then the root: DTensor parameters), and over the same model's
    plain parameters, every rank at once, the median of ``10 * repeats``. Off CUDA AdamW loops over the
    tensors one by one, each of its operators a DTensor dispatch whose cost is the rank's core's,
    not the operator's arithmetic (calibrate.profile_table: ``optimizer_dtensor_s``)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    out = []
    for sharded in (True, False):
        net = build_model(model, seed=0)
        if sharded:
            _shard_blocks(net, mesh, 1)
        params = list(net.parameters())
        optimizer = build_optimizer(params, OptimizerConfig())
        loss_sum(net(tokens[:, :-1]), tokens[:, 1:]).backward()
        optimizer.step()  # the states exist from here on
        out.append(_lockstep_time(optimizer.step, 10 * repeats, 1, typical=True))
    return [*out, float(len(params))]


def _lockstep_time(fn, repeats: int, calls: int, group=None, typical: bool = False) -> float:
    """Seconds per call of ``fn``: the best (``typical``: the median) of ``repeats`` runs of
    ``calls`` calls, every rank of ``group`` (default: all) starting each run at a barrier (a fixed
    count: ranks must issue the same collectives)."""
    runs = []
    for _ in range(repeats):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(time.perf_counter() - start)
    return (statistics.median(runs) if typical else min(runs)) / calls


def bench_copy(nbytes: int, repeats: int) -> float:
    """Bytes per second read + written by a tensor copy of ``nbytes``."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2.0 * nbytes / _best_time(lambda: dst.copy_(src), 5 * repeats)


COLLECTIVE_RUNS = 5  # lock-step runs per collective and size: the median of five


def bench_collectives(
    model: ModelSpec, tokens: int, sizes: tuple[int, ...], calls: int, repeats: int, group=None
) -> list[list[float]]:
    """``[kind, n, payload_bytes, seconds]`` per kind and size over ``group`` (default: all ranks).
    Each call follows a slice of compute (one block's GEMMs at ``tokens`` tokens), as in training;
    seconds per call = ``(median time of calls x (compute + call) - median time of calls x compute) /
    calls``, at least the tight-loop time of the call alone, each over ``COLLECTIVE_RUNS`` runs or
    more. The median, not the best: a collective's time on a shared CPU varies from run to run
    (the best read 1.3-1.9x faster than the median on this 2-core host), and a step pays the
    typical one, not its luckiest."""
    n = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randn(tokens, k, generator=gen), torch.randn(m, k, generator=gen)) for k, m in block_gemm_shapes(model)
    ]

    def compute() -> None:
        for x, w in pairs:
            torch.nn.functional.linear(x, w)

    def loop(op) -> float:
        return _lockstep_time(op, max(COLLECTIVE_RUNS, repeats), calls, group, typical=True)

    compute_s = loop(compute)
    out: list[list[float]] = []
    for nbytes in sizes:
        numel = max(n, nbytes // 4 // n * n)
        full = torch.ones(numel)
        shard = torch.ones(numel // n)
        exchanged = torch.empty_like(full)
        ops = {
            "all_reduce": lambda: dist.all_reduce(full, group=group),
            "all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=group),
            "all_to_all": lambda: dist.all_to_all_single(exchanged, full, group=group),
        }
        for kind, op in ops.items():
            op()
            alone_s = loop(op)
            between_s = loop(lambda: (compute(), op())) - compute_s
            out.append([kind, n, float(numel * 4), max(alone_s, between_s)])
    return out


SKEW_GEMM_SIDE = 256  # the slices' GEMM: 2 * 256^3 = 34 MFLOP, a third of a millisecond on one x86 core
SKEW_SLICE_GEMMS = (0, 4, 16)  # GEMMs per slice: none, about 1.3 ms and 5 ms of one core's compute
SKEW_PASSES = 5  # the whole benchmark this many times: one pass's ratio read 0.06-1.09 on one host
# within a minute (docs/fidelity.md); calibrate.sync_skew
# takes the passes' median


def bench_sync_skew(repeats: int, calls: int, passes: int = SKEW_PASSES) -> list[list[float]]:
    """``[slice FLOPs, seconds of the slice alone, seconds of the slice then a 4 KiB all-reduce, pass]``
    per slice of ``SKEW_SLICE_GEMMS`` GEMMs and pass, every rank at once (lock-step, the median of
    ``COLLECTIVE_RUNS`` runs of ``calls``): with more ranks than cores a rank that reaches the
    all-reduce waits for peers the scheduler has not finished running, a wait that grows with the
    compute before it (calibrate.sync_skew fits it, pass by pass)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(SKEW_GEMM_SIDE, SKEW_GEMM_SIDE, generator=gen) for _ in range(2))
    small = torch.ones(1024)
    out = []
    for index in range(passes):
        for gemms in SKEW_SLICE_GEMMS:

            def compute(k: int = gemms) -> None:
                for _ in range(k):
                    torch.mm(a, b)

            def both() -> None:
                compute()
                dist.all_reduce(small)

            runs = max(COLLECTIVE_RUNS, repeats)
            alone_s = _lockstep_time(compute, runs, calls, typical=True) if gemms else 0.0
            both()
            out.append(
                [
                    2.0 * gemms * SKEW_GEMM_SIDE**3,
                    alone_s,
                    _lockstep_time(both, runs, calls, typical=True),
                    float(index),
                ]
            )
    return out


def _per_rank(model: ModelSpec, seq: int, quick: bool, repeats: int, active: bool, phase) -> dict:
    """The per-rank benchmarks (on ``active`` ranks; every rank passes each ``phase`` barrier).

    The figures a CPU step rests on (the block GEMMs' rate, the model's forward + backward, the
    host passes) are timed in three bursts spread over the phase (``passes_1`` to ``passes_3``), each figure the median
    of its bursts: with two ranks at once on a 2-core VM, one burst's figures moved
    by 0.8-1.4x within a minute (forward + backward 45-68 ms, host 12-20 ms), and six calibrations
    in a row read the compute rate 4.5e10 to 8.0e10 FLOP/s."""
    bursts: list[dict] = []

    def burst() -> dict:
        bursts.append(
            {
                "matmul_flops_per_s": bench_matmul(model, seq, repeats),
                "fwd_bwd_s": bench_forward_backward(model, seq, repeats),
                "host_s": bench_host(model, repeats),
            }
        )
        return {}

    benches = (
        ("passes_1", burst),
        ("gemm_grid", lambda: {"gemm_grid": bench_gemm_grid(quick, repeats)}),
        ("passes_2", burst),
        (
            "copy",
            lambda: {
                "copy_bytes_per_s": bench_copy(COPY_BYTES, repeats),
                "dram_copy_bytes_per_s": bench_copy(DRAM_COPY_BYTES, 1 if quick else repeats),
            },
        ),
        (
            "ring",
            lambda: {
                "ring": bench_ring(repeats),
                "sdpa": bench_sdpa(repeats),
                "loss": bench_loss(LOSS_SHAPES, repeats),
                "split_backward_s": bench_split_backward(model, repeats),
            },
        ),
        ("passes_3", burst),
    )
    mine: dict = {}
    for name, bench in benches:
        if active:
            mine |= bench()
        phase(name)
    return mine | median_of_bursts(bursts) if bursts else mine


def median_of_bursts(bursts: list[dict]) -> dict:
    """Each figure's median over the bursts (the host passes mode by mode)."""
    return {
        "matmul_flops_per_s": statistics.median(b["matmul_flops_per_s"] for b in bursts),
        "fwd_bwd_s": statistics.median(b["fwd_bwd_s"] for b in bursts),
        "host_s": {mode: statistics.median(b["host_s"][mode] for b in bursts) for mode in bursts[0]["host_s"]},
    }


def main(argv: list[str] | None = None) -> int:
    """One rank: every benchmark at once on every rank; rank 0 writes ``<out>/result.json`` with the
    slowest rank's figures (lowest rates, longest times)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.model)
    repeats = 2 if args.quick else 3
    init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    phases: dict[str, float] = {}
    clock = [time.perf_counter()]

    def phase(name: str) -> None:
        dist.barrier()
        now = time.perf_counter()
        phases[name] = now - clock[0]
        clock[0] = now

    phase("start")
    # Per-rank figures with at most one rank per core: with more ranks than cores the others wait,
    # so the profile holds a rank's speed on a core of its own; the cost model time-shares it
    # (cost/estimate.py ``core_share``). Collectives are measured with every rank.
    cores = os.cpu_count() or 1
    alone = min(n, cores)
    active = rank < alone
    mine = _per_rank(model, args.seq_len, args.quick, repeats, active, phase)
    if n > 1 and cores > 1:  # context parallelism's whole ring call on a ring of two ranks, the others waiting
        pair = dist.new_group([0, 1])
        if rank < 2:
            mine["ring_calls"] = bench_ring_calls(repeats, pair)
    phase("ring_calls")
    pairs = max(1, alone // 2)
    not_timed = dict.fromkeys((False, True), (0.0, 0, 0.0))
    tp = bench_tp_host(model, repeats, rank < 2 * pairs) if n % 2 == 0 and runs_tp2(model) else not_timed
    phase("tp_host")
    if n % 2 == 0 and model.layers >= 2:
        mine["pp_host"] = bench_pp_host(model, repeats, rank < 2 * pairs)
    phase("pp_host")
    fsdp = bench_fsdp_host(model, repeats) if n > 1 else {}
    phase("fsdp_host")
    optimizer = bench_optimizer_host(model, repeats) if n > 1 else []
    phase("optimizer_host")
    sizes = COLLECTIVE_SIZES_BYTES[::2] if args.quick else COLLECTIVE_SIZES_BYTES
    calls = 4 if args.quick else 8
    collectives = bench_collectives(model, args.seq_len, sizes, calls, repeats) if n > 1 else []
    phase("collectives")
    alone_collectives: list[list[float]] = []
    if n > cores and n % 2 == 0 and runs_tp2(model):  # the TP benchmark's pairs ran alone: so do these
        group = dist.new_group(list(range(2 * pairs)))
        if rank < 2 * pairs:
            alone_collectives = bench_collectives(model, args.seq_len, sizes[:1], calls, repeats, group)
    phase("collectives_alone")
    skew = bench_sync_skew(repeats, calls) if n > cores else []
    phase("sync_skew")
    everyone: list[dict] = [{} for _ in range(n)]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        result = _slowest(everyone, model, args.seq_len, cores, tp, collectives)
        extras = {"optimizer_host_s": optimizer, "tp_collectives_alone": alone_collectives, "sync_skew": skew}
        result |= {"fsdp_host_s": fsdp, **{k: v for k, v in extras.items() if v}, "phase_s": phases}
        write_atomically(Path(args.out) / "result.json", json.dumps(result))
    dist.barrier()
    end_process_group()
    return 0


def _slowest(
    everyone: list[dict],
    model: ModelSpec,
    seq: int,
    cores: int,
    tp: dict[bool, tuple[float, int, float]],
    collectives: list[list[float]],
) -> dict:
    """The result file: the slowest rank's figures (lowest rates, longest times), and the counts
    profile_table needs to read them. Per-rank figures come from the ranks that measured them (one
    per core at most); ``what`` says how many ran."""
    n = len(everyone)
    host_block = linear_gemm_shapes(model, HOST_TOKENS, 1, False)  # the host benchmark's GEMMs, one block
    ring_calls = [r["ring_calls"] for r in everyone if r.get("ring_calls")]
    pp_host = [r["pp_host"] for r in everyone if r.get("pp_host")]
    everyone = [r for r in everyone if "fwd_bwd_s" in r]
    return {
        "matmul_flops_per_s": min(r["matmul_flops_per_s"] for r in everyone),
        "fwd_bwd_s": max(r["fwd_bwd_s"] for r in everyone),
        "copy_bytes_per_s": min(r["copy_bytes_per_s"] for r in everyone),
        "dram_copy_bytes_per_s": min(r["dram_copy_bytes_per_s"] for r in everyone),
        "model_flops": model_flops(model, seq, seq),
        "model_ops": ops_per_microbatch(model.layers, True, True),
        "sdpa_model": [
            model.heads,
            seq,
            model.head_dim,
            3 * model.layers * seq * attention_core_flops_per_token(model, seq),
        ],
        "memory_bound_bytes": calibration_memory_bound_bytes(model, seq),
        "loss_logits": [seq, model.vocab],
        "blocks": model.layers,
        "model_tensors": parameter_tensors(model, model.layers, True, True),
        "gemm_grid": [
            [*shape[:3], max(r["gemm_grid"][i][3] for r in everyone)]
            for i, shape in enumerate(everyone[0]["gemm_grid"])
        ],
        "gemm_reference_shapes": linear_gemm_shapes(model, seq, 1, False),
        "host_s": {k: max(r["host_s"][k] for r in everyone) for k in everyone[0]["host_s"]},
        "split_backward_s": [max(r["split_backward_s"][i] for r in everyone) for i in range(2)],
        **_slowest_tables(everyone, ring_calls),
        "host_block_gemms": host_block,
        "host_head_gemms": linear_gemm_shapes(model, HOST_TOKENS, 1, True)[len(host_block) :],
        "host_sdpa": [model.heads, HOST_TOKENS, model.head_dim],
        "cores": cores,
        "tp_host_s": tp[False][0],
        "tp_collectives": tp[False][1],
        "tp_waits_s": tp[False][2],
        "tp_sp_host_s": tp[True][0],
        "tp_sp_waits_s": tp[True][2],
        "collectives": collectives,
        **({"pp_host_s": pp_host} if pp_host else {}),
        "what": (
            f"{n} gloo process(es) x 1 thread on {platform.machine()} ({os.cpu_count()} cores), "
            f"torch {torch.__version__}, fp32 GEMMs of {model.name} at {seq} tokens"
            + (
                f", per-rank figures with {len(everyone)} process(es) at once (one per core)"
                if len(everyone) < n
                else ""
            )
        ),
    }


def _slowest_tables(everyone: list[dict], ring_calls: list[list]) -> dict:
    """The ``ring``, ``sdpa`` and ``loss`` tables at each shape's slowest rank; the ring's whole
    calls with their sends replace its bare blocks where two ranks timed them."""
    keys = ("ring", "sdpa", "loss") if everyone[0].get("loss") else ("ring", "sdpa")
    tables: dict = {
        key: [[*shape[:2], max(r[key][i][2] for r in everyone)] for i, shape in enumerate(everyone[0][key])]
        for key in keys
    }
    if ring_calls:
        tables["ring"] = [[*shape[:2], max(r[i][2] for r in ring_calls)] for i, shape in enumerate(ring_calls[0])]
        tables["ring_includes_sends"] = True
    return tables


if __name__ == "__main__":
    from meshwise.runtime.mesh import exit_worker

    exit_worker(main())
