"""meshwise tune's pure parts: the field, trial bookkeeping and early stop, the results file, the
refit of the profile to measured parts and the re-ranking loop, with a fake measurer: the cost
model itself under a "true" profile whose factors the refit does not know."""

from __future__ import annotations

import math
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from meshwise.catalog import read_catalog
from meshwise.errors import MeshwiseError
from meshwise.files import read_toml
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_model
from meshwise.tune import refit as refit_mod
from meshwise.tune.field import CPU_RELATIVE_BAND, FIELD_MAX, Candidate, field_of, plan_pool, step_key
from meshwise.tune.refit import BANDWIDTH, COMPUTE, FIXED, LATENCY, REDUCE_SCATTER, Predictor, refit, scaled
from meshwise.tune.trials import (
    MEASURED,
    OVER_LIMIT,
    RUNOFF,
    STOPPED,
    Trial,
    best_trial,
    noise_of,
    read_results,
    runoff_contenders,
    runoff_decided,
    runoff_over,
    runoff_passes,
    runoff_steps_min,
    should_stop,
    step_budget,
    steps_used,
    timed_steps,
    trials_used,
    write_results,
)
from meshwise.tune.tuner import HELD_OUT_MIN, Tune, default_trials

CPU = {"name": "cpu", **read_catalog("accelerators.toml")["cpu"]}


def _setup(model: str = "tiny", world: int = 2, seq: int = 64):
    spec = load_model(model)
    train = TrainSpec(global_batch=8, seq_len=seq, precision="fp32")
    predictor = Predictor(spec, train, world, world, 1)
    return spec, train, predictor, plan_pool(spec, predictor.cluster(CPU), train, seq)


def _truth(compute: float = 1.6, latency: float = 3.0, bandwidth: float = 0.5, fixed: float = 1.3) -> dict:
    """A profile the refit must find: the catalog's with each fit's keys scaled by a known factor."""
    t = scaled(CPU, COMPUTE, compute)
    t = scaled(t, LATENCY, latency)
    t = scaled(t, BANDWIDTH, bandwidth)
    return scaled(t, FIXED, fixed)


def _measure(predictor: Predictor, truth: dict, text: str, status: str = MEASURED, wobble: float = 0.0) -> Trial:
    """The fake measurer: the step and its parts as the true profile predicts them, each layout's
    off by its own fixed share within +-``wobble`` (what no profile factor explains)."""
    predicted = predictor.step(CPU, parse(text)).step_s
    if status != MEASURED:
        return Trial(text, status, predicted, peak_bytes=2000)
    t = predictor.step(truth, parse(text))
    k = 1 + wobble * math.sin(zlib.crc32(text.encode()))
    parts = {
        "compute_s": t.compute_s * k,
        "comm_s": t.comm_exposed_s * k,
        "idle_s": t.bubble_s * k,
        "optimizer_s": t.optimizer_s * k,
        "fixed_s": t.fixed_s * k,
    }
    return Trial(text, status, predicted, [t.step_s * k] * 3, parts, 1000)


# ------------------------------------------------------------------------------------- field
def test_field_is_the_band_around_the_fastest():
    pool = [Candidate(parse("dp=2"), s) for s in (1.3, 1.0, 1.29, 1.2)]
    # s (1 - b) <= best (1 + b): 1.29 * 0.87 = 1.122 <= 1.13, 1.3 * 0.87 = 1.131 > 1.13
    assert [c.predicted_step_s for c in field_of(pool, 0.13)] == [1.0, 1.2, 1.29]
    assert field_of([], 0.13) == []


def test_pool_is_distinct_in_what_changes_the_step():
    spec, _, _, pool = _setup()
    keys = [step_key(c.layout, spec.experts > 0) for c in pool]
    assert len(keys) == len(set(keys)) and len(pool) >= 8
    assert [c.predicted_step_s for c in pool] == sorted(c.predicted_step_s for c in pool)
    assert step_key(parse("dp=2,schedule=gpipe"), False) == step_key(parse("dp=2"), False)  # no PP: no schedule
    assert step_key(parse("pp=2,schedule=gpipe"), False) != step_key(parse("pp=2"), False)


