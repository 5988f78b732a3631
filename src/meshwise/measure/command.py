"""``meshwise measure``: run a layout on local processes, print predicted beside measured."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from meshwise.errors import MeshwiseError
from meshwise.files import check_output_file
from meshwise.launch import check_nproc
from meshwise.layout import check_runnable, parse
from meshwise.measure import auto_profile
from meshwise.measure.compare import Row, rows_for, time_verdicts
from meshwise.measure.plan_shapes import shapes_of
from meshwise.measure.run import run_workers
from meshwise.report import require_matplotlib
from meshwise.spec import TrainSpec, load_cluster, load_model


def _figure_text(figure: str, value: float) -> str:
    if figure.startswith("time."):
        return f"{value:.4f}"
    return f"{value:,.0f}"


def print_rows(rows: list[Row], title: str) -> None:
    """The rows as a table: rank, figure, predicted, measured, relative error."""
    console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=160)
    console.print(title)
    table = Table()
    for col in ("rank", "figure", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if col == "figure" else "right", no_wrap=True)
    for r in rows:
        err = r.rel_error
        shown = "-" if err == float("inf") else f"{err:+.1%}"
        table.add_row(
            str(r.rank), r.figure, _figure_text(r.figure, r.predicted), _figure_text(r.figure, r.measured), shown
        )
    console.print(table)
    for rank, moment in sorted({(r.rank, r.figure.split(".")[1]) for r in rows if r.figure.startswith("peak_moved.")}):
        console.print(
            f"rank {rank}: the peak moved: it fell at the '{moment}' moment, not where the plan puts it "
            f"(memory.* rows: the plan's prediction; peak_moved.{moment}.*: that moment's)"
        )


def measure_main(
    layout_text: str | None,
    nproc: int,
    model_name: str,
    steps: int,
    global_batch: int,
    seq_len: int | None,
    gpu: str | None,
    as_json: bool,
    report: str | None,
    precision: str = "auto",
) -> int:
    """Check every flag, then run the layout and print it beside the plan. Ten arguments: measure's
    flags, one each as cli.py parses them, all checked here before any process starts."""
    check_nproc(nproc)
    if steps < 0:
        raise MeshwiseError(f"--steps: {steps} must be 0 (memory and collectives only) or more")
    model = load_model(model_name)
    layout = parse(layout_text or "", nproc, explicit=True)
    seq = seq_len if seq_len is not None else model.max_seq  # --seq-len 0 is refused, not the default
    # the runtime trains in fp32 on CPU, bf16-mixed on CUDA, or a float8 format asked for (docs/runtime.md);
    # every flag is checked before any calibration
    import torch

    from meshwise.runtime import float8  # torch: as above, once every flag is checked

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    fp8 = float8.resolve(precision, device_type)
    train = TrainSpec(
        global_batch=global_batch, seq_len=seq, precision=fp8 or ("bf16-mixed" if device_type == "cuda" else "fp32")
    )
    check_runnable(layout, model, nproc, global_batch, seq, seq_field="--seq-len")
    if report:
        check_output_file("--report", report, parent_must_exist=True)
        require_matplotlib()
    if gpu is not None:
        load_cluster(gpu, nproc, nproc)  # a bad --gpu is refused before any worker starts
    if gpu is None:  # this machine's calibration at this process count (measured at first use, then cached)
        shapes = shapes_of(model, seq, layout.mbs, layout.tp, layout.cp, ep=layout.ep, folded=layout.ep_folds_tp)
        gpu = str(auto_profile.ensure(nproc, shapes=shapes))
    cluster = load_cluster(gpu, nproc, nproc)
    records = run_workers(nproc, [layout.format()], model_name, global_batch, seq, steps, precision=fp8)[0]
    rows: list[Row] = [row for record in records for row in rows_for(record, model, cluster, train)]
    if as_json:
        print(json.dumps({"layout": layout.format(), "model": model_name, "rows": [r.as_json() for r in rows]}))
    else:
        print_rows(
            rows,
            f"[bold]{model.describe()}[/bold]\nlayout {layout.short()} on {nproc} process(es), "
            f"global batch {global_batch} x {seq}, predicted with --gpu {gpu}",
        )
        for line in time_verdicts(rows):
            print(line)
    if report:
        from meshwise.report.measure_report import write_measure_report  # optional: matplotlib, the report extra

        write_measure_report(report, rows, records, model, layout, cluster, train, verdicts=time_verdicts(rows))
        if not as_json:
            print(f"report: {report}")
    return 0
