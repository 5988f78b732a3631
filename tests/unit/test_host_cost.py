"""Host time (cost/host.py): the operator counts it uses are the runtime's own, and the CPU
choices it drives (micro-batch, processes x threads) follow from it."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from meshwise.cost import host
from meshwise.cost.estimate import estimate
from meshwise.cost.rank_work import RankWork
from meshwise.layout import parse
from meshwise.spec import AcceleratorSpec, TrainSpec, load_cluster, load_model
from meshwise.train import layout_choice


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counted(name: str) -> tuple[int, int]:
    from meshwise.runtime.model import build_model, loss_sum

    spec = load_model(name)
    net = build_model(spec, seed=0)
    x = torch.randint(0, spec.vocab, (2, 16))
    with _Count() as fwd:
        loss = loss_sum(net(x), x)
    with _Count() as bwd:
        loss.backward()
    return fwd.ops, bwd.ops


def test_operator_counts_are_the_runtimes():
    """Two models of different depth give the per-block counts (the difference) and the rest."""
    (f4, b4), (f6, b6) = _counted("tiny"), _counted("small")  # 4 and 6 layers, same block kind
    assert (f6 - f4) / 2 == host.BLOCK_FORWARD_OPS
    assert (b6 - b4) / 2 == host.BLOCK_BACKWARD_OPS
    assert host.ops_per_microbatch(6, True, True) == f6 + b6


def test_optimizer_operators_and_tensors_are_the_runtimes():
    """AdamW on CPU runs its single-tensor loop: ADAMW_OPS_PER_TENSOR operators per parameter tensor,
    over as many tensors as the runtime's model has (tied head counted once)."""
    from meshwise.runtime.model import build_model

    for name in ("tiny", "tiny-tied", "tiny-qwen3"):
        spec = load_model(name)
        params = list(build_model(spec, seed=0).parameters())
        assert host.parameter_tensors(spec, spec.layers, True, True) == len(params), name
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params)
    opt.step()
    with _Count() as count:
        opt.step()
    assert count.ops == pytest.approx(host.ADAMW_OPS_PER_TENSOR * len(params), rel=0.05)


