"""Hugging Face model configs: meshwise's parameter counts against transformers' own, on the meta device.

Each config is written by transformers' own config class (``save_pretrained``), with the published
shapes of a real checkpoint; the oracle is ``num_parameters()`` of the model transformers builds from
it on the meta device (no weights, no download). Unsupported families are refused in one line.
"""

import json
import os
import subprocess
import sys

import pytest

from meshwise.cli import main
from meshwise.errors import MeshwiseError
from meshwise.spec import load_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LLAMA31_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# name: (config class, published shape of the checkpoint's config.json, published active params or None)
CASES = {
    "llama2-7b": (
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            vocab_size=32000,
            max_position_embeddings=4096,
        ),
    ),
    "llama3.1-8b": (
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rope_scaling=LLAMA31_SCALING,
        ),
    ),
    "llama3.1-405b": (
        "LlamaConfig",
        dict(
            hidden_size=16384,
            intermediate_size=53248,
            num_hidden_layers=126,
            num_attention_heads=128,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rope_scaling=LLAMA31_SCALING,
        ),
    ),
    "llama3.2-1b": (
        "LlamaConfig",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
    ),
    "mistral-7b-v0.3": (
        "MistralConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32768,
            sliding_window=None,
            rope_theta=1e6,
        ),
    ),
    "qwen2.5-0.5b": (
        "Qwen2Config",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
    ),
    "qwen2.5-7b": (
        "Qwen2Config",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
        ),
    ),
    "qwen3-0.6b": (
        "Qwen3Config",
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
    ),
    "gemma-7b": (
        "GemmaConfig",
        dict(
            hidden_size=3072,
            intermediate_size=24576,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=256,
            vocab_size=256000,
        ),
    ),
    "gemma2-9b": (
        "Gemma2Config",
        dict(
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            vocab_size=256000,
        ),
    ),
    "phi3-mini": (
        "Phi3Config",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32064,
        ),
    ),
    "gpt2": ("GPT2Config", dict()),
    "mixtral-8x7b": (
        "MixtralConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
        ),
    ),
    "mixtral-8x22b": (
        "MixtralConfig",
        dict(
            hidden_size=6144,
            intermediate_size=16384,
            num_hidden_layers=56,
            num_attention_heads=48,
            num_key_value_heads=8,
            vocab_size=32768,
            max_position_embeddings=65536,
            rope_theta=1e6,
        ),
    ),
    "qwen1.5-moe-a2.7b": (
        "Qwen2MoeConfig",
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_experts=60,
            num_experts_per_tok=4,
            num_hidden_layers=24,
            num_attention_heads=16,
            vocab_size=151936,
        ),
    ),
    "qwen3-30b-a3b": (
        "Qwen3MoeConfig",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_local_experts=128,
            num_experts_per_tok=8,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=151936,
        ),
    ),
    "deepseek-v2-lite": (
        "DeepseekV2Config",
        dict(
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            n_routed_experts=64,
            n_shared_experts=2,
            num_experts_per_tok=6,
            first_k_dense_replace=1,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=None,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            vocab_size=102400,
        ),
    ),
    "deepseek-v3": ("DeepseekV3Config", dict()),  # the class defaults are DeepSeek-V3's 671B shape
}

