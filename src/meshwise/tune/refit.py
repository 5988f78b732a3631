"""Refit a profile's cluster factors to the measured parts of a tune's trials.

Five factors, each the one owner of the profile keys it scales (:class:`Fit`):

- **compute** (sustained compute): every per-operator host time times ``k``, every arithmetic
  and memory rate over ``k``;
- **latency** and **bandwidth** (the links): latencies times ``a``, bandwidths over ``b``;
- **reduce-scatter**: ``reduce_scatter_ratio`` times ``r`` (cost/comm.py: a reduce-scatter costs the
  ratio times the all-reduce of its tensor; a profile without it prices the ring formula, which is
  ``RING_REDUCE_SCATTER_RATIO`` of the ring all-reduce, and the refit starts there). It is what tells
  DDP's all-reduce from ZeRO's reduce-scatter and all-gather, whose bytes the ring formulas equate;
- **fixed** (fixed per-step costs): the optimizer's and FSDP's host times and the DRAM rate.

The link keys share one factor until the trials tell them apart (:func:`_column_sets`): latency
from bandwidth from ``LINK_APART`` trials with a link share, the reduce-scatter ratio from the
links once its fraction of the link part differs by ``APART_SPREAD`` between trials (a trial of
DDP and one of ZeRO, :func:`_apart`); a finer set that least squares cannot solve falls back to
the next coarser one.

The samples are the parts of each trial's step that measure/timing.py times and cost/estimate.py
predicts: compute (``compute_s``), link (``comm_s`` / ``comm_exposed_s``), idle (``idle_s`` /
``bubble_s``) and fixed (``optimizer_s + fixed_s``). A part is linear in each fit's keys, so a
fit's share of it, ``owned``, is read by scaling the keys by ``PROBE`` (the part grows by
``PROBE - 1`` times the share). The factors solve ``measured = other + sum(k owned)`` over every
(trial, part) at once by least squares, each residual over the trial's measured step (a part
weighs what it weighs in the step; the normal equations solved as measure/calibrate.py's
``_relative_least_squares`` solves them), each overall factor within ``1 / MAX_FACTOR ..
MAX_FACTOR``. Rounds repeat (at most ``PASSES``) until no factor moves by more than ``CONVERGED``.

Pure Python: no torch.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from meshwise.cost.estimate import StepTime, estimate
from meshwise.layout import Layout
from meshwise.measure.calibrate import PROFILE_KEYS, format_toml
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster
from meshwise.spec.host_keys import HOST_CALL_KEYS, HOST_FIXED_KEYS
from meshwise.train.layout_choice import with_threads

PASSES = 6
CONVERGED = 0.005
PROBE = 1.01  # a fit's share of a part: the part with the fit's keys times PROBE, less the part, over PROBE - 1
TABLE_MAX_S = 0.999  # a profile table's seconds stay below 1 s (spec/cluster.py refuses more)
MAX_FACTOR = 100.0  # a fit moves its keys at most this many times either way (a part it barely sets)


@dataclass(frozen=True)
class Fit:
    """A fit's profile keys: times multiplied by its factor, rates divided, tables' last column multiplied."""

    name: str
    times: tuple[str, ...] = ()
    rates: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()


COMPUTE = Fit(
    "compute",
    times=(
        *HOST_CALL_KEYS,
        "cpu_gemm_call_s",
        "sdpa_call_s",
        "sdpa_score_s",
        "sdpa_score_dim_s",
        "cp_step_s",
        "cp_score_s",
        "cp_score_dim_s",
    ),
    rates=(
        "peak_bf16_flops_per_s",
        "peak_fp32_flops_per_s",
        "cpu_gemm_flops_per_s",
        "cpu_gemm_bytes_per_s",
        "hbm_bytes_per_s",
    ),
    tables=("cp_ring_table", "sdpa_head_table"),
)
LATENCY = Fit("latency", times=("intra_latency_s", "inter_latency_s"))
BANDWIDTH = Fit("bandwidth", rates=("intra_bytes_per_s", "inter_bytes_per_s"))
REDUCE_SCATTER = Fit("reduce-scatter", times=("reduce_scatter_ratio",))
FIXED = Fit("fixed", times=HOST_FIXED_KEYS, rates=("dram_bytes_per_s",))


def scaled(table: dict[str, Any], fit: Fit, factor: float) -> dict[str, Any]:
    """``table`` with ``fit``'s keys scaled by ``factor`` (keys the profile lacks stay absent)."""
    out = dict(table)
    for key in fit.times:
        if key in out:
            out[key] = out[key] * factor
    for key in fit.rates:
        if key in out:
            out[key] = out[key] / factor
    for key in fit.tables:
        if key in out:
            out[key] = [[*row[:-1], min(TABLE_MAX_S, row[-1] * factor)] for row in out[key]]
    return out


