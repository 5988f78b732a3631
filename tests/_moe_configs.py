"""Published config.json of mixtures of experts (the keys that shape the model and its router), for
the emit and explanation tests: written to a folder, read by ``meshwise.spec.load_model``; the same
dict is the oracle of the router and attention settings an emitted command must carry."""

from __future__ import annotations

import json

SCOUT_LAYERS = 48
CONFIGS = {
    # deepseek-ai/DeepSeek-V3 config.json (its multi-token-prediction layer aside)
    "deepseek-v3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 129280, "max_position_embeddings": 163840, "n_group": 8, "topk_group": 4,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "aux_loss_alpha": 0.001, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                              "mscale": 1.0, "mscale_all_dim": 1.0,
                                              "original_max_position_embeddings": 4096}},
    # Qwen/Qwen3-235B-A22B config.json
    "qwen3-235b-a22b": {
        "model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6, "norm_topk_prob": True, "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False, "hidden_act": "silu"},
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6, "norm_topk_prob": True, "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False, "hidden_act": "silu"},
    # openai/gpt-oss-120b config.json
    "gpt-oss-120b": {
        "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
        "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
        "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "original_max_position_embeddings": 4096},
        "swiglu_limit": 7.0, "attention_bias": True, "router_aux_loss_coef": 0.9, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "hidden_act": "silu"},
    # mistralai/Mixtral-8x22B-v0.1 config.json
    "mixtral-8x22b": {
        "model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384, "num_hidden_layers": 56,
        "num_attention_heads": 48, "num_key_value_heads": 8, "vocab_size": 32768, "num_local_experts": 8,
        "num_experts_per_tok": 2, "max_position_embeddings": 65536, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
        "router_aux_loss_coef": 0.001, "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": None},
    # meta-llama/Llama-4-Scout-17B-16E config.json (its text model)
    "llama4-scout": {
        "model_type": "llama4", "text_config": {
            "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_hidden_layers": SCOUT_LAYERS, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
            "max_position_embeddings": 10485760, "rope_theta": 500000.0, "attention_chunk_size": 8192,
            "use_qk_norm": True, "router_aux_loss_coef": 0.001, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(SCOUT_LAYERS)],
            "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192}}},
}
# MoE shapes the issue did not list: GLM-4.5-Air (zai-org), Qwen1.5-MoE-A2.7B (Qwen), Llama 4 Maverick, gpt-oss-20b
UNSEEN = {
    "glm-4.5-air": {
        "model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
        "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
        "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
        "vocab_size": 151552, "max_position_embeddings": 131072, "partial_rotary_factor": 0.5, "rope_theta": 1e6,
        "attention_bias": True, "use_qk_norm": False, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
        "norm_topk_prob": True, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"},
    "qwen1.5-moe-a2.7b": {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
        "max_position_embeddings": 8192, "rope_theta": 1e6, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1, "tie_word_embeddings": False, "hidden_act": "silu"},
    "llama4-maverick": {
        "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 202048, "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
        "max_position_embeddings": 1048576, "rope_theta": 500000.0, "attention_chunk_size": 8192,
        "use_qk_norm": False, "router_aux_loss_coef": 0.001, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(48)]},
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "num_hidden_layers": 24, "num_local_experts": 32,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096}},
}


def text_config(cfg: dict) -> dict:
    """The language model's keys (a multimodal config nests them under text_config)."""
    return cfg.get("text_config", cfg)


def write(tmp_path, name: str) -> str:
    """The named config as ``<tmp>/<name>/config.json``; the folder's path (what --model takes)."""
    cfg = {**CONFIGS, **UNSEEN}[name]
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)
