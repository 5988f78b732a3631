"""measure's step split (measure/timing.py): the parts add up to the measured step."""

from __future__ import annotations

import math

import pytest

from meshwise.measure.timing import PARTS, split


@pytest.mark.parametrize("prof", [
    {"fb_s": 0.8, "comm_fb_s": 0.2, "idle_fb_s": 0.1, "rest_s": 0.05, "comm_rest_s": 0.01},
    {"fb_s": 0.5, "comm_fb_s": 0.6, "idle_fb_s": 0.0, "rest_s": 0.0, "comm_rest_s": 0.02},  # overlapping spans
    {"fb_s": 0.0, "comm_fb_s": 0.0, "idle_fb_s": 0.0, "rest_s": 0.1, "comm_rest_s": 0.3},
])
def test_the_parts_add_up_to_the_step(prof: dict) -> None:
    parts = split(1.0, 0.7, 0.1, prof)
    assert set(parts) == set(PARTS)
    assert math.isclose(sum(parts.values()), 1.0, rel_tol=1e-12)
    assert all(v >= 0 for v in parts.values())
    assert parts["optimizer_s"] == 0.1


def test_fractions_of_the_profiled_windows_apply_to_the_unprofiled_step() -> None:
    parts = split(1.0, 0.8, 0.1, {"fb_s": 1.6, "comm_fb_s": 0.4, "idle_fb_s": 0.2, "rest_s": 0.2, "comm_rest_s": 0.1})
    assert parts["idle_s"] == pytest.approx(0.1)       # 0.8 * 0.2 / 1.6
    assert parts["comm_s"] == pytest.approx(0.25)      # 0.8 * 0.4 / 1.6 + 0.1 * 0.1 / 0.2
    assert parts["compute_s"] == pytest.approx(0.5)
    assert parts["other_s"] == pytest.approx(0.05)