def profile_text(table: dict[str, Any]) -> str:
    """The profile as TOML: ``meshwise calibrate``'s keys in its order, then any other key the base
    profile held (a catalog entry's), so that ``plan --gpu FILE`` reads the same accelerator."""
    lines = [format_toml(table).rstrip("\n")]
    lines += [
        _scalar(key, table[key])
        for key in sorted(k for k in table if k not in PROFILE_KEYS and k != "aliases")
        if _scalar(key, table[key])
    ]
    for key in sorted(k for k, v in table.items() if isinstance(v, dict)):  # a catalog GPU's op-model tables
        lines += _sub_table(key, table[key])
    return "\n".join(lines) + "\n"


def _scalar(key: str, value: Any) -> str:
    """``key = value`` in TOML for a bool, number or string; "" for anything else (a table, a list)."""
    if isinstance(value, bool):
        return f"{key} = {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"{key} = {value!r}"
    if isinstance(value, str):
        return f"{key} = {json.dumps(value)}"
    return ""


def _sub_table(path: str, table: dict[str, Any]) -> list[str]:
    """``[path]`` and its scalars, then its own sub-tables (TOML: a table's keys before its children)."""
    lines = ["", f"[{path}]"]
    lines += [_scalar(key, value) for key, value in table.items() if _scalar(key, value)]
    for key, value in table.items():
        if isinstance(value, dict):
            lines += _sub_table(f"{path}.{key}", value)
    return lines


@lru_cache(maxsize=64)
def _cluster_of_text(text: str, world: int, local_world: int) -> ClusterSpec:
    with tempfile.TemporaryDirectory(prefix="meshwise-tune-") as folder:
        path = Path(folder) / "profile.toml"
        path.write_text(text)
        return load_cluster(str(path), world, local_world)


@dataclass(frozen=True)
class Predictor:
    """The cost model's step for a layout of ``model`` under a profile table, on ``world`` ranks of
    ``local_world`` per node, each with ``threads`` threads (CPU; 1 on GPU)."""

    model: ModelSpec
    train: TrainSpec
    world: int
    local_world: int
    threads: int = 1

    def cluster(self, table: dict[str, Any]) -> ClusterSpec:
        return with_threads(_cluster_of_text(profile_text(table), self.world, self.local_world), self.threads)

    def step(self, table: dict[str, Any], layout: Layout) -> StepTime:
        return estimate(self.model, self.cluster(table), self.train, layout).time


def predicted_parts(t: StepTime) -> dict[str, float]:
    return {"compute": t.compute_s, "link": t.comm_exposed_s, "idle": t.bubble_s, "fixed": t.optimizer_s + t.fixed_s}


def measured_parts(parts: dict[str, float]) -> dict[str, float]:
    """The fitted parts of a measured step split (measure/timing.py's names)."""
    return {
        "compute": parts["compute_s"],
        "link": parts["comm_s"],
        "idle": parts.get("idle_s", 0.0),
        "fixed": parts["optimizer_s"] + parts["fixed_s"],
    }


