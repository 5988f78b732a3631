"""The cost model and the planner for mixtures of experts (docs/cost-model.md): expert states split by
ep then by ZeRO, active FLOPs, all-to-all per MoE block, ep in the search and the explanation."""

import pytest

from meshwise.cost import compute, memory
from meshwise.cost.estimate import estimate, rank_collectives
from meshwise.layout import parse
from meshwise.plan.planner import enumerate_layouts, plan
from meshwise.spec import TrainSpec, load_cluster, load_model


@pytest.fixture(scope="module")
def moe():
    return load_model("tiny-moe")


def test_expert_states_split_by_ep_then_by_zero(moe):
    train = TrainSpec(8, 64, "fp32")
    shape = memory.rank_shapes(moe, parse("dp=4", 4))[0]
    assert shape.expert_params == moe.expert_params == 3 * 4 * 3 * 64 * 48
    ddp = memory.states(shape.params, train, parse("dp=4", 4), shape.expert_params)
    ep = memory.states(shape.params, train, parse("dp=4,ep=4", 4), shape.expert_params)
    held = moe.params - moe.expert_params * 3 / 4
    assert ep == (held * 4, held * 4, held * 8) and ddp == (moe.params * 4, moe.params * 4, moe.params * 8)
    z3 = memory.states(shape.params, train, parse("dp=4,zero=3,ep=2", 4), shape.expert_params)
    assert z3 == pytest.approx((moe.params, moe.params, moe.params * 2))  # sharded: 1/shard, as dense weights


def test_active_flops_and_moe_activations(moe):
    assert moe.active_params < moe.params
    assert (
        compute.block_forward_flops_per_token(moe, 64)
        == 2 * (moe.attention_params + moe.active_mlp_params) + 4 * 64 * 64
    )
    cluster, train = load_cluster("cpu", 2), TrainSpec(8, 64, "fp32")
    one = estimate(moe, cluster, train, parse("dp=2", 2))
    two = estimate(moe, cluster, train, parse("dp=2,ep=2", 2))
    assert two.memory.params < one.memory.params and two.memory.activations > one.memory.activations  # capacity


def test_all_to_all_per_moe_block_and_micro_batch(moe):
    cluster, train = load_cluster("cpu", 2), TrainSpec(8, 64, "fp32")
    lay = parse("dp=2,ep=2", 2)  # 4 micro-batches per replica, 3 MoE blocks
    shape = memory.rank_shapes(moe, lay)[0]
    ops = {
        (c.kind, c.dim, c.count_per_step): c.bytes_per_step
        for c in rank_collectives(moe, cluster, train, lay, shape)
        if c.kind == "all_to_all"
    }
    tokens = 64 * 2 * 64 * 4  # T * k * h * e
    # 48 of the token copies (dispatch, combine; forward, backward) + 12 of the expert counts (E int64)
    assert ops == {("all_to_all", "ep", 3 * 4 * 4 + 12): 3 * 4 * 4 * tokens + 12 * 4 * 8}
    full = parse("dp=2,ep=2,ac=full", 2)
    counts = [c.count_per_step for c in rank_collectives(moe, cluster, train, full, shape) if c.kind == "all_to_all"]
    assert counts == [3 * 4 * 6 + 24]


def test_search_covers_ep_only_for_moe(moe):
    assert {lay.ep for lay in enumerate_layouts(moe, 4, 8)} == {1, 2, 4}
    assert {lay.ep for lay in enumerate_layouts(load_model("tiny"), 4, 8)} == {1}


