"""``plan --emit deepspeed`` read back by DeepSpeed 0.19.8's own ``DeepSpeedConfig``: it accepts the
JSON at the planned data-parallel size and derives the same accumulation from the batch and
micro-batch alone. The data-parallel size reaches DeepSpeed the way Megatron-DeepSpeed passes it
(an ``mpu`` answering ``get_data_parallel_world_size``); the only thing stood in for is the
process group's rank query, so no process group (and no DeepSpeed communication op build) is needed.
"""

from __future__ import annotations

import json

import pytest

from meshwise import spec
from meshwise.layout import check_runnable, parse
from meshwise.plan import emit

# (model, world size, layout, global batch, sequence, precision)
CASES = [
    ("llama3-8b", 8, "dp=8", 64, 8192, "bf16-mixed"),
    ("llama3-8b", 8, "dp=8,zero=1,mbs=2", 64, 8192, "bf16-mixed"),
    ("llama3-8b", 16, "dp=16,zero=2,mbs=4,ac=full", 512, 4096, "bf16-mixed"),
    ("llama3-8b", 64, "dp=64,zero=3", 512, 8192, "bf16-mixed"),
    ("llama3-8b", 64, "dp=64,zero=3,mbs=2,ac=full", 1024, 8192, "bf16"),
    ("llama3-8b", 32, "dp=32,zero=1", 96, 8192, "bf16"),
    ("llama3-8b", 8, "dp=8,zero=2", 8, 2048, "fp32"),
    ("llama3-70b", 256, "dp=256,zero=3,ac=full", 2048, 8192, "bf16-mixed"),
    ("llama3-70b", 1024, "dp=1024,zero=3,mbs=1,ac=full", 1024, 4096, "bf16-mixed"),
    ("mistral-7b", 24, "dp=24,zero=2,mbs=2", 480, 4096, "bf16-mixed"),
    ("tiny", 2, "dp=2", 8, 64, "fp32"),
]


def _target(model, world, text, batch, seq, precision) -> emit.Target:
    m = spec.load_model(model)
    layout = parse(text, world)
    check_runnable(layout, m, world, batch, seq)
    return emit.Target(m, layout, batch, seq, precision, world, 8)


class _DataParallel:
    """Megatron's model-parallel unit as DeepSpeed asks it: the data-parallel world size."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def ds_config(request):
    pytest.importorskip("deepspeed", reason="DeepSpeed is the oracle of --emit deepspeed (pip install meshwise[test])")
    from deepspeed.runtime import config as ds

    patch = pytest.MonkeyPatch()
    patch.setattr(ds.dist, "get_rank", lambda *a, **k: 0)
    request.addfinalizer(patch.undo)
    return ds.DeepSpeedConfig


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}:{c[2]}:{c[5]}")
def test_deepspeed_reads_the_planned_layout(ds_config, case):
    target = _target(*case)
    lay = target.layout
    text = emit.emit("deepspeed", target)
    cfg = ds_config(json.loads(text), mpu=_DataParallel(lay.dp))
    assert cfg.world_size == lay.dp
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        target.global_batch,
        lay.mbs,
        target.accum,
    )
    assert int(cfg.zero_optimization_stage) == lay.zero
    assert cfg.gradient_clipping == emit.GRAD_CLIP
    assert cfg.bfloat16_config.enabled == (target.precision != "fp32")
    assert cfg.bfloat16_config.bf16_master_weights_and_grads == (target.precision == "bf16")
    # DeepSpeed's own rule derives the same accumulation from the batch and micro-batch alone
    derived = json.loads(text)
    del derived["gradient_accumulation_steps"]
    assert ds_config(derived, mpu=_DataParallel(lay.dp)).gradient_accumulation_steps == target.accum


def test_several_layouts_are_one_json_object_keyed_by_layout(ds_config):
    targets = [_target(*c) for c in CASES[:3]]
    both = json.loads(emit.emit_many("deepspeed", targets))
    assert list(both) == [t.layout.short() for t in targets]
    for t in targets:
        assert ds_config(both[t.layout.short()], mpu=_DataParallel(t.layout.dp)).gradient_accumulation_steps == t.accum


@pytest.mark.parametrize(
    "layout,precision,names",
    [
        ("dp=8,zero=3,tp=8", "bf16-mixed", "Megatron-DeepSpeed"),
        ("dp=16,zero=1,pp=4", "bf16-mixed", "Megatron-DeepSpeed"),
        ("dp=32,zero=3,cp=2", "bf16-mixed", "cp=2"),
        ("dp=64,zero=3,shard=8", "bf16-mixed", "shard=8"),
        ("dp=64,zero=3,ac=selective", "bf16-mixed", "selective"),
        ("dp=64,zero=3", "fp8", "float8"),
        ("dp=64", "bf16", "ZeRO stage 1-3"),
    ],
)
def test_what_deepspeed_cannot_express_is_refused(layout, precision, names):
    target = _target("llama3-8b", 64, layout, 512, 4096, precision)
    with pytest.raises(emit.Unexpressible, match=names) as err:
        emit.emit("deepspeed", target)
    assert "\n" not in str(err.value) and str(err.value).startswith("--emit deepspeed:")


def test_expert_parallelism_is_refused():
    target = _target("tiny-moe", 4, "dp=4,zero=3,ep=2", 8, 64, "bf16-mixed")
    with pytest.raises(emit.Unexpressible, match="ep_size"):
        emit.emit("deepspeed", target)
