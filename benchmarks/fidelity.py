"""The published runs, predicted against their published step time: every run of one set
(dev, test, test2 to test6) of src/meshwise/catalog/published_runs.toml, dense and mixture-of-experts reported apart.

Nothing in the GPU time model is fitted to these runs: every constant comes from its component's
own published data (benchmarks/fit_components.py), and the runs are only predicted. The error is
reported for dense and MoE runs, by size band (< 10B, 10-100B, > 100B parameters), and without the
three MT-NLG runs, whose micro-batch size is inferred (their source does not state it).

The test sets are evaluated once each, by the lead (test after the MoE time model landed; test2 to test6,
collected blind, after the GPU time model changes that followed each); the dev set freely. ``--validate`` resolves every run
of a set and prices none: it is how a test set is checked before its one evaluation.

    python benchmarks/fidelity.py                           # the dev set: the table, then mean and worst |error|
    python benchmarks/fidelity.py --set dev --save          # also writes benchmarks/results/fidelity-dev.txt
    python benchmarks/fidelity.py --set test2 --validate    # one line per run, no prediction; exit 1 on a problem
    python benchmarks/fidelity.py --set test3 --save        # the lead's one evaluation: benchmarks/results/fidelity-test3.txt
    python benchmarks/fidelity.py --set test4 --save        # the same for test4: benchmarks/results/fidelity-test4.txt
    python benchmarks/fidelity.py --set test5 --save        # the same for test5: benchmarks/results/fidelity-test5.txt
    python benchmarks/fidelity.py --set test6 --save        # the same for test6: benchmarks/results/fidelity-test6.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from meshwise.cost import compute
from meshwise.cost.estimate import estimate
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable, parse
from meshwise.plan.band import band_for, family
from meshwise.plan.planner import search
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster, load_model
from meshwise.spec.cluster import catalog_accelerator

BANDS = (("< 10B", 0, 10e9), ("10-100B", 10e9, 100e9), ("> 100B", 100e9, float("inf")))
INFERRED = ("mtnlg530b",)  # runs whose micro-batch size is inferred, not published
SETS = ("dev", "test", "test2", "test3", "test4", "test5", "test6")
FIGURES = ("step_s", "tokens_per_s_per_gpu", "hardware_tflops_per_gpu")  # a run gives exactly one
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Run:
    id: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    train: TrainSpec
    layout: Layout
    published_step_s: float
    set: str = "dev"
    origin: str = ""
    moe: bool = False
    framework: str = ""  # the framework a run priced under runtime meshwise ran, where its layout needs it

    @property
    def refusals(self) -> str:
        """The runtime whose refusals the run's layout answers to (:func:`refusal_runtime`)."""
        return refusal_runtime(self.framework, self.train.runtime)

    @property
    def gpu(self) -> str:
        return self.cluster.accelerator.name

    @property
    def kind(self) -> str:
        return "MoE" if self.moe else "dense"


def _published_step_s(rec: dict, model: ModelSpec, train: TrainSpec, layout: Layout, gpus: int) -> float:
    if "step_s" in rec:
        return float(rec["step_s"])
    if "tokens_per_s_per_gpu" in rec:
        return train.tokens_per_step / (rec["tokens_per_s_per_gpu"] * gpus)
    flops = compute.hardware_flops(model, train.seq_len, train.tokens_per_step, layout.ac)
    return flops / (gpus * rec["hardware_tflops_per_gpu"] * 1e12)


def _searched_layout(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, fixed: str) -> Layout:
    """The planner's best layout with the published keys fixed (schedule 1F1B or interleaved)."""
    keys = dict(kv.split("=") for kv in fixed.split(","))
    result = search(
        model,
        cluster,
        train,
        top=1,
        where=lambda l: (
            all(str(getattr(l, k)) == v for k, v in keys.items()) and l.schedule in ("1f1b", "interleaved-1f1b")
        ),
    )
    if not result.best:
        raise RuntimeError(f"no layout with {fixed} fits")
    return result.best[0].layout


def records() -> list[dict]:
    """The runs of published_runs.toml as written, both sets."""
    return _catalog()["run"]


def _catalog() -> dict:
    return tomllib.loads(resources.files("meshwise.catalog").joinpath("published_runs.toml").read_text())


def _models(data: dict) -> dict[str, ModelSpec]:
    return {name: ModelSpec(name=name, **table) for name, table in data.get("models", {}).items()}


