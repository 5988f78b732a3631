"""``meshwise plan``: a model, a cluster and a batch in; the ranked layouts, the explanation and the
warnings out (tables, JSON, an HTML report, or a framework's configuration with ``--emit``). Its
defaults live here; ``cli.py`` only parses."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from meshwise.errors import NOTHING_FITS, MeshwiseError
from meshwise.plan.failures import FailureOptions

if TYPE_CHECKING:
    pass

DEFAULT_MODEL = "llama3-70b"
DEFAULT_GPU = "h100"
DEFAULT_GPUS = 64
DEFAULT_GLOBAL_BATCH = 512
DEFAULT_TOP = 5
MAX_PARAMS = 1e15  # a thousand times the largest published model (~1-2e12 parameters)


@dataclass(frozen=True)
class Extras:
    """What ``plan`` adds to a search: a framework to emit, a token budget with its price, and the
    failure model's options (plan/failures.py)."""

    emit: str | None = None
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    failures: FailureOptions = FailureOptions()


def plan_main(
    model_name: str | None,
    params: float | None,
    gpu: str,
    gpus: int,
    gpus_per_node: int | None,
    seq_len: int | None,
    global_batch: int,
    precision: str,
    optimizer: str,
    layout_text: str | list[str] | None,
    top: int,
    headroom: float | None,
    as_json: bool,
    report: str | None,
    runtime: str | None = None,
    verify: int = 0,
    extras: Extras = Extras(),
    tp_comm_overlap: bool = False,
    moe: dict | None = None,
) -> int:
    """Check every input, then plan and print; ``layout_text`` (one or several, ``;``-separated too)
    evaluates those layouts side by side; ``runtime`` (meshwise or megatron) defaults to the profile's
    ``runtime`` key, else meshwise; ``tp_comm_overlap``: the run turns on Megatron-LM's ``--tp-comm-overlap``
    (TrainSpec.overlap_tp_comm); ``moe``: TrainSpec's MoE fields (capacity factor, balancing, all-to-all
    overlap); ``verify`` K > 0 traces the top K candidates
    (meshwise.measure.verify.verify_plan; imports torch)."""
    from meshwise import spec
    from meshwise.cost.estimate import DEFAULT_HEADROOM
    from meshwise.layout import check_seq_len
    from meshwise.plan.budget import check_budget

    if params is not None and params > MAX_PARAMS:
        raise MeshwiseError(
            f"--params: {params:g} is past meshwise's bound of {MAX_PARAMS:g} parameters "
            "(a thousand times the largest published model)"
        )
    model = (
        spec.ModelSpec.from_param_count(params) if params is not None else spec.load_model(model_name or DEFAULT_MODEL)
    )
    cluster = spec.load_cluster(gpu, gpus, gpus_per_node)
    if seq_len is None:
        seq_len = spec.default_seq_len(model)
    if extras.emit == "megatron" and (runtime or "megatron") != "megatron":
        raise MeshwiseError(
            f"--emit megatron: plans for Megatron-LM's runtime; --runtime {runtime} would emit a "
            "layout chosen for another runtime (drop --runtime or use --runtime megatron)"
        )
    runtime = runtime or ("megatron" if extras.emit == "megatron" else cluster.accelerator.runtime) or "meshwise"
    check_seq_len(model, seq_len, "--seq-len", runtime)  # one rule for the search and --layout
    train = spec.TrainSpec(
        global_batch=global_batch,
        seq_len=seq_len,
        precision=precision,
        optimizer=optimizer,
        runtime=runtime,
        overlap_tp_comm=bool(tp_comm_overlap),
        **(moe or {}),
    )
    from meshwise.cost.fp8 import check_supported

    check_supported(cluster.accelerator, precision)
    if top < 1:
        raise MeshwiseError(f"--top: {top} must be at least 1")
    if verify < 0:
        raise MeshwiseError(f"--verify: {verify} must be 0 (no trace) or a number of candidates to trace")
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    if not 0 <= headroom < 1:
        raise MeshwiseError(f"--headroom: {headroom} must be in [0, 1)")
    check_budget(extras.tokens, extras.price_per_gpu_hour)
    extras.failures.check()
    if report:
        from meshwise.files import check_output_file
        from meshwise.report import require_matplotlib

        check_output_file("--report", report, parent_must_exist=True)
        require_matplotlib()
    chosen = _given_layouts(layout_text, model, cluster.world_size, global_batch, seq_len, runtime)
    result = _plan(model, cluster, train, top, headroom, chosen, verify)
    _output(model, cluster, train, result, headroom, as_json, report, extras, given=bool(chosen))
    return NOTHING_FITS if result.nothing_fits and not chosen else 0


