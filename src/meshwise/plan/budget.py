"""Time and cost to train on a token budget (``plan --tokens N --price-per-gpu-hour P``).

wall-clock seconds = tokens / (tokens per second of the layout); GPU-hours = seconds x devices / 3600;
cost = GPU-hours x price. Pure arithmetic on the estimate's tokens/s, so the figures agree with it
to the rounding shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshwise.errors import MeshwiseError

SECONDS_PER_DAY = 86_400
SECONDS_PER_HOUR = 3_600


@dataclass(frozen=True)
class Budget:
    """A training run of ``tokens`` at ``tokens_per_s`` on ``devices``; ``price_per_gpu_hour`` may be None."""

    tokens: float
    tokens_per_s: float
    devices: int
    price_per_gpu_hour: float | None = None

    @property
    def seconds(self) -> float:
        return self.tokens / self.tokens_per_s

    @property
    def days(self) -> float:
        return self.seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.devices / SECONDS_PER_HOUR

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def as_json(self) -> dict:
        out = {"tokens": self.tokens, "days": self.days, "gpu_hours": self.gpu_hours}
        if self.cost is not None:
            out.update(price_per_gpu_hour=self.price_per_gpu_hour, cost=self.cost)
        return out


@dataclass(frozen=True)
class BudgetFigures:
    """What the plan shows beside each candidate's step, one per candidate, each None where not asked
    for: its :class:`Budget`, its reliability (plan/failures.py: interval, goodput) and its budget
    with failures."""

    budgets: list[Budget] | None = None
    reliabilities: list | None = None
    failure_budgets: list | None = None


def check_budget(tokens: float | None, price: float | None) -> None:
    """Refuse a budget that cannot be one, before any work starts."""
    if tokens is not None and not (math.isfinite(tokens) and tokens >= 1):
        raise MeshwiseError(f"--tokens: {tokens!r} must be a finite number of tokens, at least 1 (e.g. 15e12)")
    if price is not None:
        if tokens is None:
            raise MeshwiseError("--price-per-gpu-hour: needs --tokens (the budget the cost is for)")
        if not (math.isfinite(price) and price >= 0):
            raise MeshwiseError(f"--price-per-gpu-hour: {price!r} must be a finite number, 0 or more")


def fmt_tokens(tokens: float) -> str:
    """15e12 -> '15T tokens'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if tokens >= scale:
            return f"{tokens / scale:,.4g}{unit} tokens"
    return f"{tokens:,.0f} tokens"


def fmt_days(days: float) -> str:
    return f"{days:,.1f}" if days >= 1 else f"{days:.3g}"


def fmt_gpu_hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.3g}"


def fmt_cost(cost: float) -> str:
    return f"{cost:,.0f}"


def _cells(days: float, gpu_hours: float, cost: float | None, band=None) -> list[str]:
    """Days, GPU-hours and, with a price, the cost; with a band (plan/band.py), each followed by its
    low-high in brackets."""
    shown = [(days, fmt_days), (gpu_hours, fmt_gpu_hours)] + ([(cost, fmt_cost)] if cost is not None else [])
    if band is None:
        return [fmt(v) for v, fmt in shown]
    return [f"{fmt(v)} ({fmt(band.around(v)[0])}-{fmt(band.around(v)[1])})" for v, fmt in shown]


def budget_cells(b: Budget, band=None) -> list[str]:
    """The table cells of a failure-free budget (``_cells``)."""
    return _cells(b.days, b.gpu_hours, b.cost, band)


@dataclass(frozen=True)
class FailureBudget:
    """``base``'s run with failures and checkpoints (cost/failures.py): the wall clock stretched by
    1 / goodput; ``failures`` expected over it, one per ``mtbf_s``."""

    base: Budget
    goodput: float
    mtbf_s: float

    @property
    def seconds(self) -> float:
        return self.base.seconds / self.goodput

    @property
    def days(self) -> float:
        return self.seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.base.devices / SECONDS_PER_HOUR

    @property
    def cost(self) -> float | None:
        return None if self.base.price_per_gpu_hour is None else self.gpu_hours * self.base.price_per_gpu_hour

    @property
    def failures(self) -> float:
        return self.seconds / self.mtbf_s

    def as_json(self) -> dict:
        out = {"goodput": self.goodput, "days": self.days, "gpu_hours": self.gpu_hours, "failures": self.failures}
        if self.cost is not None:
            out["cost"] = self.cost
        return out


def with_failures(b: Budget, goodput: float, mtbf_s: float) -> FailureBudget:
    """The failure-aware figures of a budget: days, GPU-hours and cost divided by the goodput."""
    return FailureBudget(b, goodput, mtbf_s)


def failure_budget_cells(f: FailureBudget, band=None) -> list[str]:
    """The table cells with failures (``_cells``)."""
    return _cells(f.days, f.gpu_hours, f.cost, band)