def test_explanation_says_why_ep(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.MixtralConfig(
        hidden_size=6144,
        intermediate_size=16384,
        num_hidden_layers=56,
        num_attention_heads=48,
        num_key_value_heads=8,
        vocab_size=32768,
        max_position_embeddings=65536,
        rope_theta=1e6,
    ).save_pretrained(tmp_path)
    model = load_model(str(tmp_path))
    p = plan(model, load_cluster("h100", 256), TrainSpec(512, 4096, moe_balancing="aux-loss-free"), top=3)
    best = p.candidates[0]
    assert best.fits and best.layout.ep > 1
    line = next(x for x in p.explanation if x.startswith("E. Experts"))
    # why: the best layout with ep=1 from the same search (not all experts against one rank)
    assert f"ep={best.layout.ep}: each rank keeps {model.experts // best.layout.ep} of" in line
    assert "all-to-all moves" in line and "chosen because" in line and "the best with ep=1" in line


def test_ep_with_cp_collectives_and_states(moe):
    """ep=4 carved from dp_shard x cp (4 x 2): all-to-alls of the rank's s/cp tokens on the EP group,
    the routing counts all-reduced over cp per MoE block (the load-balancing loss), expert ZeRO over
    the dp * cp / ep = 2 ranks left (dim edp), dense ZeRO over dp_shard x cp."""
    cluster, train = load_cluster("cpu", 8, 8), TrainSpec(8, 64, "fp32")
    lay = parse("dp=4,zero=3,cp=2,ep=4", 8)  # 2 micro-batches per replica, 3 MoE blocks, 32 tokens per rank
    shape = memory.rank_shapes(moe, lay)[0]
    ops = {
        (c.kind, c.dim): (c.count_per_step, c.bytes_per_step) for c in rank_collectives(moe, cluster, train, lay, shape)
    }
    tokens = 32 * 2 * 64 * 4  # T k h e, T = s / cp
    assert ops[("all_to_all", "ep")] == (3 * 2 * 4 + 3 * 2, 3 * 2 * 4 * tokens + 3 * 2 * 4 * 8)
    assert ops[("all_reduce", "cp")] == (3 * 2, 3 * 2 * 4 * 4)  # mbs x E float32
    per_block = 4 * 3 * 64 * 48 * 4  # one block's 4 experts, fp32
    assert ops[("all_gather", "edp")] == (3 * 2 * 2, 3 * 2 * 2 * per_block / 4)  # ZeRO-3: forward and backward
    assert ops[("reduce_scatter", "edp")] == (3 * 2, 3 * 2 * per_block / 4)
    assert ("all_gather", "dp_shard_cp") in ops
    assert memory.states(shape.params, train, parse("dp=8,zero=3,ep=4", 8), shape.expert_params) == memory.states(
        shape.params, train, memory.weights_layout(lay), shape.expert_params
    )  # cp ranks share weights
    plain = {(c.kind, c.dim) for c in rank_collectives(moe, cluster, train, parse("dp=4,zero=3,cp=2", 8), shape)}
    assert ("all_reduce", "cp") in plain and ("all_to_all", "ep") not in plain  # the loss's counts, ep or not


def test_search_covers_ep_with_cp(moe):
    layouts = list(enumerate_layouts(moe, 8, 8, seq_len=2 * 8192))
    both = {(lay.cp, lay.ep) for lay in layouts if lay.cp > 1 and lay.ep > 1}
    assert (2, 4) in both and all((lay.shard * lay.cp) % lay.ep == 0 for lay in layouts)
    assert any(lay.ep == 4 and lay.cp == 2 and lay.shard == 2 for lay in layouts)  # ep spans cp ranks beyond dp_shard


def test_ep_with_cp_moments_and_fsdp_padding(moe):
    """dp=4,zero=3,cp=2,ep=4 (measured by tests/test_measure.py): the ring moment is the last block's
    (a MoE block's tensors outweigh the dense unit's 19,008 weights that the block before prefetches),
    its gradients the head's, the shards and the last block's dense unit but Q/K/V and the first norm
    (the experts' unit is reduced already); the backward's start moves past the shared expert's
    backward (its 6,208 fresh gradients); FSDP2 pads the router (4 rows) and the shared gate (1 row)
    to multiples of the 8 shards."""
    from meshwise.cost.context_parallel import weights_layout
    from meshwise.cost.estimate import fsdp_padding

    train, layout = TrainSpec(8, 64, "fp32"), parse("dp=4,zero=3,cp=2,ep=4", 8)
    shape = memory.all_rank_shapes(moe, layout)[0]
    moments = memory.moment_memories(moe, train, layout, shape, 2, 1e12)
    sharded = moe.params * 4 / 8
    head = (moe.vocab * moe.hidden + moe.hidden) * 4
    dense_unit = 12416 + 128 + 4 * 64 + 3 * 64 * 32 + 64
    assert moments["ring"].grads == pytest.approx(sharded + head + (dense_unit - (12416 - 64 * 64) - 64) * 4)
    assert moments["backward"].grads == pytest.approx(sharded + head + (3 * 64 * 32 + 64) * 4)
    last, before, _ = memory._ring_backward(moe, TrainSpec(8, 32, "fp32"), layout, shape)
    assert moments["ring"].activations == last > before  # the last block's, not the last but one's
    assert fsdp_padding(moe, weights_layout(layout), shape) == 3 * (4 * 64 + 7 * 64)
    assert fsdp_padding(moe, weights_layout(parse("dp=4,zero=3,ep=2", 4)), shape) == 3 * 3 * 64
    tiny = load_model("tiny")
    assert fsdp_padding(tiny, parse("dp=8,zero=3", 8), memory.all_rank_shapes(tiny, parse("dp=8,zero=3", 8))[0]) == 0


def test_a_peak_inside_an_attention_under_cp_is_the_rings():
    """measure's workers say where the peak fell; under cp an attention's backward is the ring's, and
    without a ring moment of its own (not ZeRO-3) the backward's start stands in for it."""
    from types import SimpleNamespace

    from meshwise.measure._torch_tools import peak_moments
    from meshwise.measure.compare import moments_seen

    inside = SimpleNamespace(peak_in_backward=True, peak_in_module=True, peak_in_attention=True)
    mlp = SimpleNamespace(peak_in_backward=True, peak_in_module=True, peak_in_attention=False)
    assert peak_moments(inside, ring=True) == ["ring"] and peak_moments(mlp, ring=True) == ["backward"]
    assert peak_moments(inside) == peak_moments(mlp) == ["backward", "ring"]
    tiny, train = load_model("tiny"), TrainSpec(8, 64, "fp32")
    for text, name in (("cp=2,dp=2,zero=1", "backward"), ("cp=2,dp=2,zero=3", "ring")):
        layout = parse(text, 4)
        shape = memory.all_rank_shapes(tiny, layout)[0]
        assert moments_seen(["ring"], memory.moment_memories(tiny, train, layout, shape, 2, 1e12)) == [name]


def test_megatron_expert_tp_splits_the_expert_gradients_and_the_dispatch(moe):
    """Megatron, tp=2, ep=2 (expert TP = TP, its default): each rank holds 1/tp of its experts, so the
    expert data-parallel reduction carries 1/tp of meshwise's; each TP rank dispatches its T/tp
    sequence-parallel tokens and the TP group all-gathers and reduce-scatters the copies
    (token_dispatcher.py, MoEAlltoAllTokenDispatcher)."""
    cluster, lay = load_cluster("h100", 8), parse("dp=4,zero=1,tp=2,sp=on,ep=2", 8)
    shape = memory.rank_shapes(moe, lay)[0]
    ops = {}
    for runtime in ("meshwise", "megatron"):
        train = TrainSpec(8, 64, "bf16-mixed", runtime=runtime)
        ops[runtime] = {
            (c.kind, c.dim): (c.count_per_step, c.bytes_per_step)
            for c in rank_collectives(moe, cluster, train, lay, shape)
        }
    mesh, mega = ops["meshwise"], ops["megatron"]
    assert mega[("reduce_scatter", "edp")][1] == pytest.approx(mesh[("reduce_scatter", "edp")][1] / 2)
    calls, moved = mesh[("all_to_all", "ep")]
    counts = calls // 5 * moe.experts * 8  # the E int64 counts: 1 of the 5 calls per block and micro-batch
    assert mega[("all_to_all", "ep")] == (calls, pytest.approx((moved - counts) / 2 + counts))
    tokens = 64 * moe.experts_per_token * moe.hidden * 2  # T k h e, the whole micro-batch's copies gathered
    logits = lay.accum(8) * 64 * moe.vocab * 2  # meshwise gathers the logits; Megatron keeps them vocabulary-parallel
    gathered = mega[("all_gather", "tp")][1] - mesh[("all_gather", "tp")][1] + logits
    assert gathered == pytest.approx(2 * calls // 5 * tokens)  # forward and backward, per block and micro-batch


def test_plan_flags_reach_the_moe_model(capsys):
    """plan --moe-capacity-factor / --moe-balancing / --moe-comm-overlap set TrainSpec's MoE fields: the
    overlap hides all-to-all time, a padded capacity of 1.0 runs fewer rows than the aux-loss imbalance;
    a bad value is one line naming its flag, exit status 2."""
    import json

    from meshwise.cli import main

    base = [
        "plan",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h800",
        "--gpus",
        "2048",
        "--runtime",
        "megatron",
        "--seq-len",
        "4096",
        "--global-batch",
        "15360",
        "--layout",
        "pp=16,ep=64,zero=1,mbs=1",
        "--json",
    ]

    def step_s(*extra: str) -> float:
        assert main(base + list(extra)) == 0
        return json.loads(capsys.readouterr().out)["candidates"][0]["time"]["step_s"]

    dropless = step_s()
    assert step_s("--moe-comm-overlap") < dropless
    assert step_s("--moe-capacity-factor", "1.0") < dropless
    assert main(["plan", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "64", "--moe-comm-overlap"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--moe-comm-overlap" in err[0] and "Traceback" not in err[0]
