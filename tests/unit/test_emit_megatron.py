"""``plan --emit megatron`` read back two ways:

1. parsed by Megatron-LM's argument table at core_v0.16.1 (tests/data/megatron_lm_args.json, written
   by scripts/megatron_args_dump.py from Megatron-LM's own ``add_megatron_arguments``: every flag,
   its destination, kind, type and choices), so an unknown flag, a bad choice or a value of the
   wrong type fails;
2. the parsed values built into megatron-core 0.16.1's own ``TransformerConfig`` (its
   ``ModelParallelConfig`` fields included) and ``DistributedDataParallelConfig``, whose
   validation runs (the pipeline layout against the layer count, recompute, fp8 recipe, MoE, cp),
   the way Megatron-LM's ``core_transformer_config_from_args`` copies arguments by field name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import pytest
from tests._torchtitan import command_args

from meshwise import spec
from meshwise.layout import check_runnable, parse, stage_layers
from meshwise.plan import emit

ARGS_TABLE = os.path.join(os.path.dirname(__file__), "..", "data", "megatron_lm_args.json")
MIXTRAL_LIKE = spec.ModelSpec(
    name="moe-8x",
    family="mixtral",
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    ffn_hidden=14336,
    vocab=32000,
    max_seq=32768,
    experts=8,
    experts_per_token=2,
    expert_ffn_hidden=14336,
    rope_theta=1e6,
)

# (model, world size, layout, global batch, sequence, precision)
CASES = [
    ("llama3-70b", 64, "dp=8,zero=3,tp=8", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 64, "dp=8,zero=1,shard=4,tp=8,mbs=2,ac=full", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 64, "dp=2,zero=1,tp=8,pp=4,vpp=5,ac=full", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 128, "dp=4,cp=2,tp=8,pp=2,ac=selective", 512, 8192, "bf16-mixed"),
    ("llama3-70b", 256, "dp=8,zero=3,cp=4,tp=8,ac=full", 64, 8192, "fp8"),
    ("llama3-405b", 1024, "dp=8,zero=1,tp=8,pp=16,vpp=4", 1024, 8192, "fp8-blockwise"),
    ("llama3-8b", 8, "dp=8", 64, 8192, "bf16-mixed"),
    ("llama3-8b", 16, "dp=16,zero=2,mbs=2", 256, 8192, "mxfp8"),
    ("llama3-8b", 16, "dp=4,tp=2,sp=off,pp=2,mbs=2", 64, 4096, "fp32"),
    ("llama3-8b", 48, "dp=6,zero=1,tp=2,pp=4,vpp=2", 96, 8192, "bf16-mixed"),
    (MIXTRAL_LIKE, 64, "dp=8,zero=1,ep=8,tp=4,pp=2", 256, 4096, "bf16-mixed"),
    (MIXTRAL_LIKE, 64, "dp=4,zero=3,ep=4,cp=2,tp=8,ac=full", 64, 16384, "bf16-mixed"),  # fp8 + MoE: needs TE
]


def _target(model, world, text, batch, seq, precision) -> emit.Target:
    m = model if isinstance(model, spec.ModelSpec) else spec.load_model(model)
    layout = parse(text, world)
    check_runnable(layout, m, world, batch, seq)
    return emit.Target(m, layout, batch, seq, precision, world, 8)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # an unknown flag or a bad value fails the test, not the process
        raise AssertionError(f"Megatron-LM core_v0.16.1 would refuse: {message}")


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser rebuilt from its recorded argument table (types by name; Megatron's
    own converters, e.g. for --moe-layer-freq, are kept as text)."""
    with open(ARGS_TABLE) as f:
        table = json.load(f)["arguments"]
    parser = _Parser(allow_abbrev=False)
    types = {"int": int, "float": float, "str": str}
    for option, a in table.items():
        if a["kind"] in ("storetrue", "storefalse"):
            parser.add_argument(option, dest=a["dest"], action=f"store_{a['kind'][5:]}", default=None)
        elif a["kind"] == "booleanoptional":
            twin = table.get("--" + option[5:]) if option.startswith("--no-") else None
            if not (twin and twin["dest"] == a["dest"]) and option not in parser._option_string_actions:
                parser.add_argument(option, dest=a["dest"], action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(
                option,
                dest=a["dest"],
                type=types.get(a["type"], str),
                choices=a["choices"],
                nargs=a["nargs"],
                default=None,
            )
    return parser


@pytest.fixture(scope="module")
def parser():
    return megatron_parser()


def transformer_config(ns: argparse.Namespace, world: int):
    """megatron-core's TransformerConfig from the parsed arguments: fields copied by name, plus the
    renames Megatron-LM makes (num_experts, swiglu, the bf16 pipeline dtype)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core", reason="megatron-core is the oracle of --emit megatron")
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    cls = MLATransformerConfig if ns.multi_latent_attention else TransformerConfig
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if getattr(ns, f.name, None) is not None}
    for name in ("moe_layer_freq", "window_attn_skip_freq", "no_rope_freq"):  # Megatron-LM's moe_freq_type
        if isinstance(kw.get(name), str):
            kw[name] = json.loads(kw[name]) if kw[name].startswith("[") else int(kw[name])
    if isinstance(kw.get("window_size"), str):  # its tuple_type
        kw["window_size"] = tuple(int(v) for v in kw["window_size"].split(","))
    if isinstance(kw.get("moe_aux_loss_coeff"), list) and len(kw["moe_aux_loss_coeff"]) == 1:
        kw["moe_aux_loss_coeff"] = kw["moe_aux_loss_coeff"][0]  # validate_args unwraps a single value
    if isinstance(kw.get("moe_router_load_balancing_type"), list) and len(kw["moe_router_load_balancing_type"]) == 1:
        kw["moe_router_load_balancing_type"] = kw["moe_router_load_balancing_type"][0]
    kw["num_moe_experts"] = ns.num_experts
    kw["pipeline_dtype"] = kw["params_dtype"] = torch.bfloat16 if ns.bf16 else torch.float32
    if ns.swiglu:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    if ns.quick_geglu:
        from megatron.core.activations import quick_gelu

        kw.update(activation_func=quick_gelu, gated_linear_unit=True)
    return cls(**kw)


def parallel_state(ns: argparse.Namespace, world: int) -> dict[str, int]:
    """megatron-core 0.16.1's ``initialize_model_parallel`` for the parsed degrees at ``world`` ranks,
    run on torch's fake process group (rank 0 of ``world``, no communication): its own arithmetic
    refuses a world that the tensor, pipeline, context, expert and expert-tensor degrees do not
    divide. Returns the data-parallel sizes it derives."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=ns.tensor_model_parallel_size,
            pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
            context_parallel_size=ns.context_parallel_size,
            expert_model_parallel_size=ns.expert_model_parallel_size,
            expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
            num_distributed_optimizer_instances=ns.num_distributed_optimizer_instances or 1,
            create_gloo_process_groups=False,
        )
        return {
            "dp": ps.get_data_parallel_world_size(),
            "expert_dp": ps.get_expert_data_parallel_world_size(),
            "ep": ps.get_expert_model_parallel_world_size(),
            "expert_tp": ps.get_expert_tensor_parallel_world_size(),
        }
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}:{c[2]}:{c[5]}")
def test_megatron_reads_the_planned_layout(parser, case):
    target = _target(*case)
    lay, world = target.layout, case[1]
    ns = parser.parse_args(command_args(emit.emit("megatron", target), "pretrain_gpt.py"))
    cfg = transformer_config(ns, world)
    assert (
        cfg.tensor_model_parallel_size,
        cfg.pipeline_model_parallel_size,
        cfg.context_parallel_size,
        cfg.expert_model_parallel_size,
    ) == (lay.tp, lay.pp, lay.cp, lay.ep)
    groups = parallel_state(ns, world)
    assert groups["dp"] == lay.dp and groups["ep"] == lay.ep
    if target.model.moe:  # meshwise's experts are whole on a rank: expert-TP 1
        assert groups["expert_tp"] == 1 and groups["expert_dp"] == world // (lay.ep * lay.pp)
    assert cfg.sequence_parallel == lay.sp
    assert cfg.virtual_pipeline_model_parallel_size == (lay.vpp if lay.vpp > 1 else None)
    # Megatron-LM's batch rule: data-parallel size = world / (tp pp cp), micro-batches = gbs / (mbs dp)
    dp = world // (ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * ns.context_parallel_size)
    assert dp == lay.dp and ns.global_batch_size // (ns.micro_batch_size * dp) == target.accum
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size) == (
        target.model.layers,
        target.model.hidden,
        target.model.heads,
        target.model.ffn_hidden,
    )
    assert (cfg.num_query_groups or cfg.num_attention_heads) == target.model.kv_heads
    recompute = {"none": (None, None), "selective": ("selective", None), "full": ("full", "uniform")}[lay.ac]
    assert (cfg.recompute_granularity, cfg.recompute_method) == recompute
    if lay.pp > 1:  # each pipeline rank's chunks hold meshwise's blocks
        from megatron.core.transformer.enums import LayerType

        layout = cfg.pipeline_model_parallel_layout.layout
        counts = [layout[c % lay.pp][c // lay.pp].count(LayerType.decoder) for c in range(lay.stages)]
        assert counts == stage_layers(target.model.layers, lay.stages)
    fp8 = {"fp8": ("hybrid", "tensorwise"), "fp8-blockwise": ("e4m3", "blockwise"), "mxfp8": ("e4m3", "mxfp8")}
    if target.precision in fp8:
        assert (cfg.fp8, cfg.fp8_recipe) == fp8[target.precision]
    else:
        assert cfg.fp8 is None
    assert cfg.bf16 == (target.precision != "fp32")
    _check_data_parallel(ns, lay)


def _check_data_parallel(ns: argparse.Namespace, lay) -> None:
    """ZeRO stage as megatron-core's DistributedDataParallelConfig holds it."""
    from megatron.core.distributed import DistributedDataParallelConfig

    kw = {
        f.name: getattr(ns, f.name)
        for f in dataclasses.fields(DistributedDataParallelConfig)
        if getattr(ns, f.name, None) is not None
    }
    ddp = DistributedDataParallelConfig(**kw)
    stage = {
        0: (False, False, "no_shard"),
        1: (True, False, "no_shard"),
        2: (False, True, "optim_grads"),
        3: (False, True, "optim_grads_params"),
    }[lay.zero]
    assert (ddp.use_distributed_optimizer, ddp.use_megatron_fsdp, ddp.data_parallel_sharding_strategy) == stage
    assert ddp.num_distributed_optimizer_instances == (lay.replicate if lay.zero else 1)


@pytest.mark.parametrize(
    "layout,precision,names",
    [
        ("dp=8,zero=3,tp=8", "bf16", "bf16"),
        ("dp=8,zero=3,tp=8", "fp8-rowwise", "fp8-rowwise"),
        ("dp=4,zero=1,tp=8,pp=2,schedule=gpipe", "bf16-mixed", "gpipe"),
        ("dp=4,zero=1,tp=8,pp=2,schedule=zero-bubble", "bf16-mixed", "zero-bubble"),
        ("dp=2,zero=1,tp=8,pp=4,vpp=2", "bf16-mixed", "multiple of pp=4"),
    ],
)
def test_what_megatron_cannot_express_is_refused(layout, precision, names):
    batch = 12 if "vpp" in layout else 512  # 6 micro-batches on pp=4: Megatron's interleaving needs a multiple of 4
    target = _target("llama3-70b", 64, layout, batch, 8192, precision)
    with pytest.raises(emit.Unexpressible, match=names) as err:
        emit.emit("megatron", target)
    assert "\n" not in str(err.value) and str(err.value).startswith("--emit megatron:")


def test_the_argument_table_is_megatron_lms():
    with open(ARGS_TABLE) as f:
        source = json.load(f)["source"]
    assert source["tag"] == "core_v0.16.1" and source["commit"].startswith("55ac7082")


def test_moe_run_settings_reach_megatron(parser):
    """plan --moe-capacity-factor / --moe-comm-overlap: megatron-core's TransformerConfig holds the padded
    capacity, the alltoall dispatcher the time model prices and the all-to-all overlap, and validates them
    (the overlap wants virtual stages under pp > 1); full recompute with the overlap is refused."""
    layout = parse("dp=8,zero=1,ep=8,tp=4,pp=2,vpp=2", 64)
    target = emit.Target(
        MIXTRAL_LIKE, layout, 256, 4096, "bf16-mixed", 64, 8, moe_capacity_factor=1.0, overlap_ep_comm=True
    )
    cfg = transformer_config(parser.parse_args(command_args(emit.emit("megatron", target), "pretrain_gpt.py")), 64)
    assert (cfg.moe_token_dispatcher_type, cfg.moe_expert_capacity_factor) == ("alltoall", 1.0)
    assert cfg.moe_pad_expert_input_to_capacity and cfg.overlap_moe_expert_parallel_comm
    full = dataclasses.replace(target, layout=parse("dp=8,zero=1,ep=8,tp=4,pp=2,vpp=2,ac=full", 64))
    with pytest.raises(emit.Unexpressible, match="--moe-comm-overlap"):
        emit.emit("megatron", full)
