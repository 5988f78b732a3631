"""plan's extras: --tokens/--price-per-gpu-hour (time and cost), several --layout values in one table,
the batch hint, and --emit from the command line."""

from __future__ import annotations

import json
import re

import pytest

from meshwise.cli import main
from meshwise.plan.batch_hint import nearby_batches
from meshwise.plan.show import COLUMNS

TOKENS = 15e12


def _json(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tokens_figures_follow_tokens_per_s(capsys):
    out = _json(capsys, "--model", "llama3-8b", "--gpus", "64", "--tokens", "15e12", "--price-per-gpu-hour", "2.5")
    assert len(out["candidates"]) == 5
    for c in out["candidates"]:
        t = c["train_time"]
        seconds = TOKENS / c["tokens_per_s"]
        assert t["days"] == pytest.approx(seconds / 86400, rel=1e-12)
        assert t["gpu_hours"] == pytest.approx(seconds * 64 / 3600, rel=1e-12)
        assert t["cost"] == pytest.approx(t["gpu_hours"] * 2.5, rel=1e-12)


def _rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_table_figures_agree_with_tokens_per_s_to_the_rounding_shown(capsys):
    assert (
        main(["plan", "--model", "llama3-8b", "--gpus", "64", "--tokens", "15e12", "--price-per-gpu-hour", "2.5"]) == 0
    )
    rows = _rows(capsys.readouterr().out)
    assert rows and len(rows) % 2 == 0  # the layouts' table, then the time-to-train table, row for row
    half = len(rows) // 2
    for row, budget_row in zip(rows[:half], rows[half:]):
        cells = dict(zip(COLUMNS, row))
        cells |= dict(zip(["#", "layout", "days", "GPU-h", "cost"], budget_row))
        assert budget_row[0] == row[0]
        tps, tps_low, tps_high = _banded(cells["tokens/s"])  # shown to the token/s: within 0.5 of the estimate
        for name, value, unit in (
            ("days", TOKENS / 86400, 0.05),
            ("GPU-h", TOKENS * 64 / 3600, 0.5),
            ("cost", TOKENS * 64 / 3600 * 2.5, 0.5),
        ):
            shown, shown_low, shown_high = _banded(cells[name])
            low, high = value / (tps + 0.5), value / (tps - 0.5)
            assert low - unit <= shown <= high + unit, (name, shown, low, high)
            # the band of a duration is the tokens/s band turned over: its low at the highest rate
            assert shown_low == pytest.approx(value / tps_high, rel=2e-3, abs=unit)
            assert shown_high == pytest.approx(value / tps_low, rel=2e-3, abs=unit)


def _banded(cell: str) -> tuple[float, float, float]:
    """'632,764 (566,789-636,903)' -> (632764, 566789, 636903)."""
    value, rest = cell.replace(",", "").split(" (")
    low, high = rest.rstrip(")").split("-")
    return float(value), float(low), float(high)


@pytest.mark.parametrize(
    "bad,field",
    [
        (["--tokens", "0"], "--tokens"),
        (["--tokens", "nan"], "--tokens"),
        (["--price-per-gpu-hour", "2"], "--price-per-gpu-hour"),
    ],
)
def test_bad_budget_is_one_line(capsys, bad, field):
    with pytest.raises(SystemExit) if bad[1] in ("0", "nan") else _no_raise():
        code = main(["plan", "--model", "llama3-8b", "--gpus", "8", *bad])
        assert code == 2
    err = capsys.readouterr().err
    assert field in err and err.count("\n") == 1


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


LAYOUTS = ["dp=8,zero=3,tp=8", "dp=2,zero=1,tp=8,pp=4,vpp=5,ac=full", "dp=64,zero=3"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--layout", LAYOUTS[0], "--layout", LAYOUTS[1], "--layout", LAYOUTS[2]],
        ["--layout", ";".join(LAYOUTS)],
        ["--layout", LAYOUTS[0], "--layout", ";".join(LAYOUTS[1:])],
    ],
    ids=["repeated", "semicolons", "both"],
)
def test_several_layouts_one_table_best_first(capsys, flags):
    out = _json(capsys, "--model", "llama3-70b", "--gpus", "64", *flags)
    cands = out["candidates"]
    assert len(cands) == 3  # none dropped
    fitting = [c for c in cands if c["fits"]]
    assert cands[: len(fitting)] == fitting  # fitting first
    assert [c["tokens_per_s"] for c in fitting] == sorted((c["tokens_per_s"] for c in fitting), reverse=True)
    assert main(["plan", "--model", "llama3-70b", "--gpus", "64", *flags]) == 0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 3 and all(r[12] for r in rows)  # each with what binds it
    assert [r for r in rows if r[11] == "no"][0][12] == "memory"


