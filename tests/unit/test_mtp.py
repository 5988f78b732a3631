"""Multi-token prediction (cost/mtp.py): what a trained MTP module adds to the last pipeline stage."""

import pytest

from meshwise.cost import kernels, moe_block, mtp
from meshwise.cost.estimate import estimate
from meshwise.cost.memory import rank_shapes
from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

V3 = load_model("deepseek-v3")
H100 = load_cluster("h100", 8).accelerator


def test_one_module_is_a_moe_block_a_projection_and_the_head_again():
    """By hand from its parts (DeepSeek-V3 report Sec. 2.2): one more block (its attention and MoE MLP),
    the 2h x h projection of the two normed inputs, the embedding and the head with its loss."""
    train = TrainSpec(512, 4096, runtime="megatron", mtp_layers=1)
    lay = parse("dp=8,ep=8,mbs=1", 8)
    fwd, bwd, rec = kernels.block_seconds(V3, H100, train, 1, 1, False, "none")
    mlp = moe_block.rank_mlp_seconds(V3, H100, train, 1, 1, 8, False, "none", 1, 1)
    proj = sum(kernels.linears_seconds(H100, train, 4096, (7168, 2 * 7168)))
    head = kernels.head_seconds(V3, H100, train, 1, 1, False) + kernels.embedding_seconds(V3, H100, train, 1, 1, False)
    assert mtp.mtp_seconds(V3, H100, train, lay) == pytest.approx(fwd + bwd + rec + mlp + proj + head)
    assert mtp.mtp_seconds(V3, H100, TrainSpec(512, 4096, runtime="megatron"), lay) == 0.0


def test_it_lands_on_the_stage_with_the_head_and_its_all_to_alls_too():
    """The stage holding the head runs it: its compute and its MoE block's dispatch and combine; the
    other stages are unchanged."""
    from meshwise.cost.estimate import compute_seconds
    from meshwise.cost.experts import ep_collectives

    cluster, lay = load_cluster("h100", 256), parse("dp=16,ep=16,pp=16,mbs=1", 256)
    plain, with_mtp = (TrainSpec(512, 4096, runtime="megatron", mtp_layers=k) for k in (0, 1))
    m = lay.accum(512)
    for shape in rank_shapes(V3, lay):
        before, after = (compute_seconds(V3, cluster, t, lay, shape) for t in (plain, with_mtp))
        calls = [
            sum(c.count_per_step for c in ep_collectives(V3, t, lay, shape, m, cluster) if c.kind == "all_to_all")
            for t in (plain, with_mtp)
        ]
        if shape.has_head:
            assert after == pytest.approx(before + m * mtp.mtp_seconds(V3, cluster.accelerator, with_mtp, lay))
            assert calls[1] == calls[0] + 5 * m  # one more MoE block: dispatch and combine both ways, the counts
        else:
            assert (after, calls[1]) == (before, calls[0])
    assert estimate(V3, cluster, with_mtp, lay).time.step_s > estimate(V3, cluster, plain, lay).time.step_s


def test_meshwise_runtime_refuses_it_in_one_line():
    with pytest.raises(MeshwiseError, match="--mtp-layers: 1 must be 0, or at least 1 under --runtime megatron"):
        TrainSpec(512, 4096, mtp_layers=1)
    with pytest.raises(MeshwiseError, match="--mtp-layers: -1"):
        TrainSpec(512, 4096, runtime="megatron", mtp_layers=-1)
