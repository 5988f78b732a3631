"""The families of 2026 (Gemma 3, Llama 4, GPT-OSS, OLMo 2 and 3, SmolLM3, Ministral, Mistral 3, GLM-4.5,
Qwen3-VL, Seed-OSS, ERNIE 4.5, Helium, Granite, Hunyuan, GLM-4, MiniMax-M2, Kimi K2 by its architecture): meshwise's parameter counts against
the models transformers builds on the meta device from each published shape, the class defaults
meshwise fills in against the config classes themselves, and the plan of each shape on h100 and b200."""

import json
import subprocess
import sys

import pytest

from _cli import meshwise_here
from meshwise.errors import MeshwiseError
from meshwise.spec import hf_defaults, load_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

GEMMA3_4B_TEXT = dict(
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=34,
    sliding_window=1024,
    rope_scaling={"factor": 8.0, "rope_type": "linear"},
)
SCOUT_ROPE = {
    "rope_type": "llama3",
    "factor": 16.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}
# name: (config class, published shape (the model card's config.json), published total and active params)
CASES = {
    "gemma3-1b": (
        "Gemma3TextConfig",
        dict(
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            sliding_window=512,
            vocab_size=262144,
            max_position_embeddings=32768,
        ),
        None,
    ),
    "gemma3-4b": ("Gemma3Config", dict(text_config=GEMMA3_4B_TEXT), None),
    "gemma3-27b": (
        "Gemma3Config",
        dict(
            text_config=dict(
                hidden_size=5376,
                intermediate_size=21504,
                num_hidden_layers=62,
                num_attention_heads=32,
                num_key_value_heads=16,
                head_dim=128,
                query_pre_attn_scalar=168,
                sliding_window=1024,
                rope_scaling={"factor": 8.0, "rope_type": "linear"},
            )
        ),
        None,
    ),
    "llama4-scout": (
        "Llama4Config",
        dict(
            text_config=dict(
                num_local_experts=16,
                interleave_moe_layer_step=1,
                max_position_embeddings=10485760,
                rope_scaling=SCOUT_ROPE,
            )
        ),
        (109e9, 17e9),
    ),
    "llama4-maverick": (
        "Llama4Config",
        dict(text_config=dict(num_local_experts=128, interleave_moe_layer_step=2, max_position_embeddings=1048576)),
        (400e9, 17e9),
    ),
    "gpt-oss-120b": ("GptOssConfig", dict(num_hidden_layers=36, num_local_experts=128), (116.8e9, 5.1e9)),
    "gpt-oss-20b": ("GptOssConfig", dict(num_hidden_layers=24, num_local_experts=32), (20.9e9, 3.6e9)),
    "olmo2-7b": ("Olmo2Config", dict(vocab_size=100352, max_position_embeddings=4096, rope_theta=500000.0), None),
    "olmo2-32b": (
        "Olmo2Config",
        dict(
            hidden_size=5120,
            intermediate_size=27648,
            num_hidden_layers=64,
            num_attention_heads=40,
            num_key_value_heads=8,
            vocab_size=100352,
            max_position_embeddings=4096,
            rope_theta=500000.0,
        ),
        None,
    ),
    "olmo3-7b": (
        "Olmo3Config",
        dict(vocab_size=100278, max_position_embeddings=65536, rope_theta=500000.0, rms_norm_eps=1e-6),
        None,
    ),
    "smollm3-3b": ("SmolLM3Config", dict(max_position_embeddings=65536, rope_theta=5e6), (3.08e9, 3.08e9)),
    "ministral-8b": (
        "MinistralConfig",
        dict(vocab_size=131072, intermediate_size=12288, num_hidden_layers=36, head_dim=128),
        (8.02e9, 8.02e9),
    ),
    "mistral-small-3.1": ("Mistral3Config", {}, None),  # its class defaults are Mistral Small 3.1's 24B shape
    "glm-4.5-air": ("Glm4MoeConfig", dict(head_dim=128, attention_bias=True), None),
    "glm-4.5": (
        "Glm4MoeConfig",
        dict(
            hidden_size=5120,
            num_hidden_layers=92,
            head_dim=128,
            intermediate_size=12288,
            moe_intermediate_size=1536,
            n_routed_experts=160,
            first_k_dense_replace=3,
            attention_bias=True,
            use_qk_norm=True,
            rope_theta=1e6,
        ),
        None,
    ),
    "qwen3-vl": ("Qwen3VLConfig", {}, None),  # the class defaults; Qwen3-VL-MoE's untie its head
    "qwen3-vl-moe": ("Qwen3VLMoeConfig", {}, None),
    "seed-oss-36b": ("SeedOssConfig", dict(hidden_size=5120, rope_theta=1e7), None),  # ByteDance Seed's model card
    # the class defaults, ERNIE 4.5's and GLM-4's being the 0.3B's and the 9B-0414's shapes; then each
    # family's biases and norms switched on (Hunyuan and GLM-4 plan only: train refuses them below)
    "ernie-4.5-0.3b": ("Ernie4_5Config", {}, None),
    "ernie-4.5-biased": ("Ernie4_5Config", dict(use_bias=True, tie_word_embeddings=False), None),
    "helium": ("HeliumConfig", dict(attention_bias=True, mlp_bias=True), None),
    "granite": (
        "GraniteConfig",
        dict(
            num_key_value_heads=8,
            tie_word_embeddings=True,
            attention_bias=True,
            embedding_multiplier=12.0,
            attention_multiplier=0.0078125,
        ),
        None,
    ),
    "hunyuan-dense": ("HunYuanDenseV1Config", dict(head_dim=128, num_key_value_heads=8, attention_bias=True), None),
    "glm-4-9b": ("Glm4Config", {}, None),
    # the class defaults are MiniMax-M2's shape (its card: 230B, 10B active, rounded; its MTP modules,
    # which transformers leaves out, are not in the config)
    "minimax-m2": ("MiniMaxM2Config", {}, None),
    "exaone-4.0-32b": (
        "Exaone4Config",
        dict(
            hidden_size=5120,
            intermediate_size=27392,
            num_hidden_layers=64,
            num_attention_heads=40,
            num_key_value_heads=8,
            vocab_size=102400,
            max_position_embeddings=131072,
            rope_theta=1e6,
            sliding_window_pattern="LLLG",
            layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 16,
        ),
        None,
    ),
}
# multimodal wrappers: the whole model transformers builds, less its vision encoder and projector
MULTIMODAL = {
    "Gemma3Config": "Gemma3ForConditionalGeneration",
    "Llama4Config": "Llama4ForConditionalGeneration",
    "Mistral3Config": "Mistral3ForConditionalGeneration",
    "Qwen3VLConfig": "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeConfig": "Qwen3VLMoeForConditionalGeneration",
}
# published totals without the multi-token-prediction layer transformers leaves out (Z.ai's model cards)
GLM_TOTAL = {"glm-4.5-air": 106e9, "glm-4.5": 355e9}


