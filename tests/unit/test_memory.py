"""Memory model: ZeRO's worked example, the memory wall, and the activation inventory (Korthikanti)."""

import pytest

from meshwise.cost import activations as act
from meshwise.cost import pipeline
from meshwise.cost.estimate import estimate
from meshwise.layout import Layout, parse
from meshwise.spec import ModelSpec, TrainSpec, load_cluster, load_model

GB = 1e9


@pytest.mark.parametrize("zero, published_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_worked_example(zero, published_gb):
    # Rajbhandari et al. 2020 Fig. 1: Psi = 7.5B, Nd = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB per rank.
    model = ModelSpec.from_param_count(7.5e9)
    cluster = load_cluster("a100-80gb", 64)
    train = TrainSpec(global_batch=64, seq_len=2048, precision="bf16-mixed")
    e = estimate(model, cluster, train, Layout(dp=64, zero=zero, shard=64))
    print(f"zero={zero}: predicted {e.memory.states / GB:.2f} GB, published {published_gb} GB")
    assert e.memory.states / GB == pytest.approx(published_gb, abs=0.05)


def test_memory_wall_840_gb():
    # The essay's example: 70B x (2 + 2 + 8) bytes = 840 GB before activations.
    e = estimate(ModelSpec.from_param_count(70e9), load_cluster("a100-80gb", 1), TrainSpec(1, 2048, "bf16"), Layout())
    assert e.memory.states == pytest.approx(840e9) and not e.fits


def test_hsdp_shards_over_the_shard_group_only():
    model, cluster = ModelSpec.from_param_count(8e9), load_cluster("h100", 16)
    train = TrainSpec(16, 2048, "bf16-mixed")
    full = estimate(model, cluster, train, parse("dp=16,zero=3"))
    hsdp = estimate(model, cluster, train, parse("dp=16,zero=3,shard=8"))
    assert hsdp.memory.states == pytest.approx(2 * full.memory.states)


def test_tp_shards_matrices_and_replicates_norms():
    model = load_model("llama3-8b")
    cluster, train = load_cluster("h100", 8), TrainSpec(8, 1024, "bf16")
    one = estimate(model, load_cluster("h100", 1), train, parse("dp=1"))
    tp8 = estimate(model, cluster, train, parse("tp=8", 8))
    norms = (2 * model.layers + 1) * model.hidden
    assert tp8.memory.params / 2 == pytest.approx((model.params - norms) / 8 + norms)
    assert one.memory.params / 2 == model.params


def test_pipeline_stage_holds_its_layers_and_the_heaviest_rank_is_reported():
    model = load_model("llama3-8b")
    cluster, train = load_cluster("h100", 4), TrainSpec(16, 1024, "bf16")
    e = estimate(model, cluster, train, parse("pp=4", 4))
    last = model.hidden + model.head_params + 8 * model.layer_params  # 32 layers / 4 stages
    first = model.embedding_params + 8 * model.layer_params
    assert max(m.params for m in e.rank_memory) / 2 == pytest.approx(max(first, last))
    assert e.memory.total == max(m.total for m in e.rank_memory)


# Korthikanti et al. 2022 Table 3 models (s = 2048, t = 8): 22B, 175B, 530B, 1T.
KORTHIKANTI = [(64, 6144, 4), (96, 12288, 1), (128, 20480, 1), (160, 25600, 1)]
SETTINGS = [
    ("none", 1, False, "none"),
    ("tp", 8, False, "none"),
    ("tp+sp", 8, True, "none"),
    ("tp+selective", 8, False, "selective"),
    ("tp+sp+selective", 8, True, "selective"),
    ("full", 1, False, "full"),
]


@pytest.mark.parametrize("a, h, b", KORTHIKANTI)
@pytest.mark.parametrize("setting, t, sp, ac", SETTINGS)
def test_korthikanti_table2_reproduced(a, h, b, setting, t, sp, ac):
    """The tensor inventory, with the paper's conventions, gives Table 2 exactly."""
    shapes = act.Shapes(h=h, q=h, kv=h, f=4 * h, a=a, swiglu=False)
    ours = act.block_bytes(shapes, 2048, b, 2, t, sp, ac, act.MEGATRON)
    paper = act.korthikanti_table2(2048, b, h, a, t, setting)
    assert ours == pytest.approx(paper, rel=1e-12)


def test_torch_deviations_are_what_the_docstring_says():
    s, b, h, a = 2048, 1, 4096, 32
    gelu_mha = act.Shapes(h=h, q=h, kv=h, f=4 * h, a=a, swiglu=False)
    torch_bytes = act.block_bytes(gelu_mha, s, b, 2, 1, False, "none", act.TORCH)
    # Per s*b*h, in bytes: norm-1 input 2, QKV input 2, Q K V 6, SDPA output 2, out-proj input copy 2,
    # norm-2 input 2, MLP input 2, GeLU input and output 8 + 8 = 34, like the paper's 34 but without its three
    # dropout masks (3) and with the copy instead; plus SDPA's float32 log-sum-exp (4*a*s*b), no 5*a*s/h term.
    expected = s * b * h * (2 + 2 + 2 * 3 + 2 + 2 + 2 + 2 + 8 + 8) + s * b * a * 4 + 2 * s * b * 4  # + inverse RMS
    assert torch_bytes == pytest.approx(expected)
    # Linear in s: no s^2 term.
    assert act.block_bytes(gelu_mha, 2 * s, b, 2, 1, False, "none", act.TORCH) == pytest.approx(2 * torch_bytes)
    # GQA narrows K and V; SwiGLU keeps four f-wide tensors.
    gqa = act.Shapes(h=h, q=h, kv=h // 4, f=4 * h, a=a, swiglu=False)
    assert torch_bytes - act.block_bytes(gqa, s, b, 2, 1, False, "none", act.TORCH) == pytest.approx(
        s * b * 2 * (2 * h * 3 / 4)
    )
    swiglu = act.Shapes(h=h, q=h, kv=h, f=4 * h, a=a, swiglu=True)
    assert act.block_bytes(swiglu, s, b, 2, 1, False, "none", act.TORCH) - torch_bytes == pytest.approx(
        s * b * 2 * 2 * 4 * h
    )
    # Full recompute keeps the block input only.
    assert act.block_bytes(swiglu, s, b, 2, 1, False, "full", act.TORCH) == s * b * h * 2


def test_fsdp2_keeps_a_shard_beside_the_unsharded_weights():
    # Measured on the runtime (fp32): zero 1/2 hold P unsharded + P/N shards; replicate two full copies;
    # under bf16-mixed the shard is the fp32 master, counted as optimizer state by the convention.
    model, cluster = load_model("llama3-8b"), load_cluster("h100", 8)
    fp32, mixed = TrainSpec(8, 1024, "fp32"), TrainSpec(8, 1024, "bf16-mixed")
    p = model.params * 4
    assert estimate(model, cluster, fp32, parse("dp=8,zero=2")).memory.params == pytest.approx(p + p / 8)
    assert estimate(model, cluster, fp32, parse("dp=8")).memory.params == pytest.approx(2 * p)
    assert estimate(model, cluster, mixed, parse("dp=8,zero=2")).memory.params == pytest.approx(model.params * 2)


def test_in_flight_micro_batches():
    assert pipeline.in_flight("gpipe", 4, 1, 16, 0) == 16
    assert [pipeline.in_flight("1f1b", 4, 1, 16, r) for r in range(4)] == [4, 3, 2, 1]
    assert pipeline.in_flight("1f1b", 4, 1, 2, 0) == 2
    assert pipeline.in_flight("interleaved-1f1b", 4, 2, 16, 0) == (2 - 1) * 4 + 2 * 3 + 1
    assert pipeline.in_flight("zero-bubble", 4, 1, 16, 0) == 4


def test_activation_checkpointing_orders_memory():
    model, cluster = load_model("llama3-8b"), load_cluster("h100", 8)
    train = TrainSpec(8, 8192, "bf16-mixed")
    acts = [
        estimate(model, cluster, train, parse(f"dp=8,zero=3,ac={ac}")).memory.activations
        for ac in ("none", "selective", "full")
    ]
    assert acts[0] > acts[1] > acts[2]


def test_context_parallelism_splits_activations_and_shares_weights():
    """cp: states as a layout with dp*cp replicas sharding over shard*cp; block activations of s/cp
    tokens (exactly a cp-times shorter sequence's), plus the ring's K/V and dK/dV buffers; the ring's
    sends per block and micro-batch: cp-1 K/V forward and backward, cp dK/dV."""
    from meshwise.cost import memory
    from meshwise.cost.context_parallel import ring_bytes
    from meshwise.cost.estimate import rank_collectives
    from meshwise.cost.memory import rank_shapes

    model, cluster = load_model("llama3-8b"), load_cluster("h100", 8)
    train, short = TrainSpec(8, 8192, "bf16-mixed"), TrainSpec(8, 2048, "bf16-mixed")
    layout = parse("cp=4,dp=2,zero=3", 8)
    shape = rank_shapes(model, layout)[0]
    cap = cluster.accelerator.memory_bytes
    # at the same moment (the peaks differ: under cp it falls inside a ring attention's backward)
    cp = memory.moment_memories(model, train, layout, shape, 4, cap)["forward"]
    wide = memory.moment_memories(model, TrainSpec(32, 8192, "bf16-mixed"), parse("dp=8,zero=3", 8), shape, 4, cap)[
        "forward"
    ]  # same accum
    assert (cp.params, cp.optimizer) == pytest.approx((wide.params, wide.optimizer))
    ring = ring_bytes(model, short, layout)
    assert ring == 2048 * 2 * model.kv_dim * (2 * 2 + 2 * 4)
    fwd, bwd, *_ = memory._activations(model, short, layout, shape, 4)
    fwd1, bwd1, *_ = memory._activations(model, short, parse("dp=2", 2), shape, 4)
    assert (fwd, bwd) == pytest.approx((fwd1, bwd1 + ring))
    ops = {(o.kind, o.dim): o for o in rank_collectives(model, cluster, train, layout, shape)}
    m = 8 // 2
    kv_bytes = 2048 * 2 * model.kv_dim * 2
    assert ops[("send", "cp")].count_per_step == model.layers * m * (2 * 3 + 4)
    assert ops[("send", "cp")].bytes_per_step == model.layers * m * (2 * 3 * kv_bytes + 4 * kv_bytes * 2)
    assert ("reduce_scatter", "dp_shard_cp") in ops


def test_zero3_backward_holds_a_blocks_gradients_and_the_next_gather():
    # Late in a block's backward (traced, Llama 3 70B dp=64,zero=3): the block's unsharded bf16
    # gradients, the float32 shard of the block reduced before it, the head's bf16 gradient (its unit
    # is reduced last) and, beside the reduce-scatter input, the prefetched gather of the next block.
    from meshwise.cost import memory

    model, layout = load_model("llama3-70b"), parse("dp=64,zero=3", 64)
    train = TrainSpec(64, 4096, "bf16-mixed")
    shape = memory.all_rank_shapes(model, layout)[0]
    moments = memory.moment_memories(model, train, layout, shape, 1, 80e9)
    block, head = shape.block_params, model.vocab * model.hidden + model.hidden
    rope = 2 * model.max_seq * model.head_dim * 4  # the rotary tables, float32 buffers
    assert moments["block"].grads == pytest.approx(2 * head + 2 * block + 4 * block / 64)
    assert moments["block"].other == pytest.approx(4 * block + 2 * block + rope)
    assert moments["forward"].grads == 0 and moments["forward"].other == pytest.approx(4 * block + rope)


def test_a_stage_whose_warm_up_holds_every_micro_batch():
    # pp=4 with 4 micro-batches: the first stage runs all four forwards before its first backward
    # (no gradient of the step yet); the last stage runs 1F1B's steady state (every gradient).
    from meshwise.cost import memory

    model, layout = load_model("llama3-70b"), parse("pp=4,dp=2,zero=1,tp=8", 64)
    train = TrainSpec(8, 4096, "bf16-mixed")
    first, last = memory.all_rank_shapes(model, layout)[0], memory.all_rank_shapes(model, layout)[3]
    assert memory.moment_memories(model, train, layout, first, 4, 80e9)["forward"].grads == 0
    assert memory.moment_memories(model, train, layout, last, 4, 80e9)["forward"].grads > 0
