"""Time the search for Mixtral 8x22B on 256 H100 (8 per node), as a whole process, and print the
chosen layout with the explanation's expert step. The config.json is written here with the
published shape of the checkpoint (hidden 6144, 56 layers, 48 heads, 8 KV heads, 8 experts of
16384, 2 per token, vocabulary 32768); the target is under 1 s.

    python benchmarks/plan_moe.py [runs]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from _plan_timing import time_plan

MIXTRAL_8X22B = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
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
}


def main(runs: int = 3) -> None:
    folder = Path(tempfile.mkdtemp()) / "mixtral-8x22b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MIXTRAL_8X22B))
    cmd = [
        sys.executable,
        "-m",
        "meshwise.cli",
        "plan",
        "--model",
        str(folder),
        "--gpu",
        "h100",
        "--gpus",
        "256",
        "--top",
        "3",
    ]
    out = time_plan(cmd, runs)
    for line in out.splitlines():
        if line.startswith(("E. Experts", "Chosen:")):
            print(line)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