def hf_folder(tmp_path, name):
    cls, kw, _ = CASES[name]
    cfg = getattr(transformers, cls)(**kw)
    folder = tmp_path / name
    cfg.save_pretrained(folder)
    return cfg, folder


def text_count(cfg) -> int:
    """transformers' language model of ``cfg`` on the meta device: the whole model of a text config,
    the language model and head of a multimodal one (what meshwise plans; a head tied to the
    embedding is one tensor, counted once)."""
    with torch.device("meta"):
        if type(cfg).__name__ in MULTIMODAL:
            model = getattr(transformers, MULTIMODAL[type(cfg).__name__])(cfg)
            return sum(
                p.numel()
                for name, p in model.named_parameters()
                if "language_model" in name or name.startswith("lm_head")
            )
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(CASES))
def test_count_equals_transformers(tmp_path, name):
    cfg, folder = hf_folder(tmp_path, name)
    spec = load_model(str(folder))
    assert spec.params == text_count(cfg)
    published = CASES[name][2]
    multimodal = type(cfg).__name__ in MULTIMODAL
    if published:  # a multimodal model card's total counts its vision encoder too (Llama 4: about 1%)
        assert spec.params == pytest.approx(published[0], rel=0.02 if multimodal else 0.005)
        # OpenAI's model card counts GPT-OSS's active parameters without the unembedding
        active = spec.active_params - (spec.head_params if spec.family == "gpt_oss" else 0)
        assert active == pytest.approx(published[1], rel=0.03)
    assert ("vision encoder" in spec.exclusion_note) == multimodal
    if name in GLM_TOTAL:
        assert spec.params == pytest.approx(GLM_TOTAL[name], rel=0.01)
        assert "1 multi-token-prediction layer" in spec.exclusion_note