# ---------------------------------------------------------------------------- bookkeeping
def test_early_stop_only_beyond_the_noise():
    assert not should_stop([1.04], None, 0.05)  # no best yet
    assert not should_stop([1.5, 1.4], 1.0, 0.05)  # never before its third timed step
    assert not should_stop([1.2, 1.3, 1.04], 1.0, 0.05)  # its fastest step is within the noise
    assert should_stop([1.2, 1.3, 1.06], 1.0, 0.05)
    assert noise_of([1.0]) == pytest.approx(0.02) and noise_of([1.0, 1.1, 1.3]) == pytest.approx(0.3 / 1.1)


def test_short_steps_run_more_timed_steps():
    # enough steps for 1 s of timed work, at least --trial-steps, at most 4 times it
    assert timed_steps(5, 0.5) == 5 and timed_steps(5, 0.17) == 6 and timed_steps(5, 0.03) == 20
    assert timed_steps(5, 0.03, 0.5) == 17 and timed_steps(3, 0.0) == 12


def test_runoff_contenders_are_the_best_and_the_fastest_that_overlaps_it():
    trials = [
        Trial("a", MEASURED, 1.0, [1.00, 1.01, 1.03]),
        Trial("b", MEASURED, 1.0, [1.02, 1.10, 1.15]),  # 1.02 <= 1.03: overlaps a's steps
        Trial("c", MEASURED, 1.0, [1.04, 1.05, 1.06]),  # faster median than b, no step as fast as a's slowest
        Trial("d", STOPPED, 1.0, [1.0, 1.0]),  # stopped early: never a contender
        Trial("e", MEASURED, 1.0, [1.03, 1.20, 1.21]),  # overlaps too, slower than b
    ]
    assert [t.layout for t in runoff_contenders(trials)] == ["a", "b"]
    assert runoff_contenders(trials[:1] + trials[2:4]) == []  # none overlaps the best's steps
    done = [*trials, Trial("b", RUNOFF, 1.0, [1.0, 1.0]), Trial("a", RUNOFF, 1.0, [1.1, 1.1])]
    assert runoff_contenders(done) == [] and best_trial(done).layout == "b"  # the run-off decides


def test_runoff_ends_once_the_steps_stop_overlapping():
    assert not runoff_decided([[1.0, 1.0], [2.0, 2.0]])  # two passes: too few to tell
    assert runoff_decided([[1.0, 1.1, 1.05], [1.2, 1.15, 1.3]])  # every step of b slower than every one of a
    assert runoff_decided([[1.2, 1.15, 1.3], [1.0, 1.1, 1.05]])
    assert not runoff_decided([[1.0, 1.2, 1.05], [1.15, 1.1, 1.3]])  # overlap: run on
    assert not runoff_decided([[1.0, 1.0, 1.0]])


def test_runoff_ends_once_model_and_measurement_agree():
    """After two passes the run-off ends where its leader is the refitted profile's faster contender,
    and runs on where they disagree until its steps stop overlapping."""
    assert not runoff_over([[1.0], [1.2]], [1.0, 1.1])  # one pass: too few
    assert runoff_over([[1.0, 1.15], [1.2, 1.1]], [1.0, 1.1])  # a leads (1.075 < 1.15), predicted faster
    assert not runoff_over([[1.0, 1.15], [1.2, 1.1]], [1.1, 1.0])  # the profile favours b: run on
    assert not runoff_over([[1.0, 1.15, 1.1], [1.2, 1.1, 1.12]], [1.1, 1.0])  # still overlapping
    assert runoff_over([[1.0, 1.05, 1.08], [1.2, 1.1, 1.12]], [1.1, 1.0])  # decided against the profile