def _resolve(rec: dict, models: dict[str, ModelSpec]) -> tuple[ModelSpec, ClusterSpec, TrainSpec]:
    """A run's model (the runs file's own, else the catalog's), cluster and step, as written; prices nothing."""
    model = models.get(rec["model"]) or load_model(rec["model"])
    cluster = load_cluster(rec["gpu"], rec["gpus"])
    train = TrainSpec(
        global_batch=rec["global_batch"],
        seq_len=rec["seq_len"],
        precision=rec.get("precision", "bf16-mixed"),
        runtime=rec["runtime"],
        overlap_dp_comm=rec.get("overlap_dp_comm", True),
        overlap_tp_comm=rec.get("overlap_tp_comm", False),
        fused_attention=rec.get("fused_attention", True),
        selective_policy=rec.get("selective_policy", "meshwise"),
        model_code=rec.get("model_code", "meshwise"),
        overlap_ep_comm=rec.get("overlap_ep_comm", False),
        moe_capacity_factor=rec.get("moe_capacity_factor", 0.0),
        moe_balancing=rec.get("moe_balancing", "aux-loss"),
        expert_gemm=rec.get("expert_gemm", "te"),
        moe_dispatcher=rec.get("moe_dispatcher", "all-to-all"),
        mtp_layers=rec.get("mtp_layers", 0),
        loss_fusion=rec.get("loss_fusion", False),
        grad_reduce_bytes=rec.get("grad_reduce_bytes", 0),
    )
    return model, cluster, train


def load_runs(prefix: str = "", set_name: str | None = None, original: bool = False) -> list[Run]:
    """The runs of ``set_name`` (every set when None) whose id starts with ``prefix``; ``original``: only
    the 39 dense bf16 runs the model was first checked on (those without a ``precision``)."""
    data = _catalog()
    models = _models(data)
    runs = []
    for rec in data["run"]:
        if not rec["id"].startswith(prefix) or (set_name and rec["set"] != set_name):
            continue
        if original and "precision" in rec:
            continue
        model, cluster, train = _resolve(rec, models)
        if "layout" in rec:
            layout = parse(rec["layout"], rec["gpus"])
        else:
            layout = _searched_layout(model, cluster, train, rec["search"])
        runs.append(
            Run(
                rec["id"],
                rec["source"],
                model,
                cluster,
                train,
                layout,
                _published_step_s(rec, model, train, layout, rec["gpus"]),
                rec["set"],
                rec["origin"],
                rec["moe"],
                rec.get("framework", ""),
            )
        )
    return runs


def refusal_runtime(framework: str, runtime: str) -> str:
    """The runtime whose refusals (layout.runtime_refusal) a run's layout answers to: its own, except a
    torchtitan run (``framework = "torchtitan"``) priced under meshwise's runtime, whose expert TP 1 folds EP
    over the TP ranks as Megatron-Core's does (torchtitan/distributed/parallel_dims.py: the sparse mesh
    ``efsdp, ep, etp``, EP borrowing the TP degree where ETP is 1), which meshwise's own runtime cannot run."""
    return "torchtitan" if framework == "torchtitan" else runtime


def check_run(rec: dict, models: dict[str, ModelSpec]) -> str:
    """One run resolved without pricing it: its set, origin and kind, its model, a catalog GPU, the step's
    fields, its layout runnable under its runtime (a ``search`` run's fixed keys parsed, the rest searched
    only at evaluation) and one positive published figure. The run's line; MeshwiseError on a problem."""
    where = rec.get("id", "?")
    if rec.get("set") not in SETS or not rec.get("origin") or not isinstance(rec.get("moe"), bool):
        raise MeshwiseError(f"{where}: needs set (one of {', '.join(SETS)}), origin and moe (true or false)")
    if catalog_accelerator(str(rec["gpu"])) is None:
        raise MeshwiseError(f"{where}: gpu {rec['gpu']!r} is not a catalog accelerator (catalog/accelerators.toml)")
    model, cluster, train = _resolve(rec, models)
    if model.moe != rec["moe"]:
        raise MeshwiseError(f"{where}: moe = {str(rec['moe']).lower()} but {model.name!r} has {model.experts} experts")
    given = [f for f in FIGURES if f in rec]
    if len(given) != 1 or not isinstance(rec[given[0]], int | float) or rec[given[0]] <= 0:
        raise MeshwiseError(f"{where}: needs exactly one positive published figure of {', '.join(FIGURES)}")
    if "layout" in rec:
        layout = parse(rec["layout"], rec["gpus"], explicit=True)
        runtime = refusal_runtime(rec.get("framework", ""), train.runtime)
        check_runnable(layout, model, rec["gpus"], rec["global_batch"], rec["seq_len"], runtime=runtime)
        shown = f"`{layout}`"
    else:
        parse(rec["search"], rec["gpus"], explicit=True)
        shown = f"search `{rec['search']}`"
    kind = "MoE" if model.moe else "dense"
    return (
        f"{rec['id']} | {rec['set']} | {rec['origin']} | {kind} | {model.name} | {cluster.accelerator.name} x "
        f"{rec['gpus']} | {train.precision} | {train.runtime} | {shown} | published {given[0]} = {rec[given[0]]}"
    )


def validate_set(set_name: str) -> tuple[list[str], int]:
    """Every run of ``set_name`` checked by :func:`check_run` (nothing predicted, nothing priced): its lines,
    a problem's in place of its run's, and the number of problems (ids repeated across the file count)."""
    data = _catalog()
    models = _models(data)
    lines, problems = [], 0
    ids = [rec.get("id") for rec in data["run"]]
    for rec in data["run"]:
        if rec.get("set") != set_name:
            continue
        try:
            if ids.count(rec.get("id")) > 1:
                raise MeshwiseError(f"{rec.get('id')}: id given {ids.count(rec.get('id'))} times")
            lines.append("ok   " + check_run(rec, models))
        except (MeshwiseError, KeyError, TypeError) as e:
            problems += 1
            lines.append(f"FAIL {rec.get('id', '?')}: {e}")
    return lines, problems


