"""The GPU op model's keys of an accelerator profile, and the runtimes a prediction can be for.

Pure Python (no torch); spec/cluster.py reads profiles through ``gpu_fields``. The keys are described in
src/meshwise/catalog/accelerators.toml and docs/cost-model.md (Compute).
"""

from __future__ import annotations

from typing import Any

from meshwise.errors import MeshwiseError

RUNTIMES = ("meshwise", "megatron")
SELECTIVE_POLICIES = ("meshwise", "every-other-matmul")
# Whose model code runs the memory-bound operators under the meshwise (torch eager) runtime: meshwise's
# own, or torchtitan's Llama of 2024 with its eager RMSNorm or its Triton fused one (cost/kernels.py PASSES).
MODEL_CODES = ("meshwise", "torchtitan", "torchtitan-fused-norm")
GPU_KEYS = {
    "sm_count",
    "gemm_tile_m",
    "gemm_tile_n",
    "gemm_efficiency",
    "attention_efficiency",
    "hbm_efficiency",
    "runtime",
    "gemm",
    "attention",
    "kernel_floor_s",
    "host_launch_s",
    "sustained_clock",
    "sustained_mhz",
    "table_clock_mhz",
}
GEMM_FIELDS = ("efficiency", "k_half")
ATTENTION_FIELDS = (
    "forward",
    "forward_seq_half",
    "forward_causal",
    "forward_causal_seq_half",
    "backward",
    "backward_seq_half",
    "head64",
)


def gpu_fields(table: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The op model's keys of a profile, checked: positive counts, fractions in (0, 1], a known runtime."""
    out: dict[str, Any] = {}
    for key in ("sm_count", "gemm_tile_m", "gemm_tile_n"):
        if key in table:
            value = table[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be a positive integer, got {value!r}")
            out[key] = value
    for key in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "sustained_clock"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be a fraction in (0, 1], got {value!r}")
            out[key] = float(value)
    out.update(_component_rows(table, gpu))
    if "sustained_mhz" in table:
        out["sustained_clock"] = _sustained_clock(table, gpu)
    for key in ("kernel_floor_s", "host_launch_s"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be seconds in [0, 1), got {value!r}")
            out[key] = float(value)
    if "runtime" in table:
        if table["runtime"] not in RUNTIMES:
            raise MeshwiseError(f"--gpu {gpu}: runtime must be one of {', '.join(RUNTIMES)}, got {table['runtime']!r}")
        out["runtime"] = table["runtime"]
    if out.get("sm_count") and (out.get("gemm_efficiency") or out.get("gemm")):
        out.setdefault("attention_efficiency", out.get("gemm_efficiency", out.get("gemm", ((0, 0.6),))[0][1]) / 2)
        out.setdefault("hbm_efficiency", 0.8)
    return out


def _sustained_clock(table: dict[str, Any], gpu: str) -> float:
    """A cluster's own clock: ``sustained_mhz`` (the SM clock its GPUs hold through training at its power
    cap and cooling, e.g. nvidia-smi's clocks.sm under load) over ``table_clock_mhz`` (the clock the
    GEMM and attention tables ran at: accelerators.toml, components_clocks.csv)."""
    if "sustained_clock" in table:
        raise MeshwiseError(f"--gpu {gpu}: give sustained_mhz or sustained_clock, not both")
    if "table_clock_mhz" not in table:
        raise MeshwiseError(
            f"--gpu {gpu}: sustained_mhz needs table_clock_mhz, the clock the GEMM tables ran at "
            "(or base = a catalog GPU that has one, e.g. h100)"
        )
    top = _number(table["table_clock_mhz"], f"--gpu {gpu}: table_clock_mhz", 1, 10_000)
    return _number(table["sustained_mhz"], f"--gpu {gpu}: sustained_mhz", 1, top) / top


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise MeshwiseError(f"{where} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _entries(table: dict[str, Any], name: str, gpu: str, kinds: str) -> list[tuple[str, Any, str]]:
    """The entries of the profile's table ``name`` (of ``kinds``), sorted, with where each is named."""
    entries = table.get(name, {})
    if not isinstance(entries, dict):
        raise MeshwiseError(f"--gpu {gpu}: {name} must be a table of {kinds}")
    return [(key, fit, f"--gpu {gpu}: {name}.{key}") for key, fit in sorted(entries.items())]


def _component_rows(table: dict[str, Any], gpu: str) -> dict[str, tuple]:
    """``gemm.<dtype> = {efficiency, k_half}`` and ``attention.<runtime> = {kernel, forward, ...}`` as
    hashable rows: ``(dtype, efficiency, k_half)`` and ``(runtime, kernel, *ATTENTION_FIELDS)``."""
    out: dict[str, tuple] = {}
    rows = []
    for dtype, fit, where in _entries(table, "gemm", gpu, "dtypes, e.g. gemm.bf16.efficiency = 0.8"):
        if not isinstance(fit, dict) or set(fit) - set(GEMM_FIELDS) or "efficiency" not in fit:
            raise MeshwiseError(f"{where} must give efficiency (and optionally k_half), got {fit!r}")
        rows.append(
            (
                dtype,
                _number(fit["efficiency"], f"{where}.efficiency", 1e-3, 1.0),
                _number(fit.get("k_half", 0.0), f"{where}.k_half", 0.0, 1e6),
            )
        )
    if rows:
        out["gemm"] = tuple(rows)
    rows = []
    for runtime, fit, where in _entries(table, "attention", gpu, "runtimes, e.g. attention.meshwise = {...}"):
        if runtime not in RUNTIMES or not isinstance(fit, dict) or set(fit) != set(ATTENTION_FIELDS) | {"kernel"}:
            raise MeshwiseError(
                f"{where}: a runtime of {', '.join(RUNTIMES)} with kernel and {', '.join(ATTENTION_FIELDS)}"
            )
        values = [_number(fit[f], f"{where}.{f}", 0.0, 1e6 if f.endswith("half") else 1.0) for f in ATTENTION_FIELDS]
        rows.append((runtime, str(fit["kernel"]), *values))
    if rows:
        out["attention"] = tuple(rows)
    return out
