"""meshwise measure --report: one self-contained page with the bars and, for PP, both timelines."""

from __future__ import annotations

import base64
import re

import pytest

pytest.importorskip("matplotlib")

from meshwise.cost.pipeline import simulate  # noqa: E402
from meshwise.layout import parse  # noqa: E402
from meshwise.measure.compare import rows_for  # noqa: E402
from meshwise.report.measure_report import measured_ops, predicted_ops, write_measure_report  # noqa: E402
from meshwise.spec import TrainSpec, load_cluster, load_model  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def synthetic_records(text: str = "pp=2,schedule=1f1b") -> list[dict]:
    """Two ranks' records shaped like measure.worker's, the timeline a 1F1B run with F = 1 ms, B = 2 ms."""
    layout = parse(text, 2)
    m = layout.accum(8)
    ops = simulate(layout.schedule, layout.pp, layout.vpp, m, 1e-3, 2e-3)
    records = []
    for rank in range(2):
        records.append(
            {
                "rank": rank,
                "pp_rank": rank if layout.pp > 1 else 0,
                "layout": layout.format(),
                "global_batch": 8,
                "seq_len": 64,
                "world": 2,
                "memory": {
                    "Parameter": 400_000,
                    "Gradient": 400_000,
                    "Optstate": 800_000,
                    "Activation": 300_000,
                    "Temp": 50_000,
                },
                "comm": [
                    {"kind": "send", "dim": "pp", "count_per_step": 8, "bytes_per_step": 131072},
                    {"kind": "recv", "dim": "pp", "count_per_step": 8, "bytes_per_step": 131072},
                ],
                "time": {
                    "step_s": 0.03,
                    "compute_s": 0.022,
                    "comm_s": 0.002,
                    "idle_s": 0.004,
                    "optimizer_s": 0.001,
                    "fixed_s": 0.001,
                    "untimed_s": 0.0,
                    "steps_s": [0.03, 0.031, 0.029],
                },
                "timeline": [
                    {"kind": o.kind, "chunk": o.chunk, "microbatch": o.microbatch, "start": o.start, "end": o.end}
                    for o in ops
                    if o.rank == rank
                ],
            }
        )
    return records


def _setup(text: str = "pp=2,schedule=1f1b"):
    model, cluster = load_model("tiny"), load_cluster("cpu", 2)
    train = TrainSpec(8, 64, precision="fp32")
    records = synthetic_records(text)
    rows = [row for rec in records for row in rows_for(rec, model, cluster, train)]
    return model, cluster, train, parse(text, 2), rows, records


def test_measured_ops_are_one_row_per_pipeline_rank():
    ops, ranks = measured_ops(synthetic_records())
    assert ranks == 2
    assert {op.rank for op in ops} == {0, 1}
    assert {op.kind for op in ops} == {"F", "B"}
    assert len(ops) == 2 * 2 * 8  # F and B per micro-batch (m = 8) on each of 2 ranks


def test_predicted_timeline_spans_the_estimated_compute():
    model, cluster, train, layout, _, _ = _setup()
    ops = predicted_ops(model, cluster, train, layout)
    busy = [sum(o.end - o.start for o in ops if o.rank == r) for r in range(2)]
    from meshwise.cost.estimate import estimate

    assert max(busy) == pytest.approx(estimate(model, cluster, train, layout).time.compute_s, rel=1e-9)


@pytest.mark.parametrize(
    "text",
    [
        "pp=2,schedule=1f1b",
        "pp=2,schedule=gpipe",
        "pp=2,vpp=2,schedule=interleaved-1f1b",
        "pp=2,vpp=2,schedule=zero-bubble",
    ],
)
def test_pp_report_is_self_contained_with_bars_and_both_timelines(tmp_path, text):
    model, cluster, train, layout, rows, records = _setup(text)
    out = tmp_path / "run.html"
    write_measure_report(out, rows, records, model, layout, cluster, train)
    text = out.read_text()
    assert not (tmp_path / "run.html.tmp").exists()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 5  # memory, comm, time bars + measured and predicted timelines
    assert all(base64.b64decode(d).startswith(PNG) for d in images)
    assert "measured above, predicted below" in text
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from the network
    assert "<script" not in text
    assert "memory.params" in text and "time.step_s" in text


@pytest.mark.parametrize("text", ["dp=2", "dp=2,zero=2", "dp=2,zero=3", "tp=2,sp=on"])
def test_report_without_pipeline_has_no_timeline(tmp_path, text):
    model, cluster, train, layout, rows, records = _setup(text)
    out = tmp_path / "dp.html"
    from meshwise.measure.compare import time_verdicts

    write_measure_report(out, rows, records, model, layout, cluster, train, verdicts=time_verdicts(rows))
    text = out.read_text()
    assert len(re.findall(r"data:image/png;base64,", text)) == 3
    assert "Pipeline timeline" not in text
    assert "Step split" in text and "largest residual" in text and "add up to the step" in text


@pytest.mark.parametrize(
    "text,backward_over_forward", [("pp=2,schedule=1f1b", 2.0), ("pp=2,schedule=1f1b,ac=full", 3.0)]
)
def test_predicted_timeline_splits_by_the_cost_models_recompute_factor(text, backward_over_forward):
    """Both reports draw the same rule: backward = 2 x forward, 3 x under full recompute."""
    model, cluster, train, _, _, _ = _setup()
    layout = parse(text, 2)
    ops = predicted_ops(model, cluster, train, layout)
    f = next(o.end - o.start for o in ops if o.kind == "F")
    b = next(o.end - o.start for o in ops if o.kind == "B")
    assert b / f == pytest.approx(backward_over_forward)
