"""The GPU op model's keys of an accelerator profile, and the runtimes a prediction can be for.

Pure Python (no torch); spec/cluster.py reads profiles through ``gpu_fields``. The keys are described in
src/meshwise/catalog/accelerators.toml and docs/cost-model.md (Compute).
"""

from __future__ import annotations

from typing import Any

from meshwise.errors import MeshwiseError

RUNTIMES = ("meshwise", "megatron")
SELECTIVE_POLICIES = ("meshwise", "every-other-matmul")
GPU_KEYS = {"sm_count", "gemm_tile_m", "gemm_tile_n", "gemm_efficiency", "attention_efficiency", "hbm_efficiency",
            "runtime"}


def gpu_fields(table: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The op model's keys of a profile, checked: positive counts, fractions in (0, 1], a known runtime."""
    out: dict[str, Any] = {}
    for key in ("sm_count", "gemm_tile_m", "gemm_tile_n"):
        if key in table:
            value = table[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be a positive integer, got {value!r}")
            out[key] = value
    for key in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be a fraction in (0, 1], got {value!r}")
            out[key] = float(value)
    if "runtime" in table:
        if table["runtime"] not in RUNTIMES:
            raise MeshwiseError(f"--gpu {gpu}: runtime must be one of {', '.join(RUNTIMES)}, got {table['runtime']!r}")
        out["runtime"] = table["runtime"]
    if out.get("sm_count") and out.get("gemm_efficiency"):
        out.setdefault("attention_efficiency", out["gemm_efficiency"] / 2)
        out.setdefault("hbm_efficiency", 0.8)
    return out
