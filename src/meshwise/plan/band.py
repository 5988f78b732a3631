"""How far a plan's figures can be off: the band around step time, tokens/s, days and cost.

A band is the spread of the time model's out-of-sample errors on the published development runs of
the same category (benchmarks/band.py, leave-one-source-out; catalog/bands.toml holds the table):

    published step / predicted step - 1  in  [low, high]   at the table's coverage, so
    step_s in [step_s (1 + low), step_s (1 + high)],  tokens/s in [tokens/s / (1 + high), tokens/s / (1 + low)]

and days, GPU-hours and cost scale as the step does. The category is the run's kind (dense or MoE),
GPU family, precision class (bf16 or fp8) and profile (the catalog's, or one ``meshwise calibrate``
measured on the user's own hardware). A category with too few runs or sources falls back to a
broader one (:data:`FALLBACK`), the row saying which it is. A calibrated profile measures the
cluster's own speed, which takes away the offset every run of one source shares: its rows are the
spread of the errors about their source's median (benchmarks/band.py), narrower than the catalog's.

Pure Python (no torch); the table is read once per process and each plan looks it up once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshwise.catalog import read_catalog
from meshwise.spec import AcceleratorSpec, ModelSpec, TrainSpec
from meshwise.spec.train import FP8_FORMATS

# GPU families by the accelerator's name (its first matching prefix); others: "other"
FAMILIES = (
    ("a100", "ampere"),
    ("a800", "ampere"),
    ("h100", "hopper"),
    ("h200", "hopper"),
    ("h800", "hopper"),
    ("gh200", "hopper"),
    ("b200", "blackwell"),
    ("b300", "blackwell"),
    ("gb200", "blackwell"),
    ("gb300", "blackwell"),
    ("mi", "cdna"),
    ("cpu", "cpu"),
)
OWN_ROWS_ONLY = ("cpu",)  # families no GPU run speaks for: a band only from their own rows (none yet)
CALIBRATED_PREFIX = "meshwise calibrate"  # AcceleratorSpec.calibrated_on of a profile calibrate wrote


@dataclass(frozen=True)
class Category:
    """What a band depends on: dense or MoE, GPU family, precision class, catalog or calibrated profile."""

    kind: str  # "dense" | "moe"
    family: str  # "ampere" | "hopper" | "blackwell" | ...
    precision: str  # "bf16" | "fp8"
    profile: str  # "catalog" | "calibrated"

    def keys(self) -> tuple[str, ...]:
        """The table's keys to try, most specific first (:data:`FALLBACK`)."""
        k, f, p, s = self.kind, self.family, self.precision, self.profile
        if f in OWN_ROWS_ONLY:
            return (f"{s}/{k}/{f}/{p}", f"{s}/{k}/{f}")
        return (f"{s}/{k}/{f}/{p}", f"{s}/{k}/{f}", f"{s}/{k}/*/{p}", f"{s}/{k}")


FALLBACK = "kind/family/precision, then kind/family, kind/precision, then every run of the kind"


@dataclass(frozen=True)
class Band:
    """``low`` <= published / predicted - 1 <= ``high`` for the share ``coverage`` of the category's runs."""

    low: float
    high: float
    category: str  # the table row used (its key)
    asked: str  # the category asked for (differs when a fallback row answered)
    coverage: float
    runs: int
    sources: int

    def around(self, value: float) -> tuple[float, float]:
        """The band of a figure that scales as the step time (seconds, days, GPU-hours, cost)."""
        return value * (1 + self.low), value * (1 + self.high)

    def around_rate(self, value: float) -> tuple[float, float]:
        """The band of a rate, the step's inverse (tokens/s)."""
        return value / (1 + self.high), value / (1 + self.low)

    def as_json(self, value: float, rate: bool = False) -> dict:
        lo, hi = self.around_rate(value) if rate else self.around(value)
        return {
            "low": lo,
            "high": hi,
            "category": self.category,
            "asked": self.asked,
            "coverage": self.coverage,
            "runs": self.runs,
            "sources": self.sources,
        }


