"""Float8 copies of a MoE model's weights per rank: the rank's own experts, not all of them.

DeepSeek-V3 on 256 H100 in fp8 was "Nothing fits" while bf16-mixed fit at 66.4 GB: every format
added ~22 GB, float8 copies of all 256 experts of a block whatever ep. Now: meshwise's runtime keeps
the routed experts in bf16 (runtime/float8.py), so its copies are of a block's other weights, the same
at every ep; Megatron-LM's (Transformer Engine) casts the rank's 1/ep of the experts, sharded as
Megatron-FSDP shards the weights."""

from __future__ import annotations

import pytest

from meshwise.cost.estimate import estimate
from meshwise.layout import parse
from meshwise.plan.planner import plan
from meshwise.spec import TrainSpec, load_cluster, load_model

MODEL = load_model("deepseek-v3")
CLUSTER = load_cluster("h100", 256)


def _extra(runtime: str, text: str, precision: str = "fp8") -> float:
    """What ``precision`` adds to bf16-mixed's memory per rank for layout ``text``."""
    lay = parse(text, 256)
    total = {
        p: estimate(MODEL, CLUSTER, TrainSpec(512, 4096, p, runtime=runtime), lay).memory.total
        for p in ("bf16-mixed", precision)
    }
    return total[precision] - total["bf16-mixed"]


@pytest.mark.parametrize("runtime", ["meshwise", "megatron"])
def test_deepseek_v3_on_256_h100_fits_in_fp8(runtime):
    train = TrainSpec(512, 4096, "fp8", runtime=runtime)
    assert plan(MODEL, CLUSTER, train, top=3).candidates[0].fits


def test_meshwise_runtime_copies_no_experts():
    """The same float8 copies at ep = 8, 64, 256 (no experts among them), under a gigabyte."""
    extras = [_extra("meshwise", f"dp=256,zero=3,ep={ep},mbs=1,ac=full") for ep in (8, 64, 256)]
    assert max(extras) - min(extras) < 1e6 and 0 < extras[0] < 1e9


def test_megatron_copies_the_ranks_own_experts():
    """Without weight sharding (distributed optimizer): the copies shrink by 2 B per expert parameter the
    rank gives up, 2 x E x (1/8 - 1/64) from ep=8 to ep=64, E the routed experts' parameters."""
    drop = _extra("megatron", "dp=256,zero=1,ep=8,mbs=1,ac=full") - _extra(
        "megatron", "dp=256,zero=1,ep=64,mbs=1,ac=full"
    )
    assert drop == pytest.approx(2 * MODEL.expert_params * (1 / 8 - 1 / 64), rel=1e-9)


def test_megatron_fsdp_shards_the_copies():
    """Megatron-FSDP (zero=3) keeps float8 parameters sharded: 2 B per parameter the rank holds, the
    model's ends aside, so about 2 x 671B / 256 whatever ep."""
    for ep in (8, 64, 256):
        extra = _extra("megatron", f"dp=256,zero=3,ep={ep},mbs=1,ac=full")
        ends = 2 * MODEL.embedding_params + MODEL.hidden  # embedding, head, final norm
        assert extra == pytest.approx(2 * (MODEL.params - ends) / 256, rel=1e-9)
