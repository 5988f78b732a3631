"""What a Megatron-LM command needs beyond a model's shape: its family's router and load balancing,
and its attention variants (windows, sinks, NoPE blocks, q/k norms, rope scaling), as Megatron-LM
core_v0.16.1's arguments; and, for what Megatron-Core 0.16.1 builds differently, a ``#`` line that
says what differs, or a refusal (:class:`~meshwise.plan.emit.Unexpressible`) where no setting comes close.

Pure Python. The router comes from the model spec (its config.json); the balancing recipe beyond it
(the loss kind, the bias update rate) from the family's published report, said in a ``#`` line.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.spec import ModelSpec


@dataclass(frozen=True)
class Balancing:
    """How a family's published recipe balances its experts, beyond what its config.json holds:
    ``kind`` Megatron's loss (``aux_loss`` per micro-batch, ``seq_aux_loss`` per sequence), its
    weight where the config gives none, and the expert bias's update rate per step."""

    kind: str
    aux_coeff: float
    bias_rate: float
    source: str


# DeepSeek-V3 report (arXiv 2412.19437) Sec. 2.1.2 and 4.2: bias update gamma 0.001, sequence-wise balance
# loss alpha 0.0001; GLM-4.5 report (arXiv 2508.06471) Sec. 2.1 the same; the others: a balance loss per batch
# of router_aux_loss_coef (transformers' load_balancing_loss_func)
BIAS_BALANCING = Balancing("seq_aux_loss", 0.0001, 0.001, "DeepSeek-V3 report Sec. 2.1.2, 4.2")
LOSS_BALANCING = Balancing("aux_loss", 0.001, 0.0, "transformers' load-balancing loss")
MEGATRON_LLAMA3_ROPE = (1.0, 4.0, 8192)  # low/high frequency factors, original context: fixed in Megatron-Core
MEGATRON_YARN_ORIGINAL = 4096  # MLATransformerConfig.original_max_position_embeddings (no Megatron-LM flag)
DEEPSEEK_V3_MSCALE = (1.0, 1.0)  # rope_scaling mscale, mscale_all_dim: the config.json of deepseek-ai/DeepSeek-V3


def router_args(model: ModelSpec, refuse) -> tuple[list[str], list[str]]:
    """(arguments, ``#`` notes) of a MoE model's router and balancing; ``refuse(what)`` raises."""
    bal = BIAS_BALANCING if model.expert_bias else LOSS_BALANCING
    coeff = model.aux_loss_coeff or bal.aux_coeff
    # the router in float32, as meshwise's runtime computes it (and Megatron advises from 32 experts)
    args = [
        "--moe-grouped-gemm",
        "--moe-token-dispatcher-type",
        "alltoall",
        "--moe-router-dtype",
        "fp32",
        "--moe-router-score-function",
        model.router_score,
        "--moe-router-load-balancing-type",
        bal.kind,
        "--moe-aux-loss-coeff",
        repr(coeff),
    ]
    notes = []
    if not model.aux_loss_coeff:
        notes.append(f"balance loss weight {coeff:g} ({bal.source}): the model's config gives none")
    if model.expert_bias:
        if model.router_score != "sigmoid":
            refuse("an expert bias under a softmax router (Megatron-Core's needs the sigmoid)")
        args += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", repr(bal.bias_rate)]
        notes.append(f"expert-bias update rate {bal.bias_rate:g} per step ({bal.source})")
    # softmax: Megatron takes it over the k chosen logits (renormalised) unless pre-softmax; sigmoid: it
    # renormalises the k weights whenever k > 1
    if model.router_score == "softmax" and not model.router_norm_topk:
        args.append("--moe-router-pre-softmax")
    if model.router_score == "sigmoid" and not model.router_norm_topk and model.experts_per_token > 1:
        notes.append("Megatron-Core renormalises the sigmoid router's top-k weights; this model does not")
    if model.router_scale != 1.0:
        args += ["--moe-router-topk-scaling-factor", repr(model.router_scale)]
    if model.router_groups > 1:
        if model.experts % model.router_groups:
            refuse(f"grouped routing of {model.experts} experts in {model.router_groups} unequal groups")
        args += [
            "--moe-router-num-groups",
            str(model.router_groups),
            "--moe-router-group-topk",
            str(model.router_group_topk),
        ]
    if model.family == "llama4_text":  # the routing weight multiplies the expert's input (top-1)
        args.append("--moe-apply-probs-on-input")
    if model.shared_expert_gate:
        args.append("--moe-shared-expert-gate")
    biased = model.qkv_bias or model.o_bias or model.mlp_bias
    if model.router_bias != bool(biased):
        notes.append(
            f"the router {'has no' if biased else 'has a'} bias in Megatron-Core (it follows "
            f"--disable-bias-linear); {model.name}'s router {'has' if model.router_bias else 'has none'}"
        )
    return args, notes


def nope_blocks(model: ModelSpec) -> tuple[int, ...]:
    """Blocks without rotary positions: the spec's, or Llama 4's global (unchunked) blocks, which are
    its NoPE blocks (transformers' ``no_rope_layers``)."""
    if model.family == "llama4_text" and model.attention_chunk:
        return model.full_attention_layers
    return model.nope_layers


