"""``meshwise plan --report plan.html``: memory bars of the top layouts, the chosen layout's pipeline
timeline when it has a pipeline (cost.pipeline.simulate, the schedule model whose closed forms the
search uses), the predicted scaling from the fewest GPUs that fit to SCALE_UP times the request, the
explanation and the warnings."""

from __future__ import annotations

import html
from dataclasses import replace

from meshwise.cost.estimate import Estimate
from meshwise.files import write_atomically
from meshwise.plan.band import band_note, text
from meshwise.plan.budget import BudgetFigures, budget_cells, failure_budget_cells, fmt_tokens
from meshwise.plan.compare import binding
from meshwise.plan.failures import interval_cell
from meshwise.plan.planner import Plan, plan_notes, search
from meshwise.report import figures
from meshwise.report.html import image, page, paragraphs, table
from meshwise.report.schedule import predicted_timeline
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def timeline_png(e: Estimate, train: TrainSpec) -> bytes:
    """The estimate's schedule at the cost model's per-chunk times (:mod:`meshwise.report.schedule`)."""
    lay = e.layout
    return figures.pipeline_timeline(
        predicted_timeline(e, train.global_batch),
        lay.pp,
        f"{lay.short()}: {lay.accum(train.global_batch)} micro-batches",
    )


SCALE_UP = 4  # the scaling chart reaches this many times the requested count
TIMELINE_MAX_OPS = 20_000  # passes drawn at most in a pipeline timeline (beyond, a line says so)


def scaling_counts(cluster: ClusterSpec) -> tuple[list[int], list[int]]:
    """The GPU counts the scaling chart weighs: halving from the request down (until nothing fits,
    tried in that order), and doubling up to SCALE_UP times it."""
    down, n = [], cluster.world_size
    while n > 1 and n % 2 == 0:
        n //= 2
        down.append(n)
    up = [cluster.world_size * 2**k for k in range(1, SCALE_UP.bit_length())]
    return down, [cluster.world_size] + up


