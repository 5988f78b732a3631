"""``meshwise measure ... --report run.html``: one self-contained page of prediction beside measurement.

Sections: a summary table (every figure of every rank: predicted, measured, relative error
``(predicted - measured) / measured``), predicted-vs-measured bars per kind of figure (memory,
communication, time; each bar normalised to the prediction), and, for a pipelined layout, the
measured pipeline timeline (the F/B/W spans the workers recorded, ``measure.timeline``) above the
predicted one (:mod:`meshwise.report.schedule`, the same rule as the plan report's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshwise.cost.estimate import estimate
from meshwise.cost.pipeline import Op
from meshwise.files import write_atomically
from meshwise.layout import Layout
from meshwise.report import figures
from meshwise.report.html import image, page, paragraphs, table
from meshwise.report.schedule import predicted_timeline
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

GROUPS = (
    ("memory", "memory per category (bytes)"),
    ("comm", "collectives per step (bytes, calls)"),
    ("time", "step time split (seconds)"),
)


def measured_ops(records: Sequence[dict[str, Any]]) -> tuple[list[Op], int]:
    """The measured timeline as cost.pipeline Ops, one row per pipeline rank (the lowest global rank
    of each pp rank stands for its DP/TP peers); (ops, pipeline ranks)."""
    first: dict[int, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r["rank"]):
        first.setdefault(int(rec["pp_rank"]), rec)
    ops = [
        Op(pp, int(e["chunk"]), int(e["microbatch"]), e["kind"], float(e["start"]), float(e["end"]))
        for pp, rec in first.items()
        for e in rec.get("timeline", [])
    ]
    return ops, len(first)


def predicted_ops(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout) -> list[Op]:
    """The estimate's predicted timeline (:func:`meshwise.report.schedule.predicted_timeline`)."""
    return predicted_timeline(estimate(model, cluster, train, layout), train.global_batch)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _error(row: Any) -> str:
    err = row.rel_error
    return "n/a" if err == float("inf") else f"{err:+.1%}"


def write_measure_report(
    path: str | Path,
    rows: Sequence[Any],
    records: Sequence[dict[str, Any]],
    model: ModelSpec,
    layout: Layout,
    cluster: ClusterSpec,
    train: TrainSpec,
    title: str | None = None,
    verdicts: Sequence[str] = (),
) -> None:
    """Write the page atomically. ``rows``: ``measure.compare.Row`` (figure, rank, predicted,
    measured) of every rank; ``records``: the workers' rank records (``timeline`` read for PP);
    ``verdicts``: lines on the step split (``measure.compare.time_verdicts``). Nine arguments: the
    run's setting (model, layout, cluster, train) and what was measured of it, each shown."""
    title = title or f"meshwise measure: {model.name}, {layout.short()}"
    sections: list[tuple[str, str]] = []
    world = max((int(r["world"]) for r in records), default=layout.world_size)
    sections.append(
        (
            "Run",
            paragraphs(
                [
                    f"model: {model.describe()}",
                    f"layout: {layout.format()} on {world} rank(s); global batch {train.global_batch} x {train.seq_len} "
                    f"tokens, {train.precision}",
                    f"predicted with the {cluster.accelerator.name} profile ({cluster.accelerator.source or 'catalog'})",
                    "bars: measured / predicted per figure and rank; relative error = (predicted - measured) / measured",
                ]
            ),
        )
    )
    body = []
    for prefix, caption in GROUPS:
        group = [r for r in rows if r.figure.split(".", 1)[0] == prefix and (r.predicted or r.measured)]
        if group:
            png = figures.predicted_vs_measured(
                [f"{r.figure} r{r.rank}" for r in group],
                [r.predicted for r in group],
                [r.measured for r in group],
                f"{caption}: measured / predicted",
            )
            body.append(image(png, f"{prefix}: predicted vs measured"))
    sections.append(("Predicted vs measured", "\n".join(body)))
    if verdicts:  # each part timed on its own; the sum checked against the step; the largest residual named
        sections.append(
            ("Step split: compute, exposed comm, pipeline idle, optimizer, fixed", paragraphs(list(verdicts)))
        )
    if layout.pp > 1:
        ops, ranks = measured_ops(records)
        parts = []
        if ops:
            parts.append(
                image(
                    figures.pipeline_timeline(ops, ranks, "measured pipeline (one timed step)"),
                    "measured: forward/backward spans per stage and micro-batch",
                )
            )
        else:
            parts.append(paragraphs(["no measured timeline in the records"]))
        parts.append(
            image(
                figures.pipeline_timeline(
                    predicted_ops(model, cluster, train, layout), layout.pp, f"predicted pipeline ({layout.schedule})"
                ),
                "predicted: cost.pipeline.simulate at the estimated compute",
            )
        )
        sections.append(("Pipeline timeline: measured above, predicted below", "\n".join(parts)))
    sections.append(
        (
            "All figures",
            table(
                ["figure", "rank", "predicted", "measured", "error"],
                [[r.figure, str(r.rank), _fmt(r.predicted), _fmt(r.measured), _error(r)] for r in rows],
            ),
        )
    )
    write_atomically(path, page(title, sections))