def test_kimi_k2_is_read_by_its_architecture(tmp_path):
    """Kimi K2's config.json names model_type kimi_k2 and the DeepseekV3ForCausalLM class its weights
    load into: read as DeepSeek-V3 (1.04T total, 32B active on Moonshot's model card)."""
    cfg = transformers.DeepseekV3Config(
        hidden_size=7168,
        num_hidden_layers=61,
        n_routed_experts=384,
        num_experts_per_tok=8,
        first_k_dense_replace=1,
        moe_intermediate_size=2048,
        intermediate_size=18432,
        vocab_size=163840,
        num_attention_heads=64,
        num_key_value_heads=64,
        n_shared_experts=1,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    )
    cfg.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(data))
    spec = load_model(str(tmp_path))
    assert spec.family == "deepseek_v3" and spec.params == text_count(cfg)
    assert spec.params == pytest.approx(1.04e12, rel=0.02) and spec.active_params == pytest.approx(32e9, rel=0.05)
    data["architectures"] = ["KimiK2ForCausalLM"]  # neither known: refused, naming the model_type
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(MeshwiseError, match="'kimi_k2' is not supported"):
        load_model(str(tmp_path))


def test_published_gemma3_file_as_written(tmp_path):
    """Gemma 3 4B's config.json as published (transformers 4.50: the text_config holds the widths
    only, rope_scaling in the old layout) reads as the class-built one does."""
    raw = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "text_config": {**GEMMA3_4B_TEXT, "model_type": "gemma3_text"},
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"},
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    spec = load_model(str(tmp_path))
    cfg, folder = hf_folder(tmp_path, "gemma3-4b")
    assert spec.params == text_count(cfg) == load_model(str(folder)).params
    assert (spec.rope_scaling, spec.rope_factor, spec.rope_theta, spec.rope_local_theta) == ("linear", 8.0, 1e6, 1e4)
    assert spec.full_attention_layers == tuple(range(5, 34, 6)) and spec.sliding_window == 1024
    del raw["model_type"]  # read by its architectures alone: the same text model
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_model(str(tmp_path)).params == spec.params


@pytest.mark.parametrize(
    "family, cls",
    [
        ("gemma3_text", "Gemma3TextConfig"),
        ("llama4_text", "Llama4TextConfig"),
        ("gpt_oss", "GptOssConfig"),
        ("olmo2", "Olmo2Config"),
        ("olmo3", "Olmo3Config"),
        ("smollm3", "SmolLM3Config"),
        ("ministral", "MinistralConfig"),
        ("glm4_moe", "Glm4MoeConfig"),
        ("seed_oss", "SeedOssConfig"),
        ("ernie4_5", "Ernie4_5Config"),
        ("helium", "HeliumConfig"),
        ("granite", "GraniteConfig"),
        ("hunyuan_v1_dense", "HunYuanDenseV1Config"),
        ("glm4", "Glm4Config"),
        ("minimax_m2", "MiniMaxM2Config"),
        ("exaone4", "Exaone4Config"),
    ],
)
def test_class_defaults_are_the_config_classes(family, cls):
    want = getattr(transformers, cls)().to_dict()
    for key, value in hf_defaults.CLASS_DEFAULTS[family].items():
        assert want[key] == value, key


def test_fields_are_read(tmp_path):
    s = load_model(str(hf_folder(tmp_path, "llama4-maverick")[1]))
    assert s.dense_layers == tuple(range(0, 48, 2)) and s.ffn_hidden == 16384 and s.shared_ffn_hidden == 8192
    assert s.attention_chunk == 8192 and s.full_attention_layers == tuple(range(3, 48, 4))
    s = load_model(str(hf_folder(tmp_path, "gpt-oss-20b")[1]))
    assert (
        s.attn_sinks and s.router_bias and s.swiglu_limit == 7.0 and s.full_attention_layers == tuple(range(1, 24, 2))
    )
    assert s.rope_scaling == "yarn" and s.sliding_window == 128
    s = load_model(str(hf_folder(tmp_path, "olmo2-7b")[1]))
    assert s.post_norm and s.qk_norm_scope == "projection" and s.rope_theta == 500000.0
    s = load_model(str(hf_folder(tmp_path, "olmo3-7b")[1]))
    assert s.post_norm and s.sliding_window == 4096 and s.full_attention_layers == tuple(range(3, 32, 4))
    assert s.rope_theta == s.rope_local_theta == 500000.0
    s = load_model(str(hf_folder(tmp_path, "smollm3-3b")[1]))
    assert s.nope_layers == tuple(range(3, 36, 4)) and s.sliding_window == 0 and s.tied_embeddings
    s = load_model(str(hf_folder(tmp_path, "glm-4.5")[1]))
    assert s.dense_layers == (0, 1, 2) and s.experts == 160 and s.shared_ffn_hidden == 1536
    assert s.qkv_bias and not s.o_bias and s.qk_norm and s.rope_scaling == "partial_rotary_factor=0.5"