def predict(run: Run) -> float:
    """Predicted step seconds of ``run`` with the catalog's component-fitted constants."""
    return estimate(run.model, run.cluster, run.train, run.layout).time.step_s


def band(run: Run) -> str:
    params = run.model.params
    return next(name for name, lo, hi in BANDS if lo <= params < hi)


def summary(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return sum(absolute) / len(absolute), max(absolute)


def report(runs: list[Run], errors: dict[str, float] | None = None) -> dict[str, tuple[int, float, float]]:
    """{group: (runs, mean |error|, worst |error|)} for all runs, each band, and all without inferred
    inputs; with MoE runs present, also dense and MoE apart; and by kind, GPU family and precision."""
    if errors is None:
        errors = {r.id: predict(r) / r.published_step_s - 1 for r in runs}
    groups = {"all": runs} | {name: [r for r in runs if band(r) == name] for name, _, _ in BANDS}
    groups["all, MT-NLG left out"] = [r for r in runs if not r.id.startswith(INFERRED)]
    if any(r.moe for r in runs):
        groups["dense"] = [r for r in runs if not r.moe]
        groups["MoE"] = [r for r in runs if r.moe]
    for r in runs:  # by kind, GPU family and precision class, where the runs span more than one
        key = f"{r.kind} {family(r.gpu)} {'fp8' if r.train.fp8 else 'bf16'}"
        if len({(x.kind, family(x.gpu), x.train.fp8) for x in runs}) > 1:
            groups.setdefault(key, []).append(r)
    return {name: (len(group), *summary([errors[r.id] for r in group])) for name, group in groups.items() if group}


def in_band(run: Run, error: float) -> tuple[bool, float] | None:
    """(whether the published step lies inside the band plan prints for this run, the band's half-width),
    the band being plan/band.py's for the run's model kind, GPU family and precision; None without one."""
    b = band_for(run.model, run.cluster.accelerator, run.train)
    if b is None:
        return None
    return b.low <= 1 / (1 + error) - 1 <= b.high, (b.high - b.low) / 2


def table(runs: list[Run], errors: dict[str, float], set_name: str) -> list[str]:
    """The per-run table, then the summary by group and the band's coverage, as lines."""
    lines = [
        f"Set: {set_name} ({len(runs)} runs; benchmarks/fidelity.py --set {set_name})",
        "",
        "| run | kind | precision | GPU | layout | band | published s | predicted s | error | in plan's band |",
        "|---|---|---|---|---|---|---:|---:|---:|---|",
    ]
    banded = {r.id: in_band(r, errors[r.id]) for r in runs}
    for r in runs:
        p = r.published_step_s * (1 + errors[r.id])
        inside = "n/a" if banded[r.id] is None else ("yes" if banded[r.id][0] else "no")
        lines.append(
            f"| {r.id} | {r.kind} | {r.train.precision} | {r.gpu} x {r.cluster.world_size} | `{r.layout}` | "
            f"{band(r)} | {r.published_step_s:.3f} | {p:.3f} | {errors[r.id]:+.1%} | {inside} |"
        )
    lines += ["", f"{set_name} set (nothing fitted to these runs):"]
    for name, (n, mean, worst) in report(runs, errors).items():
        lines.append(f"  {name:26s} {n:2d} runs: mean |error| {mean:.1%}, worst {worst:.1%}")
    lines += [
        "",
        "plan's band (catalog/bands.toml, built from the seen sets by benchmarks/band.py: see its SEEN):",
    ]
    for kind in [*sorted({r.kind for r in runs}), "all"]:
        got = [banded[r.id] for r in runs if kind in (r.kind, "all") and banded[r.id] is not None]
        if got:
            lines.append(
                f"  {kind:22s} {len(got):2d} runs: {sum(i for i, _ in got) / len(got):.0%} inside, "
                f"median half-width {statistics.median(h for _, h in got):.1%}"
            )
    return lines


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="set_name", choices=SETS, default="dev")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/fidelity-<set>.txt")
    parser.add_argument(
        "--validate", action="store_true", help="resolve every run of the set and print it; predict nothing"
    )
    args = parser.parse_args(argv)
    if args.validate:
        lines, problems = validate_set(args.set_name)
        print("\n".join(lines))
        print(f"\n{args.set_name}: {len(lines)} runs, {problems} with a problem (nothing predicted)")
        if problems or not lines:
            raise SystemExit(1)
        return
    runs = load_runs(set_name=args.set_name)
    errors = {r.id: predict(r) / r.published_step_s - 1 for r in runs}
    lines = table(runs, errors, args.set_name)
    print("\n".join(lines))
    if args.save:
        out = RESULTS / f"fidelity-{args.set_name}.txt"
        out.write_text("\n".join(lines) + "\n")
        print(f"\nwritten: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