def test_a_trial_is_a_layout_measured_and_the_runoff_counts_in_steps():
    """One counting rule: trials are layouts measured (a run-off re-measures, no trial); steps are
    every warm-up and timed step, the run-off's one warm-up per contender included."""
    trials = [
        Trial("a", MEASURED, 1.0, [1.0] * 5),  # 2 + 5
        Trial("b", STOPPED, 1.0, [1.5] * 2),  # 2 + 2
        Trial("c", OVER_LIMIT, 1.0, peak_bytes=9),  # its warm-up alone: 2
        Trial("a", RUNOFF, 1.0, [1.0] * 3),  # 1 + 3
        Trial("b", RUNOFF, 1.0, [1.1] * 3),  # 1 + 3
    ]
    assert trials_used(trials) == 3 and steps_used(trials, warmup=2) == 7 + 4 + 2 + 4 + 4
    assert step_budget(4, 2, 5) == 28  # the steps of 4 whole trials: a third of 12 layouts x (2 + 5)
    assert runoff_passes(7) == 2 and runoff_passes(5) == 0 and runoff_passes(10) == 4  # 2 warm-up, 2 per pass


def test_best_trial_ignores_what_did_not_fit_or_stopped_early():
    trials = [
        Trial("a", MEASURED, 1.0, [2.0, 2.2, 2.1], {"compute_s": 1.5, "comm_s": 0.6}),
        Trial("b", STOPPED, 1.0, [1.0], {"compute_s": 1.0}),
        Trial("c", OVER_LIMIT, 0.5, peak_bytes=10),
        Trial("d", MEASURED, 1.0, [1.9, 1.95, 5.0], {"comm_s": 1.5, "compute_s": 0.4}),
    ]
    assert best_trial(trials).layout == "d"
    assert trials[3].measured_step_s == 1.95 and trials[2].measured_step_s is None
    assert (trials[0].binds, trials[2].binds, trials[3].binds) == ("compute", "memory", "communication")
    assert best_trial(trials[2:3]) is None


def test_results_file_round_trip_and_refusal(tmp_path):
    path = tmp_path / "trials.jsonl"
    trials = [
        Trial("dp=2", MEASURED, 1.0, [1.0, 1.1], {"compute_s": 0.9}, 123, 0),
        Trial("pp=2", OVER_LIMIT, 0.8, peak_bytes=456, round=1),
    ]
    inputs = {"model": "tiny", "world": 2}
    write_results(path, inputs, trials)
    assert read_results(path, inputs) == trials
    with pytest.raises(MeshwiseError, match="world = 2, not 4"):
        read_results(path, {"model": "tiny", "world": 4})
    path.write_text("not json\n")
    with pytest.raises(MeshwiseError, match="not a tune results file"):
        read_results(path, inputs)


# ---------------------------------------------------------------------------------- refit
@pytest.mark.parametrize("model, seq", [("tiny", 64), ("small", 128)])
def test_refit_recovers_known_factors(model, seq):
    """Measured parts from a profile with known factors: the refit finds each step again."""
    _, _, predictor, pool = _setup(model, seq=seq)
    truth = _truth()
    texts = [c.text for c in pool[:6]]
    measured = [(parse(t), _measure(predictor, truth, t).parts) for t in texts]
    table, factors = refit(CPU, measured, predictor)
    assert factors["compute"] == pytest.approx(1.6, rel=0.05)
    for text in [c.text for c in pool[6:12]] + texts:  # trialled and untried alike
        assert predictor.step(table, parse(text)).step_s == pytest.approx(
            predictor.step(truth, parse(text)).step_s, rel=0.05
        )
    base_error = max(
        abs(predictor.step(CPU, parse(t)).step_s / predictor.step(truth, parse(t)).step_s - 1) for t in texts
    )
    assert base_error > 0.2  # the test can fail: the base profile was far off


