"""Config-class defaults for the Hugging Face families whose config.json leaves keys out: Gemma 3,
Llama 4, GPT-OSS, OLMo 2 and 3, SmolLM3, Ministral, GLM-4.5, Seed-OSS, ERNIE 4.5, Helium, Granite,
Hunyuan (dense), GLM-4, MiniMax-M2, EXAONE 4, and the Mistral 3 and Qwen3-VL wrappers.

Each family's ``transformers`` config class defaults (transformers 5.x; tests/unit/test_hf_defaults.py
compares this table with the classes themselves) fill the keys a published config.json leaves out:
Gemma 3's published ``text_config`` holds little more than the widths. The multimodal wrappers
(``gemma3``, ``llama4``, ``mistral3``, ``qwen3_vl``, ``qwen3_vl_moe``) are read through their
``text_config``: the plan covers the language model, and the vision encoder and projector are named
as left out. Pure Python, no transformers import.
"""

from __future__ import annotations

from typing import Any

from meshwise.catalog import read_catalog
from meshwise.errors import MeshwiseError

# The config class defaults of the keys meshwise reads (catalog/hf_class_defaults.toml).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = read_catalog("hf_class_defaults.toml")
ROPE_DEFAULTS = {"gemma3_text": 1e6, "llama4_text": 500000.0, "gpt_oss": 150000.0, "olmo2": 10000.0}
GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150000.0,
}
GLM4_MOE_ROTARY = 0.5  # Glm4MoeConfig's (and Glm4Config's) partial_rotary_factor: rope on half of each head
WRAPPERS = {
    "gemma3": "gemma3_text",
    "llama4": "llama4_text",
    "mistral3": "mistral",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
}
VISION = "the vision encoder and multimodal projector (images are not planned)"


def unwrap(cfg: dict[str, Any], family: str, where: str) -> tuple[dict[str, Any], str]:
    """A multimodal config's text model (its ``text_config``, with the wrapper's tie and token ids),
    and what is left out; a text config as it is. ``family``: the text family the config resolved to
    (by ``model_type`` or ``architectures``)."""
    wrapped = cfg.get("model_type") in WRAPPERS or (family in WRAPPERS.values() and "text_config" in cfg)
    if not wrapped:
        return cfg, ""
    text = cfg.get("text_config")
    if text is None:
        text = {}
    if not isinstance(text, dict):
        raise MeshwiseError(f"{where}: text_config must be an object")
    outer = {k: cfg[k] for k in ("tie_word_embeddings", "bos_token_id", "eos_token_id") if k in cfg}
    # the wrapper's tie decides whether the head is the embedding (Qwen3-VL-MoE: False outside, True in
    # its text_config; transformers builds an untied head)
    tie = {"tie_word_embeddings": cfg["tie_word_embeddings"]} if "tie_word_embeddings" in cfg else {}
    return {**outer, **text, **tie, "model_type": family}, VISION


