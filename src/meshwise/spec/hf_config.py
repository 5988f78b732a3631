"""Model files: the catalog, TOML model tables, and Hugging Face ``config.json`` by ``model_type``.

A Hugging Face config is read by its ``model_type`` (or, without one, its ``architectures``), with
the defaults of that family's ``transformers`` config class for keys it leaves out; a family not
listed in :data:`HF_FAMILIES` is refused naming its ``model_type``, never counted as a Llama.
Both rope layouts are read: ``rope_theta`` + ``rope_scaling`` (transformers 4) and
``rope_parameters`` (transformers 5).
"""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from meshwise.catalog import read_catalog
from meshwise.errors import MeshwiseError
from meshwise.files import read_toml
from meshwise.spec import hf_defaults
from meshwise.spec.model import FAMILIES, ModelSpec

_MODEL_KEYS = {f.name for f in fields(ModelSpec)} - {"param_count"}

# Per family: (rms_norm_eps, rope_theta, max_position_embeddings, tie_word_embeddings) of its
# transformers config class, used only when config.json omits the key.
_DEFAULTS = {
    "llama": (1e-6, 10000.0, 2048, False),
    "mistral": (1e-6, 10000.0, 32768, False),
    "qwen2": (1e-6, 10000.0, 32768, False),
    "qwen3": (1e-6, 10000.0, 32768, False),
    "gemma": (1e-6, 10000.0, 8192, True),
    "gemma2": (1e-6, 10000.0, 8192, True),
    "phi3": (1e-5, 10000.0, 4096, False),
    "gpt2": (1e-5, 0.0, 1024, True),
    "mixtral": (1e-5, 1e6, 131072, False),
    "qwen2_moe": (1e-6, 10000.0, 32768, False),
    "qwen3_moe": (1e-6, 10000.0, 32768, False),
    "deepseek_v2": (1e-6, 10000.0, 2048, False),
    "deepseek_v3": (1e-6, 10000.0, 4096, False),
    "gemma3_text": (1e-6, 1e6, 131072, True),
    "olmo2": (1e-5, 10000.0, 2048, False),
    "llama4_text": (1e-5, 500000.0, 131072, False),
    "gpt_oss": (1e-5, 150000.0, 131072, False),
    "olmo3": (1e-5, 500000.0, 2048, False),
    "smollm3": (1e-6, 2e6, 32768, True),
    "ministral": (1e-6, 10000.0, 131072, False),
    "glm4_moe": (1e-5, 10000.0, 131072, False),
    "seed_oss": (1e-6, 10000.0, 524288, False),
    "ernie4_5": (1e-5, 500000.0, 131072, True),
    "helium": (1e-8, 100000.0, 4096, False),
    "granite": (1e-6, 10000.0, 2048, False),
    "hunyuan_v1_dense": (1e-5, 10000.0, 2048, False),
    "glm4": (1.5625e-07, 10000.0, 131072, False),
    "minimax_m2": (1e-6, 5e6, 196608, False),
    "exaone4": (1e-5, 10000.0, 2048, False),
}
HF_FAMILIES = tuple(_DEFAULTS)
assert set(HF_FAMILIES) == set(FAMILIES)
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Phi3ForCausalLM": "phi3",
    "GPT2LMHeadModel": "gpt2",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Olmo2ForCausalLM": "olmo2",
    "Llama4ForCausalLM": "llama4_text",
    "Llama4ForConditionalGeneration": "llama4",
    "GptOssForCausalLM": "gpt_oss",
    "Olmo3ForCausalLM": "olmo3",
    "SmolLM3ForCausalLM": "smollm3",
    "MinistralForCausalLM": "ministral",
    "Mistral3ForConditionalGeneration": "mistral3",
    "Glm4MoeForCausalLM": "glm4_moe",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
    "SeedOssForCausalLM": "seed_oss",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "HeliumForCausalLM": "helium",
    "GraniteForCausalLM": "granite",
    "HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",
    "Glm4ForCausalLM": "glm4",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Exaone4ForCausalLM": "exaone4",
}
_TOML_ROUTE = (
    "or describe its shape in a model TOML (layers, hidden, heads, kv_heads, ffn_hidden, vocab; "
    "docs/models.md) and pass --model that.toml"
)