def test_refit_tells_reduce_scatter_from_the_links():
    """gloo's reduce-scatter costs about an all-reduce of its tensor, the catalog's cpu profile prices
    the ring formula, half that: ZeRO over 2 of 4 ranks then looks faster than DDP over 4. A trial of
    ZeRO alone cannot tell the reduce-scatter from the links; one of ZeRO and one of DDP can."""
    _, _, predictor, _ = _setup("small", world=4, seq=128)
    truth = scaled(scaled(dict(CPU, reduce_scatter_ratio=1.0), BANDWIDTH, 2.0), LATENCY, 2.0)
    zero2, ddp = "dp=4,zero=2,shard=2,mbs=2", "dp=4,zero=0,shard=4,mbs=2"
    step = lambda table, text: predictor.step(table, parse(text)).step_s  # noqa: E731
    assert step(CPU, zero2) < step(CPU, ddp) and step(truth, ddp) < step(truth, zero2)  # the test can fail
    measured = lambda texts: [(parse(t), _measure(predictor, truth, t).parts) for t in texts]  # noqa: E731
    alone, factors = refit(CPU, measured([zero2, "dp=4,zero=1,shard=2,mbs=2"]), predictor)
    assert factors[REDUCE_SCATTER.name] == factors["bandwidth"]  # one factor for the link keys
    both, factors = refit(CPU, measured([zero2, ddp]), predictor)
    assert factors[REDUCE_SCATTER.name] == pytest.approx(2.0, rel=0.05)
    assert step(both, ddp) < step(both, zero2)
    for text in (zero2, ddp, "dp=4,zero=2,shard=4,mbs=2", "dp=4,zero=3,shard=2,mbs=2"):  # tried and untried
        assert step(both, text) == pytest.approx(step(truth, text), rel=0.05)


def test_refit_leaves_what_it_cannot_see():
    _, _, predictor, pool = _setup(world=1)
    one = pool[0].text
    table, factors = refit(CPU, [(parse(one), _measure(predictor, _truth(), one).parts)], predictor)
    assert factors["latency"] == factors["bandwidth"] == factors["reduce-scatter"] == 1.0  # one process: no link
    assert table["intra_bytes_per_s"] == CPU["intra_bytes_per_s"] and "reduce_scatter_ratio" not in table


def test_refit_factor_is_bounded():
    _, _, predictor, pool = _setup()
    text = pool[0].text
    parts = dict(_measure(predictor, CPU, text).parts, compute_s=1e6)
    _, factors = refit(CPU, [(parse(text), parts)], predictor)
    assert factors["compute"] <= refit_mod.MAX_FACTOR * 1.0001


# ------------------------------------------------------------------------------ the loop
def _run(tune: Tune, measure) -> list[Trial]:
    while (found := tune.next()) is not None:
        candidate, rnd = found
        t = measure(candidate.text)
        tune.record(Trial(t.layout, t.status, candidate.predicted_step_s, t.steps_s, t.parts, t.peak_bytes, rnd))
    return tune.trials


def test_loop_tries_the_field_then_agrees():
    """With a true profile close to the base one, the pick is the measured best of the pool, and the
    refitted model drops field members that cannot win."""
    _, _, predictor, pool = _setup()
    truth = _truth(compute=1.1, latency=1.0, bandwidth=1.0, fixed=1.0)
    tune = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND)
    trials = _run(tune, lambda t: _measure(predictor, truth, t))
    true_best = min(pool, key=lambda c: predictor.step(truth, c.layout).step_s).text
    assert best_trial(trials).layout == true_best
    assert len({t.layout for t in trials}) == len(trials)  # no layout twice
    assert len(trials) < len(tune.field)  # the refit dropped some of the field
    assert all(abs(e) < 0.05 for e in tune.errors(tune.table))


