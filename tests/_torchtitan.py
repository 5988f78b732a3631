"""torchtitan 0.3.0 as a test oracle (the ``test`` extra; never imported by meshwise).

``config_manager()`` imports it, first putting tests/_stubs on the path when Hugging Face
``datasets`` is missing (tests/_stubs/README.md), and skips the test when torchtitan is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

import pytest

from meshwise import spec

STUBS = os.path.join(os.path.dirname(__file__), "_stubs")

# torchtitan 0.3.0's llama3 and qwen3 MoE debug models as meshwise specs (shared by the emit tests)
QWEN3_MOE_DEBUG = spec.ModelSpec(
    name="qwen3-moe-debug",
    family="qwen3_moe",
    layers=8,
    hidden=256,
    heads=16,
    kv_heads=8,
    head_dim=128,
    ffn_hidden=3072,
    vocab=2048,
    max_seq=4096,
    experts=64,
    experts_per_token=8,
    expert_ffn_hidden=768,
    qk_norm=True,
)
DEBUG = spec.ModelSpec(
    name="llama3-debug", layers=6, hidden=256, heads=16, kv_heads=16, ffn_hidden=768, vocab=2048, max_seq=2048
)


def config_manager():
    pytest.importorskip("torchtitan", reason="torchtitan is the oracle of --emit torchtitan (the test extra)")
    if importlib.util.find_spec("datasets") is None and STUBS not in sys.path:
        sys.path.insert(0, STUBS)
    from torchtitan.config import ConfigManager

    return ConfigManager()


def command_args(text: str, entry: str) -> list[str]:
    """The arguments after ``entry`` in the emitted shell text (comments and line continuations dropped)."""
    body = " ".join(line for line in text.splitlines() if not line.startswith("#")).replace("\\", " ")
    words = shlex.split(body.replace("$MASTER_ADDR", "localhost"))
    return words[words.index(entry) + 1 :]