def _model_from_table(name: str, table: dict[str, Any], where: str) -> ModelSpec:
    unknown = sorted(set(table) - _MODEL_KEYS)
    if unknown:
        raise MeshwiseError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(_MODEL_KEYS))}")
    table = {"name": name, **table}
    missing = [k for k in ("layers", "hidden", "heads", "vocab", "ffn_hidden") if k not in table]
    if missing:
        raise MeshwiseError(f"{where}: missing key {missing[0]!r}")
    table.setdefault("kv_heads", table["heads"])
    table.setdefault("max_seq", 2048)
    return ModelSpec(**table)


def hf_family(cfg: dict[str, Any], where: str) -> str:
    """The family of a config: its ``model_type``, else its first known ``architectures`` entry (also
    for a ``model_type`` meshwise does not know whose architecture it does: Kimi K2's ``kimi_k2``
    names ``DeepseekV3ForCausalLM``, the class its weights load into)."""
    model_type = cfg.get("model_type")
    if model_type is None or hf_defaults.WRAPPERS.get(model_type, model_type) not in _DEFAULTS:
        archs = cfg.get("architectures") or []
        known = (
            next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None) if isinstance(archs, list) else None
        )
        if known is None and model_type is None:
            raise MeshwiseError(
                f"{where}: no model_type (or known architectures) in it; a Hugging Face config.json "
                f"of one of: {', '.join(HF_FAMILIES)} is expected, {_TOML_ROUTE}"
            )
        model_type = known or model_type
    model_type = hf_defaults.WRAPPERS.get(model_type, model_type)
    if model_type not in _DEFAULTS:
        raise MeshwiseError(
            f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(HF_FAMILIES)}; {_TOML_ROUTE}"
        )
    return model_type