def test_loop_reranks_when_the_first_ranking_is_wrong():
    """Links 30x slower to start than a calibrated profile says (tests/data/tune_profile_2p.toml,
    this project's 2-core VM): the fastest layout at 4 ranks is outside the field the profile
    draws; after the refit it is predicted faster than the measured best, tried, and picked."""
    base = read_toml(Path(__file__).parents[1] / "data" / "tune_profile_2p.toml", "profile")
    spec = load_model("tiny")
    train = TrainSpec(global_batch=8, seq_len=128, precision="fp32")
    predictor = Predictor(spec, train, 4, 4, 1)
    pool = plan_pool(spec, predictor.cluster(base), train, 128)
    truth = dict(base, intra_latency_s=base["intra_latency_s"] * 30, inter_latency_s=base["inter_latency_s"] * 30)
    tune = Tune(pool, dict(base), predictor, 0.13)  # a band narrow enough that the true best lies outside
    true_best = min(pool, key=lambda c: predictor.step(truth, c.layout).step_s).text
    assert true_best not in tune.field
    trials = _run(tune, lambda t: _measure(predictor, truth, t))
    assert best_trial(trials).layout == true_best
    assert next(t.round for t in trials if t.layout == true_best) >= 1
    assert len(trials) <= len(tune.field) // 3


def test_held_out_band_counts_trials_stopped_early():
    """Three trials, one stopped early, set the band from the held-out error; two keep the planned one."""
    _, _, predictor, pool = _setup()
    a, b, c = (_measure(predictor, _truth(), x.text, wobble=0.1) for x in pool[:3])
    trials = [a, b, replace(c, status=STOPPED, steps_s=c.steps_s[:2])]
    assert Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, trials=trials[:2]).band == CPU_RELATIVE_BAND
    assert Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, trials=trials).band < CPU_RELATIVE_BAND


def test_loop_respects_max_trials_and_resumed_trials():
    _, _, predictor, pool = _setup()
    truth = _truth()
    first = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=1)
    done = _run(first, lambda t: _measure(predictor, truth, t, wobble=0.3))
    assert len(done) == 1
    seen: list[str] = []

    def measure(text: str) -> Trial:
        seen.append(text)
        return _measure(predictor, truth, text, wobble=0.3)

    resumed = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=4, trials=list(done))
    assert resumed.factors  # the resumed trial already refitted the profile
    assert resumed.next(out_of_time=True) is None and resumed.next() is not None  # --budget-minutes spent
    trials = _run(resumed, measure)
    assert 1 <= len(seen) <= 3 and not set(seen) & {t.layout for t in done}
    assert trials[:1] == done and len({t.layout for t in trials}) == len(trials)


def test_trial_that_does_not_fit_never_ends_the_tune():
    _, _, predictor, pool = _setup()
    truth = _truth()
    first = pool[0].text
    tune = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=3)
    trials = _run(tune, lambda t: _measure(predictor, truth, t, OVER_LIMIT if t == first else MEASURED, 0.3))
    assert trials[0].layout == first and not trials[0].fits and len(trials) >= 2 and trials[1].fits
    assert trials[0].peak_bytes == 2000 and trials[0].binds == "memory"
    assert best_trial(trials).layout != first


def test_exhaustive_tries_the_first_n_and_nothing_else():
    _, _, predictor, pool = _setup()
    tune = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, exhaustive=8)
    trials = _run(tune, lambda t: _measure(predictor, _truth(), t, wobble=0.3))
    assert [t.layout for t in trials] == [c.text for c in pool[:8]] and not tune.dropped
    assert tune.runoff() == []  # no run-off either


def test_loop_ends_with_a_runoff_that_picks():
    """Two layouts whose steps overlap go to the run-off; its fastest is the pick, after it the tune
    is done; it is no trial, and it runs only in the steps the budget has left."""
    _, _, predictor, pool = _setup()
    a, b = (_measure(predictor, _truth(), c.text) for c in pool[:2])
    s = a.steps_s[0]
    trials = [replace(a, steps_s=[s, 1.2 * s, 1.1 * s]), replace(b, steps_s=[1.05 * s] * 3)]
    tune = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, trials=list(trials), warmup=2, timed=3)
    assert [t.layout for t in tune.runoff()] == [b.layout, a.layout] and tune.runoff(out_of_time=True) == []
    # --trials 2: 2 x (2 + 3) = 10 steps, all spent by the two trials: no run-off
    assert (
        Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=2, trials=list(trials), timed=3).runoff() == []
    )
    # --trials 3: 5 steps left: two warm-ups and one pass, fewer than RUNOFF_MIN_PASSES
    assert (
        Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=3, trials=list(trials), timed=3).runoff() == []
    )
    assert (
        Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=4, trials=list(trials), timed=3).runoff_passes()
        == 4
    )
    for t in (replace(a, status=RUNOFF, steps_s=[1.1 * s] * 3), replace(b, status=RUNOFF, steps_s=[s] * 3)):
        tune.record(t)
    assert best_trial(tune.trials).layout == b.layout and tune.next() is None and tune.runoff() == []
    assert tune.trials_used == 2