def family(accelerator_name: str) -> str:
    name = accelerator_name.lower()
    return next((fam for prefix, fam in FAMILIES if name.startswith(prefix)), "other")


def category(model: ModelSpec, accelerator: AcceleratorSpec, train: TrainSpec) -> Category:
    return category_of(
        model.moe, accelerator.name, train.precision, accelerator.calibrated_on.startswith(CALIBRATED_PREFIX)
    )


def category_of(moe: bool, accelerator_name: str, precision: str, calibrated: bool) -> Category:
    return Category(
        "moe" if moe else "dense",
        family(accelerator_name),
        "fp8" if precision in FP8_FORMATS else "bf16",
        "calibrated" if calibrated else "catalog",
    )


@lru_cache(maxsize=1)
def _table() -> dict[str, dict]:
    data = read_catalog("bands.toml")
    return {row["category"]: row for row in data.get("band", [])}


def lookup(cat: Category, table: dict[str, dict] | None = None) -> Band | None:
    """The most specific row of ``table`` (catalog/bands.toml when None) for ``cat``; None if it has none."""
    rows = _table() if table is None else table
    for key in cat.keys():
        row = rows.get(key)
        if row is not None:
            return Band(row["low"], row["high"], key, cat.keys()[0], row["coverage"], row["runs"], row["sources"])
    return None


def band_for(model: ModelSpec, accelerator: AcceleratorSpec, train: TrainSpec) -> Band | None:
    """The band of a plan's figures for ``model`` on ``accelerator`` under ``train``."""
    return lookup(category(model, accelerator, train))


def text(band: Band | None, value: float, fmt: str, rate: bool = False) -> str:
    """``value`` formatted with ``fmt``, then its band in brackets: ``7.28 (6.4-8.6)``."""
    if band is None:
        return format(value, fmt)
    lo, hi = band.around_rate(value) if rate else band.around(value)
    return f"{format(value, fmt)} ({format(lo, fmt)}-{format(hi, fmt)})"


def figure_bands(band: Band | None, e) -> dict:
    """A plan row's JSON band: its step seconds and tokens/s, low and high, and the row it came from."""
    if band is None:
        return {}
    step, rate = band.as_json(e.time.step_s), band.as_json(e.tokens_per_s, rate=True)
    return {
        "band": {
            "step_s": {"low": step["low"], "high": step["high"]},
            "tokens_per_s": {"low": rate["low"], "high": rate["high"]},
            **{k: step[k] for k in ("category", "asked", "coverage", "runs", "sources")},
        }
    }


def with_band(line: str, band: Band | None, estimates) -> str:
    """The explanation's "Chosen:" or "Evaluated:" line with the band after its step time and tokens/s
    (the same figures, formatted as the line formats them)."""
    if band is None or not estimates or not line.startswith(("Chosen: ", "Evaluated: ")):
        return line
    e = estimates[0]
    plain = f"{e.time.step_s:.3g} s/step, {e.tokens_per_s:,.0f} tokens/s"
    banded = f"{text(band, e.time.step_s, '.3g')} s/step, {text(band, e.tokens_per_s, ',.0f', rate=True)} tokens/s"
    return line.replace(plain, banded, 1)


def budget_band(band: Band | None, budget) -> dict:
    """A budget's JSON band (plan/budget.py): days, GPU-hours and cost scale as the step time does."""
    if band is None:
        return {}
    figures = {"days": budget.days, "gpu_hours": budget.gpu_hours}
    if budget.cost is not None:
        figures["cost"] = budget.cost
    return {
        "band": {name: dict(zip(("low", "high"), band.around(v))) for name, v in figures.items()}
        | {"category": band.category, "coverage": band.coverage}
    }


def band_note(band: Band) -> str:
    """What the brackets mean, for a table's title."""
    fallback = "" if band.category == band.asked else f" (too few runs of {band.asked}: the broader row)"
    return (
        f"the time model's error range on {band.runs} published dev runs from {band.sources} sources, "
        f"{band.category}{fallback} (benchmarks/band.py)"
    )
