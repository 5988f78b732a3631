"""A MoE block priced from its parts (cost/moe_block.py): each part against its hand-computed formula,
the grouped GEMM against its published table, monotonic behaviour, dense models unchanged, the JSON split."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from meshwise.cost import kernels, moe_block
from meshwise.cost.estimate import estimate
from meshwise.cost.memory import rank_shapes
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

H100 = load_cluster("h100", 8).accelerator
HBM = 3.35e12 * 0.866  # H100 SXM HBM3 at its hbm_efficiency (components_links.csv)
FLOOR = 4.94e-6  # kernel_floor_s (benchmarks/fit_components.py)


@pytest.fixture(scope="module")
def v3():
    return load_model("deepseek-v3")


def test_rows_per_expert_are_t_k_ep_over_e_times_the_load_factor(v3):
    assert (v3.experts, v3.experts_per_token) == (256, 8)
    assert moe_block.rows_per_expert(v3, 4096, 1, 1.0) == 4096 * 8 / 256 == 128  # balanced, no EP
    assert moe_block.rows_per_expert(v3, 4096, 32, 1.04) == pytest.approx(1.04 * 4096 * 8 * 32 / 256)
    assert moe_block.routed_tokens(4096, 4, True) == 1024 and moe_block.routed_tokens(4096, 4, False) == 4096
    assert moe_block.routed_tokens(4096, 4, False, "megatron") == 1024  # each TP rank routes its SP shard


def test_load_factor_is_the_padded_capacity_else_the_measured_imbalance():
    """Wang et al. 2024 Table 2 (catalog/moe_imbalance.toml): MaxVio_global 0.52 with an auxiliary loss,
    0.04 with per-expert bias; a capacity factor with padding runs every expert at exactly its capacity."""
    assert moe_block.IMBALANCE == {"aux-loss": 1.52, "aux-loss-free": 1.04, "forced": 1.0, "random": 1.0}
    dropless, free = TrainSpec(8, 4096), TrainSpec(8, 4096, moe_balancing="aux-loss-free")
    assert moe_block.load_factor(dropless, 8) == 1.52 and moe_block.load_factor(free, 8) == 1.04
    assert moe_block.load_factor(dropless, 1) == 1.0  # one rank holds every expert: its load is the mean
    assert moe_block.load_factor(TrainSpec(8, 4096, moe_capacity_factor=1.0), 8) == 1.0
    assert moe_block.load_factor(TrainSpec(8, 4096, moe_capacity_factor=1.25), 1) == 1.25


def test_experts_padded_to_the_busiest_run_at_its_load_on_one_rank():
    """KempnerForge's grouped kernel pads every expert to the busiest expert's tokens (a zero (E, max, h)
    buffer into torch._grouped_mm): on one rank (ep = 1) its experts multiply the busiest load's rows,
    where an unpadded grouped kernel multiplies the mean (qwen3-235b-a22b: 256 rows against 389)."""
    padded = TrainSpec(8, 4096, expert_gemm="grouped-padded")
    assert moe_block.load_factor(padded, 1) == 1.52
    assert moe_block.load_factor(TrainSpec(8, 4096, expert_gemm="grouped"), 1) == 1.0
    model, accel = load_model("qwen3-235b-a22b"), load_cluster("h100", 8).accelerator
    one = moe_block.moe_parts(model, accel, TrainSpec(8, 4096, expert_gemm="grouped"), 1, 1, 1, False)
    many = moe_block.moe_parts(model, accel, padded, 1, 1, 1, False)
    assert 1.4 < many.experts_s / one.experts_s < 1.8 and many.router_s == one.router_s  # tiles quantize the rows


def test_bad_moe_settings_name_the_field():
    from meshwise.errors import MeshwiseError

    with pytest.raises(MeshwiseError, match="--moe-capacity-factor"):
        TrainSpec(8, 4096, moe_capacity_factor=-1.0)
    with pytest.raises(MeshwiseError, match="--moe-balancing: 'bias'"):
        TrainSpec(8, 4096, moe_balancing="bias")


def test_megatron_routes_the_sequence_parallel_shard_and_gathers_for_the_experts(v3):
    """Megatron, tp = 4 (expert TP 4): the router and first permute see T / 4 tokens, the experts the whole T
    at a quarter of their width."""
    mega = TrainSpec(512, 4096, runtime="megatron", moe_capacity_factor=1.0)
    tp4, tp1 = (moe_block.moe_parts(v3, H100, mega, 1, tp, 8, False) for tp in (4, 1))
    assert tp4.router_s < tp1.router_s and tp4.permute_s < tp1.permute_s  # kernel floors aside, a quarter
    assert tp4.experts_s == pytest.approx(tp1.experts_s / 4, rel=0.35)  # same rows, a quarter of the width


def test_permute_and_router_bytes_by_hand(v3):
    """Megatron, bf16, 4096 tokens, ep 8: permute forward = (3 + 4 regroup) passes over T k h copies plus
    one token written per k, at HBM, plus 12 + 2 kernel floors; backward twice the bytes and 4 + 4
    floors. Router (DeepSeek-V3's sigmoid, grouped): the gate GEMM, then 156.2 bytes per score over T x E
    scores and 41 kernels forward, 116.1 bytes and 29 kernels backward."""
    train = TrainSpec(512, 4096, "bf16-mixed", runtime="megatron")
    parts = moe_block.moe_parts(v3, H100, train, 1, 1, 8, False)
    t, k, h = 4096, 8, 7168
    moved = ((3 + 4) * t * k * h + t * h) * 2 / HBM
    assert parts.permute_s == pytest.approx(3 * moved + (14 + 8) * FLOOR, rel=1e-9)
    gemm_f, gemm_b = kernels.linear_seconds(t, 256, h, H100, H100.peak_flops_per_s("bf16-mixed"), 2)
    scores = t * 256 * (156.2 + 116.1) / HBM + (41 + 29) * FLOOR
    assert moe_block.router_kind(v3) == "sigmoid-grouped"
    assert parts.router_s == pytest.approx(gemm_f + gemm_b + scores, rel=1e-9)
    assert parts.loop_s == 0.0  # grouped GEMMs: no per-expert loop


def test_megatron_sp_shard_bytes_by_hand(v3):
    """Megatron, tp = 4, ep 8: each TP rank routes and permutes its T/4 = 1024 tokens (3 passes over their
    copies plus one token written per k), and sorts the gathered T k copies by local expert (4 passes)."""
    train = TrainSpec(512, 4096, "bf16-mixed", runtime="megatron")
    parts = moe_block.moe_parts(v3, H100, train, 1, 4, 8, False)
    t, k, h = 4096, 8, 7168
    moved = (3 * t / 4 * k * h + t / 4 * h + 4 * t * k * h) * 2 / HBM
    assert parts.permute_s == pytest.approx(3 * moved + (14 + 8) * FLOOR, rel=1e-9)
    gemm_f, gemm_b = kernels.linear_seconds(t / 4, 256, h, H100, H100.peak_flops_per_s("bf16-mixed"), 2)
    scores = t / 4 * 256 * (156.2 + 116.1) / HBM + (41 + 29) * FLOOR
    assert parts.router_s == pytest.approx(gemm_f + gemm_b + scores, rel=1e-9)


ROUTER_KINDS = ("softmax", "sigmoid-grouped")


@pytest.fixture(scope="module")
def megatron_counts() -> dict[str, dict]:
    """benchmarks/megatron_moe_kernels.py's counts for each router kind, from one process (it imports
    megatron-core once): its JSON lines, by kind."""
    import json
    import subprocess
    import sys

    pytest.importorskip("megatron.core", reason="megatron-core is the oracle of --runtime megatron")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "megatron_moe_kernels.py"
    run = subprocess.run(
        [sys.executable, str(script), "16", "4", *ROUTER_KINDS], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {c["router_kind"]: c for c in lines}


@pytest.mark.parametrize("kind", ROUTER_KINDS)
def test_megatron_kernel_counts_are_megatron_cores(kind, megatron_counts):
    """The router's and the dispatcher's kernels and the router's bytes per score, counted on megatron-core's
    own MoELayer (benchmarks/megatron_moe_kernels.py, the installed megatron-core as the oracle), are the
    constants the plan prices Megatron's MoE block with."""
    counted = megatron_counts[kind]
    assert tuple(counted["router"]) == moe_block.ROUTER_KERNELS[kind]
    assert tuple(counted["dispatcher"]) == moe_block.PERMUTE_KERNELS["megatron"]
    per_score = tuple(round(b, 3) for b in counted["router_bytes_per_score"])
    assert per_score == pytest.approx(moe_block.ROUTER_SCORE_BYTES[kind], abs=0.5)


