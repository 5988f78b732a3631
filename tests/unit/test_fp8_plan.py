"""float8 precisions, the 2026 GPUs and Megatron-Core's memory in the planner (cost/fp8.py,
cost/megatron_memory.py, catalog/accelerators.toml)."""

from __future__ import annotations

import json

import pytest

from meshwise.cli import main
from meshwise.cost import fp8, megatron_memory
from meshwise.cost.estimate import estimate
from meshwise.cost.memory import rank_shapes
from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

FORMATS = ("fp8", "fp8-rowwise", "fp8-blockwise", "mxfp8")
GPUS = ("h100", "h800", "b200", "gb200")


def _plan_json(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gpu", GPUS)
def test_every_supported_format_plans_and_names_its_precision(capsys, gpu):
    for precision in FORMATS:
        args = [
            "--model",
            "llama3-8b",
            "--gpu",
            gpu,
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--seq-len",
            "2048",
            "--precision",
            precision,
            "--layout",
            "dp=16,zero=3",
        ]
        if precision == "mxfp8" and gpu in ("h100", "h800"):
            assert main(["plan", *args]) == 2  # Hopper has no MX tensor cores: refused in one line
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "--precision mxfp8" in err[0] and "h" in err[0]
            continue
        out = _plan_json(capsys, *args)
        assert out["precision"] == precision and out["candidates"][0]["tokens_per_s"] > 0
        assert out["calibrated"] == (gpu == "h100")
        assert bool(out["notes"]) == (gpu != "h100")


def test_float8_is_faster_than_bf16_and_blockwise_keeps_bf16_moments():
    model, cluster = load_model("llama3-8b"), load_cluster("h100", 8)
    layout = parse("dp=8,zero=3", 8)
    bf16 = estimate(model, cluster, TrainSpec(64, 4096), layout)
    runs = {p: estimate(model, cluster, TrainSpec(64, 4096, precision=p), layout) for p in ("fp8", "fp8-blockwise")}
    for e in runs.values():
        assert 1.0 < e.tokens_per_s / bf16.tokens_per_s < 2.0  # only the linear layers run in float8
    assert TrainSpec(1, 1, precision="fp8-blockwise").optimizer_bytes == 8  # fp32 master + bf16 moments
    assert TrainSpec(1, 1, precision="fp8").state_bytes_per_param == TrainSpec(1, 1).state_bytes_per_param


def test_per_tensor_float8_gathers_one_byte_per_linear_parameter():
    model, cluster = load_model("llama3-8b"), load_cluster("h100", 8)
    layout = parse("dp=8,zero=3", 8)

    def gathered(precision):
        e = estimate(model, cluster, TrainSpec(64, 4096, precision=precision), layout)
        return sum(c.bytes_per_step for c in e.comm if c.kind == "all_gather")

    shape = rank_shapes(model, layout)[0]
    linear_share = 1 - shape.root_params / shape.params
    assert gathered("fp8") / gathered("bf16-mixed") == pytest.approx((2 - linear_share) / 2, rel=1e-3)
    assert gathered("fp8-rowwise") == gathered("bf16-mixed")  # rowwise gathers bf16 (torchtitan docs)


def test_casts_are_priced_as_hbm_bytes():
    train = TrainSpec(1, 1, precision="fp8")
    fwd, bwd = fp8.linear_cast_bytes(train, 10, 20, 30)
    # X (10x30) and W (30x20) read twice and written once; dY (10x20) too, then three float8 transposes
    assert fwd == 5 * (300 + 600) and bwd == 5 * 200 + 2 * (300 + 600 + 200)
    assert fp8.linear_cast_bytes(TrainSpec(1, 1), 10, 20, 30) == (0.0, 0.0)


def test_nvlink_domain_spans_trays():
    c = load_cluster("gb200", 144)
    assert (c.gpus_per_node, c.domain_gpus) == (4, 72)
    assert c.link_for(64, 1) is c.intra and c.link_for(8, 8) is c.intra  # inside the NVL72 rack
    assert c.link_for(4, 72).bytes_per_s == c.inter.bytes_per_s  # across racks: one NIC per rank
    assert load_cluster("gb200", 128, 8).domain_gpus == 64  # the largest whole number of nodes that divides the world
    assert load_cluster("h100", 64).domain_gpus == 8


def test_mxfp8_needs_mx_tensor_cores():
    with pytest.raises(MeshwiseError, match="--precision mxfp8"):
        fp8.check_supported(load_cluster("h100", 8).accelerator, "mxfp8")
    with pytest.raises(MeshwiseError, match="--precision fp8"):
        fp8.check_supported(load_cluster("a100-80gb", 8).accelerator, "fp8")
    fp8.check_supported(load_cluster("b300", 8).accelerator, "mxfp8")


def test_megatron_distributed_optimizer_bytes():
    """Megatron-LM docs/user-guide/features/dist_optimizer.md: bf16 params with fp32 grads take
    6 + 12/d bytes per parameter with the distributed optimizer, 18 without."""
    model = load_model("llama3-8b")
    train = TrainSpec(64, 4096, runtime="megatron")
    for text, d in (("dp=8,zero=1", 8), ("dp=8,zero=0", 1)):
        layout = parse(text, 8)
        shape = rank_shapes(model, layout)[0]
        mem = megatron_memory.rank_memory(model, train, layout, shape, 8, 80e9)
        assert mem.states / shape.params == pytest.approx(6 + 12 / d)


def test_llama3_405b_megatron_memory_below_meshwise_runtime():
    """Meta's layout (tp=8, pp=16, interleaved, seq 8192, batch 2048 on 16,384 H100): meshwise's own
    runtime keeps every micro-batch's four SwiGLU tensors and DTensor's gathered inputs, Megatron-Core less
    (whether it fits: tests/unit/test_megatron_activations.py)."""
    model, cluster = load_model("llama3-405b"), load_cluster("h100", 16384)
    layout = parse("dp=128,zero=2,tp=8,sp=on,pp=16,vpp=4,ac=selective", 16384)
    megatron = estimate(model, cluster, TrainSpec(2048, 8192, runtime="megatron"), layout)
    own = estimate(model, cluster, TrainSpec(2048, 8192), layout)
    assert own.memory.total > megatron.memory.total


def test_published_float8_speedups_within_tolerance():
    """torchtitan's published float8 / bf16 ratios and NeMo 24.07's FP8 throughputs
    (benchmarks/fp8_fidelity.py; cost/fp8.py's constants come from component benchmarks, not from
    these runs): mean |error| <= 8%, worst <= 15%."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from fp8_fidelity import errors

    errs = [abs(e[3]) for e in errors()]
    assert len(errs) == 12 and sum(errs) / len(errs) <= 0.08 and max(errs) <= 0.15


QWEN3_LAYOUT = "dp=16,zero=1,tp=2,sp=on,pp=8,vpp=2,ep=32,ac=selective"  # Qwen3-235B-A22B on 256 H100


def test_expert_parallelism_folded_over_tp_is_written_planned_for_megatron_and_refused_for_meshwise(capsys):
    layout = parse(QWEN3_LAYOUT, 256)
    assert layout.ep_folds_tp and layout.expert_dp == 1  # 32 = 16 dp_shard x 2 tp
    assert not parse("dp=16,zero=1,tp=2,pp=8,ep=8", 256).ep_folds_tp  # divides dp_shard: carved as before
    with pytest.raises(MeshwiseError, match="ep=3"):
        parse("dp=16,tp=2,pp=8,ep=3", 256)
    args = [
        "plan",
        "--model",
        "qwen3-235b-a22b",
        "--gpu",
        "h100",
        "--gpus",
        "256",
        "--seq-len",
        "4096",
        "--global-batch",
        "1024",
        "--layout",
        QWEN3_LAYOUT,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--runtime megatron" in err[0]
    out = _plan_json(capsys, *args[1:], "--runtime", "megatron")
    comm = {(c["kind"], c["dim"]): c for c in out["candidates"][0]["comm"]}
    model, m = load_model("qwen3-235b-a22b"), 1024 // 16
    # the plan reports its slowest rank: the pipeline rank with the most MoE blocks (12 of 94 over 8 x 2 chunks)
    moe_blocks = max(
        round(shape.expert_params / (model.experts * model._mlp(model.expert_ffn_hidden)))
        for shape in rank_shapes(model, layout)
    )
    # dispatch + combine forward and backward, each rank sending its 1/tp of the tokens' k copies
    tokens_per_rank = 4096 / 2
    assert comm["all_to_all", "ep"]["bytes_per_step"] == pytest.approx(
        m * moe_blocks * (4 * tokens_per_rank * model.experts_per_token * model.hidden * 2 + model.experts * 8),
        rel=1e-6,
    )


def test_folded_experts_shard_over_expert_data_parallel_ranks():
    model = load_model("qwen3-235b-a22b")
    train = TrainSpec(1024, 4096, runtime="megatron")
    folded = parse("dp=16,zero=1,tp=2,pp=8,ep=32", 256)  # expert-dp 1
    carved = parse("dp=16,zero=1,tp=2,pp=8,ep=16", 256)  # expert-dp 1 (carved from dp)
    shape = rank_shapes(model, folded)[1]
    mf = megatron_memory.rank_memory(model, train, folded, shape, 64, 80e9)
    mc = megatron_memory.rank_memory(model, train, carved, shape, 64, 80e9)
    dense = shape.params - shape.expert_params
    assert mf.optimizer == pytest.approx(12 * (dense / 16 + shape.expert_params / 32))
    assert mc.optimizer == pytest.approx(12 * (dense / 16 + shape.expert_params / 16))
    assert mf.activations < mc.activations  # each TP rank routes half the tokens


def test_megatron_search_finds_folded_layouts():
    from meshwise.plan.megatron_search import _fields

    model = load_model("qwen3-235b-a22b")
    eps = {d.ep for d, _ in _fields(model, 64, 64, 4096) if d.shard == 16 and d.tp == 4}
    assert {1, 2, 4, 8, 16, 32, 64} <= eps  # tp=4 over 16 dp_shard ranks: ep=32, 64 fold over tp


def test_a_device_without_float8_is_priced_not_crashed():
    """Callers other than ``plan`` (train's auto layout on CPU ranks) may estimate float8 there."""
    model, cluster = load_model("tiny"), load_cluster("cpu", 2)
    e = estimate(model, cluster, TrainSpec(8, 64, precision="fp8"), parse("dp=2", 2))
    assert e.tokens_per_s > 0


def test_etp_one_folds_an_ep_that_divides_dp():
    """``etp=1`` states expert TP 1 (Megatron's --expert-tensor-parallel-size 1, the MoE Parallel Folding runs):
    ep=8 over dp=32 x tp=4 folds over the TP ranks, 8 consecutive ranks inside one node, where without it
    the ep ranks stand tp apart and the all-to-all leaves the node. It round-trips, and is refused where it
    folds nothing, for meshwise's runtime, and with another size."""
    folded = parse("dp=32,zero=1,tp=4,pp=8,vpp=7,ep=8,etp=1", 1024, explicit=True)
    plain = parse("dp=32,zero=1,tp=4,pp=8,vpp=7,ep=8", 1024)
    assert folded.ep_folds_tp and not plain.ep_folds_tp and folded.expert_dp == 16
    assert parse(folded.format()) == folded and "etp=1" in str(folded) and folded.to_json(1024)["etp"] == 1
    for bad in ("dp=32,tp=4,ep=8,etp=2", "dp=32,ep=8,etp=1", "dp=32,tp=4,etp=1", "dp=32,tp=8,ep=4,etp=1"):
        with pytest.raises(MeshwiseError, match="etp"):
            parse(bad, None, explicit=True)
    model, cluster = load_model("qwen3-235b-a22b"), load_cluster("h100", 1024)
    train = TrainSpec(1024, 4096, runtime="megatron")
    ops = {
        k: {(c.kind, c.dim): c for c in estimate(model, cluster, train, lay).comm}
        for k, lay in (("f", folded), ("p", plain))
    }
    # folded: each TP rank sends its T/tp tokens inside the node; unfolded: T/tp too, but over ranks tp apart
    assert ops["f"]["all_to_all", "ep"].seconds_per_step < ops["p"]["all_to_all", "ep"].seconds_per_step
    assert main(["plan", "--model", "qwen3-235b-a22b", "--gpus", "1024", "--layout", str(folded)]) == 2