def _given_layouts(
    texts: str | list[str] | None, model, world: int, global_batch: int, seq_len: int, runtime: str
) -> list:
    """Every --layout value parsed and checked before any search starts."""
    from meshwise.layout import check_runnable, parse
    from meshwise.plan.compare import check_distinct, split_layouts

    values = [texts] if isinstance(texts, str) else texts
    layouts = [parse(t, world, explicit=True) for t in split_layouts(values)]
    for lay in layouts:
        check_runnable(lay, model, world, global_batch, seq_len, seq_field="--seq-len", runtime=runtime)
    check_distinct(layouts)
    return layouts


def _plan(model, cluster, train, top: int, headroom: float, chosen: list, verify: int):
    """The search, one evaluated layout, or several side by side; then the trace and the batch hint."""
    from meshwise.plan import planner

    if len(chosen) > 1:
        from meshwise.plan.compare import rank

        evaluated = [planner.plan(model, cluster, train, top=top, headroom=headroom, layout=lay) for lay in chosen]
        first = evaluated[0]
        ranked = tuple(rank([p.candidates[0] for p in evaluated]))
        lines = tuple(line for line in first.explanation if not line.startswith("Evaluated: ")) + tuple(
            line for p in evaluated for line in p.explanation if line.startswith("Evaluated: ")
        )
        warnings = tuple(dict.fromkeys(w for p in evaluated for w in p.warnings))
        result = planner.Plan(
            ranked,
            lines,
            warnings,
            first.enumerated,
            first.fitting,
            figures=first.figures,
            band=first.band,
            checked=first.checked,
        )
    else:
        result = planner.plan(model, cluster, train, top=top, headroom=headroom, layout=chosen[0] if chosen else None)
    if verify:
        from meshwise.measure.verify import verify_plan

        result = verify_plan(model, cluster, train, result, verify, headroom)
    if not chosen:
        from meshwise.plan.batch_hint import batch_hint

        hint = batch_hint(model, cluster, train, result.candidates[0] if result.candidates else None, headroom)
        if hint:
            result = replace(result, explanation=result.explanation + (hint,))
    return result