def _pattern(layers: int, ones: set[int]) -> str:
    return "[" + ",".join("1" if i in ones else "0" for i in range(layers)) + "]"


def attention_args(model: ModelSpec, seq_len: int, refuse) -> tuple[list[str], list[str]]:
    """(arguments, ``#`` notes) for windows, chunks, sinks, NoPE blocks, q/k norms and the activation."""
    args: list[str] = []
    notes: list[str] = []
    if model.sliding_window and model.sliding_window < seq_len:
        windowed = set(range(model.layers)) - set(model.full_attention_layers)
        # transformers' window of W keys (the query's own included) is Transformer Engine's (W - 1, 0)
        args += ["--window-size", f"{model.sliding_window - 1},0"]
        if model.full_attention_layers:
            args += ["--window-attn-skip-freq", _pattern(model.layers, windowed)]
    if model.attention_chunk:
        if model.attention_chunk < seq_len:
            refuse(
                f"chunked attention ({model.attention_chunk}-token chunks) has no Megatron-Core 0.16.1 setting; "
                f"at --seq-len {model.attention_chunk} or less it is causal attention"
            )
        notes.append(
            f"chunked attention ({model.attention_chunk}-token chunks) equals causal attention at "
            f"{seq_len} tokens: no flag"
        )
    if model.attn_sinks:
        args += ["--softmax-type", "learnable"]
    nope = nope_blocks(model)
    if nope and model.position == "rope":
        args += ["--no-rope-freq", _pattern(model.layers, set(nope))]
    if model.qk_l2_norm:
        args.append("--qk-l2-norm")
        if nope:
            notes.append("Megatron-Core applies the q/k L2 norm in every block; this model in its RoPE blocks only")
    if model.family == "llama4_text" and nope and seq_len > 8192:
        notes.append(
            "Llama 4's attention temperature tuning of its NoPE blocks (past 8,192 positions) has no "
            "Megatron-Core setting: those blocks are unscaled"
        )
    if model.qk_norm and not model.qk_l2_norm:
        args.append("--qk-layernorm")
        if model.qk_norm_scope == "projection":
            notes.append("Megatron's --qk-layernorm normalises each head; this model normalises the whole projection")
    if model.swiglu_limit:
        # GPT-OSS: quick_gelu(gate) * (up + 1), gate clamped above, up both ways (Megatron-Core mlp.py's glu)
        args += [
            "--quick-geglu",
            "--glu-linear-offset",
            "1.0",
            "--activation-func-clamp-value",
            repr(model.swiglu_limit),
        ]
    return args, notes


def rope_args(model: ModelSpec, refuse) -> tuple[list[str], list[str]]:
    """(arguments, ``#`` notes) of rotary scaling: YaRN under MLA, Llama 3's frequency scaling, partial rotary."""
    args: list[str] = []
    notes: list[str] = []
    kind = model.rope_scaling
    if model.mla:  # Megatron's MLA defaults to YaRN; plain rope has to be asked for
        if kind == "yarn":
            mscale, mscale_all = DEEPSEEK_V3_MSCALE
            args += [
                "--rope-type",
                "yarn",
                "--rotary-scaling-factor",
                repr(model.rope_factor),
                "--mscale",
                repr(mscale),
                "--mscale-all-dim",
                repr(mscale_all),
            ]
            notes.append(f"YaRN mscale {mscale} and mscale_all_dim {mscale_all} as DeepSeek-V3's config.json")
            if model.rope_original_max_seq not in (0, MEGATRON_YARN_ORIGINAL):
                notes.append(
                    f"YaRN's original context is Megatron's {MEGATRON_YARN_ORIGINAL} (no flag); "
                    f"this model's is {model.rope_original_max_seq}"
                )
        else:
            args += ["--rope-type", "rope"]
    elif kind == "yarn":
        notes.append(
            f"YaRN (factor {model.rope_factor:g} from {model.rope_original_max_seq} positions) has no "
            "Megatron-LM flag outside MLA: rotary frequencies unscaled"
        )
    elif kind == "llama3":
        args += ["--use-rope-scaling", "--rope-scaling-factor", repr(model.rope_factor)]
        mine = (model.rope_low_freq_factor, model.rope_high_freq_factor, model.rope_original_max_seq)
        if mine != MEGATRON_LLAMA3_ROPE:
            notes.append(
                f"Llama 3 rope scaling with Megatron's fixed low/high frequency factors and context "
                f"{MEGATRON_LLAMA3_ROPE}; this model's are ({mine[0]:g}, {mine[1]:g}, {mine[2]})"
            )
    elif kind.startswith("partial_rotary_factor="):
        args += ["--rotary-percent", kind.split("=", 1)[1]]
    elif kind:
        refuse(f"rope scaling {kind!r} has no Megatron-LM flag (it has YaRN under MLA and Llama 3's scaling)")
    return args, notes


def max_positions(model: ModelSpec, seq_len: int) -> int:
    """``--max-position-embeddings``: the learned table's size; under rope the context the unscaled
    frequencies were trained for (a scaled model's original context), else the model's own."""
    if model.position != "rope":
        return max(model.max_seq, seq_len)
    return max(
        seq_len, model.rope_original_max_seq if model.rope_scaling and model.rope_original_max_seq else model.max_seq
    )
