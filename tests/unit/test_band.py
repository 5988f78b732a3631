"""The band around a plan's figures (plan/band.py, catalog/bands.toml, benchmarks/band.py): the category
lookup and its fallbacks, the narrower band of a calibrated profile, the table's construction from dev
errors, and where the band shows (table, "Chosen:" line, budget, --json)."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import band as band_bench  # noqa: E402
from meshwise import cli  # noqa: E402
from meshwise.catalog import read_catalog  # noqa: E402
from meshwise.plan.band import Band, band_for, category_of, lookup, text  # noqa: E402
from meshwise.spec import TrainSpec, load_cluster, load_model  # noqa: E402


def _row(key, low, high, runs=9, sources=3):
    return {"category": key, "low": low, "high": high, "coverage": 0.9, "runs": runs, "sources": sources}


def test_the_most_specific_row_answers_then_the_broader_ones_in_order():
    table = {
        k: _row(k, -0.1, 0.1)
        for k in ("catalog/dense/hopper/fp8", "catalog/dense/hopper", "catalog/dense/*/fp8", "catalog/dense")
    }
    cat = category_of(False, "h100", "fp8", calibrated=False)
    got = []
    for key in cat.keys():
        b = lookup(cat, table)
        got.append(b.category)
        assert b.asked == "catalog/dense/hopper/fp8"
        del table[key]
    assert got == ["catalog/dense/hopper/fp8", "catalog/dense/hopper", "catalog/dense/*/fp8", "catalog/dense"]
    assert lookup(cat, table) is None


def test_categories_read_kind_family_precision_and_profile():
    assert category_of(True, "gb200", "mxfp8", True).keys()[0] == "calibrated/moe/blackwell/fp8"
    assert category_of(False, "a100-80gb", "bf16-mixed", False).keys()[0] == "catalog/dense/ampere/bf16"
    assert category_of(False, "H800", "fp8-blockwise", False).keys()[0] == "catalog/dense/hopper/fp8"
    assert category_of(False, "some-new-chip", "bf16", False).keys()[-1] == "catalog/dense"
    # a CPU takes no GPU run's band: only rows of its own family, and the table has none
    assert lookup(category_of(False, "cpu", "bf16", False)) is None


def test_the_catalog_table_has_a_row_for_every_kind_and_profile():
    rows = {r["category"]: r for r in read_catalog("bands.toml")["band"]}
    for key in ("catalog/dense", "catalog/moe", "calibrated/dense", "calibrated/moe"):
        assert key in rows
    for r in rows.values():
        assert r["low"] <= r["high"] and 0 < r["coverage"] <= 1 and r["runs"] >= 1 and r["sources"] >= 1


def test_a_calibrated_profile_narrows_the_band():
    model, train = load_model("llama3-70b"), TrainSpec(512, 4096)
    accel = load_cluster("h100", 64).accelerator
    catalog = band_for(model, accel, train)
    calibrated = band_for(model, replace(accel, calibrated_on="meshwise calibrate, 2026-12-07"), train)
    assert catalog.category.startswith("catalog/") and calibrated.category.startswith("calibrated/")
    assert calibrated.high - calibrated.low < catalog.high - catalog.low


def test_band_arithmetic_and_text():
    b = Band(-0.1, 0.2, "catalog/dense", "catalog/dense/hopper/bf16", 0.9, 10, 3)
    assert b.around(10.0) == pytest.approx((9.0, 12.0))
    assert b.around_rate(1200.0) == pytest.approx((1000.0, 1200.0 / 0.9))
    assert text(b, 7.28, ".3g") == "7.28 (6.55-8.74)"
    assert text(None, 7.28, ".3g") == "7.28"


def _points(offsets, scatter):
    """Three clusters whose runs share an offset, each with the same scatter about it."""
    out = []
    for i, off in enumerate(offsets):
        for j, s in enumerate(scatter):
            cat = category_of(False, "h100", "bf16", False)
            out.append(band_bench.Point(f"r{i}{j}", f"src{i}", "h100", cat, off + s))
    return out


def test_calibrated_rows_keep_the_scatter_and_drop_the_offsets():
    points = _points([-0.2, 0.0, 0.3], [-0.02, 0.0, 0.02, 0.01, -0.01])
    catalog = band_bench.build(points, 1.0)["catalog/dense"]
    cal = band_bench.build(band_bench.calibrated(points), 1.0)["calibrated/dense"]
    assert catalog["low"] == pytest.approx(-0.22) and catalog["high"] == pytest.approx(0.32)
    assert cal["low"] == pytest.approx(-0.02) and cal["high"] == pytest.approx(0.02)


def test_a_row_needs_enough_runs_and_sources_but_the_kind_row_is_always_there():
    points = _points([0.0, 0.1], [0.0, 0.01, 0.02])  # two sources: below MIN_SOURCES
    table = band_bench.build(points, 0.9)
    assert set(table) == {"catalog/dense"}


def test_source_weighted_rows_count_each_source_once():
    """Source-weighted (the default): a source of many runs sharing one offset weighs as much as a source of one, so the
    row's median and spread are the sources', not the big source's; with one run per source it is the plain
    quantile."""
    cat = category_of(False, "h100", "bf16", False)
    big = [band_bench.Point(f"b{j}", "big", "h100", cat, 0.10 + 0.001 * j) for j in range(18)]
    small = [band_bench.Point(f"s{i}", f"src{i}", "h100", cat, e) for i, e in enumerate((-0.1, 0.0))]
    plain = band_bench.build(big + small, 0.8)["catalog/dense"]
    weighted = band_bench.build(big + small, 0.8, weighted=True)["catalog/dense"]
    assert plain["low"] > 0.05  # the 18 runs of one source set the plain row's 10th percentile
    assert weighted["low"] < -0.05 and weighted["high"] > 0.1
    singles = [band_bench.Point(f"x{i}", f"x{i}", "h100", cat, e) for i, e in enumerate((-0.2, 0.0, 0.1, 0.3))]
    for q in (0.1, 0.5, 0.9):
        assert band_bench.weighted_quantile(singles, q) == pytest.approx(
            band_bench.quantile([p.error for p in singles], q)
        )


def test_leave_one_source_out_bands_a_source_without_it():
    points = _points([-0.2, 0.0, 0.3], [-0.02, 0.0, 0.02, 0.01, -0.01])
    banded = band_bench.leave_one_source_out(points, 1.0, 1.0)
    for p, low, high, _ in banded:
        if p.origin == "src2":  # built from the other two sources only: it cannot cover +0.3
            assert high == pytest.approx(0.02) and not low <= p.error <= high
    inside, _ = band_bench.scores(banded)
    assert inside == pytest.approx(5 / 15)


def test_plan_json_carries_the_band_of_every_figure(capsys):
    assert (
        cli.main(
            ["plan", "--model", "llama3-8b", "--gpus", "8", "--json", "--tokens", "1e12", "--price-per-gpu-hour", "2"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    for c in data["candidates"]:
        b = c["band"]
        assert b["category"].startswith("catalog/dense/hopper") and b["asked"] == "catalog/dense/hopper/bf16"
        assert 0 < b["coverage"] <= 1 and b["runs"] > 0 and b["sources"] > 0
        low, high = b["step_s"]["low"], b["step_s"]["high"]
        assert low <= high and b["tokens_per_s"]["low"] <= b["tokens_per_s"]["high"]
        assert b["tokens_per_s"]["low"] * high == pytest.approx(c["tokens_per_s"] * c["time"]["step_s"], rel=1e-9)
        t = c["train_time"]
        for name in ("days", "gpu_hours", "cost"):
            assert t["band"][name]["low"] / t[name] == pytest.approx(low / c["time"]["step_s"], rel=1e-9)


def test_plan_text_shows_the_band_in_the_table_and_the_chosen_line(capsys):
    assert cli.main(["plan", "--model", "llama3-8b", "--gpus", "8", "--top", "2"]) == 0
    out = capsys.readouterr().out
    chosen = next(line for line in out.splitlines() if line.startswith("Chosen:"))
    assert " s/step, " in chosen and ") s/step" in chosen and ") tokens/s" in chosen
    assert "in brackets: the time model's error range on" in " ".join(out.split())  # the title may wrap
