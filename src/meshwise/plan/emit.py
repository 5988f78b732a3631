"""``plan --emit``: a layout as torchtitan's, Megatron-LM's or DeepSpeed's own configuration.

Pure Python: no torch, no framework import. The names, flags and keys are those of the releases the
tests read the output back with (torchtitan 0.3.0's ConfigManager, Megatron-LM core_v0.16.1's argument
parser and megatron-core 0.16.1's TransformerConfig, DeepSpeed 0.19.8's DeepSpeedConfig); docs/emit.md
says what each layout key becomes. What a framework cannot express is refused in one line naming it
(:class:`Unexpressible`), never approximated silently.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, stage_layers
from meshwise.plan import megatron_family as family
from meshwise.spec import ModelSpec

FRAMEWORKS = ("torchtitan", "megatron", "deepspeed")
VERSIONS = {"torchtitan": "torchtitan 0.3.0", "megatron": "Megatron-LM core_v0.16.1", "deepspeed": "DeepSpeed 0.19.8"}
GRAD_CLIP = 1.0  # max gradient norm: meshwise train's optimizer.grad_clip default, and each framework's own
FP8_FORMATS = ("fp8", "fp8-rowwise", "fp8-blockwise", "mxfp8")


class Unexpressible(MeshwiseError):
    """The framework has no configuration for this layout or precision (one line naming what)."""


@dataclass(frozen=True)
class Target:
    """What is emitted: a layout of ``model`` at ``global_batch`` sequences of ``seq_len`` tokens in
    ``precision`` on ``world_size`` devices, ``gpus_per_node`` to a node."""

    model: ModelSpec
    layout: Layout
    global_batch: int
    seq_len: int
    precision: str
    world_size: int
    gpus_per_node: int
    tp_comm_overlap: bool = False  # plan --tp-comm-overlap: emitted for Megatron-LM where the layout allows it (SP)
    runtime: str = "megatron"  # the runtime the layout was planned for (plan --runtime)
    moe_capacity_factor: float = 0.0  # plan --moe-capacity-factor: Megatron-LM's, with inputs padded to it
    overlap_ep_comm: bool = False  # plan --moe-comm-overlap: Megatron-LM's --overlap-moe-expert-parallel-comm

    @property
    def accum(self) -> int:
        return self.layout.accum(self.global_batch)

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.gpus_per_node)


def emit(framework: str, target: Target) -> str:
    """The configuration text for ``framework`` (see :data:`FRAMEWORKS`); raises :class:`Unexpressible`."""
    if framework not in FRAMEWORKS:
        raise MeshwiseError(f"--emit: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if target.model.states_only:
        raise Unexpressible(f"--emit {framework}: a bare parameter count has no shape to configure; give --model")
    return {"torchtitan": torchtitan_text, "megatron": megatron_text, "deepspeed": deepspeed_text}[framework](target)


def refusal(framework: str, target: Target) -> str | None:
    """Why ``framework`` cannot express ``target`` (None: it can)."""
    try:
        emit(framework, target)
    except Unexpressible as err:
        return str(err)
    return None


def _launcher(target: Target, entry: list[str]) -> list[str]:
    """torchrun for every node: a rendezvous endpoint only when there are several nodes."""
    per_node = min(target.gpus_per_node, target.world_size)
    cmd = ["torchrun", "--nnodes", str(target.nodes), "--nproc-per-node", str(per_node)]
    if target.nodes > 1:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500"]
    return cmd + entry


def _shell(header: list[str], cmd: list[str], args: list[str]) -> str:
    """Comment lines, then the command with one flag and its values per continued line."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups or arg in TITAN_AC.values():
            groups.append([arg])
        else:
            groups[-1].append(arg)
    first = " ".join(c if c.startswith("$") else shlex.quote(c) for c in cmd)
    body = [first] + ["  " + " ".join(shlex.quote(a) for a in g) for g in groups]
    return "\n".join(f"# {h}" for h in header) + "\n" + " \\\n".join(body)


def _header(framework: str, target: Target) -> list[str]:
    lay = target.layout
    return [
        f"{VERSIONS[framework]}: {target.model.name}, {lay.short()} on {target.world_size} devices; global batch "
        f"{target.global_batch} x {target.seq_len} tokens, {target.accum} micro-batch(es) of {lay.mbs} per "
        f"replica; {target.precision} (meshwise plan --emit {framework})"
    ]