def test_meshwise_loop_pays_per_expert_kernels(v3):
    """meshwise's runtime loops over its E/ep experts: 6 elementwise kernels each, and dense GEMMs
    per expert (each with its floor), so at few rows per expert it is slower than a grouped GEMM."""
    mesh = moe_block.moe_parts(v3, H100, TrainSpec(512, 4096, "bf16-mixed"), 1, 1, 1, False)
    mega = moe_block.moe_parts(v3, H100, TrainSpec(512, 4096, "bf16-mixed", runtime="megatron"), 1, 1, 1, False)
    assert mesh.loop_s == pytest.approx(256 * 6 * FLOOR)
    assert mesh.experts_s > mega.experts_s


def test_grouped_gemm_within_its_published_table():
    """The tile/wave GEMM over rows / (rows + GROUPED_ROWS_HALF) against each row of DeepGEMM's grouped
    table (H800 FP8): within 17% of each time, nearer on average than the GEMM model alone."""
    accel = replace(H100, sustained_clock=1.0)
    path = Path(moe_block.__file__).parents[1] / "catalog/components_grouped_gemm.csv"
    with open(path, encoding="utf-8") as f:
        rows = [
            r
            for r in csv.DictReader(line for line in f if not line.startswith("#"))
            if r["gpu"] == "h100" and r["dtype"] == "fp8"
        ]
    with_factor, without = [], []
    for r in rows:
        g, m, n, k = int(r["groups"]), int(r["m"]), int(r["n"]), int(r["k"])
        published = 2 * g * m * n * k / (float(r["tflops"]) * 1e12)
        model = kernels.gemm_seconds(m, n, k, accel, 2 * accel.peak_bf16_flops_per_s, 1, g, "fp8")
        with_factor.append(abs(model / moe_block.grouped_factor(m) / published - 1))
        without.append(abs(model / published - 1))
    assert len(rows) == 10 and max(with_factor) < 0.17
    assert sum(with_factor) < sum(without)


