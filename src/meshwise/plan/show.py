"""Terminal output of a plan: a rich table of the top (or the given) layouts, then the explanation and
warnings. With a token budget, each row adds its wall-clock days, GPU-hours and cost (plan/budget.py)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from meshwise.plan.band import band_note, text
from meshwise.plan.budget import Budget, FailureBudget, budget_cells, failure_budget_cells, fmt_tokens
from meshwise.plan.compare import binding
from meshwise.plan.failures import interval_cell
from meshwise.plan.planner import TIE, Plan
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec
from meshwise.units import gb_text

COLUMNS = (
    "#",
    "layout",
    "params",
    "grads",
    "optim",
    "activ",
    "other",
    "total",
    "step s",
    "tokens/s",
    "MFU",
    "fits",
    "binds",
)


def print_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    plan: Plan,
    console: Console | None = None,
    budgets: list[Budget] | None = None,
    reliabilities: list | None = None,
    failure_budgets: list[FailureBudget] | None = None,
) -> None:
    """``reliabilities`` (plan/failures.py) add each row's checkpoint interval and goodput, and
    ``failure_budgets`` its days, GPU-hours and cost with failures beside the failure-free ones."""
    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=240)
    console.print(f"[bold]{model.describe()}[/bold]")
    if not model.states_only and model.exclusion_note:
        console.print(model.exclusion_note, soft_wrap=True)
    console.print(
        f"{cluster.world_size} x {cluster.accelerator.name} ({cluster.nodes} node(s) of {cluster.gpus_per_node}); "
        f"global batch {train.global_batch} x {train.seq_len} tokens; {train.precision}, {train.optimizer}; "
        f"{plan.fit_words()}"
    )
    if plan.candidates:
        title = (
            f"memory per rank in GB (largest rank); rows: fastest first, but within {TIE:.0%} of the fastest a tie, "
            "simplest first"
        )
        columns = list(COLUMNS)
        if plan.band is not None:
            title += f"; in brackets: {band_note(plan.band)}"
        table = _table(title, columns)
        for i, e in enumerate(plan.candidates, 1):
            mem = e.memory
            table.add_row(
                str(i),
                e.layout.short(),
                gb_text(mem.params, unit=False),
                gb_text(mem.grads, unit=False),
                gb_text(mem.optimizer, unit=False),
                gb_text(mem.activations, unit=False),
                gb_text(mem.other, unit=False),
                gb_text(mem.total, unit=False),
                text(plan.band, e.time.step_s, ".3g"),
                text(plan.band, e.tokens_per_s, ",.0f", rate=True),
                f"{e.mfu:.1%}",
                "yes" if e.fits else "[red]no[/red]",
                binding(e),
            )
        console.print(table)
        if budgets:
            console.print(_budget_table(plan, budgets, reliabilities, failure_budgets))
    for line in plan.explanation:
        console.print(line, soft_wrap=True)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in ("layout", "binds") else "right", no_wrap=True)
    return table


def _budget_table(
    plan: Plan, budgets: list[Budget], reliabilities: list | None, failure_budgets: list[FailureBudget] | None
) -> Table:
    """The time to train the token budget, a row per layout of the main table (in its order): days,
    GPU-hours and cost, and with failures the interval, the goodput and the same figures with them."""
    priced = budgets[0].cost is not None
    title = f"time to train {fmt_tokens(budgets[0].tokens)}" + (
        f" at {budgets[0].price_per_gpu_hour:,.4g} per GPU-hour" if priced else ""
    )
    columns = ["#", "layout", "days", "GPU-h"] + (["cost"] if priced else [])
    if reliabilities:
        columns += ["ckpt every", "goodput"]
    if failure_budgets:
        columns += ["days w/ fail", "GPU-h w/ fail"] + (["cost w/ fail"] if priced else [])
    table = _table(title, columns)
    for i, e in enumerate(plan.candidates):
        table.add_row(
            str(i + 1),
            e.layout.short(),
            *budget_cells(budgets[i], plan.band),
            *_failure_cells(i, reliabilities, failure_budgets, plan.band),
        )
    return table


def _failure_cells(
    i: int, reliabilities: list | None, failure_budgets: list[FailureBudget] | None, band=None
) -> list[str]:
    cells = [interval_cell(reliabilities[i]), f"{reliabilities[i].goodput:.1%}"] if reliabilities else []
    return cells + (failure_budget_cells(failure_budgets[i], band) if failure_budgets else [])