# ------------------------------------------------------------------------------------------ torchtitan
@dataclass(frozen=True)
class TitanConfig:
    """One entry of torchtitan 0.3.0's config registry, by the shape it builds (tests check each
    against torchtitan's own registry). ``base`` None: the config trains in float8 whatever is asked."""

    module: str
    base: str | None
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    experts: int = 0
    float8: tuple[tuple[str, str], ...] = ()  # (meshwise precision, config function) pairs


# torchtitan 0.3.0's registry, one config a line; base "-": none but float8 (see TitanConfig); float8:
# meshwise precision:config function, comma-separated, "-" for none
_TITAN_TABLE = """
module       base                    layers  hidden  heads  kv_heads  vocab   experts  float8
llama3       llama3_debugmodel       6       256     16     16        2048    0        fp8-rowwise:llama3_debugmodel_float8
llama3       llama3_8b               32      4096    32     8         128256  0        mxfp8:llama3_8b_mxfp8
llama3       llama3_70b              80      8192    64     8         128256  0        -
llama3       -                       126     16384   128    8         128256  0        fp8-rowwise:llama3_405b
qwen3        qwen3_debugmodel        8       256     16     8         2048    0        -
qwen3        qwen3_0_6b              28      1024    16     8         151936  0        -
qwen3        qwen3_1_7b              28      2048    16     8         151936  0        -
qwen3        qwen3_14b               40      5120    40     8         151936  0        -
qwen3        qwen3_32b               64      5120    64     8         151936  0        -
qwen3        qwen3_moe_debug         8       256     16     8         2048    64       -
qwen3        qwen3_30b_a3b           48      2048    32     4         151936  128      -
deepseek_v3  deepseek_v3_debugmodel  6       256     16     16        2048    8        mxfp8:deepseek_v3_debugmodel_mxfp8
deepseek_v3  deepseek_v3_16b         27      2048    16     16        102400  64       -
deepseek_v3  deepseek_v3_671b        61      7168    128    128       129280  256      fp8-rowwise:deepseek_v3_671b_float8
gpt_oss      gpt_oss_debugmodel      4       256     64     8         2048    8        -
gpt_oss      gpt_oss_20b             24      2880    64     8         201088  32       -
gpt_oss      gpt_oss_120b            36      2880    64     8         201088  128      -
"""


def _titan_entry(line: str) -> TitanConfig:
    """One row of :data:`_TITAN_TABLE`."""
    module, base, *shape, float8 = line.split()
    pairs = tuple(tuple(pair.split(":")) for pair in float8.split(",") if pair != "-")
    return TitanConfig(module, None if base == "-" else base, *map(int, shape), float8=pairs)


TITAN_REGISTRY = tuple(_titan_entry(line) for line in _TITAN_TABLE.strip().splitlines()[1:])
# torchtitan 0.3.0's MoE models it registers and meshwise has no family for: Qwen3.5 (gated DeltaNet
# linear attention), Kimi K2.5 and Moonlight (multimodal configs of its kimi_k2_7 module)
TITAN_UNMODELLED = ("qwen3_5", "kimi_k2_7")
TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
TITAN_AC = {
    "none": "activation-checkpoint:none",
    "selective": "activation-checkpoint:selective",
    "full": "activation-checkpoint:full",
}


def titan_config(target: Target) -> tuple[str, str]:
    """(module, config function) of the registry entry with the model's shape, in the asked precision."""
    m = target.model
    entry = next(
        (
            c
            for c in TITAN_REGISTRY
            if (c.layers, c.hidden, c.heads, c.kv_heads, c.vocab, c.experts)
            == (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab, m.experts)
        ),
        None,
    )
    if entry is None:
        names = ", ".join(c.base or dict(c.float8)["fp8-rowwise"] for c in TITAN_REGISTRY)
        raise Unexpressible(
            f"--emit torchtitan: torchtitan 0.3.0 has no registered config with {m.name}'s shape "
            f"(it has {names}); register a config function for it and pass its --module/--config"
        )
    if target.precision in FP8_FORMATS:
        fn = dict(entry.float8).get(target.precision)
        if fn is None:
            have = ", ".join(f"{p} ({f})" for p, f in entry.float8) or "none"
            raise Unexpressible(
                f"--emit torchtitan: --precision {target.precision} has no torchtitan 0.3.0 config for "
                f"{m.name} (float8 is set in a config function, not on its command line; "
                f"this shape has: {have})"
            )
        return entry.module, fn
    if entry.base is None:
        raise Unexpressible(
            f"--emit torchtitan: torchtitan 0.3.0's config for {m.name} trains its linear layers in "
            f"float8 (rowwise) and its command line cannot turn that off; use --precision fp8-rowwise"
        )
    return entry.module, entry.base