class _Elements(TorchDispatchMode):
    """Elements of parameter-sized tensors each aten operator reads (its tensor arguments) and
    writes (its tensor results; an in-place result is the argument it wrote, counted as a write)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.passes = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        results = out if isinstance(out, (tuple, list)) else [out]
        self.passes += len({id(a) for a in flat if a.numel() == self.numel})  # a tensor read twice: once
        self.passes += sum(1 for r in results if isinstance(r, torch.Tensor) and r.numel() == self.numel)
        return out


def test_adamw_element_passes_are_torch_s():
    """The optimizer's memory term counts torch's own single-tensor AdamW: each parameter's elements
    read and written ADAMW_ELEMENT_PASSES times (counted here operator by operator)."""
    p = torch.nn.Parameter(torch.ones(4096))
    p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW([p])
    opt.step()
    with _Elements(4096) as count:
        opt.step()
    assert count.passes == host.ADAMW_ELEMENT_PASSES


def test_more_microbatches_cost_more_host_time_at_equal_flops():
    model, cluster = load_model("small"), load_cluster("cpu", 1, 1)
    train = TrainSpec(8, 128, "fp32")
    one = estimate(model, cluster, train, parse("mbs=8", 1)).time
    eight = estimate(model, cluster, train, parse("mbs=1", 1)).time
    a = cluster.accelerator
    from meshwise.cost.memory import rank_shapes

    sums = host.grad_accumulation_seconds(a, rank_shapes(model, parse("mbs=1", 1))[0].params, 4, 8)  # 7 gradient sums
    assert sums > 0
    assert eight.compute_s - one.compute_s == pytest.approx(
        7 * host.ops_per_microbatch(6, True, True) * a.op_overhead_s + sums
    )


def test_recompute_host_time_per_mode():
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, op_overhead_s=1e-5, checkpoint_call_s=1e-3, selective_op_s=2e-5)
    full = host.recompute_seconds_per_block(a, "full")
    sel = host.recompute_seconds_per_block(a, "selective")
    assert host.recompute_seconds_per_block(a, "none") == 0
    assert full == pytest.approx(host.BLOCK_FORWARD_OPS * 1e-5 + 1e-3)
    assert sel == pytest.approx(full + 2 * host.BLOCK_FORWARD_OPS * 2e-5)


def test_recompute_under_tp_runs_dtensor_operators_again():
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, op_overhead_s=1e-5, checkpoint_call_s=1e-3, tp_op_s=4e-5)
    plain = host.recompute_seconds_per_block(a, "full")
    assert host.recompute_seconds_per_block(a, "full", tp=2) == pytest.approx(plain + host.BLOCK_FORWARD_OPS * 4e-5)
    base = host.host_seconds(a, 4, True, True, "none", 2, tp=2)
    assert host.host_seconds(a, 4, True, True, "full", 2, tp=2) - base == pytest.approx(
        2 * 4 * host.recompute_seconds_per_block(a, "full", tp=2)
    )


def test_sequence_parallel_adds_its_redistributions_per_block_under_tp_only():
    """tp_sp_block_s per block per micro-batch under tp > 1 with SP on, the forward's half again
    under checkpointing; nothing without TP or SP."""
    a = AcceleratorSpec(
        "x", 1, 1.0, 1.0, 1.0, op_overhead_s=1e-5, checkpoint_call_s=1e-3, tp_op_s=4e-5, tp_sp_block_s=2e-3
    )
    for ac, factor in (("none", 1.0), ("full", 1.5), ("selective", 1.5)):
        off = host.host_seconds(a, 4, True, True, ac, 3, tp=2, sp=False)
        assert host.host_seconds(a, 4, True, True, ac, 3, tp=2, sp=True) - off == pytest.approx(3 * 4 * 2e-3 * factor)
    assert host.host_seconds(a, 4, True, True, "none", 3, tp=1, sp=True) == host.host_seconds(
        a, 4, True, True, "none", 3
    )


def test_zero_bubble_pays_its_split_backward_per_block_and_micro_batch():
    """zb_split_block_s per block per micro-batch on each rank under the zero-bubble schedule with
    pp > 1, in its compute (time-shared as the rest of it); other schedules and GPU-style profiles
    without the constant pay nothing; the planner's compute cache tells the schedules apart."""
    from dataclasses import replace

    assert host.split_backward_seconds(
        AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, zb_split_block_s=2e-3), "zero-bubble", 2, 3, 4
    ) == pytest.approx(4 * 3 * 2e-3)
    model, train = load_model("tiny"), TrainSpec(8, 64, "fp32")
    cpu = load_cluster("cpu", 2, 2)
    timed = replace(cpu, accelerator=replace(cpu.accelerator, zb_split_block_s=2e-3))
    zb, one = parse("pp=2,vpp=2,schedule=zero-bubble,mbs=2", 2), parse("pp=2,vpp=2,schedule=interleaved-1f1b,mbs=2", 2)
    m, blocks = zb.accum(train.global_batch), model.layers // 2  # each rank: two chunks of one block
    assert estimate(model, timed, train, zb).time.compute_s - estimate(
        model, cpu, train, zb
    ).time.compute_s == pytest.approx(m * blocks * 2e-3)
    for other in (one, parse("pp=2,mbs=2", 2)):
        assert estimate(model, timed, train, other).time.compute_s == estimate(model, cpu, train, other).time.compute_s
    cache: dict = {}  # the same rank shapes as 1F1B's, so only the schedule tells their compute apart
    plain_zb = parse("pp=2,schedule=zero-bubble,mbs=2", 2)
    estimate(model, timed, train, parse("pp=2,schedule=1f1b,mbs=2", 2), stage_cache=cache)
    assert (
        estimate(model, timed, train, plain_zb, stage_cache=cache).time == estimate(model, timed, train, plain_zb).time
    )


