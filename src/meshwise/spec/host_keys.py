"""The host-time keys of an accelerator profile (cost/host.py), checked.

Pure Python (no torch); spec/cluster.py reads profiles through ``host_fields``. ``meshwise calibrate``
measures them on a CPU machine; GPU entries leave them out (0: the kernels, not the launches, set
the pace there).
"""

from __future__ import annotations

import math
from typing import Any

from meshwise.errors import MeshwiseError
from meshwise.spec.model import MLP_KINDS

# seconds a launched call of each kind costs on the host, which scale with the compute the rank runs
HOST_CALL_KEYS = (
    "op_overhead_s",
    "checkpoint_call_s",
    "selective_op_s",
    "tp_op_s",
    "tp_sp_block_s",
    "zb_split_block_s",
    "pp_call_s",
)
# seconds a step pays once per parameter shard or state pass: FSDP's calls and the optimizer's DTensor ops
HOST_FIXED_KEYS = ("fsdp_call_s", "fsdp_param_s", "fsdp_byte_s", "optimizer_dtensor_s")
HOST_SECONDS_KEYS = (
    *HOST_CALL_KEYS,
    *HOST_FIXED_KEYS,
    "cpu_gemm_call_s",
    "cp_step_s",
    "cp_score_s",
    "cp_score_dim_s",
    "sdpa_call_s",
    "sdpa_score_s",
    "sdpa_score_dim_s",
    "sync_skew_slice_s",
)
# rates and ratios, 0 or more (0: not measured)
NON_NEGATIVE_KEYS = ("cpu_gemm_flops_per_s", "cpu_gemm_bytes_per_s", "dram_bytes_per_s", "sync_skew_ratio")
# when a calibration was made and what measure/probe.py read then: accepted, checked, not part of the spec
PROBE_KEYS = ("probe_gemm_flops_per_s", "probe_op_s", "calibrated_unix_s")
# true when cp_step_s and its terms were timed as whole ring-attention calls, sends included (cost/context_parallel.py)
HOST_FLAG_KEYS = ("cp_step_includes_sends",)
TABLE_MAX_S = 60.0  # a measured row's seconds: a ring step at 2,048 local tokens took 1.5 s on a loaded 2-core host
# measured tables, 2 rows or more: [score elements, sequence or tokens > 0; head width or vocab > 0; seconds in (0, TABLE_MAX_S)]
TABLE_KEYS = ("cp_ring_table", "sdpa_head_table", "loss_token_table")
TABLE_COLUMNS = {
    "cp_ring_table": "score elements, head width",
    "sdpa_head_table": "sequence, head width",
    "loss_token_table": "tokens, vocab",
}
# a MoE block's parts, one call forward + backward on one rank, as measure/moe_parts.py times them at a
# run's shapes (cost/host_moe.py reads them): the shape the row holds (``mlp_kind`` the shared expert's
# activation, its index in spec/model.py MLP_KINDS; the flags 0 or 1), then its seconds
MOE_PART_SHAPE = (
    "tokens",
    "hidden",
    "experts",
    "top_k",
    "expert_ffn",
    "shared_ffn",
    "shared_gate",
    "mlp_kind",
    "mlp_bias",
    "ep",
)
MOE_PART_FLAGS = ("shared_gate", "mlp_bias")
MOE_PART_SECONDS = ("router_s", "permute_s", "experts_s", "shared_s", "dispatch_host_s", "forward_s")
MOE_PART_COLUMNS = MOE_PART_SHAPE + MOE_PART_SECONDS
HOST_KEYS = (
    set(HOST_SECONDS_KEYS)
    | {"thread_efficiency", "cores_per_node", "gemm_reference_efficiency"}
    | set(HOST_FLAG_KEYS)
    | set(TABLE_KEYS)
    | {"moe_part_table"}
    | set(PROBE_KEYS)
    | set(NON_NEGATIVE_KEYS)
)