def scaling_points(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float
) -> list[tuple[int, Estimate]]:
    """The best layout at each count from the smallest power-of-two fraction of the request that fits
    up to SCALE_UP times the request (same node size and batch): one search of one layout each, the
    way down stopping at the first count where nothing fits."""

    def best_at(gpus: int) -> Estimate | None:
        per_node = min(cluster.gpus_per_node, gpus)
        if gpus % per_node:
            return None
        result = search(model, replace(cluster, gpus_per_node=per_node, nodes=gpus // per_node), train, 1, headroom)
        return result.best[0] if result.best else None

    down, up = scaling_counts(cluster)
    points = []
    for gpus in down:
        e = best_at(gpus)
        if e is None:
            break
        points.append((gpus, e))
    points.reverse()
    points += [(gpus, e) for gpus, e in ((g, best_at(g)) for g in up) if e is not None]
    return points


def _timeline_section(e: Estimate, train: TrainSpec) -> tuple[str, str] | None:
    """The chosen layout's pipeline schedule: none without a pipeline, a line where too long to draw."""
    lay = e.layout
    if lay.pp == 1:
        return None
    m = lay.accum(train.global_batch)
    title = "Pipeline schedule of the chosen layout"
    if m * lay.pp * lay.vpp * 3 > TIMELINE_MAX_OPS:
        return title, (
            f"<p>{m:,} micro-batches per step over {lay.pp} stages: too many passes to draw "
            f"(over {TIMELINE_MAX_OPS:,}); the bubble is {e.time.bubble_s / e.time.step_s:.1%} "
            "of the step.</p>"
        )
    return title, image(
        timeline_png(e, train),
        "stages x time: forward, backward and idle per micro-batch (the bubble is the white space)",
    )


def _failure_section(plan: Plan, reliabilities: list, failure_budgets: list | None) -> tuple[str, str]:
    """Per layout: the checkpoint's blocking and written seconds, Daly's interval, the goodput, and with a
    budget the days, GPU-hours and cost with failures."""

    head = ["#", "layout", "staged GB/rank", "stage s", "write s", "restart s", "ckpt every (steps)", "goodput"]
    rows = []
    for i, (e, r) in enumerate(zip(plan.candidates, reliabilities), 1):
        c = r.cost
        rows.append(
            [
                f"#{i}",
                e.layout.short(),
                f"{c.staged_bytes_per_rank / 1e9:.2f}",
                f"{c.stage_s:.3g}",
                f"{c.write_s:.3g}",
                f"{r.lost_s:.0f}",
                interval_cell(r),
                f"{r.goodput:.1%}",
            ]
            + (failure_budget_cells(failure_budgets[i - 1]) if failure_budgets else [])
        )
    if failure_budgets:
        head += ["days w/ failures", "GPU-hours w/ failures"] + (
            ["cost w/ failures"] if failure_budgets[0].cost is not None else []
        )
    note = (
        f"<p>One interruption every {reliabilities[0].mtbf_s / 3600:.3g} h. Interval: Daly (2006)'s higher-order "
        "optimum; goodput: Daly's expected useful share of the wall clock (docs/cost-model.md).</p>"
    )
    return "Failures and checkpoints", note + table(head, rows)


def write_plan_report(
    path: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    plan: Plan,
    headroom: float,
    extra: BudgetFigures = BudgetFigures(),
) -> None:
    """The page; ``extra.budgets`` (one per candidate, plan/budget.py) adds days, GPU-hours and cost
    columns; ``extra.reliabilities`` and ``extra.failure_budgets`` (plan/failures.py) a section of
    intervals, goodput and the same figures with failures."""
    accel = cluster.accelerator
    sections: list[tuple[str, str]] = []
    setting = (
        f"{cluster.world_size} x {accel.name} ({cluster.nodes} node(s) of "
        f"{cluster.gpus_per_node}); global batch {train.global_batch} x {train.seq_len} tokens; "
        f"{train.precision}, {train.optimizer}; {plan.fit_words()}."
    )
    setting += "".join(f" Note: {line}." for line in plan_notes(cluster, train))
    # model and accelerator names come from user files: escaped like every other string of the page
    sections.append(("Setting", f"<p>{html.escape(model.describe())}<br>{html.escape(setting)}</p>"))
    if plan.candidates:
        sections += _top_sections(plan, accel, train, headroom, extra)
    sections += _scaling_section(model, cluster, train, headroom)
    sections.append(("Explanation", paragraphs(plan.explanation)))
    if plan.warnings:
        sections.append(("Warnings", paragraphs(plan.warnings, "warn")))
    write_atomically(path, page(f"meshwise plan: {model.name} on {cluster.world_size} x {accel.name}", sections))


def _top_sections(plan: Plan, accel, train: TrainSpec, headroom: float, extra: BudgetFigures) -> list[tuple[str, str]]:
    """The top layouts' table and memory bars, the failures' section and the chosen one's timeline."""
    sections: list[tuple[str, str]] = []
    budgets = extra.budgets
    rows = [
        [
            f"#{i}",
            e.layout.short(),
            f"{e.memory.total / 1e9:.1f}",
            text(plan.band, e.time.step_s, ".3g"),
            text(plan.band, e.tokens_per_s, ",.0f", rate=True),
            f"{e.mfu:.1%}",
            "yes" if e.fits else "no",
            binding(e),
        ]
        + (budget_cells(budgets[i - 1], plan.band) if budgets else [])
        for i, e in enumerate(plan.candidates, 1)
    ]
    head = ["#", "layout", "GB", "step s", "tokens/s", "MFU", "fits", "binds"]
    if budgets:
        head += ["days", "GPU-hours"] + (["cost"] if budgets[0].cost is not None else [])
    mem = figures.memory_bars(
        [e.layout.short() for e in plan.candidates],
        [e.memory.as_json() for e in plan.candidates],
        accel.memory_bytes,
        accel.memory_bytes * (1 - headroom),
    )
    budget_note = (
        (
            f"<p>Time and cost for {fmt_tokens(budgets[0].tokens)}: tokens / tokens/s of each layout"
            + (f", at {budgets[0].price_per_gpu_hour:,.4g} per GPU-hour" if budgets[0].cost is not None else "")
            + ".</p>"
        )
        if budgets
        else ""
    )
    if plan.band is not None:
        budget_note += f"<p>In brackets: {html.escape(band_note(plan.band))}.</p>"
    sections.append(
        (
            "Top layouts",
            budget_note
            + table(head, rows)
            + image(mem, "memory per rank of the top layouts against the device capacity"),
        )
    )
    if extra.reliabilities:
        sections.append(_failure_section(plan, extra.reliabilities, extra.failure_budgets))
    timeline = _timeline_section(plan.candidates[0], train)
    if timeline:
        sections.append(timeline)
    return sections


def _scaling_section(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float
) -> list[tuple[str, str]]:
    """The predicted throughput from the fewest GPUs that fit to SCALE_UP times the request (none when
    no count fits)."""
    sections: list[tuple[str, str]] = []
    points = scaling_points(model, cluster, train, headroom)
    if points:
        png = figures.scaling_curve(
            [g for g, _ in points],
            [e.tokens_per_s for _, e in points],
            [e.mfu for _, e in points],
            f"predicted throughput as the GPU count grows (global batch {train.global_batch})",
            requested=cluster.world_size,
        )
        rows = [[str(g), e.layout.short(), f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}"] for g, e in points]
        sections.append(
            (
                "Scaling",
                image(png, "tokens/s and MFU with the best layout at each GPU count")
                + table(["GPUs", "chosen layout", "tokens/s", "MFU"], rows),
            )
        )
    return sections