def test_a_pipeline_schedule_pays_its_own_work_per_stage_call():
    """pp_call_s per stage call, a forward and a backward per micro-batch and chunk on each rank
    under pp > 1, in its compute (time-shared as the rest of it); nothing without pp or the constant."""
    from dataclasses import replace

    assert host.pipeline_call_seconds(AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, pp_call_s=1e-3), 2, 2, 4) == pytest.approx(
        2 * 4 * 2 * 1e-3
    )
    assert host.pipeline_call_seconds(AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, pp_call_s=1e-3), 1, 1, 4) == 0.0
    model, train = load_model("tiny"), TrainSpec(8, 64, "fp32")
    cpu = load_cluster("cpu", 2, 2)
    timed = replace(cpu, accelerator=replace(cpu.accelerator, pp_call_s=1e-3))
    for text, chunks in (("pp=2,mbs=2", 1), ("pp=2,vpp=2,schedule=interleaved-1f1b,mbs=2", 2)):
        layout = parse(text, 2)
        m = layout.accum(train.global_batch)
        extra = (
            estimate(model, timed, train, layout).time.compute_s - estimate(model, cpu, train, layout).time.compute_s
        )
        assert extra == pytest.approx(2 * m * chunks * 1e-3)
    plain = parse("dp=2,mbs=2", 2)
    assert estimate(model, timed, train, plain).time == estimate(model, cpu, train, plain).time
    # four ranks on two cores: time-shared, so the step grows by more than the one rank's calls
    four = replace(load_cluster("cpu", 4, 4), accelerator=replace(cpu.accelerator, cores_per_node=2))
    four_timed = replace(four, accelerator=replace(four.accelerator, pp_call_s=1e-3))
    layout = parse("pp=2,dp=2,mbs=2", 4)
    grown = estimate(model, four_timed, train, layout).time.step_s - estimate(model, four, train, layout).time.step_s
    assert grown > 2 * layout.accum(train.global_batch) * 1e-3


def test_a_dtensor_optimizer_step_pays_its_own_per_tensor_cost():
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, op_overhead_s=1e-5, tp_op_s=4e-5, optimizer_dtensor_s=1e-4)
    plain = host.optimizer_host_seconds(a, 39, dtensor=False)
    assert plain == pytest.approx(39 * host.ADAMW_OPS_PER_TENSOR * 1e-5)
    assert host.optimizer_host_seconds(a, 39, dtensor=True) == pytest.approx(plain + 39 * 1e-4)  # not tp_op_s


def test_gpu_profiles_have_no_host_time():
    a = load_cluster("h100", 8).accelerator
    assert host.host_seconds(a, 32, True, True, "full", 8) == 0


def test_a_given_layout_without_mbs_takes_the_largest_micro_batch_that_fits(monkeypatch):
    monkeypatch.setenv(layout_choice.THREADS_ENV, "1")
    model = load_model("small")
    layout, lines = layout_choice.choose("dp=1", model, 1, 1, 8, 128, "cpu")
    assert layout.mbs == 8 and "no accumulation" in lines[0]
    given, _ = layout_choice.choose("dp=1,mbs=2", model, 1, 1, 8, 128, "cpu")
    assert given.mbs == 2


def test_threads_scale_a_rank_s_flops_by_the_profile_s_efficiency():
    cluster = load_cluster("cpu", 1, 1)
    two = layout_choice.with_threads(cluster, 2).accelerator
    k = 1 + cluster.accelerator.thread_efficiency
    assert two.peak_fp32_flops_per_s == pytest.approx(cluster.accelerator.peak_fp32_flops_per_s * k)
    assert two.op_overhead_s == cluster.accelerator.op_overhead_s  # launching does not parallelise
    timed = dataclasses.replace(
        cluster,
        accelerator=dataclasses.replace(
            cluster.accelerator,
            sdpa_call_s=5e-5,
            sdpa_score_s=3e-9,
            sdpa_score_dim_s=1e-10,
            cp_score_s=8e-9,
            sdpa_head_table=((64.0, 16.0, 2e-5), (512.0, 16.0, 1e-3)),
        ),
    )
    two = layout_choice.with_threads(timed, 2).accelerator  # the attention kernels' rows split over threads
    assert (two.sdpa_score_s, two.sdpa_score_dim_s, two.cp_score_s) == pytest.approx((3e-9 / k, 1e-10 / k, 8e-9 / k))
    assert [t for _, _, t in two.sdpa_head_table] == pytest.approx([2e-5 / k, 1e-3 / k])
    assert two.sdpa_call_s == 5e-5


