"""The published runs' split into a development and a test set (src/meshwise/catalog/published_runs.toml):
every run has a set and an origin, an origin never straddles the sets, the held-out sources stay out,
and every run parses and fits its world size. Nothing here predicts a run."""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity import SETS, load_runs, records  # noqa: E402
from meshwise.layout import runtime_refusal, validate  # noqa: E402

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