def _titan_refusals(target: Target) -> None:
    lay = target.layout
    if target.precision == "bf16" or target.precision == "fp32":
        raise Unexpressible(
            f"--emit torchtitan: --precision {target.precision} is not torchtitan's mixed precision "
            "(bf16 compute, fp32 weights and optimizer states); use bf16-mixed"
        )
    if lay.pp > 1 and lay.schedule == "zero-bubble":
        raise Unexpressible(
            "--emit torchtitan: schedule=zero-bubble is not mapped (torchtitan's ZBVZeroBubble and "
            "InterleavedZeroBubble differ from meshwise's in chunk placement); use interleaved-1f1b"
        )
    if lay.zero == 1 and lay.pp == 1 and target.accum > 1:
        raise Unexpressible(
            f"--emit torchtitan: zero=1 with {target.accum} micro-batches: torchtitan's FSDP "
            "reduce-scatters gradients every micro-batch (ZeRO-2); use zero=2"
        )


def _titan_pipeline(target: Target) -> list[str]:
    """pp degree, schedule and the exact module split of meshwise's stage_layers, chunk by chunk."""
    lay = target.layout
    if lay.pp == 1:
        return []
    counts, parts, first = stage_layers(target.model.layers, lay.stages), [], 0
    for c, n in enumerate(counts):
        names = [f"layers.{i}" for i in range(first, first + n)]
        first += n
        if c == 0:
            names.insert(0, "tok_embeddings")
        if c == len(counts) - 1:
            names += ["norm", "lm_head"]
        parts.append(",".join(names))
    return [
        "--parallelism.pipeline_parallel_degree",
        str(lay.pp),
        "--parallelism.pipeline_parallel_schedule",
        TITAN_SCHEDULES[lay.schedule],
        "--parallelism.pipeline_parallel_microbatch_size",
        str(lay.mbs),
        "--parallelism.module_fqns_per_model_part",
        *parts,
    ]


def torchtitan_args(target: Target) -> list[str]:
    """``--module``/``--config`` and the ``--section.key`` overrides, the checkpointing subcommand last."""
    _titan_refusals(target)
    module, config = titan_config(target)
    lay = target.layout
    replicate, shard = (lay.replicate, lay.shard) if lay.zero else (lay.dp, 1)
    # with pp, torchtitan's local batch is split into the pipeline's micro-batches (no accumulation)
    local = lay.mbs * target.accum if lay.pp > 1 else lay.mbs
    args = [
        "--module",
        module,
        "--config",
        config,
        "--training.local_batch_size",
        str(local),
        "--training.global_batch_size",
        str(target.global_batch),
        "--training.seq_len",
        str(target.seq_len),
        "--training.max_norm",
        str(GRAD_CLIP),
        "--parallelism.data_parallel_replicate_degree",
        str(replicate),
        "--parallelism.data_parallel_shard_degree",
        str(shard),
        "--parallelism.tensor_parallel_degree",
        str(lay.tp),
        "--parallelism.context_parallel_degree",
        str(lay.cp),
        "--parallelism.expert_parallel_degree",
        str(lay.ep),
        # the default spmd_types backend hands torch 2.13's fully_shard plain-tensor parameters
        # with dp_mesh_dims, which it refuses (ValueError ... must be DTensors on the full SPMD mesh)
        "--parallelism.spmd_backend",
        "full_dtensor",
    ]
    if lay.tp > 1:
        args.append("--parallelism.enable_sequence_parallel" if lay.sp else "--parallelism.no_enable_sequence_parallel")
    if lay.zero:
        args += ["--parallelism.fsdp_reshard_after_forward", "always" if lay.zero == 3 else "never"]
    args += _titan_pipeline(target)
    if lay.pp > 1 or lay.ep > 1:
        args.append("--training.disable_cuda_graphs")
    if target.precision in FP8_FORMATS:
        args.append("--compile.enable")
    return args + [TITAN_AC[lay.ac]]


