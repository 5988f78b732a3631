"""Predicted against published step time for every run of the calibration set
(src/meshwise/catalog/published_runs.toml), and leave-one-out cross-validation.

The GPU time model has one fitted constant per device: ``gemm_efficiency`` (the fraction of peak a
GEMM's busy tiles reach). Everything else is a datasheet or measured figure with its source.

- in-sample: the catalog's constants (src/meshwise/catalog/accelerators.toml), every run;
- leave-one-out: for every run, refit its device's constant on that device's other runs and
  predict the run left out: the out-of-sample error, measured rather than assumed.

    python benchmarks/fidelity.py          # the table, mean and worst |error|, in-sample and LOO
    python benchmarks/fidelity.py --fit    # also the constants fitted on every run (for the catalog)
"""

from __future__ import annotations

import math
import sys
import tomllib
from dataclasses import dataclass, replace
from importlib import resources

from meshwise.cost import compute
from meshwise.cost.estimate import estimate
from meshwise.layout import Layout, parse
from meshwise.plan.planner import search
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster, load_model

FIT_RANGE = (0.30, 1.00)


@dataclass(frozen=True)
class Run:
    id: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    train: TrainSpec
    layout: Layout
    published_step_s: float

    @property
    def gpu(self) -> str:
        return self.cluster.accelerator.name


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
    result = search(model, cluster, train, top=1,
                    where=lambda l: all(str(getattr(l, k)) == v for k, v in keys.items())
                    and l.schedule in ("1f1b", "interleaved-1f1b"))
    if not result.best:
        raise RuntimeError(f"no layout with {fixed} fits")
    return result.best[0].layout


def load_runs(prefix: str = "") -> list[Run]:
    """The calibration set (only the runs whose id starts with ``prefix``, when given)."""
    data = tomllib.loads(resources.files("meshwise.catalog").joinpath("published_runs.toml").read_text())
    models = {name: ModelSpec(name=name, **table) for name, table in data.get("models", {}).items()}
    runs = []
    for rec in data["run"]:
        if not rec["id"].startswith(prefix):
            continue
        model = models.get(rec["model"]) or load_model(rec["model"])
        cluster = load_cluster(rec["gpu"], rec["gpus"])
        train = TrainSpec(global_batch=rec["global_batch"], seq_len=rec["seq_len"], precision="bf16-mixed",
                          runtime=rec["runtime"], overlap_dp_comm=rec.get("overlap_dp_comm", True),
                          overlap_tp_comm=rec.get("overlap_tp_comm"), fused_attention=rec.get("fused_attention", True),
                          selective_policy=rec.get("selective_policy", "meshwise"))
        if "layout" in rec:
            layout = parse(rec["layout"], rec["gpus"])
        else:
            layout = _searched_layout(model, cluster, train, rec["search"])
        runs.append(Run(rec["id"], rec["source"], model, cluster, train, layout,
                        _published_step_s(rec, model, train, layout, rec["gpus"])))
    return runs


def predict(run: Run, gemm_efficiency: float | None = None) -> float:
    """Predicted step seconds of ``run`` (with the device's GEMM efficiency replaced when given)."""
    cluster = run.cluster
    if gemm_efficiency is not None:
        cluster = replace(cluster, accelerator=replace(cluster.accelerator, gemm_efficiency=gemm_efficiency))
    return estimate(run.model, cluster, run.train, run.layout).time.step_s


def _loss(runs: list[Run], eff: float) -> float:
    """Mean |log(predicted / published)| (symmetric in over- and under-prediction)."""
    return sum(abs(math.log(predict(r, eff) / r.published_step_s)) for r in runs) / len(runs)


def fit(runs: list[Run]) -> float:
    """The GEMM efficiency minimising the mean |log error| over ``runs`` (golden-section search)."""
    lo, hi = FIT_RANGE
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = _loss(runs, a), _loss(runs, b)
    for _ in range(30):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = _loss(runs, a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = _loss(runs, b)
    return (lo + hi) / 2


def by_device(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.gpu, []).append(r)
    return out


def leave_one_out(runs: list[Run]) -> list[float]:
    """For each run: refit its device's constant without it, predict it; the relative errors."""
    groups = by_device(runs)
    errors = []
    for r in runs:
        others = [o for o in groups[r.gpu] if o is not r]
        eff = fit(others) if others else r.cluster.accelerator.gemm_efficiency
        errors.append(predict(r, eff) / r.published_step_s - 1)
    return errors


def summary(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return sum(absolute) / len(absolute), max(absolute)


def main(argv: list[str]) -> None:
    runs = load_runs()
    if "--fit" in argv:
        for gpu, group in by_device(runs).items():
            print(f"fitted on all {len(group)} runs: {gpu} gemm_efficiency = {fit(group):.3f}")
    in_sample = [predict(r) / r.published_step_s - 1 for r in runs]
    loo = leave_one_out(runs)
    print(f"| run | GPU | layout | published s | predicted s | error | LOO error |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r, e, l in zip(runs, in_sample, loo):
        print(f"| {r.id} | {r.gpu} x {r.cluster.world_size} | `{r.layout}` | {r.published_step_s:.3f} | "
              f"{predict(r):.3f} | {e:+.1%} | {l:+.1%} |")
    mean, worst = summary(in_sample)
    lmean, lworst = summary(loo)
    print(f"\n{len(runs)} runs. In-sample (catalog constants): mean |error| {mean:.1%}, worst {worst:.1%}. "
          f"Leave-one-out: mean |error| {lmean:.1%}, worst {lworst:.1%} (target 8% / 15%).")


if __name__ == "__main__":
    main(sys.argv[1:])
