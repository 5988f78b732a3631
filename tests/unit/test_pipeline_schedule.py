"""The schedule model: the closed-form bubble the search uses equals the simulated timeline the
report draws, for every schedule."""

import pytest

from meshwise.cost.pipeline import bubble_fraction, simulate, simulated_bubble_fraction

SCHEDULES = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("interleaved-1f1b", 4),
    ("zero-bubble", 1),
    ("zero-bubble", 2),
]
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


# ------------------------------------------------------------ long steps: a bounded walk
@pytest.mark.parametrize("p, v", [(2, 2), (3, 4), (4, 3), (8, 2)])
def test_long_walk_equals_full_walk(monkeypatch, p, v):
    """A step of many rounds is walked as WALK_ROUNDS rounds: the same moments, busiest flights and
    gathers (extrapolated per round) as the full walk, on every rank."""
    from meshwise.cost import pipeline

    for m in (p * (p + 1) + p * 3, p * 29):
        m = max(m, pipeline.WALK_ROUNDS * p + p)
        assert pipeline.walked_microbatches(p, m) < m
        for rank in range(p):
            short = (
                [pipeline.interleaved_moments(p, v, m, rank, e, f) for e in (0, 1) for f in (0, 1)],
                pipeline.interleaved_gathers(p, v, m, rank),
                pipeline._busiest_flights(p, v, pipeline.walked_microbatches(p, m), rank),
            )
            with monkeypatch.context() as mp:
                mp.setattr(pipeline, "WALK_ROUNDS", 10**9)
                pipeline.interleaved_moments.cache_clear(), pipeline.interleaved_gathers.cache_clear()
                full = (
                    [pipeline.interleaved_moments(p, v, m, rank, e, f) for e in (0, 1) for f in (0, 1)],
                    pipeline.interleaved_gathers(p, v, m, rank),
                    pipeline._busiest_flights(p, v, m, rank),
                )
            pipeline.interleaved_moments.cache_clear(), pipeline.interleaved_gathers.cache_clear()
            assert short == full, (p, v, m, rank)


def test_huge_batch_walks_a_bounded_step(monkeypatch, capsys):
    """A global batch of 10^8 sequences (a batch typed in tokens) is planned with no pipeline walk
    longer than WALK_ROUNDS rounds (it ran out of memory walking 10^8 micro-batches)."""
    from meshwise.cli import main
    from meshwise.cost import pipeline

    walked = []
    order = pipeline._local_order.__wrapped__

    def spy(p, v, m, rank):
        walked.append((p, m))
        assert m <= max(8 * p, p * (p + 1)), f"a walk of {m} micro-batches"
        return order(p, v, m, rank)

    monkeypatch.setattr(pipeline, "_local_order", spy)
    for fn in (
        pipeline.interleaved_moments,
        pipeline.interleaved_gathers,
        pipeline.busiest_blocks,
        pipeline._busiest_flights,
        pipeline._lookahead_of,
    ):
        fn.cache_clear()
    assert main(["plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "100000000", "--json"]) == 0
    assert walked


def test_huge_batch_plans_in_bounded_memory():
    """The same plan in a process limited to 2 GB of address space (it reached 24 GB)."""
    import subprocess
    import sys

    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); from meshwise.cli import "
        "main; raise SystemExit(main(['plan', '--model', 'llama3-8b', '--gpus', '64', '--global-batch', "
        "'100000000', '--json']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