def torchtitan_text(target: Target) -> str:
    args = torchtitan_args(target)
    header = _header("torchtitan", target)
    if target.model.moe and target.precision in FP8_FORMATS:
        header.append(
            "its float8 config converts the routed experts' grouped GEMMs too; the plan keeps them bf16 "
            "as meshwise's runtime does (its memory lacks their float8 copies, its time their speed-up)"
        )
    return _shell(header, _launcher(target, ["-m", "torchtitan.train"]), args)


# ------------------------------------------------------------------------------------------- megatron
MEGATRON_FP8 = {"fp8": ("hybrid", "tensorwise"), "fp8-blockwise": ("e4m3", "blockwise"), "mxfp8": ("e4m3", "mxfp8")}


def _megatron_refusals(target: Target) -> None:
    lay = target.layout
    if target.precision == "bf16":
        raise Unexpressible(
            "--emit megatron: --precision bf16 (no fp32 master weights) has no Megatron-LM flag; its "
            "--bf16 keeps fp32 main parameters (use --precision bf16-mixed)"
        )
    if target.precision == "fp8-rowwise":
        raise Unexpressible(
            "--emit megatron: --precision fp8-rowwise has no Megatron-LM recipe (--fp8-recipe: "
            "tensorwise, delayed, blockwise, mxfp8); use fp8, fp8-blockwise or mxfp8"
        )
    if lay.pp > 1 and lay.schedule in ("gpipe", "zero-bubble"):
        raise Unexpressible(
            f"--emit megatron: schedule={lay.schedule} is not a Megatron-LM schedule (it runs 1F1B, "
            "and interleaved 1F1B with virtual stages); use 1f1b or interleaved-1f1b"
        )
    if target.model.moe and lay.tp > 1 and not lay.sp:
        raise Unexpressible(
            f"--emit megatron: a MoE model at tp={lay.tp} needs sequence parallelism in "
            "Megatron-LM (sp=off is refused at start-up); use sp=on"
        )
    if target.overlap_ep_comm and (lay.ep == 1 or lay.ac == "full" or (lay.pp > 1 and lay.vpp == 1)):
        raise Unexpressible(
            f"--emit megatron: --moe-comm-overlap needs ep > 1, no full recompute and, under pp > 1, "
            f"virtual stages (megatron-core's TransformerConfig); {lay} has not"
        )
    m = target.accum
    if lay.vpp > 1 and m % lay.pp:
        raise Unexpressible(
            f"--emit megatron: Megatron-LM's interleaved schedule needs the {m} micro-batches per step "
            f"to be a multiple of pp={lay.pp}; use a global batch that gives one"
        )


def _megatron_refuse(what: str) -> None:
    raise Unexpressible(f"--emit megatron: {what}")