# Published totals / active parameters (model cards and papers), to 3 significant figures.
PUBLISHED = {
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "mixtral-8x22b": (141e9, 39e9),
    "deepseek-v2-lite": (15.7e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "deepseek-v3": (671e9, 37e9),
    "llama3.1-8b": (8.03e9, None),
    "gemma-7b": (8.54e9, None),
    "gpt2": (124e6, None),
}


def hf_folder(tmp_path, name):
    cls, kw = CASES[name]
    cfg = getattr(transformers, cls)(**kw)
    folder = tmp_path / name
    cfg.save_pretrained(folder)
    return cfg, folder


def hf_count(cfg) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.num_parameters()


@pytest.mark.parametrize("name", list(CASES))
def test_count_equals_transformers(tmp_path, name):
    cfg, folder = hf_folder(tmp_path, name)
    spec = load_model(str(folder))
    assert spec.family == cfg.model_type
    assert spec.params == hf_count(cfg)
    if name in PUBLISHED:
        total, active = PUBLISHED[name]
        assert spec.params == pytest.approx(total, rel=0.006)
        if active:
            assert spec.active_params == pytest.approx(active, rel=0.02)
    if not spec.moe:
        assert spec.active_params == spec.params


def test_fields_are_read(tmp_path):
    _, folder = hf_folder(tmp_path, "llama3.1-8b")
    s = load_model(str(folder))
    assert (s.rope_theta, s.rope_scaling, s.rope_factor, s.rope_original_max_seq) == (500000.0, "llama3", 8.0, 8192)
    _, folder = hf_folder(tmp_path, "qwen3-0.6b")
    s = load_model(str(folder))
    assert s.head_dim == 128 and s.hidden // s.heads == 64 and s.qk_norm and s.tied_embeddings
    _, folder = hf_folder(tmp_path, "qwen2.5-0.5b")
    s = load_model(str(folder))
    assert s.qkv_bias and not s.o_bias
    _, folder = hf_folder(tmp_path, "gemma2-9b")
    s = load_model(str(folder))
    assert s.mlp == "geglu" and s.norms_per_layer == 4 and s.final_softcap == 30.0 and s.sliding_window == 4096


def test_plan_json_has_the_model(tmp_path, capsys):
    _, folder = hf_folder(tmp_path, "mixtral-8x7b")
    assert main(["plan", "--model", str(folder), "--gpus", "64", "--top", "1", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["family"] == "mixtral" and model["params"] == 46_702_792_704
    assert model["active_params"] == 12_879_925_248 and model["experts"] == 8 and model["experts_per_token"] == 2


def one_line_exit_2(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "meshwise.cli", "plan", *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""
    return r.stderr


@pytest.mark.parametrize("cls, model_type", [("BertConfig", "bert"), ("GPTNeoXConfig", "gpt_neox")])
def test_unsupported_family_is_refused_by_name(tmp_path, cls, model_type):
    getattr(transformers, cls)().save_pretrained(tmp_path)
    assert f"model_type {model_type!r} is not supported" in one_line_exit_2("--model", str(tmp_path))


def test_bad_model_files(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      \xff\xfe")
    assert "weights file" in one_line_exit_2("--model", str(weights))
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    assert "tokenizer" in one_line_exit_2("--model", str(tok))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in one_line_exit_2("--model", str(empty))
    assert "Hub ids are not downloaded" in one_line_exit_2("--model", "meta-llama/Llama-3.1-8B")
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"model_type": "llama", "name": "caf\u00e9"}'.encode("latin-1"))
    assert "not a UTF-8" in one_line_exit_2("--model", str(latin))
    for value, kind in (([1, 2], "list"), ("llama", "str"), (None, "NoneType")):
        bad = tmp_path / f"{kind}.json"
        bad.write_text(json.dumps(value))
        assert "not an object" in one_line_exit_2("--model", str(bad))
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "vocab_size": 10}))
    assert "lacks 'n_embd'" in one_line_exit_2("--model", str(gpt2))
    toml = tmp_path / "m.toml"
    toml.write_text('layers = 2\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab = 100\ntied_embeddings = "maybe"\n')
    assert "tied_embeddings must be true or false" in one_line_exit_2("--model", str(toml))
    toml.write_bytes(b"layers = 2\n# \xff\xfe\n")
    assert "not a UTF-8" in one_line_exit_2("--model", str(toml))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_model_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    cfg.chmod(0)
    assert "cannot read" in one_line_exit_2("--model", str(cfg))


def test_unreadable_model_file_is_one_line(tmp_path, monkeypatch):
    # As root the permission bits do not stop a read: the same path, through a PermissionError.
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")

    read_text = type(cfg).read_text

    def denied(self, *args, **kwargs):
        if self == cfg:
            raise PermissionError(13, "Permission denied")
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(type(cfg), "read_text", denied)
    with pytest.raises(MeshwiseError, match="cannot read .*Permission denied"):
        load_model(str(cfg))


def test_checkpoint_of_another_architecture_is_refused():
    from meshwise.train import checkpoint

    tiny = load_model("tiny")
    old = {
        k: v
        for k, v in checkpoint.model_meta(tiny).items()
        if k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "mlp", "vocab", "tied_embeddings")
    }
    checkpoint.check_shape({"model": old}, tiny, "ck/step-1")  # saved before the family fields: same model
    with pytest.raises(MeshwiseError, match="family='llama'.*has family='qwen3'"):
        checkpoint.check_shape({"model": checkpoint.model_meta(tiny)}, load_model("tiny-qwen3"), "ck/step-1")


@pytest.mark.parametrize("name", ["gemma-7b", "gemma2-9b"])
@pytest.mark.parametrize("gpu", ["h100", "h200", "a100-80gb", "h100-hbm2e", "b200"])
def test_gemma_plans(tmp_path, capsys, name, gpu):
    """Gemma's gated GeLU MLP (geglu) is timed on every accelerator (it was a KeyError on h100, a100)."""
    cfg, folder = hf_folder(tmp_path, name)
    assert main(["plan", "--model", str(folder), "--gpu", gpu, "--gpus", "16", "--top", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["params"] == hf_count(cfg) and out["candidates"]