def with_defaults(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """``cfg`` with its class defaults under the keys it leaves out."""
    out = {**CLASS_DEFAULTS[family], **cfg}
    if family == "gpt_oss" and not cfg.get("rope_parameters") and not cfg.get("rope_scaling"):
        out["rope_parameters"] = dict(GPT_OSS_ROPE)
    if family in ("glm4_moe", "glm4") and "partial_rotary_factor" not in {**(cfg.get("rope_parameters") or {}), **cfg}:
        out["partial_rotary_factor"] = GLM4_MOE_ROTARY
    return out


def layer_types(cfg: dict[str, Any], family: str, layers: int) -> list[str]:
    """Each block's attention kind, as the config class derives it when ``layer_types`` is absent."""
    given = cfg.get("layer_types")
    if given:
        if not isinstance(given, list) or len(given) != layers:
            raise MeshwiseError(f"config.json: layer_types must list {layers} attention kinds, one per layer")
        return [str(t) for t in given]
    if family == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern", 6) or 6
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if family in ("gpt_oss", "gemma2"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if family == "olmo3":
        return ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    if family == "smollm3":  # windowed only where use_sliding_window is on, on the NoPE blocks
        windowed = cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None
        return [
            "sliding_attention" if windowed and not rope else "full_attention" for rope in no_rope_flags(cfg, layers)
        ]
    if family == "ministral":
        return ["sliding_attention" if cfg.get("sliding_window") is not None else "full_attention"] * layers
    if family == "exaone4":  # sliding_window_pattern: every n-th block global, or a string such as "LLLG"
        pattern = cfg.get("sliding_window_pattern") or 0
        if cfg.get("sliding_window") is None or not pattern:
            return ["full_attention"] * layers
        if isinstance(pattern, str):
            return [
                "full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention" for i in range(layers)
            ]
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if family == "llama4_text":
        interval = cfg.get("no_rope_layer_interval", 4) or 4
        nope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        chunked = cfg.get("attention_chunk_size") is not None
        return ["chunked_attention" if n and chunked else "full_attention" for n in nope]
    return ["sliding_attention"] * layers


def no_rope_flags(cfg: dict[str, Any], layers: int) -> list[int]:
    """SmolLM3's ``no_rope_layers``: 1 where a block rotates, 0 where it attends without positions
    (by default every ``no_rope_layer_interval``-th block)."""
    given = cfg.get("no_rope_layers")
    if given is None:
        interval = cfg.get("no_rope_layer_interval", 4) or 4
        return [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(given, list) or len(given) != layers:
        raise MeshwiseError(f"config.json: no_rope_layers must list {layers} flags, one per layer")
    return [int(bool(x)) for x in given]


LOCAL_THETA = {"gemma3_text": 10000.0, "olmo3": 500000.0}  # the windowed blocks' base, absent from the file
FULL_THETA = {"gemma3_text": 1e6, "olmo3": 500000.0}


def layered_rope(cfg: dict[str, Any], family: str) -> tuple[dict[str, Any], float]:
    """(the global blocks' rope, as ``_rope`` reads it; the windowed blocks' theta) of Gemma 3 or OLMo 3:
    transformers 5 nests ``rope_parameters`` by layer kind; transformers 4 wrote rope_theta, a
    rope_scaling of the global blocks and (Gemma 3) rope_local_base_freq. OLMo 3's config class gives
    the windowed blocks its default base whatever rope_theta says (transformers 5.x)."""
    params = cfg.get("rope_parameters") or {}
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = dict(params.get("full_attention") or {})
        local = params.get("sliding_attention") or {}
        full.setdefault("rope_theta", FULL_THETA[family])
        return {"rope_parameters": full}, float(local.get("rope_theta", LOCAL_THETA[family]))
    scaling = cfg.get("rope_scaling") or {}
    full = {**scaling, **(params if isinstance(params, dict) else {})}
    full.setdefault("rope_theta", cfg.get("rope_theta", FULL_THETA[family]))
    return {"rope_parameters": full}, float(cfg.get("rope_local_base_freq", LOCAL_THETA[family]))


def recent_fields(cfg: dict[str, Any], family: str, layers: int) -> dict[str, Any]:
    """The ModelSpec fields particular to each family of this table (widths and rope are read by the
    caller): the attention's layout of windows and norms, or, for the families that are Llama's
    block with their own biases and scales, those."""
    if family in _BIASED_LLAMAS:
        return _biased_llama_fields(cfg, family)
    kinds = layer_types(cfg, family, layers)
    full = tuple(i for i, t in enumerate(kinds) if t == "full_attention")
    window = {"sliding_window": 0, "full_attention_layers": full}
    if any(t == "sliding_attention" for t in kinds):
        window["sliding_window"] = int(cfg.get("sliding_window") or 0)
    if family == "gemma3_text":
        return dict(
            window,
            norms_per_layer=4,
            qk_norm=True,
            query_scale=float(cfg["query_pre_attn_scalar"]),
            attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        )
    if family in ("olmo2", "olmo3"):
        return dict(window if family == "olmo3" else {}, qk_norm=True, qk_norm_scope="projection", post_norm=True)
    if family == "smollm3":
        return dict(window, nope_layers=tuple(i for i, rope in enumerate(no_rope_flags(cfg, layers)) if not rope))
    if family == "ministral":
        return window
    if family == "exaone4":  # OLMo 2's norms on the sublayer outputs, q/k norms per head; with a window,
        # the global blocks attend without rotary positions
        nope = tuple(i for i, t in enumerate(kinds) if t == "full_attention") if window["sliding_window"] else ()
        return dict(window, qk_norm=True, post_norm=True, nope_layers=nope)
    if family == "gpt_oss":
        return dict(
            window,
            experts=cfg["num_local_experts"],
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden=cfg["intermediate_size"],
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            attn_sinks=True,
            router_bias=True,
            swiglu_limit=float(cfg.get("swiglu_limit") or 0.0),
        )
    if family == "llama4_text":
        step = cfg.get("interleave_moe_layer_step", 1) or 1
        moe = cfg.get("moe_layers")
        moe = set(range(step - 1, layers, step) if moe is None else moe)
        chunk = int(cfg.get("attention_chunk_size") or 0) if any(t == "chunked_attention" for t in kinds) else 0
        return dict(
            full_attention_layers=full if chunk else (),
            attention_chunk=chunk,
            experts=cfg["num_local_experts"],
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden=cfg["intermediate_size"],
            shared_ffn_hidden=cfg["intermediate_size"],
            ffn_hidden=cfg["intermediate_size_mlp"],
            dense_layers=tuple(i for i in range(layers) if i not in moe),
        )
    return {}


# the families that are Llama's block with biases, scales or norms of their own (_biased_llama_fields)
_BIASED_LLAMAS = ("seed_oss", "ernie4_5", "helium", "granite", "hunyuan_v1_dense", "glm4", "minimax_m2")


def _biased_llama_fields(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """The biases, q/k norms and multipliers of a family built as Llama's block (_BIASED_LLAMAS)."""
    if family == "seed_oss":  # Llama's block; q, k and v biased by attention_bias, the output by its own flag
        return dict(
            qkv_bias=bool(cfg["attention_bias"]), o_bias=bool(cfg["attention_out_bias"]), mlp_bias=bool(cfg["mlp_bias"])
        )
    if family == "ernie4_5":  # Llama's block; use_bias biases every projection, the MLP's too
        bias = bool(cfg["use_bias"])
        return dict(qkv_bias=bias, o_bias=bias, mlp_bias=bias)
    if family == "helium":  # Llama's block; the output projection is never biased
        return dict(qkv_bias=bool(cfg["attention_bias"]), mlp_bias=bool(cfg["mlp_bias"]))
    if family == "granite":  # Llama's block with multipliers (they add no weights); the scores are
        # scaled by attention_multiplier itself, query_scale^-1/2
        bias = bool(cfg["attention_bias"])
        return dict(
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bool(cfg["mlp_bias"]),
            query_scale=float(cfg["attention_multiplier"]) ** -2,
            embedding_multiplier=float(cfg["embedding_multiplier"]),
            residual_multiplier=float(cfg["residual_multiplier"]),
            logits_scaling=float(cfg["logits_scaling"]),
        )
    if family == "hunyuan_v1_dense":  # Llama's block with an RMSNorm of each query and key head
        bias = bool(cfg["attention_bias"])
        return dict(qkv_bias=bias, o_bias=bias, qk_norm=True)
    if family == "glm4":  # norms on both sides of each sublayer; q, k and v biased, the output never
        return dict(qkv_bias=bool(cfg["attention_bias"]), norms_per_layer=4)
    if family == "minimax_m2":  # RMSNorm over the whole q and k projections (its experts: _expert_fields)
        return dict(qk_norm=True, qk_norm_scope="projection")
    raise ValueError(f"{family} is not one of {_BIASED_LLAMAS}")
