"""``plan --emit torchtitan`` read back by torchtitan 0.3.0's own ConfigManager (its CLI parser and the
config validation it runs at parse time): the planned degrees, batch, schedule, stage split and
checkpointing mode come back out of torchtitan's config objects."""

from __future__ import annotations

import pytest
from tests._moe_configs import CONFIGS, UNSEEN
from tests._torchtitan import DEBUG, QWEN3_MOE_DEBUG, command_args, config_manager

from meshwise import spec
from meshwise.layout import check_runnable, parse, stage_layers
from meshwise.plan import emit
from meshwise.spec.hf_config import model_from_hf_config

# (model, world size, layout, global batch, sequence, precision)
CASES = [
    ("llama3-70b", 64, "dp=8,zero=3,tp=8", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 64, "dp=8,zero=3,shard=4,tp=8,mbs=2,ac=full", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 64, "dp=2,zero=1,tp=8,pp=4,vpp=5,ac=full", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 128, "dp=4,cp=2,tp=8,pp=2,ac=selective", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 128, "dp=4,zero=2,tp=8,pp=4,schedule=gpipe", 64, 8192, "bf16-mixed"),
    ("llama3-70b", 256, "dp=8,zero=3,cp=4,tp=8,ac=full", 64, 8192, "bf16-mixed"),
    ("llama3-8b", 8, "dp=8", 64, 8192, "bf16-mixed"),
    ("llama3-8b", 16, "dp=16,zero=3,shard=8,mbs=2,ac=selective", 256, 8192, "bf16-mixed"),
    ("llama3-8b", 16, "dp=4,tp=2,sp=off,pp=2,vpp=4,mbs=2", 64, 4096, "bf16-mixed"),
    ("llama3-debug", 8, "dp=2,zero=3,tp=2,pp=2,vpp=3,ac=full", 16, 256, "bf16-mixed"),
    (QWEN3_MOE_DEBUG, 8, "dp=4,zero=3,ep=4,tp=2", 32, 512, "bf16-mixed"),
    (QWEN3_MOE_DEBUG, 16, "dp=4,zero=3,ep=8,cp=2,tp=2,ac=full", 32, 4096, "bf16-mixed"),
    # the MoE families torchtitan 0.3.0 registers, at the sizes planned for them
    ("deepseek-v3", 256, "dp=32,zero=3,ep=32,pp=8,ac=full", 1024, 4096, "bf16-mixed"),
    ("deepseek-v3", 1024, "dp=128,zero=3,shard=64,ep=64,pp=8,ac=full", 1024, 4096, "fp8-rowwise"),
    ("gpt-oss-120b", 64, "dp=64,zero=3,ep=8,ac=selective", 512, 4096, "bf16-mixed"),
    ("gpt-oss-20b", 64, "dp=32,zero=3,ep=8,tp=2", 512, 4096, "bf16-mixed"),
    ("qwen3-30b-a3b", 64, "dp=64,zero=3,ep=16", 512, 4096, "bf16-mixed"),
    ("qwen3-30b-a3b", 256, "dp=64,zero=3,ep=16,pp=4,ac=full", 1024, 4096, "bf16-mixed"),
]


def _model(m):
    if isinstance(m, spec.ModelSpec):
        return m
    if m in {**CONFIGS, **UNSEEN} and m != "deepseek-v3":  # published config.json (the catalog has DeepSeek-V3)
        return model_from_hf_config({**CONFIGS, **UNSEEN}[m], m)
    return DEBUG if m == "llama3-debug" else spec.load_model(m)


def _target(model, world, text, batch, seq, precision) -> emit.Target:
    layout = parse(text, world)
    check_runnable(layout, _model(model), world, batch, seq)
    return emit.Target(_model(model), layout, batch, seq, precision, world, 8)


@pytest.fixture(scope="module")
def manager():
    return config_manager()


def _dp_degrees(p) -> tuple[int, int]:
    return p.data_parallel_replicate_degree, p.data_parallel_shard_degree


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}:{c[2]}")
def test_torchtitan_reads_the_planned_layout(manager, float8_hardware, case):
    target = _target(*case)
    lay = target.layout
    cfg = manager.parse_args(command_args(emit.emit("torchtitan", target), "torchtitan.train"))
    p, t = cfg.parallelism, cfg.training
    # the mesh: replicate x shard x cp x tp x pp is the world, as torchtitan's ParallelDims requires
    assert _dp_degrees(p) == ((lay.replicate, lay.shard) if lay.zero else (lay.dp, 1))
    assert (
        p.tensor_parallel_degree,
        p.context_parallel_degree,
        p.pipeline_parallel_degree,
        p.expert_parallel_degree,
    ) == (lay.tp, lay.cp, lay.pp, lay.ep)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree * lay.cp * lay.tp * lay.pp == case[1]
    assert p.enable_sequence_parallel == (lay.sp or lay.tp == 1)
    assert p.spmd_backend == "full_dtensor"
    # the batch: torchtitan's own accumulation rule (trainer.py) gives the planned micro-batches
    batch_degree = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    accum = t.global_batch_size // (t.local_batch_size * batch_degree)
    micro = t.local_batch_size // p.pipeline_parallel_microbatch_size if lay.pp > 1 else 1
    assert (t.global_batch_size, t.seq_len) == (target.global_batch, target.seq_len)
    assert accum * micro == target.accum
    assert (p.pipeline_parallel_microbatch_size if lay.pp > 1 else t.local_batch_size) == lay.mbs
    ac = type(cfg.activation_checkpoint).__qualname__.split(".")[0]
    assert ac == {"none": "NoneType", "selective": "SelectiveAC", "full": "FullAC"}[lay.ac]
    if lay.pp > 1:
        parts = p.module_fqns_per_model_part
        assert len(parts) == lay.pp * lay.vpp
        assert [sum(n.startswith("layers.") for n in part) for part in parts] == stage_layers(
            target.model.layers, lay.stages
        )
        assert (
            p.pipeline_parallel_schedule
            == {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}[lay.schedule]
        )