def test_budget_is_a_third_of_the_field_in_trials_and_steps():
    """Without --trials a tune may use a third of its field (at least HELD_OUT_MIN trials) and the
    steps of that many whole trials; it starts no trial its steps do not fit, and a short-stepped
    trial runs more timed steps only with steps the trials before it left."""
    _, _, predictor, pool = _setup("small", world=2, seq=128)
    tune = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND)
    assert len(tune.field) == FIELD_MAX and len(pool) > FIELD_MAX  # the field is capped, the pool is not
    assert tune.max_trials == 4 and tune.budget_steps == 4 * (2 + 5) == 28
    assert default_trials(8) == HELD_OUT_MIN and default_trials(30) == 10
    assert tune.max_timed_steps() == 5  # 28 steps over 4 trials: no step to spare
    tune.record(_measure(predictor, _truth(), tune.next()[0].text, OVER_LIMIT))  # its 2 warm-up steps of 7
    assert tune.steps_used == 2 and tune.max_timed_steps() == 26 // 3 - 2  # its 5 spare steps shared
    long = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, max_trials=2)
    over = _measure(predictor, _truth(), long.next()[0].text)
    long.record(replace(over, steps_s=over.steps_s * 3))  # 2 + 9 steps: 3 left, a whole trial needs 7
    assert long.next() is None and long.runoff() == []
    # two trials whose steps overlap: the smallest run-off's 6 steps are kept from the trials
    a, b = (_measure(predictor, _truth(), c.text) for c in pool[:2])
    near = [replace(a, steps_s=[1.0, 1.1, 1.05, 1.0, 1.0]), replace(b, steps_s=[1.08, 1.2, 1.1, 1.1, 1.1])]
    tied = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, trials=near, max_trials=3)  # 21 steps, 14 spent
    assert runoff_steps_min() == 6 and tied.steps_left == 7 and tied.steps_for_trials == 1
    assert tied.next() is None and tied.runoff() and tied.runoff_passes() == 2
    apart = [near[0], replace(near[1], steps_s=[1.3, 1.4, 1.35, 1.3, 1.3])]
    assert Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, trials=apart, max_trials=3).steps_for_trials == 7
    ex = Tune(pool, dict(CPU), predictor, CPU_RELATIVE_BAND, exhaustive=20)
    assert ex.budget_steps is None and ex.max_timed_steps() == 0  # the benchmark's ground truth: unbounded


@pytest.mark.parametrize("name", ["h100", "b200", "cpu"])
def test_written_profile_plans_as_the_catalog_entry(tmp_path, name):
    """The profile a tune writes, before any refit, is the same accelerator to plan --gpu: every
    key kept, a GPU's op-model sub-tables included."""
    from meshwise.cost.estimate import estimate
    from meshwise.spec import load_cluster
    from meshwise.tune.refit import profile_text

    path = tmp_path / "profile.toml"
    path.write_text(profile_text({"name": name, **read_catalog("accelerators.toml")[name]}))
    spec = load_model("llama3-8b")
    train = TrainSpec(global_batch=64, seq_len=4096, precision="bf16-mixed")
    for text in ("dp=16,zero=3,mbs=2,ac=selective", "dp=2,tp=8,pp=1,mbs=1"):
        layout = parse(text, 16)
        ours = estimate(spec, load_cluster(str(path), 16, 8), train, layout)
        catalog = estimate(spec, load_cluster(name, 16, 8), train, layout)
        assert ours.time == catalog.time and ours.memory == catalog.memory
