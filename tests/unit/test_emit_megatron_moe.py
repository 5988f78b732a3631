"""``plan --emit megatron`` of mixtures of experts, end to end: six MoE families (and MoE
shapes it did not list) planned by ``meshwise plan`` on 64, 256 and 1,024 H100 and emitted. Each
command is either refused in one line naming what Megatron cannot express, or parsed by Megatron-LM's
argument table, built into megatron-core 0.16.1's TransformerConfig (MLA's when it is MLA), passed
through its ``initialize_model_parallel`` at the world size (torch's fake process group), and carries
the router and attention settings of the model's published config.json (the oracle: the config's own
keys, tests/_moe_configs.py). Slow: ~30 plans (about 2 s each on an idle core)."""

from __future__ import annotations

import json

import pytest
from tests._moe_configs import CONFIGS, UNSEEN, text_config, write
from tests._torchtitan import command_args
from tests.unit.test_emit_megatron import megatron_parser, parallel_state, transformer_config

from meshwise.cli import main

pytest.importorskip("megatron.core", reason="megatron-core is the oracle of --emit megatron")

SIGMOID_FAMILIES = {"deepseek_v3", "glm4_moe", "llama4_text"}  # transformers hard-codes their sigmoid router
RENORMALISED = {"mixtral", "gpt_oss"}  # transformers renormalises their top-k weights whatever norm_topk_prob says


@pytest.fixture(scope="module")
def parser():
    return megatron_parser()


