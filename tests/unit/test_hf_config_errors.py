"""A config.json refused in the file's own words: the keys it holds, not meshwise's fields;
a mixture-of-experts config without experts refused, not planned as a dense model; the router read
from the file (the keys Megatron's emit needs)."""

from __future__ import annotations

import json
import re

import pytest
from tests._moe_configs import CONFIGS

from meshwise.cli import main
from meshwise.spec import load_model

MIXTRAL = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def _refusal(tmp_path, capsys, cfg: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["plan", "--model", str(tmp_path), "--gpus", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "change,keys,not_fields",
    [
        ({"num_experts_per_tok": 9}, ["num_experts_per_tok"], ["experts_per_token"]),
        ({"hidden_size": 4095}, ["hidden_size", "num_attention_heads"], ["hidden", "heads"]),
        ({"vocab_size": -1}, ["vocab_size"], ["vocab"]),
    ],
)
def test_errors_name_the_files_keys(tmp_path, capsys, change, keys, not_fields):
    err = _refusal(tmp_path, capsys, {**MIXTRAL, **change})
    assert str(tmp_path) in err and all(k in err for k in keys), err
    assert not any(re.search(rf"\b{f}\b", err.split(": ", 2)[-1]) for f in not_fields), err


@pytest.mark.parametrize(
    "cfg,key",
    [
        ({**MIXTRAL, "num_local_experts": 0}, "num_local_experts"),
        ({**CONFIGS["qwen3-30b-a3b"], "num_experts": 0}, "num_experts"),
    ],
)
def test_a_moe_config_without_experts_is_refused(tmp_path, capsys, cfg, key):
    err = _refusal(tmp_path, capsys, cfg)
    assert f"{key} is 0" in err, err


def test_router_is_read_from_the_file(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**CONFIGS["deepseek-v3"], "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827})
    )  # Kimi K2's router
    m = load_model(str(tmp_path))
    assert (m.router_score, m.router_groups, m.router_group_topk, m.router_scale, m.expert_bias) == (
        "sigmoid",
        1,
        1,
        2.827,
        True,
    )