def test_torchs_grouped_kernels_on_blackwell_take_their_own_row(v3):
    """On a B200 the experts of meshwise's runtime in one grouped kernel (torchtitan's torch._grouped_mm) take
    the ``grouped-bf16`` row (torchao's B200 table: 0.456 of peak, where dense cuBLAS reads 0.818), so they cost
    0.818 / 0.456 of the dense row's time; Megatron's grouped experts and the H100's keep the dense row."""
    b200 = load_cluster("b200", 8).accelerator
    grouped = TrainSpec(8, 4096, expert_gemm="grouped")
    megatron = replace(grouped, runtime="megatron")
    assert moe_block.grouped_row(b200, grouped, "bf16") == "grouped-bf16"
    assert moe_block.grouped_row(b200, grouped, "fp8") == "grouped-fp8"
    assert moe_block.grouped_row(b200, megatron, "bf16") == "bf16"
    assert moe_block.grouped_row(H100, grouped, "bf16") == "bf16"
    dense_row = replace(b200, gemm=tuple(r for r in b200.gemm if not r[0].startswith("grouped")))
    slow = moe_block.moe_parts(v3, b200, grouped, 1, 1, 8, False).experts_s
    fast = moe_block.moe_parts(v3, dense_row, grouped, 1, 1, 8, False).experts_s
    assert slow / fast == pytest.approx(0.818 / 0.456, rel=0.05)
    assert moe_block.moe_parts(v3, b200, megatron, 1, 1, 8, False) == moe_block.moe_parts(
        v3, dense_row, megatron, 1, 1, 8, False
    )


def test_fewer_rows_per_expert_lower_efficiency():
    assert moe_block.grouped_factor(32) < moe_block.grouped_factor(128) < moe_block.grouped_factor(4096) < 1


@pytest.mark.parametrize("runtime", ["meshwise", "megatron"])
def test_more_experts_at_fixed_active_params_are_slower(v3, runtime):
    """Fine-grained experts (E and k doubled, each half as wide: the same active parameters) take
    longer: fewer rows per expert, twice the token copies to permute."""
    fine = replace(v3, experts=512, experts_per_token=16, expert_ffn_hidden=1024)
    assert fine.active_params - v3.active_params == v3.moe_layers * 256 * 7168  # the larger router only
    train = TrainSpec(512, 4096, "bf16-mixed", runtime=runtime)
    coarse_s = moe_block.moe_parts(v3, H100, train, 1, 1, 8, False)
    fine_s = moe_block.moe_parts(fine, H100, train, 1, 1, 8, False)
    assert fine_s.experts_s > coarse_s.experts_s and fine_s.permute_s > coarse_s.permute_s
    assert fine_s.total_s > coarse_s.total_s


