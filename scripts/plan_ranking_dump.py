"""Dump ``meshwise plan --json --top 30`` and the printed plan (``--top 3``) for a fixed set of
cases, two files per case, to compare the search's ranking and every printed figure before and
after a change (``diff -r`` two output folders).

    python scripts/plan_ranking_dump.py OUT_DIR [CASE ...]   # every case, or those named
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Hugging Face config.json shapes (published checkpoints), written to OUT_DIR/configs
CONFIGS = {
    "mixtral-8x22b": {
        "model_type": "mixtral",
        "hidden_size": 6144,
        "intermediate_size": 16384,
        "num_hidden_layers": 56,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
        "max_position_embeddings": 65536,
        "rope_theta": 1e6,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
    },
    "qwen1.5-moe-a2.7b": {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "vocab_size": 151936,
    },
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": 1,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
}

CASES = {  # name: plan arguments ({cfg} is the configs folder)
    "bench-moe": "--model {cfg}/mixtral-8x22b --gpu h100 --gpus 256",
    "bench-long": "--model llama3.1-70b --gpu h100 --gpus 512 --seq-len 131072",
    "bench-405b": "--model llama3-405b --gpu h100 --gpus 16384 --gpus-per-node 8 --seq-len 8192 --global-batch 2048",
    "llama8b-8": "--model llama3-8b --gpu h100 --gpus 8",
    "llama8b-64": "--model llama3-8b --gpu h100 --gpus 64",
    "llama70b-64": "--model llama3-70b --gpu h100 --gpus 64",
    "llama70b-512": "--model llama3-70b --gpu h100 --gpus 512",
    "llama70b-64-megatron": "--model llama3-70b --gpu h100 --gpus 64 --runtime megatron",
    "llama70b-64-bf16": "--model llama3-70b --gpu a100-80gb --gpus 64 --precision bf16",
    "llama8b-64-32k": "--model llama3.1-8b --gpu h100 --gpus 64 --seq-len 32768 --global-batch 64",
    "llama70b-128-32k": "--model llama3.1-70b --gpu h100 --gpus 128 --seq-len 32768 --global-batch 128",
    "tiny-cpu-2": "--model tiny --gpu cpu --gpus 2 --global-batch 8",
    "tiny-cpu-4": "--model tiny --gpu cpu --gpus 4 --global-batch 8",
    "tiny-cpu-8": "--model tiny --gpu cpu --gpus 8 --global-batch 8",
    "tiny-moe-cpu-4": "--model tiny-moe --gpu cpu --gpus 4 --global-batch 8",
    "tiny-qwen3-cpu-4": "--model tiny-qwen3 --gpu cpu --gpus 4 --global-batch 8",
    "mixtral8x7b-64": "--model {cfg}/mixtral-8x7b --gpu h100 --gpus 64",
    "qwen3moe-64": "--model {cfg}/qwen3-30b-a3b --gpu h100 --gpus 64",
    "qwen15moe-32": "--model {cfg}/qwen1.5-moe-a2.7b --gpu h100 --gpus 32",
    "deepseek-lite-32": "--model {cfg}/deepseek-v2-lite --gpu h100 --gpus 32",
    "deepseek-v3-16384": "--model deepseek-v3 --gpus 16384",
    "deepseek-v3-16384-megatron": "--model deepseek-v3 --gpus 16384 --runtime megatron",
    "deepseek-v3-2048": "--model deepseek-v3 --gpu h100 --gpus 2048",
    "deepseek-v3-2048-megatron": "--model deepseek-v3 --gpu h100 --gpus 2048 --runtime megatron",
    "qwen3-235b-1024": "--model qwen3-235b-a22b --gpu h100 --gpus 1024",
    "qwen3-235b-1024-megatron": "--model qwen3-235b-a22b --gpu h100 --gpus 1024 --runtime megatron",
    "qwen3-235b-8192-megatron": "--model qwen3-235b-a22b --gpu h100 --gpus 8192 --runtime megatron",
    "bench-405b-megatron": "--model llama3-405b --gpu h100 --gpus 16384 --gpus-per-node 8 --seq-len 8192 --global-batch 2048 --runtime megatron",
    "llama8b-64-megatron": "--model llama3-8b --gpu h100 --gpus 64 --runtime megatron",
    "mixtral8x7b-64-megatron": "--model {cfg}/mixtral-8x7b --gpu h100 --gpus 64 --runtime megatron",
    "mixtral8x22b-512-megatron": "--model {cfg}/mixtral-8x22b --gpu h100 --gpus 512 --runtime megatron",
    "qwen3moe-64-megatron": "--model {cfg}/qwen3-30b-a3b --gpu h100 --gpus 64 --runtime megatron",
    "params70b-64": "--params 70e9 --gpu h100 --gpus 64",
    "nothing-fits-405b-8": "--model llama3-405b --gpu h100 --gpus 8",
    "layout-eval": "--model llama3-70b --gpu h100 --gpus 64 --layout dp=8,zero=3,tp=8",
}


def main(out: Path, only: list[str]) -> None:
    cfg = out / "configs"
    cfg.mkdir(parents=True, exist_ok=True)
    for name, shape in CONFIGS.items():
        (cfg / name).mkdir(exist_ok=True)
        (cfg / name / "config.json").write_text(json.dumps(shape))
    for name, args in CASES.items():
        if only and name not in only:
            continue
        plan = [sys.executable, "-m", "meshwise.cli", "plan", *args.format(cfg=cfg).split()]
        for suffix, extra in (("json", ["--json", "--top", "30"]), ("txt", ["--top", "3"])):
            run = subprocess.run(plan + extra, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
            text = run.stdout if run.returncode == 0 else f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
            # the configs folder's path appears in the output (the model's source): make it stable
            (out / f"{name}.{suffix}").write_text(text.replace(str(cfg), "CFG"))
        print(name, "ok" if run.returncode == 0 else f"exit {run.returncode}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
