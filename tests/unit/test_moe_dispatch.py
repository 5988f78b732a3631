"""Where a token's copies go (cost/moe_dispatch.py), DeepEP's dispatch beside the all-to-all of every copy,
the all-to-all across nodes at each GPU's own NIC (cost/experts.py), and the experts' GEMMs as grouped_gemm's
cuBLAS loop runs them (cost/moe_block.py)."""

import itertools
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshwise.cost import kernels, moe_block, moe_dispatch
from meshwise.cost.experts import ep_collectives
from meshwise.cost.memory import rank_shapes
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity  # noqa: E402

H100 = load_cluster("h100", 8).accelerator
RUNS_MODELS = fidelity._models(fidelity._catalog())  # the models the published runs file defines


def _model(name):
    return RUNS_MODELS.get(name) or load_model(name)


def _fake_balanced_gate_spans(experts: int, top_k: int, ranks: int, tokens: int) -> float:
    """NeMo AutoModel's FakeBalancedGate as its code writes it (``arange(T * k).view(-1, k) % E``): the mean
    number of ranks, ``E / ranks`` experts each in order, that a token's experts land on."""
    per = experts // ranks
    rows = [[(t * top_k + j) % experts for j in range(top_k)] for t in range(tokens)]
    return sum(len({e // per for e in row}) for row in rows) / tokens


@pytest.mark.parametrize(
    "name, ep", [("qwen3-30b-a3b", 8), ("deepseek-v3", 64), ("kimi-k2", 32), ("gpt-oss-20b", 8), ("gpt-oss-120b", 64)]
)
def test_forced_routing_spans_what_the_fake_gate_sends(name, ep):
    model = _model(name)
    forced = TrainSpec(8, 4096, moe_balancing="forced")
    tokens = model.experts * model.experts_per_token  # whole periods of the gate's pattern
    oracle = _fake_balanced_gate_spans(model.experts, model.experts_per_token, ep, tokens)
    assert moe_dispatch.destinations(model, forced, ep) == pytest.approx(oracle)


def test_learned_routing_spans_the_mean_over_every_choice_of_k():
    """Uniform top-k without replacement, against the enumeration of every choice (16 experts over 4 ranks,
    top-4); group-limited routing draws from the kept groups only."""
    per = 4
    choices = list(itertools.combinations(range(16), 4))
    oracle = sum(len({e // per for e in c}) for c in choices) / len(choices)
    assert moe_dispatch._span(16, 4, 4, False) == pytest.approx(oracle)
    v3, train = _model("deepseek-v3"), TrainSpec(8, 4096)
    assert (v3.router_groups, v3.router_group_topk) == (8, 4)
    # 8 nodes of 32 experts, one group each: the token's 8 experts among 4 kept groups
    assert moe_dispatch.destinations(v3, train, 8) == pytest.approx(moe_dispatch._span(128, 8, 4, False))
    assert 3.5 < moe_dispatch.destinations(v3, train, 8) < 4


def test_megatron_forced_balance_is_random_routing_not_the_fake_gate():
    """Megatron-Core's --moe-router-force-load-balancing draws normal random logits (moe_utils.RandomSTE), so a
    token's top-8 of 128 experts is a uniform draw: sampled here (seeded), its experts span about 3.6 of 4
    nodes, where the consecutive fake gate's span one."""
    rng = random.Random(0)
    model = _model("qwen3-235b-a22b")
    sampled = sum(len({e // 32 for e in rng.sample(range(128), 8)}) for _ in range(20000)) / 20000
    spans = moe_dispatch.destinations(model, TrainSpec(8, 4096, moe_balancing="random"), 4)
    assert spans == pytest.approx(sampled, rel=0.01)
    assert moe_dispatch.destinations(model, TrainSpec(8, 4096, moe_balancing="forced"), 4) < 0.4 * spans


def test_deepep_sends_each_token_once_per_rank_and_all_to_all_every_copy():
    model, cluster = _model("qwen3-30b-a3b"), load_cluster("h100", 8)
    layout = parse("dp=8,zero=3,ep=8,mbs=4", 8)
    shape = rank_shapes(model, layout)[0]
    a2a, deepep = (
        TrainSpec(512, 4096, moe_balancing="forced"),
        TrainSpec(512, 4096, moe_balancing="forced", moe_dispatcher="deepep"),
    )

    def tokens_bytes(train):
        ops = ep_collectives(model, train, layout, shape, 16, cluster)
        return max(op.bytes_per_step for op in ops if op.kind == "all_to_all")

    # the fake gate's 8 consecutive experts sit on one of the 16-expert ranks: 1 copy sent, not 8
    assert tokens_bytes(deepep) == pytest.approx(tokens_bytes(a2a) / 8)
    parts, fused = (moe_block.moe_parts(model, H100, t, 4, 1, 8, False) for t in (a2a, deepep))
    e, t = 2, 4 * 4096
    moved = 2 * (t * 1 + t * 8) * model.hidden * e / kernels.hbm_bytes_per_s(H100)
    floors = sum(moe_dispatch.DEEPEP_KERNELS) * H100.kernel_floor_s
    assert fused.permute_s == pytest.approx(3 * moved + floors)
    assert fused.permute_s < parts.permute_s / 5


def test_all_to_all_across_nodes_runs_at_each_gpus_nic():
    """ep = 32 over 4 nodes: 24 of 32 shares leave the node, each rank through its own 47 GB/s NIC (the node's
    8 NICs all busy with their own ranks), its node's share on NVLink at the same time."""
    model, cluster = _model("qwen3-30b-a3b"), load_cluster("h100", 32)
    layout = parse("dp=32,ep=32,mbs=1", 32)
    shape = rank_shapes(model, layout)[0]
    ops = ep_collectives(model, TrainSpec(64, 4096), layout, shape, 2, cluster)
    tokens = next(op for op in ops if op.bytes_per_step > 1e6)
    payload = tokens.bytes_per_step / tokens.count_per_step
    assert payload == 4096 * 8 * model.hidden * 2
    per_call = 31 * cluster.inter.latency_s + 24 / 32 * payload / cluster.inter.bytes_per_s
    assert tokens.seconds_per_step == pytest.approx(tokens.count_per_step * per_call)
    assert cluster.inter.bytes_per_s == pytest.approx(47e9)  # nccl-tests' NDR bus bandwidth per NIC
    inside = ep_collectives(model, TrainSpec(64, 4096), parse("dp=8,ep=8", 8), shape, 2, load_cluster("h100", 8))
    assert max(op.seconds_per_step for op in inside) < tokens.seconds_per_step / 4


def test_cublas_loop_runs_one_gemm_per_expert_in_turn():
    """grouped_gemm's default build (one cuBLAS GEMM per expert, one stream): gate and up as one GEMM, no
    per-expert Python kernels; against meshwise's own loop, which splits gate and up and pays its kernels."""
    model = _model("qwen3-30b-a3b")
    train = TrainSpec(512, 4096, moe_balancing="forced", expert_gemm="cublas-loop")
    parts = moe_block.moe_parts(model, H100, train, 4, 1, 8, False)
    rows, local, f, h = 4 * 4096 * 8 * 8 / 128, 16, model.expert_ffn_hidden, model.hidden
    peak = H100.peak_flops_per_s("bf16-mixed")
    fwd = sum(local * kernels.gemm_seconds(rows, n, k, H100, peak, 2) for n, k in ((2 * f, h), (h, f)))
    bwd = sum(
        local * (kernels.gemm_seconds(rows, k, n, H100, peak, 2) + kernels.gemm_seconds(k, n, rows, H100, peak, 2))
        for n, k in ((2 * f, h), (h, f))
    )
    assert parts.experts_s == pytest.approx(fwd + bwd)
    assert parts.loop_s == 0.0
    own = moe_block.moe_parts(model, H100, replace(train, expert_gemm="te"), 4, 1, 8, False)
    assert own.loop_s > 0 and moe_block.expert_kernel(replace(train, expert_gemm="te")) == "loop"