def test_imbalance_and_ep_move_the_experts(v3):
    """ep > 1 puts the busiest rank at the measured max/mean load; ep = 1 holds every expert's weights and
    reads them all (weight-bound at T k / E = 128 rows each)."""
    train = TrainSpec(512, 4096, "bf16-mixed", runtime="megatron", moe_balancing="aux-loss-free")
    one, eight = (moe_block.moe_parts(v3, H100, train, 1, 1, ep, False) for ep in (1, 8))
    weights_s = 256 * 3 * 7168 * 2048 * 2 / HBM  # every expert's three matrices, read once
    assert one.experts_s > 3 * weights_s and eight.experts_s < one.experts_s
    balanced = moe_block.moe_parts(v3, H100, replace(train, moe_capacity_factor=1.0), 1, 1, 8, False)
    aux = moe_block.moe_parts(v3, H100, replace(train, moe_balancing="aux-loss"), 1, 1, 8, False)
    # 4% more rows, and a row tile more on some of each expert's GEMMs (1,065 rows against 1,024: 9 tiles of
    # 128 against 8; tile quantization, cost/kernels.py)
    assert 1.0 < eight.experts_s / balanced.experts_s <= 1.12
    assert 1.4 < aux.experts_s / balanced.experts_s <= 1.6


# step seconds of dense layouts at b46bb6e, before this module: a dense model never reads it (the megatron
# row since Megatron's unfused loss was priced by its own bytes, 52 per logit: cost/kernels.py PASSES, and
# since its vocabulary-parallel loss gathers no logits: cost/estimate.py _tp_collectives, and since a ring's
# or tree's steps inside a node keep the node's latency across nodes and a group across nodes is no faster
# than the node's link: cost/comm.py, ClusterSpec.link_for)
DENSE = [
    ("llama3-70b", "h100", 64, "dp=8,zero=1,tp=8", "bf16-mixed", "meshwise", 39.650801613451165),
    ("llama3-8b", "h100", 8, "dp=8,zero=3,mbs=2", "fp8-rowwise", "meshwise", 21.337422598866436),
    ("llama3-70b", "h100", 64, "dp=2,zero=1,tp=8,pp=4,vpp=5,ac=selective", "bf16-mixed", "megatron", 41.38903799671373),
    ("mistral-7b", "a100-80gb", 16, "dp=16,zero=2,ac=full", "bf16-mixed", "meshwise", 44.163515716286504),
]


@pytest.mark.parametrize("name, gpu, gpus, layout, precision, runtime, step_s", DENSE)
def test_dense_predictions_unchanged(name, gpu, gpus, layout, precision, runtime, step_s):
    e = estimate(
        load_model(name), load_cluster(gpu, gpus), TrainSpec(512, 4096, precision, runtime=runtime), parse(layout, gpus)
    )
    assert e.time.step_s == step_s and "moe_block_s" not in e.time.as_json()


def test_json_carries_the_moe_split(v3):
    """The plan's time split holds each part per step on the slowest rank, with the all-to-alls."""
    cluster, lay = load_cluster("h100", 1024), parse("dp=64,ep=64,pp=16,mbs=1,schedule=gpipe", 1024)
    train = TrainSpec(512, 4096, "bf16-mixed")
    e = estimate(v3, cluster, train, lay)
    split = e.time.as_json()["moe_block_s"]
    assert set(split) == {"router_s", "permute_s", "experts_s", "shared_s", "loop_s", "host_s", "dispatch_combine_s"}
    a2a = sum(c.seconds_per_step for c in e.comm if c.kind == "all_to_all" and c.dim == "ep")
    assert split["dispatch_combine_s"] == a2a > 0
    per_call = moe_block.moe_parts(v3, cluster.accelerator, train, 1, 1, 64, False).experts_s
    calls = {moe_block.moe_blocks_of(v3, s.expert_params) * lay.accum(512) for s in rank_shapes(v3, lay)}
    assert any(split["experts_s"] == pytest.approx(per_call * c) for c in calls if c)
    assert sum(v for k, v in split.items() if k != "dispatch_combine_s") < e.time.compute_s


