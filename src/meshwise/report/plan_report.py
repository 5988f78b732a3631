"""``meshwise plan --report plan.html``: memory bars of the top layouts, the chosen layout's pipeline
timeline (cost.pipeline.simulate, the schedule model whose closed forms the search uses), the
predicted scaling from 8 GPUs to the requested count, the explanation and the warnings."""

from __future__ import annotations

import html
from dataclasses import replace

from meshwise.cost.estimate import Estimate
from meshwise.files import write_atomically
from meshwise.plan.budget import Budget, budget_cells, fmt_tokens
from meshwise.plan.compare import binding
from meshwise.plan.planner import Plan, search
from meshwise.report import figures
from meshwise.report.html import image, page, paragraphs, table
from meshwise.report.schedule import predicted_timeline
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def timeline_png(e: Estimate, train: TrainSpec) -> bytes:
    """The estimate's schedule at the cost model's per-chunk times (:mod:`meshwise.report.schedule`)."""
    lay = e.layout
    return figures.pipeline_timeline(predicted_timeline(e, train.global_batch), lay.pp,
                                     f"{lay.short()}: {lay.accum(train.global_batch)} micro-batches")


def scaling_points(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float) -> list[tuple[int, Estimate]]:
    """The best layout at 8, 16, 32, ... GPUs up to the cluster's count (same node size and batch)."""
    counts = []
    n = min(8, cluster.world_size)
    while n < cluster.world_size:
        counts.append(n)
        n *= 2
    counts.append(cluster.world_size)
    points = []
    for gpus in counts:
        per_node = min(cluster.gpus_per_node, gpus)
        sized = replace(cluster, gpus_per_node=per_node, nodes=gpus // per_node)
        result = search(model, sized, train, 1, headroom)
        if result.best:
            points.append((gpus, result.best[0]))
    return points


def write_plan_report(path: str, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, plan: Plan,
                      headroom: float, budgets: list[Budget] | None = None) -> None:
    """The page; ``budgets`` (one per candidate, plan/budget.py) adds days, GPU-hours and cost columns."""
    accel = cluster.accelerator
    sections: list[tuple[str, str]] = []
    setting = (f"{cluster.world_size} x {accel.name} ({cluster.nodes} node(s) of "
               f"{cluster.gpus_per_node}); global batch {train.global_batch} x {train.seq_len} tokens; "
               f"{train.precision}, {train.optimizer}; {plan.enumerated:,} layouts searched, {plan.fitting:,} fit.")
    # model and accelerator names come from user files: escaped like every other string of the page
    sections.append(("Setting", f"<p>{html.escape(model.describe())}<br>{html.escape(setting)}</p>"))
    if plan.candidates:
        rows = [[f"#{i}", e.layout.short(), f"{e.memory.total / 1e9:.1f}", f"{e.time.step_s:.3g}",
                 f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}", "yes" if e.fits else "no", binding(e)]
                + (budget_cells(budgets[i - 1]) if budgets else [])
                for i, e in enumerate(plan.candidates, 1)]
        head = ["#", "layout", "GB", "step s", "tokens/s", "MFU", "fits", "binds"]
        if budgets:
            head += ["days", "GPU-hours"] + (["cost"] if budgets[0].cost is not None else [])
        mem = figures.memory_bars([e.layout.short() for e in plan.candidates],
                                  [e.memory.as_json() for e in plan.candidates], accel.memory_bytes,
                                  accel.memory_bytes * (1 - headroom))
        budget_note = (f"<p>Time and cost for {fmt_tokens(budgets[0].tokens)}: tokens / tokens/s of each layout"
                       + (f", at {budgets[0].price_per_gpu_hour:,.4g} per GPU-hour" if budgets[0].cost is not None
                          else "") + ".</p>") if budgets else ""
        sections.append(("Top layouts", budget_note + table(head, rows)
                         + image(mem, "memory per rank of the top layouts against the device capacity")))
        sections.append(("Pipeline schedule of the chosen layout",
                         image(timeline_png(plan.candidates[0], train),
                               "stages x time: forward, backward and idle per micro-batch (the bubble is the white space)")))
    points = scaling_points(model, cluster, train, headroom)
    if points:
        png = figures.scaling_curve([g for g, _ in points], [e.tokens_per_s for _, e in points],
                                    [e.mfu for _, e in points],
                                    f"predicted throughput as the GPU count grows (global batch {train.global_batch})")
        rows = [[str(g), e.layout.short(), f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}"] for g, e in points]
        sections.append(("Scaling", image(png, "tokens/s and MFU with the best layout at each GPU count")
                         + table(["GPUs", "chosen layout", "tokens/s", "MFU"], rows)))
    sections.append(("Explanation", paragraphs(plan.explanation)))
    if plan.warnings:
        sections.append(("Warnings", paragraphs(plan.warnings, "warn")))
    write_atomically(path, page(f"meshwise plan: {model.name} on {cluster.world_size} x {accel.name}", sections))
