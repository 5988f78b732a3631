"""Specs and catalog: every entry loads, parameter counts match the published ones, loaders agree."""

import json

import pytest

from meshwise.catalog import accelerator_names, model_names
from meshwise.errors import MeshwiseError
from meshwise.spec import ModelSpec, TrainSpec, load_cluster, load_model


@pytest.mark.parametrize("name", model_names())
def test_every_catalog_model_loads_with_a_source(name):
    m = load_model(name)
    assert m.params > 0 and m.source


@pytest.mark.parametrize(
    "name, published",
    [
        ("llama2-7b", 6.74e9),
        ("llama2-13b", 13.0e9),
        ("llama2-70b", 69.0e9),
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.6e9),
        ("llama3-405b", 405.9e9),
        ("mistral-7b", 7.24e9),
    ],
)
def test_parameter_counts_match_published(name, published):
    # Hugging Face model cards: Llama 2 6.74B/13.0B/69.0B, Llama 3 8.03B/70.6B/405.9B, Mistral 7.24B.
    assert load_model(name).params == pytest.approx(published, rel=0.005)


def test_gpt_rows_match_narayanan_eq2():
    # Narayanan et al. 2021 Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)); meshwise has no biases
    # and no learned positions, a difference below 0.5% for these shapes (1.7B: 4.7M learned positions = 0.3%).
    for name, (l, h) in {"gpt-1.7b": (24, 2304), "gpt-145.6b": (80, 12288), "gpt-1t": (128, 25600)}.items():
        eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * l * h))
        assert load_model(name).params == pytest.approx(eq2, rel=0.005)


@pytest.mark.parametrize("name", accelerator_names())
def test_every_accelerator_loads(name):
    c = load_cluster(name, 16)
    assert c.accelerator.memory_bytes > 0 and c.accelerator.source and c.world_size == 16


def test_hf_config_llama_and_gpt2(tmp_path):
    llama = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(llama))
    m = load_model(str(tmp_path / "config.json"))
    assert m.params == load_model("llama3-8b").params and m.mlp == "swiglu" and m.family == "llama"
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    (tmp_path / "gpt2.json").write_text(json.dumps(gpt2))
    g = load_model(str(tmp_path / "gpt2.json"))
    assert g.mlp == "gelu" and g.ffn_hidden == 3072 and g.tied_embeddings
    # GPT-2 small: 124,439,808 parameters (transformers' GPT2LMHeadModel.num_parameters(), learned
    # positions and every bias included, the tied head once).
    assert g.params == 124_439_808


def test_toml_model(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[model]\nname = "mine"\nlayers = 2\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab = 100\n')
    m = load_model(str(p))
    assert m.name == "mine" and m.kv_heads == 4
    p.write_text("layers = 2\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab = 100\nbogus = 1\n")
    with pytest.raises(MeshwiseError, match="bogus"):
        load_model(str(p))


def test_bad_specs_name_the_field():
    with pytest.raises(MeshwiseError, match="unknown model"):
        load_model("gpt-9000")
    with pytest.raises(MeshwiseError, match="unknown accelerator"):
        load_cluster("tpu-v9", 8)
    with pytest.raises(MeshwiseError, match="--precision"):
        TrainSpec(8, 128, precision="fp4")
    with pytest.raises(MeshwiseError, match="--gpus"):
        load_cluster("h100", 12, 8)
    with pytest.raises(MeshwiseError, match="heads"):
        ModelSpec(name="x", layers=1, hidden=64, heads=3, kv_heads=3, ffn_hidden=64, vocab=10, max_seq=8)


def test_precision_conventions():
    # docs/design.md: bf16 = 2+2+8 = 12, bf16-mixed = 2+2+12 = 16, fp32 = 4+4+8 = 16 bytes per parameter.
    assert [TrainSpec(1, 1, p).state_bytes_per_param for p in ("bf16", "bf16-mixed", "fp32")] == [12, 16, 16]


@pytest.mark.parametrize(
    "given, name",
    [
        ("H100", "h100"),
        ("h100-sxm", "h100"),
        ("h100-80gb", "h100"),
        ("H100 SXM", "h100"),
        ("A100-80GB", "a100-80gb"),
        ("B200", "b200"),
        ("h200_sxm", "h200"),
        ("MI300X", "mi300x"),
        ("GB200 NVL72", "gb200"),
        ("gb300-nvl72", "gb300"),
        ("H800-SXM", "h800"),
    ],
)
def test_gpu_names_resolve_with_any_case_and_aliases(given, name):
    assert load_cluster(given, 8).accelerator.name == name


def test_every_alias_names_one_entry():
    """accelerators.toml's aliases: no alias is another entry's name or alias (each resolves to its own)."""
    from meshwise.catalog import read_catalog
    from meshwise.spec.cluster import catalog_accelerator

    for entry, table in read_catalog("accelerators.toml").items():
        for alias in table.get("aliases", ()):
            assert catalog_accelerator(alias) == entry, alias


@pytest.mark.parametrize("given, guess", [("a100", "a100-40gb or a100-80gb"), ("mi300", "mi300x"), ("h10", "h100")])
def test_unknown_gpu_says_did_you_mean(given, guess):
    with pytest.raises(MeshwiseError) as e:
        load_cluster(given, 8)
    assert f"did you mean {guess}" in str(e.value) and "\n" not in str(e.value)