def test_tp_splits_the_experts_only_where_the_runtime_does(v3):
    """meshwise runs a MoE block whole on every TP rank; Megatron-Core splits the experts' width over TP
    (expert TP = TP by default) unless EP is folded over TP, where each rank routes T / tp tokens."""
    mesh, mega = TrainSpec(512, 4096, "bf16-mixed"), TrainSpec(512, 4096, "bf16-mixed", runtime="megatron")
    assert moe_block.moe_parts(v3, H100, mesh, 1, 4, 8, False) == moe_block.moe_parts(v3, H100, mesh, 1, 1, 8, False)
    whole, split = (moe_block.moe_parts(v3, H100, mega, 1, tp, 8, False) for tp in (1, 4))
    assert whole.experts_s / 4 < split.experts_s < whole.experts_s / 2  # a quarter of the work, smaller GEMMs
    assert split.router_s < whole.router_s and split.permute_s < whole.permute_s  # each routes its SP shard
    folded = moe_block.moe_parts(v3, H100, mega, 1, 4, 32, True)
    assert folded.permute_s < whole.permute_s / 3  # T / 4 tokens routed


def test_flat_path_splits_moe_over_tp_as_the_op_model_does():
    """A GPU without the op model (b300) prices compute from FLOPs: under Megatron (expert TP = TP) and
    under EP folded over TP, TP divides the experts' work, so tp=4 costs about a quarter of tp=1's per
    rank at the same tokens; meshwise's unfolded block runs whole on every TP rank."""
    from meshwise.cost import compute

    assert compute.tp_divides_moe(False, "megatron") and compute.tp_divides_moe(True, "meshwise")
    assert not compute.tp_divides_moe(False, "meshwise")
    model = load_model("qwen3-235b-a22b")
    flat = load_cluster("b300", 64)
    assert not flat.accelerator.has_op_model
    compute_s = {}
    for runtime in ("megatron", "meshwise"):
        train = TrainSpec(256, 4096, "bf16-mixed", runtime=runtime)
        for tp in (1, 4):
            compute_s[runtime, tp] = estimate(
                model, flat, train, parse(f"dp={64 // tp},tp={tp},mbs=1", 64)
            ).time.compute_s
    # tp=4 ranks see 4x the tokens of a tp=1 rank: Megatron's divide all of it by 4, meshwise's not the experts'
    assert compute_s["megatron", 4] == pytest.approx(compute_s["megatron", 1], rel=0.15)
    assert compute_s["meshwise", 4] > 2.0 * compute_s["megatron", 4]


def test_overlapped_all_to_alls_expose_only_what_exceeds_the_compute():
    """--overlap-moe-expert-parallel-comm (DualPipe): one micro-batch's all-to-alls run under another's
    compute, so only their excess over the rank's compute is exposed; off, all of it."""
    from meshwise.cost import comm, experts
    from meshwise.errors import MeshwiseError

    link = load_cluster("h100", 16).inter
    ops = [comm.collective("all_to_all", "ep", 16, 1e8, 10, link)]
    total = ops[0].seconds_per_step
    plain, over = TrainSpec(8, 4096, runtime="megatron"), TrainSpec(8, 4096, runtime="megatron", overlap_ep_comm=True)
    assert experts.exposed_s(ops, 0.5 * total, plain) == total
    assert experts.exposed_s(ops, 0.5 * total, over) == pytest.approx(0.5 * total)
    assert experts.exposed_s(ops, 2 * total, over) == 0.0
    with pytest.raises(MeshwiseError, match="--moe-comm-overlap"):
        TrainSpec(8, 4096, overlap_ep_comm=True)


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "llama3-8b"])
def test_attention_gemms_carry_the_attention_parameters(name):
    """The op model's attention linears (cost/kernels.py ``attention_shapes``, ``mla_down_shapes``) multiply
    exactly the attention's weights, whose count is exact against transformers (docs/models.md): latent
    attention's down- and up-projections (not an MHA of head_dim 192), Qwen3's 64 heads of 128 over a
    hidden of 4096 (not h x h). MLA's latent norms are not GEMM weights."""
    model = load_model(name)
    weights = sum(n * k for n, k in kernels.attention_shapes(model, 1))
    if model.mla:
        weights += sum(n * k for n, k in kernels.mla_down_shapes(model))
        norms = model.kv_lora_rank + (model.q_lora_rank if model.q_lora_rank else 0)
    else:
        norms = 0
    assert weights == model.attention_params - norms
    # under TP each rank holds 1/tp of every projection Megatron splits (all but MLA's down-projections)
    split = sum(n * k for n, k in kernels.attention_shapes(model, 8))
    assert split == pytest.approx(sum(n * k for n, k in kernels.attention_shapes(model, 1)) / 8)