def test_processes_are_chosen_among_the_splits_of_the_cores():
    n, threads, line = layout_choice.choose_cpu_processes("auto", load_model("small"), 8, 128, cores=4)
    assert n * threads == 4 and n in (1, 2, 4)
    assert f"{n} x {threads} thread(s) on 4 core(s)" in line


def test_more_ranks_than_cores_time_share_and_fill_the_bubble_with_other_ranks_work():
    """cores_per_node: a rank's compute and optimizer are time-shared (x ranks / cores) when every
    rank computes at once; a pipeline stage idle in the bubble gives its core back, so there the
    step grows by less; ranks no more than cores are unchanged."""
    from dataclasses import replace

    from meshwise.cost import host

    model, train = load_model("tiny"), TrainSpec(8, 64, "fp32")
    plain = load_cluster("cpu", 4, 4)
    shared = replace(plain, accelerator=replace(plain.accelerator, cores_per_node=2))
    assert host.core_share(shared.accelerator, 4) == 2.0 and host.core_share(plain.accelerator, 4) == 1.0
    pp, dp = parse("pp=2,dp=2,mbs=2", 4), parse("dp=4,mbs=2", 4)
    before, after = estimate(model, plain, train, dp).time, estimate(model, shared, train, dp).time
    assert after.compute_s == pytest.approx(2 * before.compute_s)
    assert after.optimizer_s == pytest.approx(2 * before.optimizer_s)
    before, after = estimate(model, plain, train, pp).time, estimate(model, shared, train, pp).time
    assert before.compute_s < after.compute_s < 2 * before.compute_s
    assert before.step_s < after.step_s < 2 * before.step_s
    two = load_cluster("cpu", 2, 2)
    two_shared = replace(two, accelerator=replace(two.accelerator, cores_per_node=2))
    for text in ("pp=2,mbs=2", "dp=2,mbs=2", "tp=2,mbs=4"):
        assert (
            estimate(model, two_shared, train, parse(text, 2)).time == estimate(model, two, train, parse(text, 2)).time
        )


def test_tp_without_sp_replicates_the_norms_residuals_and_loss_over_every_token():
    """The CPU memory-bound term by the tokens each rank processes: a tp=2 rank with SP on moves
    what a dp rank of half its tokens moves, except the loss over the gathered logits (all of its
    tokens); with SP off also the norms, residual adds and embedding over all of its tokens."""
    from meshwise.cost import kernels

    model, accel = load_model("small"), load_cluster("cpu", 2).accelerator
    train, blocks, bw = TrainSpec(8, 128, "fp32"), load_model("small").layers, accel.hbm_bytes_per_s
    one, off, on = (
        host.memory_bound_seconds(model, accel, train, RankWork(mbs, tp, sp, "none", blocks, True, True), 1)
        for mbs, tp, sp in ((4, 1, False), (8, 2, False), (8, 2, True))
    )
    tokens, p = 4 * 128, kernels.PASSES["meshwise"]
    assert on - one == pytest.approx(tokens * model.vocab * p["loss_bytes"] / bw)
    replicated = (blocks * 3 * (2 * p["norm"] + 2 * p["residual"]) + 3 * p["norm"] + 5) * tokens * model.hidden * 4
    assert off - on == pytest.approx(replicated / bw)
    assert not host.is_host_bound(load_cluster("h100", 8).accelerator) and host.is_host_bound(accel)


