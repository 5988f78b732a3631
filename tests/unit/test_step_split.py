"""measure's step split (measure/timing.py): the parts add up to the measured step."""

from __future__ import annotations

import math

import pytest

from meshwise.measure.timing import PARTS, split


@pytest.mark.parametrize("waits", [
    {("fb", "comm"): 0.2, ("fb", "idle"): 0.1, ("rest", "comm"): 0.01},
    {("fb", "comm"): 0.6, ("fb", "idle"): 0.3, ("opt", "comm"): 0.5},  # more than the windows hold
    {},
])
def test_the_parts_add_up_to_the_step(waits: dict) -> None:
    parts = split(1.0, 0.7, 0.1, waits)
    assert set(parts) == set(PARTS)
    assert math.isclose(sum(parts.values()), 1.0, rel_tol=1e-12)
    assert all(v >= 0 for v in parts.values())


def test_waits_are_charged_to_their_window() -> None:
    parts = split(1.0, 0.8, 0.1, {("fb", "comm"): 0.2, ("fb", "idle"): 0.1, ("rest", "comm"): 0.04})
    assert parts == pytest.approx({"compute_s": 0.5, "comm_s": 0.24, "idle_s": 0.1, "optimizer_s": 0.1,
                                   "other_s": 0.06})