def _solve(samples: list[tuple[list[float], float, float, float]], count: int) -> list[float] | None:
    """Least squares of ``sum(c_j owned_j) = measured - other`` over the samples, each residual over
    its trial's measured step (so a part weighs what it weighs in the step); None when singular."""
    rows = [
        ([o / step for o in owned], (m - other) / step)
        for owned, other, m, step in samples
        if sum(owned) > 0 and step > 0
    ]
    if len(rows) < count:
        return None
    a = [
        [sum(r[i] * r[j] for r, _ in rows) for j in range(count)] + [sum(r[i] * y for r, y in rows)]
        for i in range(count)
    ]
    for i in range(count):  # Gauss-Jordan on the normal equations, as calibrate's _relative_least_squares
        pivot = max(range(i, count), key=lambda j: abs(a[j][i]))
        a[i], a[pivot] = a[pivot], a[i]
        if abs(a[i][i]) < 1e-18:
            return None
        a[i] = [x / a[i][i] for x in a[i]]
        for j in range(count):
            if j != i:
                a[j] = [x - a[j][i] * y for x, y in zip(a[j], a[i])]
    found = [a[i][count] for i in range(count)]
    return found if all(map(math.isfinite, found)) else None


def _factors(
    samples: list[tuple[list[float], float, float, float]], count: int, so_far: list[float] | None = None
) -> list[float] | None:
    """Factors ``c`` of ``measured = other + sum(c_j owned_j)`` over (owned parts, other, measured,
    the trial's step) samples (:func:`_solve`), each (times ``so_far``, what earlier passes applied)
    within ``1 / MAX_FACTOR .. MAX_FACTOR``: a factor the free fit puts below the bound is held there
    and the others refitted. None where too few samples hold a share."""
    before = so_far or [1.0] * count
    lows, highs = [1 / MAX_FACTOR / b for b in before], [MAX_FACTOR / b for b in before]
    fixed: dict[int, float] = {}
    while len(fixed) < count:
        free = [j for j in range(count) if j not in fixed]
        held = [
            ([owned[j] for j in free], other + sum(owned[j] * k for j, k in fixed.items()), m, step)
            for owned, other, m, step in samples
        ]
        found = _solve(held, len(free))
        if found is None:
            return None
        low = min(range(len(free)), key=lambda i: found[i] / lows[free[i]])
        if found[low] >= lows[free[low]]:
            out = dict(fixed) | dict(zip(free, found))
            return [min(highs[j], out[j]) for j in range(count)]
        fixed[free[low]] = lows[free[low]]
    return [fixed[j] for j in range(count)]


Measured = tuple[Layout, dict[str, float]]  # a trial's layout and its measured parts (measure/timing.py names)


FITS = (COMPUTE, LATENCY, BANDWIDTH, REDUCE_SCATTER, FIXED)
# cost/comm.py prices a reduce-scatter at reduce_scatter_ratio times the all-reduce of its tensor; a
# profile without the ratio prices it by the ring formula, which is this ratio of the ring all-reduce
RING_REDUCE_SCATTER_RATIO = 0.5


def refit(
    table: dict[str, Any], measured: list[Measured], predictor: Predictor
) -> tuple[dict[str, Any], dict[str, float]]:
    """(the refitted table, each fit's overall factor) from the trials' measured parts."""
    factors = {f.name: 1.0 for f in FITS}
    seeded = not table.get("reduce_scatter_ratio")
    if seeded:
        table = {**table, "reduce_scatter_ratio": RING_REDUCE_SCATTER_RATIO}
    for _ in range(PASSES):
        found = _joint_factors(table, measured, predictor, factors)
        if not found:
            break
        for fit, k in found.items():
            table = scaled(table, fit, k)
            factors[fit.name] *= k
        if max(abs(k - 1) for k in found.values()) <= CONVERGED:
            break
    if seeded and factors[REDUCE_SCATTER.name] == 1.0:  # never fitted: the profile as it came
        table = {k: v for k, v in table.items() if k != "reduce_scatter_ratio"}
    return table, factors


LINK_APART = 3  # layouts with a link share needed before latency and bandwidth are fitted apart


