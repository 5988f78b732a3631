"""What a tune prints (rank 0): a progress bar while it runs, then the trials, the pick, the
profile's error before and after the refit, days and cost from the measured step, or all as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

from meshwise.layout import parse
from meshwise.plan.budget import Budget, budget_cells, fmt_tokens
from meshwise.plan.emit import Target, Unexpressible, emit
from meshwise.report.tune_report import write_tune_report
from meshwise.tune.trials import RUNOFF, Trial, best_trial
from meshwise.units import gb_text


class Progress:
    """A rich progress bar over the trials (on a terminal, and not under --json)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        shown = sys.stdout.isatty() and not driver.opts.get("json")
        self.bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not shown,
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("tune", total=self._total())

    def _total(self) -> int:
        tune = self.driver.tune
        left = len([t for t in tune.field if t not in tune.tried and t not in tune.dropped])
        total = len(tune.trials) + left
        return min(total, tune.max_trials) if tune.max_trials else total

    def start(self, plan: Any) -> None:
        self.bar.update(
            self.task,
            description=f"trial {len(self.driver.tune.trials) + 1}: {plan.layout.short()}",
            total=max(self._total(), len(self.driver.tune.trials) + 1),
        )

    def done(self, trial: Trial) -> None:
        self.bar.update(self.task, completed=len(self.driver.tune.trials), total=self._total())

    def close(self) -> None:
        self.bar.stop()


def _mean_abs(errors: list[float]) -> float | None:
    return sum(map(abs, errors)) / len(errors) if errors else None


def report(driver: Any, model: Any, cfg: Any) -> int:
    """Write the profile and config (driver.finish), then print; returns the exit status (0)."""
    summary = driver.finish()
    trials = driver.tune.trials
    best = best_trial(trials)
    tokens_per_step = cfg.schedule.global_batch * cfg.data.seq_len
    budget = None
    if best is not None and driver.opts.get("tokens"):
        budget = Budget(
            driver.opts["tokens"],
            tokens_per_step / best.measured_step_s,
            driver.world,
            driver.opts.get("price_per_gpu_hour"),
        )
    emitted = _emit(driver, model, cfg, best) if best is not None and driver.opts.get("emit") else None
    if driver.opts.get("report"):
        _report(driver, summary, trials)
    if driver.opts.get("json"):
        print(
            json.dumps(
                {
                    **summary,
                    "trials": [t.as_json() for t in trials if t.status != RUNOFF],
                    "runoff": [t.as_json() for t in trials if t.status == RUNOFF],
                    "pick_step_s": best.measured_step_s if best else None,
                    "budget": budget.as_json() if budget else None,
                    "emit": emitted,
                }
            )
        )
        return 0
    _table(trials, summary)
    runoff = [t for t in trials if t.status == RUNOFF]
    before, after = _mean_abs(summary["error_before"]), _mean_abs(summary["error_after"])
    print(
        f"Field: {len(summary['field'])} layout(s) within the band of the fastest predicted; "
        f"{summary['trials_used']} trial(s) of {summary['trials_allowed'] or len(summary['field'])} "
        f"({summary['resumed']} resumed), "
        f"{len(summary['dropped'])} dropped by the refitted profile"
        + (f"; {len(runoff)} measured again together (run-off, {summary['runoff_steps']} steps)" if runoff else "")
        + f"; {summary['steps_used']} of {summary['step_budget'] or 'unbounded'} steps"
    )
    if best is None:
        print("No layout of the field fit; a smaller model, batch or more memory (--memory-limit)")
    else:
        print(
            f"Pick: {best.layout} ({best.measured_step_s:.4g} s/step measured, "
            f"{tokens_per_step / best.measured_step_s:,.0f} tokens/s); the planner alone (--layout auto) "
            f"runs {summary['auto']}"
        )
        print(f"Train config: {summary['config']} (meshwise train --config {summary['config']})")
    if before is not None and after is not None:
        print(
            f"Profile: {summary['profile']} (mean |step error| over the measured trials: {before:.1%} with "
            f"{summary['base_profile']}, {after:.1%} refitted; plan --gpu {summary['profile']})"
        )
    if budget is not None:
        cells = budget_cells(budget)
        cost = f", cost {cells[2]}" if len(cells) > 2 else ""
        print(
            f"Budget: {fmt_tokens(budget.tokens)} in {cells[0]} days, {cells[1]} GPU-hours on {driver.world} "
            f"device(s){cost} (from the measured step)"
        )
    if driver.opts.get("report"):
        print(f"report: {driver.opts['report']}")
    if emitted:
        print(emitted, end="" if emitted.endswith("\n") else "\n")
    return 0


def _emit(driver: Any, model: Any, cfg: Any, best: Trial) -> str:
    """The pick as ``--emit``'s framework configures it; a framework that cannot express the pick
    is one line on stderr (the tune's results stand)."""
    precision = "fp32" if driver.device_type != "cuda" else "bf16-mixed"
    local = driver.tune.predictor.local_world
    try:
        return emit(
            driver.opts["emit"],
            Target(
                model, parse(best.layout), cfg.schedule.global_batch, cfg.data.seq_len, precision, driver.world, local
            ),
        )
    except Unexpressible as e:
        print(f"meshwise: note: {e}", file=sys.stderr, flush=True)
        return ""


COLUMNS = ("#", "layout", "round", "status", "predicted s", "refitted s", "measured s", "peak memory", "binds")


def _rows(trials: list[Trial], summary: dict[str, Any]) -> list[list[str]]:
    """One row per trial, numbered, then the run-off's re-measurements (no number: no trial)."""
    count = 0
    labels = []
    for t in trials:
        count += t.status != RUNOFF
        labels.append(str(count) if t.status != RUNOFF else "")
    return [
        [
            label,
            t.layout,
            str(t.round),
            t.status,
            f"{t.predicted_step_s:.4g}",
            f"{summary['refitted_step_s'][t.layout]:.4g}",
            f"{t.measured_step_s:.4g}" if t.measured_step_s is not None else "-",
            gb_text(t.peak_bytes),
            t.binds,
        ]
        for label, t in zip(labels, trials, strict=True)
    ]


def _table(trials: list[Trial], summary: dict[str, Any]) -> None:
    console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=200)
    table = Table(title="Trials")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("layout", "status", "binds") else "right", no_wrap=True)
    for row in _rows(trials, summary):
        table.add_row(*row)
    console.print(table)


def _report(driver: Any, summary: dict[str, Any], trials: list[Trial]) -> None:
    """The HTML page: the trials and the predicted-against-measured chart (the starting profile's
    prediction of each trial, and the refitted one's)."""
    tune = driver.tune
    points = [
        (
            t.measured_step_s,
            tune.predictor.step(tune.base_table, parse(t.layout)).step_s,
            summary["refitted_step_s"][t.layout],
        )
        for t in trials
        if t.measured_step_s
    ]
    lines = [
        f"pick: {summary['pick']}",
        f"--layout auto (the planner alone): {summary['auto']}",
        f"starting profile: {summary['base_profile']}; refitted: {summary['profile']}",
        f"field: {len(summary['field'])} layout(s); {summary['trials_used']} trial(s) of "
        f"{summary['trials_allowed'] or len(summary['field'])}; {len(summary['dropped'])} dropped; "
        f"{summary['steps_used']} of {summary['step_budget'] or 'unbounded'} steps, run-off included",
    ]
    write_tune_report(driver.opts["report"], "meshwise tune", COLUMNS, _rows(trials, summary), points, lines)