def test_megatron_selective_recomputes_mla_up_projections(v3):
    """recompute_modules mla_up_proj (Megatron-Core multi_latent_attention.py): ``selective`` on latent
    attention runs the two up-projections' forward again; on GQA it recomputes nothing but the core."""
    train = TrainSpec(8, 4096, runtime="megatron")
    rec = kernels.block_seconds(v3, H100, train, 1, 2, True, "selective")[2]
    up_f = kernels.linears_seconds(H100, train, 4096, *kernels.attention_shapes(v3, 2)[:2])[0]
    assert rec == pytest.approx(up_f) and rec > 0
    assert kernels.block_seconds(load_model("llama3-8b"), H100, train, 1, 2, True, "selective")[2] == 0.0


def test_transformer_engine_runs_one_gemm_per_expert_on_four_streams(v3):
    """Megatron's default expert GEMMs (Transformer Engine's GroupedLinear): each of the E/ep local experts'
    projections is its own cuBLAS GEMM, issued round robin on 4 streams: ceil(E/ep / 4) rounds of a batch
    of 4, by hand; one grouped kernel instead (expert_gemm = "grouped") is priced apart."""
    train = TrainSpec(512, 4096, "bf16-mixed", runtime="megatron")
    parts = moe_block.moe_parts(v3, H100, train, 1, 1, 8, False)
    rows, peak = 1.52 * 4096 * 8 * 8 / 256, H100.peak_flops_per_s("bf16-mixed")
    by_hand = 0.0
    for n, k in ((2 * 2048, 7168), (7168, 2048)):
        by_hand += 8 * sum(
            kernels.gemm_seconds(m, nn, kk, H100, peak, 2, 4, "bf16")
            for m, nn, kk in ((rows, n, k), (rows, k, n), (k, n, rows))
        )
    assert parts.experts_s == pytest.approx(by_hand, rel=1e-9)
    grouped = moe_block.moe_parts(v3, H100, replace(train, expert_gemm="grouped"), 1, 1, 8, False)
    assert grouped.experts_s != parts.experts_s and grouped.router_s == parts.router_s


def test_megatron_block_takes_at_least_its_hosts_issue_time(v3):
    """Megatron syncs the host inside each MoE block: the block costs at least its kernels' host issue time
    (TransformerEngine #2053: 37.08 us a kernel on GB200's Grace, 13.48 on a DGX H100's Xeon)."""
    qwen = load_model("qwen3-235b-a22b")  # 128 experts, top-8, softmax router, no shared expert
    train = TrainSpec(128, 4096, runtime="megatron", moe_balancing="random")
    counted = 33 + 3 + 16 + 6 + 17 * 32  # softmax router and its gate GEMM, alltoall permute under ep, 32 experts
    assert moe_block.host_kernels(qwen, train, 4) == counted
    assert moe_block.host_kernels(v3, train, 32) == 70 + 3 + 22 + 17 * 9  # 8 local experts and the shared one
    deepep = replace(train, moe_dispatcher="deepep")
    assert moe_block.host_kernels(v3, deepep, 32) == 70 + 3 + 14 + 17 * 9
    gb200, h100 = load_cluster("gb200", 8).accelerator, load_cluster("h100", 8).accelerator
    assert moe_block.host_issue_s(qwen, gb200, train, 4) == pytest.approx(counted * 37.08e-6)
    assert moe_block.host_issue_s(qwen, h100, train, 4) == pytest.approx(counted * 13.48e-6)
    parts = moe_block.moe_parts(qwen, gb200, train, 1, 1, 4, False)
    gpu_s = parts.router_s + parts.permute_s + parts.experts_s + parts.shared_s + parts.loop_s
    assert parts.host_s == pytest.approx(counted * 37.08e-6 - gpu_s) and parts.host_s > 0
    assert parts.total_s == pytest.approx(counted * 37.08e-6)  # the host's time, not the GPU's
    own = moe_block.moe_parts(qwen, gb200, replace(train, runtime="meshwise"), 1, 1, 4, False)
    assert own.host_s == 0.0  # meshwise's runtime: no sync inside the block priced here
    coarse = replace(qwen, experts=8, experts_per_token=2, expert_ffn_hidden=32768)  # Grok-1's experts
    assert moe_block.moe_parts(coarse, gb200, train, 1, 4, 8, False).host_s == 0.0  # the GPU's work hides the host's
