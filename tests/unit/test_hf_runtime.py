"""meshwise's model against transformers' own, family by family: tiny random models made by
transformers, their weights loaded into meshwise, forward logits equal within 1e-5 (fp32)."""

import json

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from meshwise.runtime.model import build_model, runtime_refusal  # noqa: E402
from meshwise.spec.hf_config import model_from_hf_config  # noqa: E402
from meshwise.train.hf_weights import from_hf, to_hf  # noqa: E402

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=97,
    max_position_embeddings=64,
)
SMOL_IDS = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2)  # the class's own lie past a 97-token vocabulary
FAMILIES = {
    "llama": ("LlamaConfig", dict(TINY, rms_norm_eps=1e-5)),
    "llama3.1": (
        "LlamaConfig",
        dict(
            TINY,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "llama3.2-tied": ("LlamaConfig", dict(TINY, tie_word_embeddings=True, head_dim=32)),
    "llama-linear-rope": ("LlamaConfig", dict(TINY, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral-window": ("MistralConfig", dict(TINY, sliding_window=6)),
    "llama-bias": ("LlamaConfig", dict(TINY, attention_bias=True, mlp_bias=True)),
    "mistral": ("MistralConfig", dict(TINY, sliding_window=None, rope_theta=1e6)),
    "qwen2": ("Qwen2Config", dict(TINY, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(TINY, head_dim=24)),
    "gemma": ("GemmaConfig", dict(TINY, head_dim=32)),
    "phi3": ("Phi3Config", dict(TINY, pad_token_id=0)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=97, n_positions=64)),
    "olmo2": ("Olmo2Config", dict(TINY, rope_theta=500000.0)),
    # Gemma 3: a window shorter than the test's 16 tokens on blocks 0 and 2, full attention on 1 and 3,
    # the global blocks' linear rope scaling, query_pre_attn_scalar unlike head_dim, final soft-capping
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            TINY,
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=24,
            final_logit_softcapping=3.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    "gemma2-no-attn-cap": (
        "Gemma2Config",
        dict(TINY, head_dim=32, sliding_window=6, attn_logit_softcapping=None, query_pre_attn_scalar=16),
    ),
    # OLMo 3: OLMo 2's norms with a window on three blocks of four (block 3 global), the windowed
    # blocks' own rope base
    "olmo3": (
        "Olmo3Config",
        dict(
            TINY,
            num_hidden_layers=4,
            sliding_window=5,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            },
        ),
    ),
    # SmolLM3: blocks 1 and 3 without rotary positions (NoPE), tied; then with its window on them
    "smollm3": ("SmolLM3Config", dict(TINY, num_hidden_layers=4, no_rope_layer_interval=2, **SMOL_IDS)),
    "smollm3-window": (
        "SmolLM3Config",
        dict(
            TINY, num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=5, **SMOL_IDS
        ),
    ),
    "ministral": (
        "MinistralConfig",
        dict(TINY, head_dim=16, sliding_window=6, layer_types=["sliding_attention", "full_attention"]),
    ),
    # Seed-OSS: Llama's block with q, k, v biased (its class default) and the output projection not;
    # then every projection biased (the output by attention_out_bias)
    "seed_oss": ("SeedOssConfig", dict(TINY, head_dim=16)),
    "seed_oss-all-bias": ("SeedOssConfig", dict(TINY, head_dim=16, attention_out_bias=True, mlp_bias=True)),
    # ERNIE 4.5 and Helium rotate interleaved pairs of each head: their q/k rows are reordered on load
    "ernie4_5": ("Ernie4_5Config", dict(TINY, head_dim=16, use_bias=True, tie_word_embeddings=False)),
    "ernie4_5-tied": ("Ernie4_5Config", dict(TINY, head_dim=16, pad_token_id=0)),
    "helium": ("HeliumConfig", dict(TINY, head_dim=16, attention_bias=True, mlp_bias=True, pad_token_id=0)),
    # EXAONE 4: norms on the sublayer outputs, q/k norms per head, a window on three blocks of four
    # whose fourth attends without rotary positions; then without a window (every block global, with rope)
    "exaone4": ("Exaone4Config", dict(TINY, num_hidden_layers=4, sliding_window=5, sliding_window_pattern=4)),
    "exaone4-global": ("Exaone4Config", dict(TINY, sliding_window=None, layer_types=["full_attention"] * 2)),
    # Granite: the embedding, each sublayer's output, the scores and the logits scaled
    "granite": (
        "GraniteConfig",
        dict(
            TINY,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.3,
            logits_scaling=8.0,
            attention_bias=True,
        ),
    ),
}


def tiny_hf(name: str):
    cls, kw = FAMILIES[name]
    cfg = getattr(transformers, cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # norms and biases away from their init, so a mix-up shows
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln_" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return cfg, model


def meshwise_from(cfg, hf_model):
    import json

    spec = model_from_hf_config(json.loads(cfg.to_json_string()), "tiny-hf")
    assert runtime_refusal(spec, 16) is None
    model = build_model(spec, seed=0)
    state = from_hf(spec, hf_model.state_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    if spec.tied_embeddings:  # the head is the embedding: one tensor under two names
        missing = [k for k in missing if k != "output.weight"]
    assert not unexpected and not missing, (missing, unexpected)
    return spec, model.eval()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_equal_transformers(name):
    cfg, hf_model = tiny_hf(name)
    spec, model = meshwise_from(cfg, hf_model)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(ids).logits
        got = model(ids)
    assert sum(p.numel() for p in model.parameters()) == spec.params == hf_model.num_parameters()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_names_round_trip(name):
    cfg, hf_model = tiny_hf(name)
    spec, model = meshwise_from(cfg, hf_model)
    hf_state = {k: v for k, v in hf_model.state_dict().items()}
    back = to_hf(spec, dict(model.named_parameters()))
    if spec.tied_embeddings:
        hf_state.pop("lm_head.weight", None)
    assert set(back) == set(hf_state)
    for k in back:
        assert torch.equal(back[k], hf_state[k]), k


def test_tied_model_is_tied_after_build():
    cfg, hf_model = tiny_hf("llama3.2-tied")
    _, model = meshwise_from(cfg, hf_model)
    assert model.output.weight is model.tok_embeddings.weight


@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_loads_in_transformers(tmp_path, name):
    """The export is the family's own checkpoint: no missing or unexpected keys, the same logits,
    the same greedy continuation."""
    from meshwise.train.export import export_model
    from meshwise.train.generate import generate_ids

    cfg, hf_model = tiny_hf(name)
    spec, model = meshwise_from(cfg, hf_model)
    export_model(model, spec, tmp_path / "model.safetensors", {"format": "pt"})
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager", dtype=torch.float32
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(loaded) is type(hf_model)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids).logits, model(ids), atol=1e-5, rtol=0)
    prompt = [5, 17, 42]
    want = loaded.generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8, eos_token_id=None, pad_token_id=0
    )[0].tolist()
    assert generate_ids(model, prompt, 8, 0.0, 0, 0, spec.max_seq) == want


def test_sharded_export_round_trips(tmp_path):
    from meshwise.train.export import export_model, read_safetensors

    cfg, hf_model = tiny_hf("qwen3")
    spec, model = meshwise_from(cfg, hf_model)
    lines = export_model(model, spec, tmp_path / "model.safetensors", {"format": "pt"}, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and "shards" in lines[0] and not (tmp_path / "model.safetensors").exists()
    merged = {}
    for f in files:
        merged.update(read_safetensors(tmp_path / f)[0])
    assert set(merged) == set(index["weight_map"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, merged[k], atol=0, rtol=0)


@pytest.mark.parametrize(
    "cls, kw, words",
    [
        ("Gemma2Config", dict(TINY, head_dim=32), "attention logit soft-capping"),
        (
            "Glm4MoeConfig",
            dict(TINY, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
            "GLM-4.5's sigmoid-scored",
        ),
        ("Llama4TextConfig", dict(TINY, num_local_experts=4, intermediate_size_mlp=128), "chunked attention"),
        ("GptOssConfig", dict(TINY, num_local_experts=4), "attention sinks, clamped SwiGLU"),
        (
            "DeepseekV3Config",
            dict(
                TINY,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_nope_head_dim=16,
                qk_rope_head_dim=8,
                v_head_dim=16,
                first_k_dense_replace=1,
            ),
            "multi-head latent attention",
        ),
        ("LlamaConfig", dict(TINY, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope scaling 'dynamic'"),
    ],
)
def test_what_the_runtime_cannot_build_is_refused(cls, kw, words):
    spec = model_from_hf_config(json.loads(getattr(transformers, cls)(**kw).to_json_string()), "x")
    assert words in runtime_refusal(spec, 16)
