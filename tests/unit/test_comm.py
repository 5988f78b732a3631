"""Communication model: ZeRO volumes, TP per-layer collectives, link tiers, pipeline messages."""

import pytest

from meshwise.cost.comm import collective_seconds
from meshwise.cost.estimate import estimate, rank_collectives
from meshwise.cost.memory import all_rank_shapes
from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.spec import LinkSpec, ModelSpec, TrainSpec, load_cluster, load_model


def _wire_elements(e, psi, elem_bytes):
    """Elements each rank moves: all-reduce counts twice its payload (reduce-scatter + all-gather)."""
    total = 0.0
    for c in e.comm:
        total += c.bytes_per_step * (2 if c.kind == "all_reduce" else 1)
    return total / elem_bytes / psi


@pytest.mark.parametrize("zero, volume", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_zero_communication_volume(zero, volume):
    # ZeRO Sec. 7: DP and ZeRO-1/2 move 2 Psi per rank per step, ZeRO-3 3 Psi (one micro-batch per step).
    psi = 7.5e9
    e = estimate(
        ModelSpec.from_param_count(psi),
        load_cluster("a100-80gb", 64),
        TrainSpec(64, 2048, "bf16"),
        parse(f"dp=64,zero={zero}"),
    )
    assert _wire_elements(e, psi, 2) == pytest.approx(volume)


def test_tp_collectives_per_layer():
    # The runtime's collectives (docs/runtime.md), per micro-batch: sp off, 2 all-reduces per block
    # each way, 1 for the head's input gradient, the gathered logits and the embedding's output
    # gathered (its table split on the hidden dimension); sp on, that output gathered in forward
    # (then split on the sequence) and its gradient gathered in backward.
    model = load_model("llama3-8b")
    cluster, train = load_cluster("h100", 8), TrainSpec(1, 4096, "bf16")
    payload = 4096 * model.hidden * 2
    logits = 4096 * model.vocab * 2
    off = {(c.kind, c.dim): c for c in estimate(model, cluster, train, parse("tp=8,sp=off", 8)).comm}
    assert off[("all_reduce", "tp")].count_per_step == 4 * model.layers + 1 + 2  # + gradient norm and loss
    assert off[("all_reduce", "tp")].bytes_per_step == pytest.approx((4 * model.layers + 1) * payload + 16)
    assert off[("all_gather", "tp")].bytes_per_step == pytest.approx(logits + payload)
    on = {(c.kind, c.dim): c for c in estimate(model, cluster, train, parse("tp=8,sp=on", 8)).comm}
    assert on[("all_gather", "tp")].count_per_step == 4 * model.layers + 3 + 1
    assert on[("reduce_scatter", "tp")].count_per_step == 4 * model.layers + 1
    # the SP norm weights' partial gradients, once per step: 2 per block + the final norm (+2 world)
    assert on[("all_reduce", "tp")].count_per_step == 2 * model.layers + 1 + 2
    full = {(c.kind, c.dim): c for c in estimate(model, cluster, train, parse("tp=8,ac=full", 8)).comm}
    assert full[("all_gather", "tp")].count_per_step == 6 * model.layers + 4  # recompute re-gathers
    assert full[("reduce_scatter", "tp")].count_per_step == 5 * model.layers + 1


def test_megatron_loss_stays_vocabulary_parallel():
    # Megatron's GPTModel keeps its logits split on the vocabulary (parallel_output, gather_output off)
    # and vocab_parallel_cross_entropy all-reduces three float32 values per token (the max, the target's
    # logit, the sum of exps): no all-gather of the logits, which meshwise's runtime makes.
    model = load_model("llama3-8b")
    cluster, layout = load_cluster("h100", 8), parse("tp=8,sp=on", 8)
    tokens = 4096
    ops = {}
    for runtime in ("meshwise", "megatron"):
        train = TrainSpec(1, tokens, "bf16", runtime=runtime)
        ops[runtime] = {(c.kind, c.dim): c for c in estimate(model, cluster, train, layout).comm}
    logits = tokens * model.vocab * 2
    gathered = (
        ops["meshwise"][("all_gather", "tp")].bytes_per_step - ops["megatron"][("all_gather", "tp")].bytes_per_step
    )
    assert gathered == pytest.approx(logits)
    reduced = (
        ops["megatron"][("all_reduce", "tp")].bytes_per_step - ops["meshwise"][("all_reduce", "tp")].bytes_per_step
    )
    assert reduced == pytest.approx(3 * tokens * 4)


def test_link_tiers():
    c = load_cluster("h100", 64, 8)
    assert c.link_for(8, 1) == c.intra  # TP of 8 inside a node: NVLink
    assert c.link_for(8, 8).bytes_per_s == c.inter.bytes_per_s  # DP across nodes, one rank per node: one NIC
    assert c.link_for(16, 4).bytes_per_s == 2 * c.inter.bytes_per_s  # two ranks of the group per node: two NICs
    # eight NICs (376 GB/s) but every ring also crosses NVLink inside each node (300 GB/s): the slower tier
    assert c.link_for(16, 1).bytes_per_s == c.intra.bytes_per_s < 8 * c.inter.bytes_per_s
    cpu = load_cluster("cpu", 4)  # gloo: one link, not two tiers; two "nodes" of 2 keep the product
    assert cpu.link_for(4, 1).bytes_per_s == 2 * cpu.inter.bytes_per_s


def test_collective_costs():
    link = LinkSpec(bytes_per_s=100e9, latency_s=1e-5)
    big = 1e9
    assert collective_seconds("all_reduce", 8, big, link) == pytest.approx(14 * 1e-5 + 2 * 7 / 8 * big / 100e9)
    assert collective_seconds("all_gather", 8, big, link) == pytest.approx(7 * 1e-5 + 7 / 8 * big / 100e9)
    # small messages: the tree's log-depth latency wins
    assert collective_seconds("all_reduce", 1024, 8, link) == pytest.approx(2 * 10 * 1e-5 + 16 / 100e9)
    assert collective_seconds("send", 2, big, link) == pytest.approx(1e-5 + big / 100e9)


def test_ring_steps_across_nodes_split_as_nccl_tunes_them():
    """NCCL's tuning model (src/graph/tuning.cc, v2.21.5): a ring all-gather or reduce-scatter of n ranks
    over N nodes takes N-1 steps between nodes and n-N inside one; its tree (k-1) inside, log2 N between."""
    c = load_cluster("h100", 1344 * 8, 8)
    link = c.link_for(336, 4)  # MLPerf GPT-3's DP group at TP 4: 2 ranks in each of 168 nodes
    assert (link.ranks_per_node, link.intra_latency_s) == (2, c.intra.latency_s)
    hops = 167 * c.inter.latency_s + 168 * c.intra.latency_s
    assert collective_seconds("reduce_scatter", 336, 8, link) == pytest.approx(hops + 335 / 336 * 8 / link.bytes_per_s)
    assert collective_seconds("all_gather", 336, 8, link) < 335 * c.inter.latency_s  # was every step at NIC latency
    tree = 2 * (c.intra.latency_s + 8 * c.inter.latency_s) + 2 * 8 / link.bytes_per_s
    assert collective_seconds("all_reduce", 336, 8, link) == pytest.approx(tree)
    # one rank per node, or a group inside one node: every step at its link's own latency, as before
    one = c.link_for(16, 8)
    assert collective_seconds("all_gather", 16, 8, one) == pytest.approx(
        15 * one.latency_s + 15 / 16 * 8 / one.bytes_per_s
    )


def test_tp_across_nodes_is_slower_than_inside():
    model = load_model("llama3-70b")
    train = TrainSpec(64, 4096, "bf16-mixed")
    inside = estimate(model, load_cluster("h100", 16, 8), train, parse("tp=8,zero=3", 16))
    across = estimate(model, load_cluster("h100", 16, 4), train, parse("tp=8,zero=3", 16))

    # 4 NICs of 47 GB/s (188 GB/s for the group) instead of NVLink's 300 GB/s bus bandwidth (1.6x);
    # the ring's steps inside each node keep NVLink's latency (NCCL's tuning model), so a little less
    def tp_seconds(e):
        return sum(c.seconds_per_step for c in e.comm if c.dim == "tp")

    assert tp_seconds(across) > 1.4 * tp_seconds(inside)


def test_pipeline_messages():
    model = load_model("llama3-8b")
    train = TrainSpec(16, 4096, "bf16")
    layout, m = parse("pp=4,tp=2,sp=on", 8), 16
    message = 4096 * model.hidden * 2 / 2  # bf16 activations of the sequence shard (sp over tp=2)
    per_rank = []
    for shape in all_rank_shapes(model, layout):
        ops = {(c.kind, c.dim): c for c in rank_collectives(model, load_cluster("h100", 8), train, layout, shape)}
        per_rank.append(ops[("send", "pp")].count_per_step)
        assert ops[("recv", "pp")].count_per_step == ops[("send", "pp")].count_per_step
        assert ops[("send", "pp")].bytes_per_step == pytest.approx(per_rank[-1] * message)
    assert per_rank == [m, 2 * m, 2 * m, m]  # the end ranks send one way, the middle ranks both
    sends = {(c.kind, c.dim): c for c in estimate(model, load_cluster("h100", 8), train, layout).comm}[("send", "pp")]
    assert sends.count_per_step in per_rank  # the estimate reports its slowest rank's collectives


def test_a_run_stating_bf16_gradient_reductions_halves_them():
    """NeMo 1.x's distributed_fused_adam reduce-scatters in its ``grad_sync_dtype`` (MLPerf v4.0's GPT-3: bf16):
    ``grad_reduce_bytes = 2`` halves the DP reduce-scatter's payload and nothing else; other values refuse."""
    model, cluster, lay = load_model("llama3-70b"), load_cluster("h100", 64), parse("dp=8,zero=1,tp=8", 64)
    fp32, bf16 = (
        estimate(model, cluster, TrainSpec(64, 4096, "bf16-mixed", runtime="megatron", grad_reduce_bytes=b), lay)
        for b in (0, 2)
    )

    def payload(e, kind):
        return sum(c.bytes_per_step for c in e.comm if c.kind == kind and c.dim == "dp")

    assert payload(bf16, "reduce_scatter") == pytest.approx(payload(fp32, "reduce_scatter") / 2)
    assert payload(bf16, "all_gather") == payload(fp32, "all_gather")
    with pytest.raises(MeshwiseError, match="grad_reduce_bytes"):
        TrainSpec(64, 4096, grad_reduce_bytes=3)