def _rope(cfg: dict[str, Any], theta_default: float) -> dict[str, Any]:
    """rope_theta and llama3-style scaling fields, from ``rope_parameters`` or ``rope_theta``/``rope_scaling``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise MeshwiseError("config.json: rope_parameters / rope_scaling must be objects")
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", cfg.get("rope_theta", theta_default))
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_scaling": "" if kind == "default" else str(kind)}
    if kind != "default":
        out.update(
            rope_factor=float(merged.get("factor", 1.0)),
            rope_low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            rope_original_max_seq=int(merged.get("original_max_position_embeddings") or 0),
        )
    partial = merged.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (1, 1.0, None):
        out["rope_scaling"] = out["rope_scaling"] or f"partial_rotary_factor={partial}"
    return out


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def _routed_and_shared(cfg: dict[str, Any], layers: int, family: str) -> dict[str, Any]:
    """DeepSeek's expert keys (GLM-4.5 reads them too): routed experts, shared ones of the same width,
    and the dense blocks before the first MoE block."""
    return dict(
        experts=cfg["n_routed_experts"],
        experts_per_token=cfg["num_experts_per_tok"],
        expert_ffn_hidden=cfg["moe_intermediate_size"],
        shared_ffn_hidden=(cfg.get("n_shared_experts") or 0) * cfg["moe_intermediate_size"],
        dense_layers=_sparse_layers(cfg, layers, family),
    )


def _sparse_layers(cfg: dict[str, Any], layers: int, family: str) -> tuple[int, ...]:
    """Indices of the blocks with a dense MLP in a MoE family (transformers' own rule per family)."""
    if family in ("qwen2_moe", "qwen3_moe"):
        step = cfg.get("decoder_sparse_step", 1) or 1
        only = set(cfg.get("mlp_only_layers") or [])
        return tuple(i for i in range(layers) if i in only or (i + 1) % step)
    if family == "glm4_moe":  # transformers: a MoE block from first_k_dense_replace on
        return tuple(range(min(cfg.get("first_k_dense_replace", 0) or 0, layers)))
    if family.startswith("deepseek"):
        first = cfg.get("first_k_dense_replace", 0) or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        return tuple(i for i in range(layers) if i < first or i % freq)
    return ()


def model_from_hf_config(cfg: dict[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """A ModelSpec with every field the family's transformers model uses to build its weights."""
    family = hf_family(cfg, where)
    cfg, excluded = hf_defaults.unwrap(cfg, family, where)
    if family in hf_defaults.CLASS_DEFAULTS:
        cfg = hf_defaults.with_defaults(cfg, family)
    try:
        if family == "gpt2":
            return _gpt2_spec(cfg, name, where)
        return _decoder_spec(cfg, name, family, where, excluded)
    except KeyError as missing:
        raise MeshwiseError(f"{where}: lacks {missing.args[0]!r}, which a {family} config needs") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, MeshwiseError):
            raise
        raise MeshwiseError(f"{where}: a {family} config with a value of the wrong type ({e})") from None


def _gpt2_spec(cfg: dict[str, Any], name: str, where: str) -> ModelSpec:
    """GPT-2's config.json keys (n_embd, n_layer, ...): learned positions, LayerNorm, biases everywhere."""
    eps, _, max_seq, tie = _DEFAULTS["gpt2"]
    family = "gpt2"
    hidden = cfg["n_embd"]
    return ModelSpec(
        name=name,
        family=family,
        layers=cfg["n_layer"],
        hidden=hidden,
        heads=cfg["n_head"],
        kv_heads=cfg["n_head"],
        ffn_hidden=cfg.get("n_inner") or 4 * hidden,
        mlp="gelu",
        vocab=cfg.get("vocab_size", 50257),
        tied_embeddings=cfg.get("tie_word_embeddings", tie),
        max_seq=cfg.get("n_positions", max_seq),
        norm="layernorm",
        norm_eps=cfg.get("layer_norm_epsilon", eps),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        position="learned",
        rope_theta=0.0,
        bos_id=cfg.get("bos_token_id"),
        eos_ids=_ids(cfg.get("eos_token_id")),
        source=where,
    )


def _decoder_spec(cfg: dict[str, Any], name: str, family: str, where: str, excluded) -> ModelSpec:
    """The Llama-like families' config.json keys (hidden_size, num_hidden_layers, ...)."""
    eps, theta, max_seq, tie = _DEFAULTS[family]
    heads = cfg["num_attention_heads"]
    layers = cfg["num_hidden_layers"]
    hidden = cfg["hidden_size"]
    fields_: dict[str, Any] = dict(
        name=name,
        family=family,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        ffn_hidden=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        tied_embeddings=cfg.get("tie_word_embeddings", tie),
        max_seq=cfg.get("max_position_embeddings", max_seq),
        norm_eps=cfg.get("rms_norm_eps", eps),
        head_dim=cfg.get("head_dim") or 0,
        bos_id=cfg.get("bos_token_id"),
        eos_ids=_ids(cfg.get("eos_token_id")),
        source=where,
        excluded=excluded,
        **_rope(cfg, theta),
    )
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if family.startswith("gemma"):
        fields_["mlp"] = "geglu"
    elif act != "silu":
        raise MeshwiseError(f"{where}: hidden_act {act!r} is not supported for {family} (silu)")
    attn_bias = bool(cfg.get("attention_bias", False))
    fields_.update(_attention_fields(cfg, family, layers, hidden, heads))
    if family in ("gemma3_text", "olmo3"):
        rope_cfg, local_theta = hf_defaults.layered_rope(cfg, family)
        fields_.update(_rope(rope_cfg, theta), rope_local_theta=local_theta)
    if family in hf_defaults.CLASS_DEFAULTS:
        fields_.update(hf_defaults.recent_fields(cfg, family, layers))
    if family == "llama4_text":  # its q/k L2 norm has no weights: the count leaves it out, the emit does not
        fields_["qk_l2_norm"] = bool(cfg.get("use_qk_norm", False))
    fields_.update(_expert_fields(cfg, family, layers, heads, attn_bias, where))
    fields_.update(_router_fields(cfg, family, fields_.get("experts", 0), where))
    try:
        spec = ModelSpec(**fields_)
    except MeshwiseError as err:
        raise MeshwiseError(_in_file_keys(str(err), name, family, cfg, where)) from None
    mtp = (cfg.get("num_nextn_predict_layers") or 0) if family in ("deepseek_v3", "glm4_moe") else 0
    return _with_mtp(spec, mtp) if mtp else spec


def _attention_fields(cfg: dict[str, Any], family: str, layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """The attention's biases, q/k norms, sliding window and soft-capping, by family."""
    fields: dict[str, Any] = {}
    attn_bias = bool(cfg.get("attention_bias", False))
    if family in (
        "llama",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "olmo2",
        "llama4_text",
        "olmo3",
        "smollm3",
    ):
        fields.update(qkv_bias=attn_bias, o_bias=attn_bias)
    if family == "glm4_moe":  # q, k and v biased; the output projection never is
        fields.update(
            qkv_bias=attn_bias,
            qk_norm=bool(cfg.get("use_qk_norm", False)),
            head_dim=cfg.get("head_dim") or hidden // heads,
        )
    if family in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = True
    if family in ("llama", "smollm3"):
        fields["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    if family in ("qwen3", "qwen3_moe"):
        fields["qk_norm"] = True
    window = cfg.get("sliding_window") or 0
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        window = 0
    fields["sliding_window"] = window
    if family == "gemma2":
        fields.update(
            norms_per_layer=4,
            attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
            query_scale=float(cfg.get("query_pre_attn_scalar") or 256),
        )
        if window:
            kinds = hf_defaults.layer_types(cfg, family, layers)
            fields["full_attention_layers"] = tuple(i for i, t in enumerate(kinds) if t == "full_attention")
    return fields


# ModelSpec's fields by the config.json keys they are read from (a family's own key first where it differs)
_FILE_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn_hidden": "intermediate_size",
    "vocab": "vocab_size",
    "max_seq": "max_position_embeddings",
    "head_dim": "head_dim",
    "norm_eps": "rms_norm_eps",
    "experts_per_token": "num_experts_per_tok",
    "expert_ffn_hidden": "moe_intermediate_size",
    "shared_ffn_hidden": "shared_expert_intermediate_size",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "sliding_window": "sliding_window",
    "rope_theta": "rope_theta",
    "router_groups": "n_group",
    "router_group_topk": "topk_group",
    "router_scale": "routed_scaling_factor",
    "aux_loss_coeff": "router_aux_loss_coef",
    "swiglu_limit": "swiglu_limit",
    "attention_chunk": "attention_chunk_size",
}


def _in_file_keys(message: str, name: str, family: str, cfg: dict[str, Any], where: str) -> str:
    """A ModelSpec refusal in the words of the file: its keys for the fields named, ``where`` for the model."""
    keys = dict(_FILE_KEYS, experts=next((k for k in EXPERT_KEYS if k in cfg), EXPERT_KEYS[0]))
    if family in ("mixtral", "minimax_m2", "gpt_oss", "llama4_text"):  # experts as wide as intermediate_size
        keys["expert_ffn_hidden"] = "intermediate_size"
    if family == "llama4_text":
        keys["ffn_hidden"] = "intermediate_size_mlp"
    message = message.replace(f"model {name!r}:", f"{where}:", 1)
    return re.sub(r"\b(" + "|".join(map(re.escape, keys)) + r")\b", lambda m: keys[m.group(1)], message)


MOE_FAMILIES = (
    "mixtral",
    "minimax_m2",
    "qwen2_moe",
    "qwen3_moe",
    "glm4_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "llama4_text",
)
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# transformers' router per family, where config.json leaves a key out: (score, norm_topk_prob,
# routed_scaling_factor, n_group, topk_group, expert bias, balance-loss weight); DeepSeek-V3 and GLM-4.5
# hard-code the sigmoid and the bias (e_score_correction_bias), Mixtral and GPT-OSS renormalise the
# top-k, Llama 4 takes the sigmoid of its top-1 logit; DeepSeek-V2 scores by softmax (scoring_func)
_ROUTER_DEFAULTS = {
    "mixtral": ("softmax", True, 1.0, 0, 0, False, 0.001),
    "gpt_oss": ("softmax", True, 1.0, 0, 0, False, 0.001),
    "qwen2_moe": ("softmax", False, 1.0, 0, 0, False, 0.001),
    "qwen3_moe": ("softmax", False, 1.0, 0, 0, False, 0.001),
    "llama4_text": ("sigmoid", False, 1.0, 0, 0, False, 0.001),
    "deepseek_v3": ("sigmoid", True, 2.5, 8, 4, True, 0.0),
    "glm4_moe": ("sigmoid", True, 1.0, 1, 1, True, 0.0),
    "deepseek_v2": ("softmax", False, 1.0, 0, 0, False, 0.0),
    "minimax_m2": ("sigmoid", True, 1.0, 0, 0, True, 0.001),
}


def _router_fields(cfg: dict[str, Any], family: str, experts: int, where: str) -> dict[str, Any]:
    """The router of a MoE config, the family's transformers defaults for the keys it leaves out; a
    MoE family's config without experts refused (not planned as a dense model)."""
    if family in MOE_FAMILIES and not experts:
        key = next((k for k in EXPERT_KEYS if k in cfg), EXPERT_KEYS[0])
        raise MeshwiseError(
            f"{where}: {key} is 0; a {family} config needs at least one expert "
            f"(a model without experts is a dense family's config)"
        )
    if not experts:
        return {}
    score, norm, scale, groups, group_topk, bias, aux = _ROUTER_DEFAULTS[family]
    if family in ("deepseek_v2", "minimax_m2"):
        score = cfg.get("scoring_func") or score
    if family == "deepseek_v2":
        bias = cfg.get("topk_method") == "noaux_tc"
    if family == "minimax_m2":
        bias = bool(cfg.get("use_routing_bias", bias))
    aux = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha", aux))
    return dict(
        router_score=score,
        router_norm_topk=bool(cfg.get("norm_topk_prob", norm)),
        router_scale=float(cfg.get("routed_scaling_factor", scale) or 1.0),
        router_groups=int(cfg.get("n_group", groups) or 0),
        router_group_topk=int(cfg.get("topk_group", group_topk) or 0),
        expert_bias=bias,
        aux_loss_coeff=float(aux or 0.0),
    )


def _expert_fields(
    cfg: dict[str, Any], family: str, layers: int, heads: int, attn_bias: bool, where: str
) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral, MiniMax-M2, Qwen MoE, GLM-4.5 or DeepSeek config (and DeepSeek's
    MLA attention); none for another family."""
    out: dict[str, Any] = {}
    if family in ("mixtral", "minimax_m2"):  # every block a MoE block of intermediate_size experts
        out.update(
            experts=cfg.get("num_local_experts", 8),
            experts_per_token=cfg.get("num_experts_per_tok", 2),
            expert_ffn_hidden=cfg["intermediate_size"],
        )
    if family in ("qwen2_moe", "qwen3_moe"):
        experts = cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]  # transformers 4 | 5
        out.update(
            experts=experts,
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden=cfg["moe_intermediate_size"],
            dense_layers=_sparse_layers(cfg, layers, family),
        )
        if family == "qwen2_moe":
            out.update(shared_ffn_hidden=cfg["shared_expert_intermediate_size"], shared_expert_gate=True)
    if family == "glm4_moe":
        out.update(_routed_and_shared(cfg, layers, family))
    if family.startswith("deepseek"):
        if attn_bias:
            raise MeshwiseError(f"{where}: attention_bias is not supported for {family}")
        rope, nope = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"]
        out.update(
            _routed_and_shared(cfg, layers, family),
            head_dim=rope + nope,
            q_lora_rank=cfg.get("q_lora_rank") or 0,
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_rope_head_dim=rope,
            v_head_dim=cfg["v_head_dim"],
            kv_heads=heads,
        )
    return out


def _with_mtp(spec: ModelSpec, layers: int) -> ModelSpec:
    """DeepSeek-V3's (and GLM-4.5's) multi-token-prediction modules, left out of the count and the plan
    as transformers leaves them out of the model it builds: each is (DeepSeek-V3 report, arXiv 2412.19437, sec. 2.2)
    one more MoE block, a 2h x h projection and norms of the two inputs and the shared head (3h);
    the embedding and output head are shared with the main model."""
    block = spec.attention_params + spec.layer_norm_params + spec._moe_block(spec.experts)
    size = layers * (block + 2 * spec.hidden * spec.hidden + 3 * spec.hidden)
    what = f"{layers} multi-token-prediction layer{'s' if layers > 1 else ''} (num_nextn_predict_layers)"
    return replace(spec, excluded=what, excluded_params=size)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise MeshwiseError(
            f"--model: {path} is not a UTF-8 text file (a model TOML or config.json is expected)"
        ) from None
    except OSError as e:
        raise MeshwiseError(f"--model: cannot read {path} ({e.strerror or e})") from None


def _hf_config_file(path: Path) -> ModelSpec:
    try:
        cfg = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise MeshwiseError(f"--model: {path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise MeshwiseError(
            f"--model: {path} holds a JSON {type(cfg).__name__}, not an object (a config.json is expected)"
        )
    if "model" in cfg and ("vocab" in cfg.get("model", {}) if isinstance(cfg.get("model"), dict) else False):
        raise MeshwiseError(f"--model: {path} is a tokenizer, not a model config; give the model's config.json")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_hf_config(cfg, name, f"--model {path}")


def load_model(ref: str) -> ModelSpec:
    """A catalog name, a TOML file (model fields at top level or under ``[model]``), or a HF config.json
    (or the folder that holds one)."""
    catalog = read_catalog("models.toml")
    if ref in catalog:
        return _model_from_table(ref, catalog[ref], f"catalog model {ref!r}")
    path = Path(ref)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MeshwiseError(f"--model: folder {ref} holds no config.json (a Hugging Face model folder is expected)")
        path = path / "config.json"
    if path.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf"):
        raise MeshwiseError(f"--model: {ref} is a weights file; give the model's config.json or its folder")
    if path.suffix in (".toml", ".json") or path.exists():
        if not path.is_file():
            raise MeshwiseError(
                f"--model: {ref} is not a regular file" if path.exists() else f"--model: file {ref} does not exist"
            )
        if path.suffix != ".toml":
            return _hf_config_file(path)
        _read_text(path)  # one line for a non-UTF-8 or unreadable file
        table = read_toml(path, "--model")
        table = table.get("model", table) if isinstance(table.get("model", table), dict) else table
        return _model_from_table(str(table.pop("name", path.stem)), dict(table), f"--model {ref}")
    hub = "/" in ref and not ref.startswith((".", "/")) and len(ref.split("/")) == 2
    hint = " (Hugging Face Hub ids are not downloaded: download the folder and give its path)" if hub else ""
    raise MeshwiseError(
        f"--model: unknown model {ref!r}{hint}; choose one of {', '.join(catalog)}, "
        f"or give a .toml, a config.json or a model folder"
    )