def _megatron_model(model: ModelSpec, seq_len: int) -> tuple[list[str], list[str]]:
    """The model's shape as Megatron-LM GPT arguments, and the ``#`` notes of what Megatron builds differently."""
    args = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--ffn-hidden-size",
        str(model.ffn_hidden),
        "--num-attention-heads",
        str(model.heads),
    ]
    if model.kv_heads != model.heads and not model.mla:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.mla:  # --qk-layernorm: MLA's norms of the compressed query and key-value (DeepSeek-V2/V3)
        args += [
            "--multi-latent-attention",
            "--kv-lora-rank",
            str(model.kv_lora_rank),
            "--qk-head-dim",
            str(model.head_dim - model.qk_rope_head_dim),
            "--qk-pos-emb-head-dim",
            str(model.qk_rope_head_dim),
            "--v-head-dim",
            str(model.v_head_dim),
            "--qk-layernorm",
        ]
        if model.q_lora_rank:
            args += ["--q-lora-rank", str(model.q_lora_rank)]
    elif model.head_dim != model.hidden // model.heads:
        args += ["--kv-channels", str(model.head_dim)]
    args += ["--seq-length", str(seq_len), "--max-position-embeddings", str(family.max_positions(model, seq_len))]
    notes: list[str] = []
    if model.position == "rope":
        args += ["--position-embedding-type", "rope"]
        if model.rope_theta != 10000.0:  # Megatron-LM's default base; the catalog leaves Llama 3's 500,000 out
            args += ["--rotary-base", str(int(model.rope_theta))]
        more, why = family.rope_args(model, _megatron_refuse)
        args, notes = args + more, notes + why
    else:
        args += ["--position-embedding-type", "learned_absolute"]
    args += [
        "--normalization",
        "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "--norm-epsilon",
        str(model.norm_eps),
    ]
    if model.mlp == "swiglu" and not model.swiglu_limit:
        args.append("--swiglu")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not (model.qkv_bias or model.o_bias or model.mlp_bias):
        args.append("--disable-bias-linear")
    elif model.qkv_bias and not (model.o_bias or model.mlp_bias):
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    more, why = family.attention_args(model, seq_len, _megatron_refuse)
    args, notes = args + more, notes + why
    if model.moe:
        args += [
            "--num-experts",
            str(model.experts),
            "--moe-router-topk",
            str(model.experts_per_token),
            "--moe-ffn-hidden-size",
            str(model.expert_ffn_hidden),
        ]
        if model.shared_ffn_hidden:
            args += ["--moe-shared-expert-intermediate-size", str(model.shared_ffn_hidden)]
        if model.dense_layers:
            pattern = ",".join("0" if i in model.dense_layers else "1" for i in range(model.layers))
            args += ["--moe-layer-freq", f"[{pattern}]"]
        more, why = family.router_args(model, _megatron_refuse)
        args, notes = args + more, notes + why
    return args, notes


def megatron_layout(model: ModelSpec, lay: Layout) -> str:
    """``--pipeline-model-parallel-layout``: meshwise's stage split chunk by chunk (E the embedding, t a
    block, L the loss), so Megatron places the same blocks on the same ranks, virtual stages included."""
    counts = stage_layers(model.layers, lay.stages)
    parts = [
        ("E" if c == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + ("L" if c == len(counts) - 1 else "")
        for c, n in enumerate(counts)
    ]
    return "|".join(parts)


def _megatron_parallel(target: Target) -> list[str]:
    lay = target.layout
    args = [
        "--tensor-model-parallel-size",
        str(lay.tp),
        "--pipeline-model-parallel-size",
        str(lay.pp),
        "--context-parallel-size",
        str(lay.cp),
        "--expert-model-parallel-size",
        str(lay.ep),
    ]
    if target.model.moe:  # meshwise's experts are never TP-split (Layout.ep_folds_tp); Megatron's default is tp
        args += ["--expert-tensor-parallel-size", "1"]
    if lay.sp:
        args.append("--sequence-parallel")
        if target.tp_comm_overlap:
            args.append("--tp-comm-overlap")
    if lay.pp > 1:
        args += ["--pipeline-model-parallel-layout", megatron_layout(target.model, lay)]
    args += ["--micro-batch-size", str(lay.mbs), "--global-batch-size", str(target.global_batch)]
    if lay.ac == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif lay.ac == "selective":
        args += ["--recompute-granularity", "selective"]
    if lay.zero == 1:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif lay.zero in (2, 3):
        strategy = "optim_grads" if lay.zero == 2 else "optim_grads_params"
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            strategy,
            "--ckpt-format",
            "fsdp_dtensor",
            "--overlap-grad-reduce",
            "--overlap-param-gather",
        ]
    if lay.zero and lay.replicate > 1:
        args += ["--num-distributed-optimizer-instances", str(lay.replicate)]
    return args


def _megatron_precision(precision: str) -> list[str]:
    if precision == "fp32":
        return []
    args = ["--bf16"]
    if precision in MEGATRON_FP8:
        fmt, recipe = MEGATRON_FP8[precision]
        args += ["--fp8-format", fmt, "--fp8-recipe", recipe]
    if precision == "fp8-blockwise":  # DeepSeek-V3's bf16 Adam moments (spec.train)
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    return args


def megatron_parts(target: Target) -> tuple[list[str], list[str]]:
    """Megatron-LM ``pretrain_gpt.py`` arguments (the model, the parallel layout, batch, recompute,
    optimizer) and the ``#`` notes of what Megatron-Core builds differently from the planned model."""
    _megatron_refusals(target)
    model, notes = _megatron_model(target.model, target.seq_len)
    return model + _megatron_parallel(target) + _megatron_moe(target) + _megatron_precision(target.precision) + [
        "--clip-grad",
        str(GRAD_CLIP),
    ], notes