def _plan(tmp_path, capsys, name: str, gpus: int, extra=()) -> tuple[int, dict | None, str]:
    """(exit status, the plan's JSON, stderr) of ``plan --emit megatron --json``."""
    rc = main(
        [
            "plan",
            "--model",
            write(tmp_path, name),
            "--gpu",
            "h100",
            "--gpus",
            str(gpus),
            "--seq-len",
            "4096",
            "--global-batch",
            "1024",
            "--emit",
            "megatron",
            "--json",
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def _model_type(cfg: dict) -> str:
    return text_config(cfg).get("model_type", cfg["model_type"])


def _router_oracle(cfg: dict) -> dict:
    """What the config's router is, as Megatron-Core's TransformerConfig fields."""
    c, family = text_config(cfg), _model_type(cfg)
    sigmoid = family in SIGMOID_FAMILIES or c.get("scoring_func") == "sigmoid"
    norm = family in RENORMALISED or c.get("norm_topk_prob", family in SIGMOID_FAMILIES - {"llama4_text"})
    scale = c.get("routed_scaling_factor", 2.5 if family == "deepseek_v3" else 1.0)
    groups = c.get("n_group", 8 if family == "deepseek_v3" else 0)
    aux = c.get("router_aux_loss_coef", c.get("aux_loss_alpha", _class_default(family, "router_aux_loss_coef")))
    return {
        "moe_router_score_function": "sigmoid" if sigmoid else "softmax",
        "moe_router_pre_softmax": not sigmoid and not norm,
        "moe_router_topk_scaling_factor": scale if scale != 1.0 else None,
        "moe_router_num_groups": groups if groups > 1 else None,
        "moe_router_group_topk": c.get("topk_group", 4) if groups > 1 else None,
        "moe_router_enable_expert_bias": c.get("topk_method") == "noaux_tc" or family == "glm4_moe",
        "moe_apply_probs_on_input": family == "llama4_text",
        "moe_aux_loss_coeff": aux if aux is not None else 0.0001,
    }


def _class_default(family: str, key: str):
    """A key's default in the family's transformers config class (None where the class has no such key)."""
    transformers = pytest.importorskip("transformers")
    return getattr(transformers.AutoConfig.for_model(family), key, None)


def _moe_pattern(cfg: dict, layers: int) -> list[int]:
    c, family = text_config(cfg), _model_type(cfg)
    if family in ("deepseek_v3", "glm4_moe"):
        return [0 if i < c["first_k_dense_replace"] else 1 for i in range(layers)]
    if family.startswith("llama4"):
        step = c.get("interleave_moe_layer_step", 1)
        return [1 if (i + 1) % step == 0 else 0 for i in range(layers)]
    return [1] * layers


def _check_attention(cfg: dict, tc, text: str, seq: int, max_positions: int) -> None:
    c, family = text_config(cfg), _model_type(cfg)
    layers = c.get("num_hidden_layers", 36)
    if family == "gpt_oss":
        assert tc.softmax_type == "learnable"  # its attention sinks
        assert tc.window_size == (c.get("sliding_window", 128) - 1, 0)
        kinds = c["layer_types"]
        assert tc.window_attn_skip_freq == [1 if k == "sliding_attention" else 0 for k in kinds]
        assert tc.activation_func_clamp_value == c.get("swiglu_limit", 7.0) and tc.glu_linear_offset == 1.0
        assert "# YaRN" in text  # no Megatron-LM flag outside MLA: said, not silent
    if family.startswith("llama4"):
        assert tc.no_rope_freq == [1 - r for r in c["no_rope_layers"]]
        assert tc.qk_l2_norm == c["use_qk_norm"]
        assert "chunked attention" in text and c["attention_chunk_size"] >= seq
    if family == "qwen3_moe":
        assert tc.qk_layernorm
    if family == "deepseek_v3":  # MLA's q and kv norms, YaRN
        assert tc.qk_layernorm and tc.rope_type == "yarn"
        rope = c["rope_scaling"]
        assert (tc.rotary_scaling_factor, tc.mscale, tc.mscale_all_dim, tc.original_max_position_embeddings) == (
            rope["factor"],
            rope["mscale"],
            rope["mscale_all_dim"],
            rope["original_max_position_embeddings"],
        )
    rope = c.get("rope_scaling") or {}
    assert max_positions == max(
        seq, rope.get("original_max_position_embeddings") or c.get("max_position_embeddings", 131072)
    )
    del layers


def _check_command(parser, cfg: dict, plan: dict, gpus: int) -> None:
    text = plan["emit"]["text"]
    lay = plan["candidates"][0]["layout"]
    ns = parser.parse_args(command_args(text, "pretrain_gpt.py"))
    tc = transformer_config(ns, gpus)
    groups = parallel_state(ns, gpus)
    c = text_config(cfg)
    assert (ns.expert_tensor_parallel_size, groups["expert_tp"]) == (1, 1)
    assert (
        tc.tensor_model_parallel_size,
        tc.pipeline_model_parallel_size,
        tc.expert_model_parallel_size,
        groups["dp"],
    ) == (lay["tp"], lay["pp"], lay["ep"], lay["dp"])
    experts = next(c[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if k in c)
    assert (tc.num_moe_experts, tc.moe_router_topk) == (experts, c.get("num_experts_per_tok", 4))
    assert tc.moe_grouped_gemm and tc.moe_token_dispatcher_type == "alltoall" and tc.moe_router_dtype == "fp32"
    got = {k: getattr(tc, k) for k in _router_oracle(cfg)}
    assert got == _router_oracle(cfg)
    layers = tc.num_layers
    pattern = tc.moe_layer_freq if isinstance(tc.moe_layer_freq, list) else [1] * layers
    assert pattern == _moe_pattern(cfg, layers)
    _check_attention(cfg, tc, text, ns.seq_length, ns.max_position_embeddings)
    assert plan["runtime"] == "megatron"


@pytest.mark.parametrize("gpus", [64, 256, 1024])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_moe_commands_build_in_megatron_core(tmp_path, capsys, parser, name, gpus):
    rc, plan, err = _plan(tmp_path, capsys, name, gpus)
    if rc == 0:
        _check_command(parser, CONFIGS[name], plan, gpus)
    else:  # refused: one line, naming what Megatron cannot express (or that nothing fits at all)
        lines = err.strip().splitlines()
        assert rc in (2, 3) and len(lines) == 1 and "--emit megatron:" in lines[0], err
        assert "no layout fits" in lines[0] or "Megatron" in lines[0], err


@pytest.mark.parametrize("name", list(UNSEEN))
def test_moe_shapes_not_listed_build_too(tmp_path, capsys, parser, name):
    rc, plan, err = _plan(tmp_path, capsys, name, 256)
    if rc == 0:
        _check_command(parser, UNSEEN[name], plan, 256)
    else:
        assert len(err.strip().splitlines()) == 1 and "--emit megatron:" in err, err


def test_chunked_attention_past_its_chunk_is_refused(tmp_path, capsys):
    rc = main(
        [
            "plan",
            "--model",
            write(tmp_path, "llama4-scout"),
            "--gpu",
            "h100",
            "--gpus",
            "256",
            "--seq-len",
            "16384",
            "--global-batch",
            "256",
            "--emit",
            "megatron",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "chunked attention" in err


def test_emit_megatron_refuses_another_runtime(tmp_path, capsys):
    rc = main(["plan", "--model", "deepseek-v3", "--gpus", "64", "--runtime", "meshwise", "--emit", "megatron"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--runtime meshwise" in err