def test_cores_per_node_is_checked(tmp_path):
    from meshwise.catalog import read_catalog
    from meshwise.errors import MeshwiseError
    from meshwise.measure.calibrate import format_toml

    f = tmp_path / "p.toml"
    f.write_text(format_toml({"name": "x", **read_catalog("accelerators.toml")["cpu"], "cores_per_node": 4}))
    assert load_cluster(str(f), 2).accelerator.cores_per_node == 4
    f.write_text(format_toml({"name": "x", **read_catalog("accelerators.toml")["cpu"]}) + "cores_per_node = 1.5\n")
    with pytest.raises(MeshwiseError, match="cores_per_node"):
        load_cluster(str(f), 2)


def test_gradient_sums_over_micro_batches_are_charged_on_cpu_ranks():
    """Every micro-batch after the first adds its gradients into the held ones: three passes over
    the rank's gradients at the DRAM copy bandwidth, (m - 1) times; sharded where FSDP2 reduces each
    micro-batch (ZeRO-2/3), none with one micro-batch, none on a GPU profile (Megatron fuses it)."""
    from meshwise.cost import memory
    from meshwise.cost.estimate import _accumulation_s, estimate
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    model, train = load_model("tiny"), TrainSpec(8, 64, precision="fp32")
    slow = {}
    for n, text in ((1, "mbs=2"), (2, "dp=2,zero=0,mbs=1"), (2, "dp=2,zero=3,mbs=1"), (1, "mbs=8")):
        cluster = load_cluster("cpu", n, n)
        fast = dataclasses.replace(cluster, accelerator=dataclasses.replace(cluster.accelerator, dram_bytes_per_s=20e9))
        half = dataclasses.replace(cluster, accelerator=dataclasses.replace(cluster.accelerator, dram_bytes_per_s=10e9))
        layout = parse(text, n)
        m = layout.accum(train.global_batch)
        slow[text] = (
            estimate(model, half, train, layout).time.compute_s - estimate(model, fast, train, layout).time.compute_s
        )
        params = memory.rank_shapes(model, layout)[0].params / (2 if "zero=3" in text else 1)
        assert slow[text] == pytest.approx((m - 1) * 3 * params * 4 * (1 / 10e9 - 1 / 20e9), rel=1e-6)
    assert slow["mbs=8"] == 0 and slow["mbs=2"] > slow["dp=2,zero=3,mbs=1"] > 0
    gpu = load_cluster("h100", 8, 8)
    layout = parse("dp=8,mbs=1", 8)
    assert _accumulation_s(model, gpu.accelerator, train, layout, memory.rank_shapes(model, layout)[0], 4) == 0


def test_context_parallel_ranks_pay_fsdp2_s_dtensor_optimizer_and_norm():
    """Under cp > 1 FSDP2 wraps the weights over dp x cp (runtime/data_parallel.py), so a cp=2 rank's
    optimizer step and gradient norm dispatch through DTensor as a dp=2 rank's do (a grid step of
    cp=2 at hidden 64 measured 16 ms of optimizer where the plain-tensor charge read 3 ms)."""
    from meshwise.cost import memory
    from meshwise.cost.context_parallel import dtensor_parameters
    from meshwise.cost.estimate import _accumulation_s

    model, train = load_model("tiny"), TrainSpec(4, 64, precision="fp32")
    cluster = load_cluster("cpu", 2, 2)
    timed = dataclasses.replace(
        cluster, accelerator=dataclasses.replace(cluster.accelerator, optimizer_dtensor_s=1e-3, tp_op_s=2e-3)
    )
    extra = {}
    for text in ("dp=2,zero=1,mbs=1", "cp=2,zero=1,mbs=1", "pp=2,mbs=1"):
        layout = parse(text, 2)
        a, b = estimate(model, timed, train, layout).time, estimate(model, cluster, train, layout).time
        extra[text] = (a.optimizer_s - b.optimizer_s, a.fixed_s - b.fixed_s)
    tensors = host.parameter_tensors(model, model.layers, True, True)
    assert extra["cp=2,zero=1,mbs=1"] == pytest.approx(extra["dp=2,zero=1,mbs=1"])
    assert extra["cp=2,zero=1,mbs=1"][0] == pytest.approx(tensors * (1e-3 - cluster.accelerator.optimizer_dtensor_s))
    assert extra["pp=2,mbs=1"] == (0.0, 0.0)  # plain tensors: no DTensor charge
    assert dtensor_parameters(parse("cp=2", 2)) and not dtensor_parameters(parse("pp=2", 2))
    # ZeRO-2 over the cp ranks reduces each micro-batch's gradients: the sums run over the shard
    zero2 = parse("cp=2,zero=2,mbs=1", 2)
    shape = memory.rank_shapes(model, zero2)[0]
    assert _accumulation_s(model, cluster.accelerator, train, zero2, shape, 4) == pytest.approx(
        _accumulation_s(model, cluster.accelerator, train, parse("mbs=1", 1), shape, 4) / 2
    )