def _shape(config) -> tuple[int, ...]:
    """(layers, width, heads, KV heads, vocabulary, experts) of a torchtitan trainer config's model."""
    model = config.model_spec.model
    attention = model.layers[0].attention
    kv = getattr(attention, "n_kv_heads", None) or attention.n_heads
    moe = next((layer.moe for layer in model.layers if getattr(layer, "moe", None) is not None), None)
    return len(model.layers), model.dim, attention.n_heads, kv, model.vocab_size, moe.num_experts if moe else 0


@pytest.fixture
def float8_hardware(monkeypatch):
    """torchtitan's float8 and MX converters told the device is capable (they probe CUDA at build time)."""
    pytest.importorskip("torchao")
    from torchtitan.components.quantization import float8, mx

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)
    for name in dir(mx):
        if "capab" in name:
            monkeypatch.setattr(mx, name, lambda *a: True)


def test_registry_table_matches_torchtitan(manager, float8_hardware):
    """emit's table of torchtitan configs by shape is what torchtitan's registry builds, float8 ones too."""
    import importlib

    for entry in emit.TITAN_REGISTRY:
        registry = importlib.import_module(f"torchtitan.models.{entry.module}.config_registry")
        shape = (entry.layers, entry.hidden, entry.heads, entry.kv_heads, entry.vocab, entry.experts)
        for name in [entry.base] + [fn for _, fn in entry.float8] if entry.base else [fn for _, fn in entry.float8]:
            assert _shape(getattr(registry, name)()) == shape, name


def test_every_moe_torchtitan_registers_is_emitted(manager, float8_hardware):
    """Every mixture of experts in the installed torchtitan's registry, of a family meshwise models, has
    an entry of emit's table with its shape (so ``--emit torchtitan`` names it)."""
    import importlib
    import importlib.util
    import inspect
    import pkgutil

    import torchtitan.models as models

    table = {(e.layers, e.hidden, e.heads, e.kv_heads, e.vocab, e.experts) for e in emit.TITAN_REGISTRY}
    seen = set()
    for info in pkgutil.iter_modules(models.__path__):
        if not info.ispkg:
            continue
        try:
            if importlib.util.find_spec(f"torchtitan.models.{info.name}.config_registry") is None:
                continue  # common: building blocks, no registry
            registry = importlib.import_module(f"torchtitan.models.{info.name}.config_registry")
        except ImportError:  # its own dependencies (torchvision, fla) are not the test extra's
            assert info.name in emit.TITAN_UNMODELLED, info.name
            continue
        for name, fn in inspect.getmembers(registry, inspect.isfunction):
            if fn.__module__ != registry.__name__ or name.startswith("_") or inspect.signature(fn).parameters:
                continue
            try:
                shape = _shape(fn())
            except (ValueError, AttributeError, ImportError):  # nvfp4 / flash elsewhere; no decoder (flux)
                continue
            if shape[5] and info.name not in emit.TITAN_UNMODELLED:
                assert shape in table, f"{info.name}.{name}"
                seen.add(info.name)
    assert {"qwen3", "deepseek_v3", "gpt_oss"} <= seen


def test_moe_float8_says_what_the_plan_keeps_in_bf16():
    target = _target("deepseek-v3", 1024, "dp=128,zero=3,shard=64,ep=64,pp=8,ac=full", 1024, 4096, "fp8-rowwise")
    text = emit.emit("torchtitan", target)
    assert "--config deepseek_v3_671b_float8" in " ".join(text.split()) and "# its float8 config converts" in text


def test_float8_config_is_torchtitans_float8(manager, monkeypatch):
    """fp8-rowwise picks the registry's float8 config; torchtitan builds it with its rowwise recipe
    once its hardware probe is told the device is float8-capable (torchao does the conversion)."""
    pytest.importorskip("torchao")
    from torchtitan.components.quantization import float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)
    target = _target("llama3-debug", 8, "dp=4,zero=3,tp=2", 16, 256, "fp8-rowwise")
    args = command_args(emit.emit("torchtitan", target), "torchtitan.train")
    assert args[:4] == ["--module", "llama3", "--config", "llama3_debugmodel_float8"]
    cfg = manager.parse_args(args)
    w1 = cfg.model_spec.model.layers[0].feed_forward.w1
    assert type(w1).__qualname__ == "Float8Linear.Config"
    # rowwise: one scale per row (torchao's AXISWISE granularity), not one per tensor
    assert w1._torchao_config.cast_config_weight.scaling_granularity.name == "AXISWISE"
    assert cfg.compile.enable


@pytest.mark.parametrize(
    "model,layout,precision,names",
    [
        ("llama3-70b", "dp=8,zero=3,tp=8", "fp8", "fp8"),
        ("llama3-405b", "dp=8,zero=3,tp=8", "bf16-mixed", "float8"),
        ("mistral-7b", "dp=64,zero=3", "bf16-mixed", "registered config"),
        ("llama3-8b", "dp=64,zero=1,mbs=1", "bf16-mixed", "zero=1"),
        ("llama3-8b", "dp=16,zero=3,pp=4,schedule=zero-bubble", "bf16-mixed", "zero-bubble"),
    ],
)
def test_what_torchtitan_cannot_express_is_refused(model, layout, precision, names):
    target = _target(model, 64, layout, 512, 4096, precision)
    with pytest.raises(emit.Unexpressible, match=names) as err:
        emit.emit("torchtitan", target)
    assert "\n" not in str(err.value) and str(err.value).startswith("--emit torchtitan:")