def test_deepseek_v3_mtp_is_named_as_left_out(tmp_path):
    cfg = transformers.DeepseekV3Config()
    cfg.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["num_nextn_predict_layers"] = 1  # as DeepSeek-V3's published config.json has it
    (tmp_path / "config.json").write_text(json.dumps(data))
    spec = load_model(str(tmp_path))
    assert spec.params == text_count(cfg)  # transformers builds no MTP layer: neither does the count
    assert "1 multi-token-prediction layer" in spec.exclusion_note
    # the report's 685B on the Hub = 671B main model + 14B MTP module (embedding and head copies included)
    assert 11e9 < spec.excluded_params < 14e9
    catalog = load_model("deepseek-v3")  # the catalog's shape says the same
    assert (catalog.params, catalog.exclusion_note) == (spec.params, spec.exclusion_note)
    r = subprocess.run(
        [sys.executable, "-m", "meshwise.cli", "plan", "--model", str(tmp_path), "--gpus", "2048", "--top", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert sum("multi-token-prediction" in line for line in r.stdout.splitlines()) == 1


@pytest.mark.parametrize(
    "name", ["gemma3-27b", "llama4-maverick", "gpt-oss-120b", "olmo2-32b", "glm-4.5", "seed-oss-36b", "minimax-m2"]
)
@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_plan_exits_0(tmp_path, name, gpu):
    _, folder = hf_folder(tmp_path, name)
    gpus = "512" if "maverick" in name or "glm" in name or "minimax" in name else "64"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "meshwise.cli",
            "plan",
            "--model",
            str(folder),
            "--gpus",
            gpus,
            "--gpu",
            gpu,
            "--seq-len",
            "4096",
            "--top",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["model"]["params"] == load_model(str(folder)).params
    assert out["candidates"]


@pytest.mark.parametrize("cls, model_type", [("BertConfig", "bert")])
def test_unknown_family_points_to_the_toml_route(tmp_path, cls, model_type):
    getattr(transformers, cls)().save_pretrained(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "meshwise.cli", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "model TOML" in r.stderr


@pytest.mark.parametrize(
    "name, piece",
    [
        ("gpt-oss-20b", "attention sinks"),
        ("llama4-scout", "chunked attention"),
        ("glm-4.5-air", "bias-corrected expert routing"),
        ("glm-4-9b", "partial rotary"),
        ("hunyuan-dense", "after the rotary"),
        ("minimax-m2", "bias-corrected expert routing"),
    ],
)
def test_train_refuses_what_the_runtime_does_not_build_in_one_line(tmp_path, name, piece):
    """The refusal comes before any work, so ``meshwise_here`` (tests/_cli.py: cli.main in this
    process) sees what a user's shell would: exit status 2, one line on stderr, nothing on stdout."""
    _, folder = hf_folder(tmp_path, name)
    r = meshwise_here(
        "train", "--model", str(folder), "--steps", "1", "--nproc-per-node", "1", "--checkpoint-dir", "", cwd=tmp_path
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and piece in r.stderr, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr


def test_exaone4_pattern_string_reads_as_its_layer_types(tmp_path):
    """EXAONE 4's ``sliding_window_pattern`` "LLLG" without ``layer_types`` (transformers' class needs
    the list; meshwise reads the string too): the same blocks windowed and rope-less as the list gives."""
    _, folder = hf_folder(tmp_path, "exaone-4.0-32b")
    spec = load_model(str(folder))
    raw = json.loads((folder / "config.json").read_text())
    del raw["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    again = load_model(str(tmp_path))
    assert again.full_attention_layers == spec.full_attention_layers == tuple(range(3, 64, 4))
    assert again.nope_layers == spec.nope_layers == tuple(range(3, 64, 4)) and again.params == spec.params