def _joint_factors(
    table: dict[str, Any], measured: list[Measured], predictor: Predictor, so_far: dict[str, float]
) -> dict[Fit, float]:
    """One factor per fit whose keys set some part of some trial, fitted over every (trial, part);
    latency and bandwidth share one factor until ``LINK_APART`` trials hold a link share."""
    samples: list[tuple[dict[Fit, float], float, float, float]] = []
    for lay, parts in measured:
        now = predicted_parts(predictor.step(table, lay))
        probed = {f: predicted_parts(predictor.step(scaled(table, f, PROBE), lay)) for f in FITS}
        split = measured_parts(parts)
        step_s = sum(split.values())
        for part, m in split.items():
            owned = {f: max(0.0, (probed[f][part] - now[part]) / (PROBE - 1)) for f in FITS}
            samples.append((owned, now[part] - sum(owned.values()), m, step_s))
    for columns in _column_sets(table, measured, predictor, [owned for owned, *_ in samples]):
        active = [c for c in columns if any(sum(owned[f] for f in c) > 0 for owned, _, _, _ in samples)]
        held = [f for f in FITS if not any(f in c for c in active)]  # not fitted: their shares stay
        found = _factors(
            [
                ([sum(owned[f] for f in c) for c in active], other + sum(owned[f] for f in held), m, step)
                for owned, other, m, step in samples
            ],
            len(active),
            [so_far[c[0].name] for c in active],
        )
        if found:
            return {f: k for c, k in zip(active, found) for f in c}
    return {}


def _column_sets(
    table: dict[str, Any], measured: list[Measured], predictor: Predictor, shares: list[dict[Fit, float]]
) -> list[list[tuple[Fit, ...]]]:
    """The fits' columns to solve for, finest first (the next where a finer one is singular): latency
    and bandwidth apart from ``LINK_APART`` trials with a link share, the reduce-scatter ratio apart
    where the trials tell it from the links (:func:`_apart`); until then one factor for the link keys."""
    linked = len({lay.format() for lay, _ in measured if predictor.step(table, lay).comm_exposed_s > 0})
    base: list[tuple[Fit, ...]] = [(COMPUTE,), (FIXED,)]
    sets = []
    if _apart(shares, REDUCE_SCATTER, (LATENCY, BANDWIDTH)):
        if linked >= LINK_APART:
            sets.append([*base, (LATENCY,), (BANDWIDTH,), (REDUCE_SCATTER,)])
        sets.append([*base, (LATENCY, BANDWIDTH), (REDUCE_SCATTER,)])
    elif linked >= LINK_APART:
        sets.append([*base, (LATENCY,), (BANDWIDTH, REDUCE_SCATTER)])
    return [*sets, [*base, (LATENCY, BANDWIDTH, REDUCE_SCATTER)]]


APART_SPREAD = 0.2  # the least spread of a fit's fraction of a part over the trials that fits it apart


def _apart(shares: list[dict[Fit, float]], fit: Fit, rest: tuple[Fit, ...]) -> bool:
    """Whether ``fit``'s share of a part, as a fraction of it and ``rest``'s shares together, spans at
    least ``APART_SPREAD`` over the samples that hold either: a fit whose fraction is the same in every
    sample moves those parts as ``rest`` does, and least squares cannot tell them apart."""
    fractions = [owned[fit] / total for owned in shares if (total := owned[fit] + sum(owned[f] for f in rest)) > 0]
    return bool(fractions) and max(fractions) - min(fractions) >= APART_SPREAD


def held_out_errors(
    table: dict[str, Any], measured: list[Measured], steps_s: list[float], predictor: Predictor
) -> list[float]:
    """Each trial's relative step error under the profile refitted to the other trials (leave one
    out): how far the refitted model is off on a layout it was not fitted to; [] below two trials."""
    if len(measured) < 2:
        return []
    out = []
    for i, (lay, _) in enumerate(measured):
        fitted, _ = refit(table, measured[:i] + measured[i + 1 :], predictor)
        out.append((predictor.step(fitted, lay).step_s - steps_s[i]) / steps_s[i])
    return out


def step_errors(table: dict[str, Any], measured_steps: list[tuple[Layout, float]], predictor: Predictor) -> list[float]:
    """(predicted - measured) / measured of each trial's step under ``table``."""
    return [(predictor.step(table, lay).step_s - m) / m for lay, m in measured_steps if m > 0]