def megatron_args(target: Target) -> list[str]:
    return megatron_parts(target)[0]


def _megatron_moe(target: Target) -> list[str]:
    """The padded capacity factor and the all-to-all overlap the time model priced (plan
    --moe-capacity-factor, --moe-comm-overlap)."""
    if not target.model.moe:
        return []
    args = []  # the alltoall dispatcher: plan/megatron_family.py, for every MoE model
    if target.moe_capacity_factor:
        args += ["--moe-expert-capacity-factor", str(target.moe_capacity_factor), "--moe-pad-expert-input-to-capacity"]
    if target.overlap_ep_comm:
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def megatron_text(target: Target) -> str:
    args, notes = megatron_parts(target)
    header = _header("megatron", target)
    if target.runtime != "megatron":
        header.append(
            "planned for meshwise's runtime: its throughput and memory are not Megatron-LM's "
            "(meshwise plan --runtime megatron plans for Megatron-LM)"
        )
    header += notes
    header.append("add your data and tokenizer arguments (--data-path, --tokenizer-type)")
    lay = target.layout
    # Megatron-LM asserts one CUDA connection with TP or CP (before Blackwell), Megatron-FSDP more than one
    env = ["CUDA_DEVICE_MAX_CONNECTIONS=1"] if (lay.tp > 1 or lay.cp > 1) and lay.zero < 2 else []
    return _shell(header, env + _launcher(target, ["pretrain_gpt.py"]), args)


# ------------------------------------------------------------------------------------------ deepspeed
def deepspeed_config(target: Target) -> dict:
    """DeepSpeed's JSON: batch, micro-batch, accumulation, ZeRO stage, precision, clipping."""
    lay, p = target.layout, target.precision
    if lay.tp > 1 or lay.pp > 1:
        raise Unexpressible(
            f"--emit deepspeed: tp={lay.tp},pp={lay.pp} needs Megatron-DeepSpeed (DeepSpeed's JSON has "
            "no tensor or pipeline degree); use --emit megatron, or a layout with tp=1,pp=1"
        )
    if lay.cp > 1:
        raise Unexpressible(
            f"--emit deepspeed: cp={lay.cp} (ring attention) has no DeepSpeed configuration (its "
            "sequence parallelism is Ulysses, set in the model code)"
        )
    if lay.ep > 1:
        raise Unexpressible(f"--emit deepspeed: ep={lay.ep} is set in DeepSpeed's MoE layer (ep_size), not in its JSON")
    if lay.zero and lay.shard != lay.dp:
        raise Unexpressible(
            f"--emit deepspeed: shard={lay.shard} (hybrid sharding): DeepSpeed 0.19.8 shards over the "
            "whole data-parallel group (MiCS was removed); use shard=dp"
        )
    if lay.ac == "selective":
        raise Unexpressible(
            "--emit deepspeed: ac=selective (per-operator recompute) has no DeepSpeed setting; use ac=full or none"
        )
    if p in FP8_FORMATS:
        raise Unexpressible(
            f"--emit deepspeed: --precision {p}: DeepSpeed's JSON has no float8 training "
            "(it comes from Transformer Engine layers in the model code)"
        )
    if p == "bf16" and lay.zero == 0:
        raise Unexpressible(
            "--emit deepspeed: --precision bf16 (no fp32 master weights) needs ZeRO stage 1-3 "
            "(bf16_master_weights_and_grads); use zero=1, 2 or 3"
        )
    cfg: dict = {
        "train_batch_size": target.global_batch,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": target.accum,
        "gradient_clipping": GRAD_CLIP,
        "zero_optimization": {"stage": lay.zero, "overlap_comm": True},
    }
    if p == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif p == "bf16":
        cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True}
    return cfg


def deepspeed_text(target: Target) -> str:
    return json.dumps(deepspeed_config(target), indent=2)


def emit_many(framework: str, targets: list[Target]) -> str:
    """Several layouts: shell blocks one after another; for DeepSpeed one JSON object keyed by layout."""
    if framework == "deepspeed" and len(targets) > 1:
        return json.dumps({t.layout.short(): deepspeed_config(t) for t in targets}, indent=2)
    return "\n\n".join(emit(framework, t) for t in targets)
