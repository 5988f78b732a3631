"""measure's step split (measure/timing.py): every part timed, their sum checked against the step."""

from __future__ import annotations

import math

import pytest

from meshwise.measure.compare import Row, time_verdicts
from meshwise.measure.timing import PARTS, check_sum, split

WINDOWS = {"fb": 0.7, "opt": 0.1, "fixed": 0.17}


@pytest.mark.parametrize(
    "waits",
    [
        {("fb", "comm"): 0.2, ("fb", "idle"): 0.1, ("fixed", "comm"): 0.01},
        {("fb", "comm"): 0.6, ("fb", "idle"): 0.3, ("opt", "comm"): 0.5},  # more than the windows hold
        {},
    ],
)
def test_the_parts_and_the_untimed_rest_add_up_to_the_step(waits: dict) -> None:
    parts = split(1.0, WINDOWS, waits)
    assert set(parts) == set(PARTS) | {"untimed_s"}
    assert math.isclose(sum(parts.values()), 1.0, rel_tol=1e-12)
    assert all(parts[p] >= 0 for p in PARTS)
    assert parts["untimed_s"] == pytest.approx(0.03)


def test_waits_are_charged_to_their_window() -> None:
    parts = split(
        1.0, WINDOWS, {("fb", "comm"): 0.2, ("fb", "idle"): 0.1, ("fixed", "comm"): 0.04, ("rest", "comm"): 0.01}
    )
    assert parts == pytest.approx(
        {"compute_s": 0.4, "comm_s": 0.25, "idle_s": 0.1, "optimizer_s": 0.1, "fixed_s": 0.13, "untimed_s": 0.02}
    )


def test_a_split_that_misses_a_window_fails_the_check() -> None:
    """The parts are timed, not the remainder: a window left untimed (here the optimizer, and
    compute cut short) shows as a sum short of the step, and the check says so; a whole split passes."""
    whole = split(1.0, WINDOWS, {})
    assert check_sum(1.0, whole) == ""
    missed = split(1.0, {**WINDOWS, "opt": 0.0, "fb": 0.5}, {})
    line = check_sum(1.0, missed)
    assert "0.6700 s" in line and "-33.0%" in line
    counted_twice = split(1.0, {**WINDOWS, "fb": 0.9}, {})  # overlapping windows: more than the step
    assert check_sum(1.0, counted_twice) != ""


def _rows(predicted: dict, measured: dict) -> list[Row]:
    return [Row(f"time.{k}", 0, predicted[k], measured[k]) for k in predicted]


def test_the_largest_residual_names_the_missing_part() -> None:
    """An FSDP2-like miss (measured compute far above the prediction) is named as compute; an
    over-counted optimizer as over-counted; a split whose parts miss the step is reported."""
    pred = {
        "step_s": 0.16,
        "compute_s": 0.055,
        "comm_s": 0.089,
        "idle_s": 0.0,
        "optimizer_s": 0.016,
        "fixed_s": 0.002,
        "untimed_s": 0.0,
    }
    meas = {
        "step_s": 0.23,
        "compute_s": 0.12,
        "comm_s": 0.092,
        "idle_s": 0.0,
        "optimizer_s": 0.015,
        "fixed_s": 0.002,
        "untimed_s": 0.001,
    }
    lines = time_verdicts(_rows(pred, meas))
    assert "add up" in lines[0] and "does not hold" not in lines[0]
    assert "largest residual compute +65.0 ms" in lines[1] and "missing from" in lines[1]
    over = time_verdicts(_rows({**pred, "optimizer_s": 0.2}, meas))
    assert "largest residual optimizer" in over[1] and "over-counted" in over[1]
    short = time_verdicts(_rows(pred, {**meas, "compute_s": 0.06, "untimed_s": 0.061}))
    assert "does not hold" in short[0]
