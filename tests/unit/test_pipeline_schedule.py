"""The schedule model: the closed-form bubble the search uses equals the simulated timeline the
report draws, for every schedule."""

import pytest

from meshwise.cost.pipeline import bubble_fraction, simulate, simulated_bubble_fraction

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4), ("zero-bubble", 1), ("zero-bubble", 2)]
# m >= p everywhere, and m < p where torch allows it (GPipe, interleaved: layout.check_microbatches)
CASES = [(sch, v, p, m) for sch, v in SCHEDULES for p in (2, 4, 8) for m in (p, 2 * p, 4 * p)]
CASES += [(sch, v, p, m) for sch, v in SCHEDULES if sch in ("gpipe", "interleaved-1f1b") for p, m in ((4, 2), (8, 3))]


@pytest.mark.parametrize("schedule, v, p, m", CASES)
def test_closed_form_equals_simulation(schedule, v, p, m):
    assert simulated_bubble_fraction(schedule, p, v, m) == pytest.approx(bubble_fraction(schedule, p, v, m), abs=1e-9)


def test_timeline_respects_dependencies():
    ops = simulate("interleaved-1f1b", 4, 2, 8)
    end = {(o.kind, o.chunk, o.microbatch): o.end for o in ops}
    start = {(o.kind, o.chunk, o.microbatch): o.start for o in ops}
    for (kind, c, i), t in start.items():
        if kind == "F" and c > 0:
            assert t >= end[("F", c - 1, i)]
        if kind == "B" and c < 7:
            assert t >= end[("B", c + 1, i)]
    by_rank = {}
    for o in ops:
        by_rank.setdefault(o.rank, []).append((o.start, o.end))
    for spans in by_rank.values():  # a rank runs one op at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