def _output(
    model, cluster, train, result, headroom: float, as_json: bool, report: str | None, extras: Extras, given: bool
) -> None:
    from meshwise.plan.band import budget_band
    from meshwise.plan.budget import Budget
    from meshwise.plan.planner import plan_notes

    budgets = None
    if extras.tokens is not None:
        budgets = [
            Budget(extras.tokens, e.tokens_per_s, cluster.world_size, extras.price_per_gpu_hour)
            for e in result.candidates
        ]
    result, rels, fbudgets = _with_failures(model, cluster, train, result, extras.failures, budgets)
    emitted = _emitted(model, cluster, train, result, extras.emit, given) if extras.emit else None
    if as_json:
        out = {
            "model": model.as_json(),
            **result.as_json(),
            "runtime": train.runtime,
            "precision": train.precision,
            "tp_comm_overlap": train.overlap_tp_comm,
            "calibrated": bool(cluster.accelerator.calibrated_on),
            "notes": plan_notes(cluster, train, result.candidates),
        }
        if budgets is not None:
            for c, b in zip(out["candidates"], budgets):
                c["train_time"] = b.as_json() | budget_band(result.band, b)
        for c, r, fb in zip(out["candidates"], rels or [], fbudgets or [None] * len(out["candidates"])):
            c["reliability"] = r.as_json()
            if fb is not None:
                c["train_time_with_failures"] = fb.as_json() | budget_band(result.band, fb)
        if emitted is not None:
            out["emit"] = {"framework": extras.emit, "text": emitted}
        print(json.dumps(out))
    elif emitted is not None:
        shown = result.candidates if given else result.candidates[:1]
        for e in shown:
            print(
                f"meshwise: {extras.emit} configuration of {e.layout.short()} ({e.tokens_per_s:,.0f} tokens/s, "
                f"{'fits' if e.fits else 'does NOT fit'}; planned for the {train.runtime} runtime) on stdout",
                file=sys.stderr,
            )
        print(emitted)
    else:
        from meshwise.plan.show import print_plan

        print_plan(model, cluster, train, result, budgets=budgets, reliabilities=rels, failure_budgets=fbudgets)
        for line in plan_notes(cluster, train, result.candidates):
            print(f"note: {line}")
    if report:
        from meshwise.report.plan_report import write_plan_report

        write_plan_report(
            report,
            model,
            cluster,
            train,
            result,
            headroom,
            budgets=budgets,
            reliabilities=rels,
            failure_budgets=fbudgets,
        )
        if not as_json:
            print(f"report: {report}", file=sys.stderr if emitted is not None else sys.stdout)


def _with_failures(model, cluster, train, result, options: FailureOptions, budgets):
    """Each candidate's interval and goodput, the explanation's failure lines and the staging warning
    (plan/failures.py), and the budgets with failures; (result, None, None) when not shown."""
    from meshwise.plan import failures
    from meshwise.plan.budget import with_failures

    if not failures.shown(cluster, options) or not result.candidates:
        return result, None, None
    rels = failures.reliabilities(model, cluster, train, result.candidates, options)
    lines = failures.explanation_lines(cluster, result.candidates, rels, options)
    warns = failures.staging_warnings(model, cluster, train, result.candidates, rels, options)
    result = replace(result, explanation=result.explanation + tuple(lines), warnings=result.warnings + tuple(warns))
    fbudgets = [with_failures(b, r.goodput, r.mtbf_s) for b, r in zip(budgets, rels)] if budgets else None
    return result, rels, fbudgets


def _emitted(model, cluster, train, result, framework: str, given: bool) -> str:
    """The configuration text: each given layout, or the chosen one; when the chosen one cannot be
    expressed, the refusal names the best of the shown candidates that can."""
    from meshwise.plan import emit

    if not result.candidates:
        raise MeshwiseError(f"--emit {framework}: no layout fits, so there is nothing to emit")
    targets = [
        emit.Target(
            model,
            e.layout,
            train.global_batch,
            train.seq_len,
            train.precision,
            cluster.world_size,
            cluster.gpus_per_node,
            tp_comm_overlap=train.overlap_tp_comm,
            runtime=train.runtime,
            moe_capacity_factor=train.moe_capacity_factor,
            overlap_ep_comm=train.overlap_ep_comm,
        )
        for e in result.candidates
    ]
    if given:
        return emit.emit_many(framework, targets)
    why = emit.refusal(framework, targets[0])
    if why is None:
        return emit.emit(framework, targets[0])
    other = next(
        ((t, e) for t, e in zip(targets[1:], result.candidates[1:]) if e.fits and emit.refusal(framework, t) is None),
        None,
    )
    tail = (
        f"; the best of the top {len(targets)} it can express: {other[0].layout.short()} "
        f"({other[1].tokens_per_s:,.0f} tokens/s; --layout to emit it)"
        if other
        else f"; none of the top {len(targets)} can be expressed (try --top 30)"
    )
    raise MeshwiseError(why + tail)
