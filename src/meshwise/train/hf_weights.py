"""Hugging Face weight names and config.json, both ways, per family.

meshwise names are layout-independent (``layers.3.attention.wq.weight``); Hugging Face's are the
family's own (``model.layers.3.self_attn.q_proj.weight``). Phi-3 stores Q, K and V as one
``qkv_proj`` and gate and up as one ``gate_up_proj`` (concatenated on the output dimension);
GPT-2 stores Q, K, V as one ``c_attn`` and every matrix as a ``Conv1D``, (in, out), the transpose
of ``nn.Linear``'s. meshwise rotates each head's (i, i + d/2) pairs, as transformers does for most
families; ERNIE 4.5 and Helium rotate its (2i, 2i + 1) pairs, so their q and k rows are reordered
within each head on the way in and back on the way out (the scores are the same: q and k move together).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from meshwise.spec import ModelSpec

_LLAMA_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
    "mlp.w1": "mlp.gate_proj",
    "mlp.w3": "mlp.up_proj",
    "mlp.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
}
# Gemma 2/3 and OLMo 2: norms on the sublayers' outputs (OLMo 2 has those only)
_SANDWICH_BLOCK = {
    **_LLAMA_BLOCK,
    "mlp_norm": "pre_feedforward_layernorm",
    "attention_out_norm": "post_attention_layernorm",
    "mlp_out_norm": "post_feedforward_layernorm",
}
_LLAMA_ROOT = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GPT2_BLOCK = {
    "attention.wo": "attn.c_proj",
    "mlp.w1": "mlp.c_fc",
    "mlp.w2": "mlp.c_proj",
    "attention_norm": "ln_1",
    "mlp_norm": "ln_2",
}
_GPT2_ROOT = {
    "tok_embeddings.weight": "transformer.wte.weight",
    "pos_embeddings.weight": "transformer.wpe.weight",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")
INTERLEAVED_ROPE = ("ernie4_5", "helium")  # rotary over each head's (2i, 2i + 1) pairs
_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "ministral": "MinistralForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "helium": "HeliumForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "granite": "GraniteForCausalLM",
}


def _block_names(spec: ModelSpec) -> dict[str, str]:
    if spec.family == "gpt2":
        return _GPT2_BLOCK
    return _SANDWICH_BLOCK if spec.post_norm or spec.norms_per_layer == 4 else _LLAMA_BLOCK


def _hf_name(spec: ModelSpec, name: str) -> str:
    gpt2 = spec.family == "gpt2"
    root = _GPT2_ROOT if gpt2 else _LLAMA_ROOT
    if name in root:
        return root[name]
    m = _BLOCK.fullmatch(name)
    block = _block_names(spec)
    if not m or m.group(2) not in block:
        raise KeyError(name)
    prefix = "transformer.h" if gpt2 else "model.layers"
    return f"{prefix}.{m.group(1)}.{block[m.group(2)]}.{m.group(3)}"


def _rope_rows(spec: ModelSpec, t: torch.Tensor, to_pairs: bool) -> torch.Tensor:
    """A q or k projection's rows (weight or bias) reordered within each head: Hugging Face's
    (2i, 2i + 1) rotary pairs to meshwise's (i, i + d/2), or back (``to_pairs``)."""
    d = spec.head_dim
    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    if to_pairs:
        order = torch.argsort(order)
    return t.reshape(t.shape[0] // d, d, *t.shape[1:])[:, order].reshape(t.shape).contiguous()


def to_hf(spec: ModelSpec, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """meshwise state dict (full tensors) -> the family's Hugging Face state dict (tied head omitted)."""
    out: dict[str, torch.Tensor] = {}
    fused = {}
    for name, t in tensors.items():
        if name == "output.weight" and spec.tied_embeddings:
            continue
        m = _BLOCK.fullmatch(name)
        part = m.group(2) if m else ""
        if spec.family == "phi3" and part in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3"):
            fused[(m.group(1), part, m.group(3))] = t
            continue
        if spec.family == "gpt2" and part in ("attention.wq", "attention.wk", "attention.wv"):
            fused[(m.group(1), part, m.group(3))] = t
            continue
        conv1d = spec.family == "gpt2" and part in ("attention.wo", "mlp.w1", "mlp.w2") and name.endswith("weight")
        t2 = t.t() if conv1d else t
        if spec.family in INTERLEAVED_ROPE and part in ("attention.wq", "attention.wk"):
            t2 = _rope_rows(spec, t2, to_pairs=True)
        out[_hf_name(spec, name)] = t2.contiguous()
    for layer in sorted({k[0] for k in fused}, key=int):
        for kind in ("weight", "bias"):
            qkv = [fused.get((layer, f"attention.w{x}", kind)) for x in "qkv"]
            if qkv[0] is not None:
                if spec.family == "phi3":
                    out[f"model.layers.{layer}.self_attn.qkv_proj.{kind}"] = torch.cat(qkv, 0)
                else:
                    cat = torch.cat(qkv, 0)
                    out[f"transformer.h.{layer}.attn.c_attn.{kind}"] = (
                        cat.t() if kind == "weight" else cat
                    ).contiguous()
            gate_up = [fused.get((layer, f"mlp.w{x}", kind)) for x in "13"]
            if gate_up[0] is not None:
                out[f"model.layers.{layer}.mlp.gate_up_proj.{kind}"] = torch.cat(gate_up, 0)
    return out


def from_hf(spec: ModelSpec, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The family's Hugging Face state dict -> meshwise names (the inverse of :func:`to_hf`)."""
    reverse: dict[str, tuple[str, bool]] = {}
    names = ["tok_embeddings.weight", "norm.weight"]
    names += [] if spec.tied_embeddings else ["output.weight"]
    names += ["pos_embeddings.weight", "norm.bias"] if spec.family == "gpt2" else []
    block = _block_names(spec)
    for i in range(spec.layers):
        names += [f"layers.{i}.{part}.{kind}" for part in block for kind in ("weight", "bias")]
    for name in names:
        m = _BLOCK.fullmatch(name)
        conv1d = (
            spec.family == "gpt2"
            and m is not None
            and m.group(3) == "weight"
            and m.group(2) in ("attention.wo", "mlp.w1", "mlp.w2")
        )
        reverse[_hf_name(spec, name)] = (name, conv1d)
    out: dict[str, torch.Tensor] = {}
    q, kv = spec.heads * spec.head_dim, spec.kv_dim
    for hf_name, t in hf.items():
        if hf_name in reverse:
            name, transpose = reverse[hf_name]
            out[name] = (t.t() if transpose else t).contiguous()
            if spec.family in INTERLEAVED_ROPE and (".attention.wq." in name or ".attention.wk." in name):
                out[name] = _rope_rows(spec, out[name], to_pairs=False)
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(self_attn\.qkv_proj|mlp\.gate_up_proj)\.(weight|bias)", hf_name)
        g = re.fullmatch(r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)", hf_name)
        if m and m.group(2) == "self_attn.qkv_proj":
            for part, piece in zip("qkv", t.split([q, kv, kv], 0)):
                out[f"layers.{m.group(1)}.attention.w{part}.{m.group(3)}"] = piece.contiguous()
        elif m:
            gate, up = t.chunk(2, 0)
            out[f"layers.{m.group(1)}.mlp.w1.{m.group(3)}"] = gate.contiguous()
            out[f"layers.{m.group(1)}.mlp.w3.{m.group(3)}"] = up.contiguous()
        elif g:
            full = t.t() if g.group(2) == "weight" else t
            for part, piece in zip("qkv", full.split([q, kv, kv], 0)):
                out[f"layers.{g.group(1)}.attention.w{part}.{g.group(2)}"] = piece.contiguous()
        elif hf_name == "lm_head.weight" and spec.tied_embeddings:
            continue
        else:
            raise KeyError(hf_name)
    return out


def _layer_types(spec: ModelSpec) -> list[str]:
    """Each block's attention kind as transformers' ``layer_types`` names it: windowed outside
    ``full_attention_layers`` where the model has a window."""
    return [
        "full_attention" if i in spec.full_attention_layers or not spec.sliding_window else "sliding_attention"
        for i in range(spec.layers)
    ]


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A config.json that makes transformers build the model meshwise trained."""
    common: dict[str, Any] = {
        "architectures": [_ARCH[spec.family]],
        "model_type": spec.family,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": spec.tied_embeddings,
        "torch_dtype": "float32",
        "pad_token_id": None,
    }
    if spec.bos_id is not None:
        common["bos_token_id"] = spec.bos_id
    if spec.eos_ids:
        common["eos_token_id"] = spec.eos_ids[0] if len(spec.eos_ids) == 1 else list(spec.eos_ids)
    if spec.family == "gpt2":
        return {**common, **_gpt2_fields(spec)}
    cfg = {**common, **_llama_fields(spec)}
    _family_fields(spec, cfg)
    return cfg


def _gpt2_fields(spec: ModelSpec) -> dict[str, Any]:
    """GPT-2's own names for the shape (no dropout: meshwise trains without it)."""
    return {
        "n_layer": spec.layers,
        "n_embd": spec.hidden,
        "n_head": spec.heads,
        "n_inner": spec.ffn_hidden,
        "n_positions": spec.max_seq,
        "layer_norm_epsilon": spec.norm_eps,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def _rope(spec: ModelSpec) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of the model's global attention."""
    rope: dict[str, Any] = {"rope_type": spec.rope_scaling or "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling == "llama3":
        rope.update(
            factor=spec.rope_factor,
            low_freq_factor=spec.rope_low_freq_factor,
            high_freq_factor=spec.rope_high_freq_factor,
            original_max_position_embeddings=spec.rope_original_max_seq,
        )
    if rope["rope_type"] == "linear":
        rope["factor"] = spec.rope_factor
    return rope


def _llama_fields(spec: ModelSpec) -> dict[str, Any]:
    """The keys every Llama-like family's config shares."""
    rope = _rope(spec)
    return {
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn_hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_seq,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None if rope["rope_type"] == "default" else rope,
        "rope_parameters": rope,
        "hidden_act": "gelu_pytorch_tanh" if spec.mlp == "geglu" else "silu",
        "attention_bias": spec.qkv_bias or spec.o_bias,
        "mlp_bias": spec.mlp_bias,
        "sliding_window": spec.sliding_window or None,
    }


def _family_fields(spec: ModelSpec, cfg: dict[str, Any]) -> None:
    """The keys of one family beyond the Llama-like ones, set in ``cfg``."""
    if spec.family == "gemma":
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
    if spec.family in ("gemma2", "gemma3_text"):
        scalar = int(spec.query_scale) if spec.query_scale == int(spec.query_scale) else spec.query_scale
        cfg.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=scalar or spec.head_dim,
            final_logit_softcapping=spec.final_softcap or None,
            attn_logit_softcapping=None,
            layer_types=_layer_types(spec),
            sliding_window=spec.sliding_window or spec.max_seq,
        )
    if spec.family in ("olmo3", "ministral", "smollm3", "exaone4"):
        cfg["layer_types"] = _layer_types(spec)
    if spec.family == "ernie4_5":  # one flag biases every projection
        cfg["use_bias"] = spec.qkv_bias
    if spec.family == "helium":  # q, k and v biased by attention_bias; the output projection never is
        cfg["attention_bias"] = spec.qkv_bias
    if spec.family == "granite":
        cfg.update(
            embedding_multiplier=spec.embedding_multiplier,
            residual_multiplier=spec.residual_multiplier,
            logits_scaling=spec.logits_scaling,
            attention_multiplier=(spec.query_scale or spec.head_dim) ** -0.5,
        )
    if spec.family == "seed_oss":  # its own flag for the output projection's bias; trained without dropout
        cfg.update(
            attention_bias=spec.qkv_bias, attention_out_bias=spec.o_bias, attention_dropout=0.0, residual_dropout=0.0
        )
    if spec.family == "smollm3":
        cfg.update(
            no_rope_layers=[int(i not in spec.nope_layers) for i in range(spec.layers)],
            use_sliding_window=bool(spec.sliding_window),
        )
    if spec.family in ("gemma3_text", "olmo3"):
        local = {"rope_type": "default", "rope_theta": spec.rope_local_theta}
        cfg.update(
            rope_scaling=None, rope_parameters={"full_attention": cfg["rope_parameters"], "sliding_attention": local}
        )
