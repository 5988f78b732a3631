"""``meshwise plan``: a model, a cluster and a batch in; the ranked layouts, the explanation and the
warnings out (tables, JSON, an HTML report, or a framework's configuration with ``--emit``). Its
defaults live here; ``cli.py`` only parses."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

from meshwise import spec
from meshwise.cost.estimate import DEFAULT_HEADROOM
from meshwise.cost.fp8 import check_supported
from meshwise.errors import NOTHING_FITS, MeshwiseError
from meshwise.files import check_output_file
from meshwise.layout import check_runnable, check_seq_len, parse
from meshwise.plan import emit, failures, planner
from meshwise.plan.band import budget_band
from meshwise.plan.batch_hint import batch_hint
from meshwise.plan.budget import Budget, BudgetFigures, check_budget, with_failures
from meshwise.plan.compare import check_distinct, rank, split_layouts
from meshwise.plan.failures import FailureOptions
from meshwise.plan.planner import plan_notes
from meshwise.plan.show import print_plan
from meshwise.report import require_matplotlib

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


@dataclass(frozen=True)
class Request:
    """The run ``plan`` is asked about, as given: a catalog name, file or bare parameter count; the
    cluster; the training setting (``runtime`` None: the profile's ``runtime`` key, else meshwise;
    ``tp_comm_overlap``: Megatron-LM's ``--tp-comm-overlap``, TrainSpec.overlap_tp_comm; ``moe``:
    TrainSpec's MoE fields, capacity factor, balancing and all-to-all overlap)."""

    model_name: str | None = None
    params: float | None = None
    gpu: str = DEFAULT_GPU
    gpus: int = DEFAULT_GPUS
    gpus_per_node: int | None = None
    seq_len: int | None = None
    global_batch: int = DEFAULT_GLOBAL_BATCH
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    runtime: str | None = None
    tp_comm_overlap: bool = False
    moe: dict | None = None


@dataclass(frozen=True)
class Shown:
    """What ``plan`` weighs and prints: ``layout_text`` (one or several, ``;``-separated too) evaluates
    those layouts side by side; the top rows, the headroom (None: DEFAULT_HEADROOM), JSON or tables,
    an HTML report; ``verify`` K > 0 traces the top K candidates (meshwise.measure.verify.verify_plan;
    imports torch)."""

    layout_text: str | list[str] | None = None
    top: int = DEFAULT_TOP
    headroom: float | None = None
    as_json: bool = False
    report: str | None = None
    verify: int = 0


def plan_main(request: Request, shown: Shown = Shown(), extras: Extras = Extras()) -> int:
    """Check every input, then plan and print."""
    model, cluster, train = _setting(request, extras.emit)
    headroom = _checked_shown(shown, cluster, train)
    check_budget(extras.tokens, extras.price_per_gpu_hour)
    extras.failures.check()
    if shown.report:
        check_output_file("--report", shown.report, parent_must_exist=True)
        require_matplotlib()
    chosen = _given_layouts(
        shown.layout_text, model, cluster.world_size, train.global_batch, train.seq_len, train.runtime
    )
    result = _plan(model, cluster, train, shown.top, headroom, chosen, shown.verify)
    _output(model, cluster, train, result, headroom, shown, extras, given=bool(chosen))
    return NOTHING_FITS if result.nothing_fits and not chosen else 0


def _setting(request: Request, emit: str | None):
    """(model, cluster, train) of the request, each field checked; the runtime resolved."""
    r = request
    if r.params is not None and r.params > MAX_PARAMS:
        raise MeshwiseError(
            f"--params: {r.params:g} is past meshwise's bound of {MAX_PARAMS:g} parameters "
            "(a thousand times the largest published model)"
        )
    model = (
        spec.ModelSpec.from_param_count(r.params)
        if r.params is not None
        else spec.load_model(r.model_name or DEFAULT_MODEL)
    )
    cluster = spec.load_cluster(r.gpu, r.gpus, r.gpus_per_node)
    seq_len = spec.default_seq_len(model) if r.seq_len is None else r.seq_len
    runtime = r.runtime
    if emit == "megatron" and (runtime or "megatron") != "megatron":
        raise MeshwiseError(
            f"--emit megatron: plans for Megatron-LM's runtime; --runtime {runtime} would emit a "
            "layout chosen for another runtime (drop --runtime or use --runtime megatron)"
        )
    runtime = runtime or ("megatron" if emit == "megatron" else cluster.accelerator.runtime) or "meshwise"
    check_seq_len(model, seq_len, "--seq-len", runtime)  # one rule for the search and --layout
    train = spec.TrainSpec(
        global_batch=r.global_batch,
        seq_len=seq_len,
        precision=r.precision,
        optimizer=r.optimizer,
        runtime=runtime,
        overlap_tp_comm=bool(r.tp_comm_overlap),
        **(r.moe or {}),
    )
    check_supported(cluster.accelerator, r.precision)
    return model, cluster, train


def _checked_shown(shown: Shown, cluster, train) -> float:
    """Check how many rows, the trace and the headroom; the headroom, its default filled in."""
    if shown.top < 1:
        raise MeshwiseError(f"--top: {shown.top} must be at least 1")
    if shown.verify < 0:
        raise MeshwiseError(f"--verify: {shown.verify} must be 0 (no trace) or a number of candidates to trace")
    headroom = DEFAULT_HEADROOM if shown.headroom is None else shown.headroom
    if not 0 <= headroom < 1:
        raise MeshwiseError(f"--headroom: {headroom} must be in [0, 1)")
    return headroom


def _given_layouts(
    texts: str | list[str] | None, model, world: int, global_batch: int, seq_len: int, runtime: str
) -> list:
    """Every --layout value parsed and checked before any search starts."""

    values = [texts] if isinstance(texts, str) else texts
    layouts = [parse(t, world, explicit=True) for t in split_layouts(values)]
    for lay in layouts:
        check_runnable(lay, model, world, global_batch, seq_len, seq_field="--seq-len", runtime=runtime)
    check_distinct(layouts)
    return layouts


def _plan(model, cluster, train, top: int, headroom: float, chosen: list, verify: int):
    """The search, one evaluated layout, or several side by side; then the trace and the batch hint."""

    if len(chosen) > 1:
        evaluated = [planner.evaluate_layout(model, cluster, train, lay, headroom) for lay in chosen]
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
    elif chosen:
        result = planner.evaluate_layout(model, cluster, train, chosen[0], headroom)
    else:
        result = planner.plan(model, cluster, train, top=top, headroom=headroom)
    if verify:
        from meshwise.measure.verify import verify_plan  # imports torch: only on --verify

        result = verify_plan(model, cluster, train, result, verify, headroom)
    if not chosen:
        hint = batch_hint(model, cluster, train, result.candidates[0] if result.candidates else None, headroom)
        if hint:
            result = replace(result, explanation=result.explanation + (hint,))
    return result


def _output(model, cluster, train, result, headroom: float, shown: Shown, extras: Extras, given: bool) -> None:
    """Tables, JSON or a framework's configuration on stdout, and the HTML report."""
    as_json, report = shown.as_json, shown.report

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
        print_plan(model, cluster, train, result, budgets=budgets, reliabilities=rels, failure_budgets=fbudgets)
        for line in plan_notes(cluster, train, result.candidates):
            print(f"note: {line}")
    if report:
        from meshwise.report.plan_report import write_plan_report  # matplotlib: only on --report

        write_plan_report(report, model, cluster, train, result, headroom, BudgetFigures(budgets, rels, fbudgets))
        if not as_json:
            print(f"report: {report}", file=sys.stderr if emitted is not None else sys.stdout)


def _with_failures(model, cluster, train, result, options: FailureOptions, budgets):
    """Each candidate's interval and goodput, the explanation's failure lines and the staging warning
    (plan/failures.py), and the budgets with failures; (result, None, None) when not shown."""

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