def test_loss_reads_its_cost_per_logit_off_the_measured_table():
    """Rows (tokens, vocab, seconds per token): 128 x 256 = 32,768 logits at 1 ns each, 128 x 65,536 =
    8,388,608 at 7 ns; between them linear in the logits, flat past both ends."""
    table = ((128.0, 256.0, 256 * 1e-9), (128.0, 65536.0, 65536 * 7e-9))
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 1e10, loss_token_table=table)
    assert host.loss_seconds(a, 64, 256) == pytest.approx(64 * 256 * 1e-9)  # below the table: 1 ns
    assert host.loss_seconds(a, 512, 65536) == pytest.approx(512 * 65536 * 7e-9)  # past it: 7 ns
    mid = (32768 + 8388608) / 2  # halfway: 4 ns
    assert host.loss_seconds(a, 1, mid) == pytest.approx(mid * 4e-9)


def test_loss_without_a_table_streams_from_dram_past_the_cache():
    """28 bytes per logit (cost/kernels.py) over the cache bandwidth while the fp32 logits fit in 4 MiB,
    over the DRAM bandwidth past it."""
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 2e10, dram_bytes_per_s=5e9)
    assert host.loss_seconds(a, 128, 256) == pytest.approx(128 * 256 * 28 / 2e10)  # 128 KiB of logits
    assert host.loss_seconds(a, 256, 32768) == pytest.approx(256 * 32768 * 28 / 5e9)  # 32 MiB of logits
    assert host.loss_seconds(dataclasses.replace(a, dram_bytes_per_s=0.0), 256, 32768) == pytest.approx(
        256 * 32768 * 28 / 2e10
    )


def test_memory_bound_time_holds_the_loss_once():
    """The step's memory-bound seconds are the other passes' bytes plus the loss's measured seconds."""
    from meshwise.cost import kernels

    model = load_model("small")
    table = ((128.0, 256.0, 256 * 1e-9), (128.0, 65536.0, 65536 * 7e-9))
    a = AcceleratorSpec("x", 1, 1.0, 1.0, 1e10, loss_token_table=table)
    train = TrainSpec(4, 128, precision="fp32")
    work, headless = RankWork(2, 1, False, "none", 6, True, True), RankWork(2, 1, False, "none", 6, True, False)
    got = host.memory_bound_seconds(model, a, train, work, 3)
    rest = kernels.rank_memory_bound_bytes(model, "meshwise", 4, 128, work, 0.0)
    per_logit = 1e-9 + 6e-9 * (256 * 256 - 32768) / (8388608 - 32768)  # 65,536 logits: between the rows
    assert got == pytest.approx(3 * (rest / 1e10 + 256 * 256 * per_logit))
    assert host.memory_bound_seconds(model, a, train, headless, 3) == pytest.approx(
        3 * kernels.rank_memory_bound_bytes(model, "meshwise", 4, 128, headless, 0.0) / 1e10
    )
