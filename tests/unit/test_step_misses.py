"""benchmarks/step_misses.py: the published runs the GPU time model misses beyond a bound, with the plan's
split of each step and the misses grouped by what they share (one seen set, test5: a second's pricing)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity  # noqa: E402
import step_misses  # noqa: E402


@pytest.fixture(scope="module")
def priced():
    return [step_misses.predicted(r) for r in fidelity.load_runs(set_name="test5")]


def test_the_split_sums_to_the_step_fidelity_predicts(priced):
    for m in priced:
        assert sum(m.parts_s) == pytest.approx(m.predicted_s, rel=1e-9)
        assert m.predicted_s == pytest.approx(fidelity.predict(m.run), rel=1e-12)
        assert sum(m.shares) == pytest.approx(1.0, rel=1e-9)


def test_exactly_the_runs_beyond_the_bound_are_listed_worst_first(priced):
    found = step_misses.misses(priced, 0.15)
    assert {m.run.id for m in found} == {m.run.id for m in priced if abs(m.error) > 0.15}
    assert [abs(m.error) for m in found] == sorted((abs(m.error) for m in found), reverse=True)
    assert step_misses.misses(priced, 9.0) == []


def test_groups_partition_the_misses_by_origin_gpu_runtime_and_parallelism(priced):
    found = step_misses.misses(priced, 0.0)
    grouped = step_misses.groups(found)
    assert sorted(m.run.id for ms in grouped.values() for m in ms) == sorted(m.run.id for m in found)
    for (origin, gpu, runtime, layout), members in grouped.items():
        assert all(m.group == (origin, gpu, runtime, layout) for m in members)
    sizes = [len(ms) for ms in grouped.values()]
    assert sizes == sorted(sizes, reverse=True)


def test_parallelism_names_the_dimension_that_shapes_the_step():
    runs = {r.id: r for r in fidelity.load_runs(set_name="test5")}
    assert step_misses.parallelism(runs["kempnerforge-h200-70b-32-tp4-pp4"]) == "PP 1f1b"
    assert step_misses.parallelism(runs["kempnerforge-h200-7b-4-tp4"]) == "TP"
    assert step_misses.parallelism(runs["kempnerforge-h200-7b-4-fsdp4"]) == "FSDP only"
    assert step_misses.parallelism(runs["kempnerforge-h200-7b-1-1gpu"]) == "DP only"


def test_the_summary_is_fidelitys_dense_figure(priced):
    dense = [m for m in priced if not m.run.moe]
    _, mean, worst = step_misses.summary(dense)
    errors = {m.run.id: m.error for m in dense}
    want = fidelity.report([m.run for m in dense], errors)["all"]
    assert (mean, worst) == pytest.approx(want[1:])


@pytest.mark.parametrize("argv", [["--sets", "test9"], ["--sets", ""], ["--beyond", "-0.1"]])
def test_bad_input_is_one_line_and_exit_status_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        step_misses.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(("--sets", "--beyond"))
