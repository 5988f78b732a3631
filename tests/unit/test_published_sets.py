"""The published runs' split into a development set and two test sets (src/meshwise/catalog/published_runs.toml):
every run has a set and an origin, an origin never straddles the sets, the held-out sources stay out,
and every run parses and fits its world size; test2's validation resolves its runs and prices none.
Nothing here predicts a run."""

import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity  # noqa: E402
from fidelity import SETS, load_runs, records  # noqa: E402
from meshwise.cost import estimate as estimate_module  # noqa: E402
from meshwise.errors import MeshwiseError  # noqa: E402
from meshwise.layout import runtime_refusal, validate  # noqa: E402
from meshwise.plan import planner  # noqa: E402
from meshwise.plan.band import family  # noqa: E402
from meshwise.spec.cluster import catalog_accelerator  # noqa: E402

HELD_OUT = ("Korthikanti", "MegaScale", "Megatron-LM README", "2407.21783", "Llama 3 (2024) Table 4")


def test_every_run_has_a_set_an_origin_and_a_kind():
    for rec in records():
        assert rec.get("set") in SETS, rec["id"]
        assert rec.get("origin"), rec["id"]
        assert isinstance(rec.get("moe"), bool), rec["id"]


def test_ids_are_unique():
    ids = [rec["id"] for rec in records()]
    assert len(ids) == len(set(ids))


def test_an_origin_is_on_one_side_only():
    sides = defaultdict(set)
    for rec in records():
        sides[rec["origin"]].add(rec["set"])
    straddling = {origin: s for origin, s in sides.items() if len(s) > 1}
    assert not straddling


def test_the_first_39_dense_runs_are_dev():
    """Their handling was chosen while looking at them: they cannot be test data."""
    original = [rec for rec in records() if "precision" not in rec]
    assert len(original) == 39
    assert all(rec["set"] == "dev" and not rec["moe"] for rec in original)


def test_the_test_set_holds_dense_and_moe_runs_of_several_gpus_and_precisions():
    for set_name in SETS:
        new = [rec for rec in records() if rec["set"] == set_name and "precision" in rec]
        assert any(rec["moe"] for rec in new) and any(not rec["moe"] for rec in new), set_name
        assert len({rec["gpu"] for rec in new}) >= 2, set_name
        assert len({rec["precision"] for rec in new}) >= 2, set_name


def test_held_out_sources_stay_out_of_both_sets():
    for rec in records():
        assert not any(name in rec["source"] for name in HELD_OUT), rec["id"]


def test_moe_flag_matches_the_model_and_every_layout_fits():
    for run in load_runs():
        assert run.moe == run.model.moe, run.id
        validate(run.layout, run.model, run.cluster.world_size, run.train.global_batch)
        assert runtime_refusal(run.layout, run.model, run.train.seq_len, run.train.runtime) is None, run.id


# NeMo's performance summaries of the 25.09 container and later stay out (Megatron-Bridge publishes them).
EXCLUDED_FROM = (25, 9)


def test_nemo_summaries_of_25_09_and_later_stay_out():
    for rec in records():
        text = f"{rec['source']} {rec['origin']}"
        assert "Megatron-Bridge" not in text, rec["id"]
        for yy, mm in re.findall(r"NeMo (\d\d)\.(\d\d)", text):
            assert (int(yy), int(mm)) < EXCLUDED_FROM, rec["id"]


def _test2() -> list[dict]:
    return [rec for rec in records() if rec["set"] == "test2"]


def test_test2_spans_moe_dense_origins_and_gpu_generations():
    runs = _test2()
    assert len(runs) >= 20
    assert sum(rec["moe"] for rec in runs) >= 8
    assert len({rec["origin"] for rec in runs}) >= 4
    assert {family(catalog_accelerator(rec["gpu"])) for rec in runs} >= {"ampere", "hopper", "blackwell"}


def test_test2_sources_are_documents_no_other_set_read():
    """A whole document on one side: the repository and path (or title) a test2 run cites, before its
    parenthesis, is cited by no dev or test run."""
    others = " ".join(rec["source"] for rec in records() if rec["set"] != "test2")
    for rec in _test2():
        document = rec["source"].split(" (")[0]
        assert len(document) > 20 and document not in others, rec["id"]


# mosaicml/llm-foundry scripts/train/benchmarking/README.md (commit 4952183), the NumParams column
MPT_PARAMS = {
    "mpt-1b": 1315950592,
    "mpt-3b": 2651837440,
    "mpt-7b": 6658859008,
    "mpt-13b": 12853954560,
    "mpt-30b": 29975214080,
    "mpt-70b": 64862437376,
}


def test_mpt_models_count_the_parameters_their_benchmark_table_states():
    models = fidelity._models(fidelity._catalog())
    for name, count in MPT_PARAMS.items():
        assert models[name].params == count, name


def test_validate_resolves_every_test2_run_and_prices_none(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("the validation path priced a run")

    for module, name in (
        (fidelity, "estimate"),
        (fidelity, "search"),
        (fidelity, "band_for"),
        (fidelity, "predict"),
        (fidelity.compute, "hardware_flops"),
        (estimate_module, "estimate"),
        (planner, "search"),
    ):
        monkeypatch.setattr(module, name, refuse)
    fidelity.main(["--set", "test2", "--validate"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("ok ") for line in lines) == len(_test2())
    assert not any(line.startswith("FAIL") for line in lines)
    assert "predicted" not in " ".join(lines).replace("nothing predicted", "")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"gpu": "h100-nvl72x"}, "not a catalog accelerator"),
        ({"layout": "dp=8,zero=3,ep=3,mbs=4,ac=full"}, "ep=3"),
        ({"tokens_per_s_per_gpu": 100.0}, "exactly one"),
        ({"step_s": -1.0}, "exactly one"),
        ({"moe": False}, "moe = false"),
        ({"precision": "fp4"}, "precision"),
        ({"set": "holdout"}, "needs set"),
    ],
)
def test_validate_names_what_is_wrong_with_a_run(change, says):
    rec = next(r for r in _test2() if r["id"] == "automodel-h100-qwen3-30b-a3b-8") | change
    with pytest.raises(MeshwiseError, match=says):
        fidelity.check_run(rec, fidelity._models(fidelity._catalog()))


def test_validate_exits_non_zero_on_a_problem(monkeypatch, capsys):
    catalog = fidelity._catalog()
    broken = next(r for r in catalog["run"] if r["set"] == "test2") | {"layout": "dp=3,zero=3,mbs=1"}
    monkeypatch.setattr(fidelity, "_catalog", lambda: catalog | {"run": [broken]})
    with pytest.raises(SystemExit) as stop:
        fidelity.main(["--set", "test2", "--validate"])
    assert stop.value.code == 1
    assert capsys.readouterr().out.startswith(f"FAIL {broken['id']}: ")