def _number(table: dict[str, Any], key: str, gpu: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MeshwiseError(f"--gpu {gpu}: {key} must be a finite number, got {value!r}")
    return float(value)


def _fraction(table: dict[str, Any], key: str, gpu: str, out: dict[str, Any]) -> None:
    """``out[key]``: the table's ``key``, where it has one, checked to be a fraction in (0, 1]."""
    if key in table:
        value = _number(table, key, gpu)
        if not 0 < value <= 1:
            raise MeshwiseError(f"--gpu {gpu}: {key} must be a fraction in (0, 1], got {value!r}")
        out[key] = value


def host_fields(table: dict[str, Any], gpu: str) -> dict[str, Any]:
    """Seconds in [0, 1); thread_efficiency in (0, 1]; cores_per_node a whole number, 0 or more."""
    out: dict[str, Any] = {}
    for key in HOST_SECONDS_KEYS:
        if key in table:
            value = _number(table, key, gpu)
            if not 0 <= value < 1:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be seconds in [0, 1), got {value!r}")
            out[key] = value
    _fraction(table, "thread_efficiency", gpu, out)
    for key in NON_NEGATIVE_KEYS:
        if key in table:
            if not _number(table, key, gpu) >= 0:
                raise MeshwiseError(f"--gpu {gpu}: {key} must be 0 or more, got {table[key]!r}")
            out[key] = float(table[key])
    _fraction(table, "gemm_reference_efficiency", gpu, out)
    for key in PROBE_KEYS:
        if key in table and not _number(table, key, gpu) > 0:
            raise MeshwiseError(f"--gpu {gpu}: {key} must be a positive number, got {table[key]!r}")
    if "cores_per_node" in table:
        value = table["cores_per_node"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MeshwiseError(
                f"--gpu {gpu}: cores_per_node must be a whole number of cores, 0 or more, got {value!r}"
            )
        out["cores_per_node"] = value
    for key in HOST_FLAG_KEYS:
        if key in table:
            if not isinstance(table[key], bool):
                raise MeshwiseError(f"--gpu {gpu}: {key} must be true or false, got {table[key]!r}")
            out[key] = table[key]
    for key in TABLE_KEYS:
        if key in table:
            out[key] = _rows(table[key], key, gpu)
    if "moe_part_table" in table:
        out["moe_part_table"] = _moe_rows(table["moe_part_table"], gpu)
    return out


def _moe_rows(value: Any, gpu: str) -> tuple:
    """``moe_part_table``: one or more rows of ``MOE_PART_COLUMNS``, the shape's whole numbers (tokens,
    widths, experts, k, ep at least 1; shared width 0 or more; ``mlp_kind`` an index of MLP_KINDS; the
    flags 0 or 1) and seconds in [0, ``TABLE_MAX_S``)."""

    def shape_ok(r: list) -> bool:
        f = dict(zip(MOE_PART_SHAPE, r))
        flags = all(f[k] in (0, 1) for k in MOE_PART_FLAGS) and f["mlp_kind"] in range(len(MLP_KINDS))
        positive = ("tokens", "hidden", "experts", "top_k", "expert_ffn", "ep")
        return flags and f["shared_ffn"] >= 0 and all(f[k] >= 1 and f[k] == int(f[k]) for k in positive)

    ok = isinstance(value, list) and len(value) >= 1
    for r in value if ok else ():
        ok = ok and isinstance(r, list) and len(r) == len(MOE_PART_COLUMNS)
        ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in r)
        ok = ok and shape_ok(r) and all(0 <= x < TABLE_MAX_S for x in r[len(MOE_PART_SHAPE) :])
    if not ok:
        raise MeshwiseError(
            f"--gpu {gpu}: moe_part_table must be one or more rows [{', '.join(MOE_PART_COLUMNS)}] of "
            f"whole numbers for the shape and seconds in [0, {TABLE_MAX_S:.0f})"
        )
    return tuple(tuple(float(x) for x in r) for r in value)


def _rows(value: Any, key: str, gpu: str) -> tuple:
    """A measured table: two or more rows of three finite numbers, the first two above 0, the time in
    (0, ``TABLE_MAX_S``)."""
    ok = (
        isinstance(value, list)
        and len(value) >= 2
        and all(
            isinstance(r, list)
            and len(r) == 3
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in r)
            and r[0] > 0
            and r[1] > 0
            and 0 < r[2] < TABLE_MAX_S
            for r in value
        )
    )
    if not ok:
        raise MeshwiseError(
            f"--gpu {gpu}: {key} must be two or more rows [{TABLE_COLUMNS[key]}, seconds] "
            f"of positive numbers, seconds below {TABLE_MAX_S:.0f}"
        )
    return tuple(tuple(float(x) for x in r) for r in value)
