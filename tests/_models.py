"""Model files shared by the tests."""

from __future__ import annotations

from pathlib import Path

MODEL_TOML = """[model]
layers = 2
hidden = 32
heads = 2
kv_heads = 2
ffn_hidden = 64
vocab = 256
max_seq = 32
"""


def micro_model(folder: Path, extra: str = "") -> str:
    """A 37K-parameter model: two blocks, so pp=2 is possible; tp=2 divides every width.
    ``extra``: more ``key = value`` lines for the [model] table (e.g. ``tied_embeddings = true``)."""
    path = folder / "micro.toml"
    path.write_text(MODEL_TOML + extra)
    return str(path)