def test_a_layout_given_twice_is_refused(capsys):
    assert (
        main(
            ["plan", "--model", "llama3-70b", "--gpus", "64", "--layout", "dp=8,zero=3,tp=8", "--layout", "tp=8,zero=3"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "given twice" in err and err.count("\n") == 1


def test_nearby_batches_are_bounded_and_only_when_the_batch_rules_out_degrees():
    assert nearby_batches(1024, 1024) == []  # every dp degree divides: no extra search at all
    assert nearby_batches(2048, 16384) == []  # the degrees it rules out (4096+) are far from 2048
    assert nearby_batches(512, 64) == []
    assert nearby_batches(1000, 1024) == [1024, 896]  # most degrees admitted first
    assert all(abs(b - 1000) <= 125 for b in nearby_batches(1000, 1024))


def test_batch_hint_fires_when_a_nearby_batch_allows_a_faster_layout(capsys):
    out = _json(capsys, "--model", "llama3-70b", "--gpus", "1024", "--global-batch", "1000", "--top", "1")
    hint = [line for line in out["explanation"] if line.startswith("Batch hint:")]
    assert len(hint) == 1 and "--global-batch 1024" in hint[0]
    faster = int(re.search(r"at ([\d,]+) tokens/s", hint[0]).group(1).replace(",", ""))
    again = _json(capsys, "--model", "llama3-70b", "--gpus", "1024", "--global-batch", "1024", "--top", "1")
    # the hint's figure is what the planner finds at that batch, and no hint when the batch divides
    assert faster == round(again["candidates"][0]["tokens_per_s"])
    assert faster > out["candidates"][0]["tokens_per_s"] * 1.03
    assert not [line for line in again["explanation"] if line.startswith("Batch hint:")]


def test_emit_prints_only_the_configuration_on_stdout(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "64", "--emit", "deepspeed"]) == 0
    captured = capsys.readouterr()
    cfg = json.loads(captured.out)  # stdout is the JSON alone
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)
    assert "deepspeed configuration of" in captured.err


def test_emit_of_several_layouts_and_refusal(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-70b",
                "--gpus",
                "64",
                "--emit",
                "megatron",
                "--layout",
                "dp=8,zero=3,tp=8;dp=2,zero=1,tp=8,pp=4,vpp=5,ac=full",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("pretrain_gpt.py") == 2
    assert (
        main(["plan", "--model", "llama3-70b", "--gpus", "64", "--emit", "deepspeed", "--layout", "dp=8,zero=3,tp=8"])
        == 2
    )
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Megatron-DeepSpeed" in captured.err


def test_report_has_the_same_time_and_cost(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.html"
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--gpus",
                "16",
                "--top",
                "2",
                "--tokens",
                "2e12",
                "--price-per-gpu-hour",
                "3",
                "--report",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    first = json.loads(capsys.readouterr().out)["candidates"][0]["train_time"]
    page = out.read_text()
    assert "GPU-hours" in page and "<th>cost</th>" in page
    band = first["band"]  # each cell with its band, as the JSON gives it
    for name, fmt in (("days", ",.1f"), ("gpu_hours", ",.0f"), ("cost", ",.0f")):
        low, high = band[name]["low"], band[name]["high"]
        assert f"<td>{first[name]:{fmt}} ({low:{fmt}}-{high:{fmt}})</td>" in page


def test_no_valid_layout_names_the_batch_with_the_most_degrees():
    """DeepSeek-V3 on 1,000 H100 at batch 1,024 has no valid layout; the refusal named 1,025
    (whose only layouts run dp=25, a 40-stage GPipe) where 1,000 admits every degree of the world."""
    import re

    from meshwise.errors import MeshwiseError
    from meshwise.layout import check_runnable, parse
    from meshwise.plan.planner import plan
    from meshwise.spec import TrainSpec, load_cluster, load_model

    model = load_model("deepseek-v3")
    with pytest.raises(MeshwiseError) as err:
        plan(model, load_cluster("h100", 1000), TrainSpec(1024, 4096, "bf16-mixed"), top=1)
    m = re.search(r"--global-batch (\d+) has one \((\S+)\)", str(err.value))
    assert m and int(m.group(1)) == 1000, err.value
    check_runnable(parse(m.group(2)), model, 1000, 1000, 4096)


def test_zero3_rows_with_empty_columns_say_what_the_columns_are(capsys):
    """ZeRO-3 rows of DeepSeek-V3 read params or grads 0.0 GB with no word why."""
    from meshwise.cli import main

    assert main(["plan", "--model", "deepseek-v3", "--gpus", "256", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    empty = [
        c
        for c in data["candidates"]
        if c["layout"].get("zero") == 3 and min(c["memory"]["params"], c["memory"]["grads"]) < 0.05e9
    ]
    assert empty and any("peak moment" in n and "ZeRO-3" in n for n in data["notes"])
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--gpus",
                "8",
                "--seq-len",
                "8192",
                "--global-batch",
                "64",
                "--layout",
                "dp=8,zero=1",
                "--json",
            ]
        )
        == 0
    )
    assert not any("peak moment" in n for n in json.loads(capsys.readouterr().out)["notes"])
