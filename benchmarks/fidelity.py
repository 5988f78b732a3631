"""The published runs as a test set: predicted against published step time for every run of
src/meshwise/catalog/published_runs.toml, by model size band.

Nothing in the GPU time model is fitted to these runs: every constant comes from its component's
own published data (benchmarks/fit_components.py), and the runs are only predicted. The error is
reported for all runs, by size band (< 10B, 10-100B, > 100B parameters), and without the three
MT-NLG runs, whose micro-batch size is inferred (their source does not state it).

    python benchmarks/fidelity.py          # the table, then mean and worst |error| overall and by band
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from importlib import resources

from meshwise.cost import compute
from meshwise.cost.estimate import estimate
from meshwise.layout import Layout, parse
from meshwise.plan.planner import search
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster, load_model

BANDS = (("< 10B", 0, 10e9), ("10-100B", 10e9, 100e9), ("> 100B", 100e9, float("inf")))
INFERRED = ("mtnlg530b",)  # runs whose micro-batch size is inferred, not published


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
                          overlap_tp_comm=rec.get("overlap_tp_comm", False), fused_attention=rec.get("fused_attention", True),
                          selective_policy=rec.get("selective_policy", "meshwise"),
                          model_code=rec.get("model_code", "meshwise"))
        if "layout" in rec:
            layout = parse(rec["layout"], rec["gpus"])
        else:
            layout = _searched_layout(model, cluster, train, rec["search"])
        runs.append(Run(rec["id"], rec["source"], model, cluster, train, layout,
                        _published_step_s(rec, model, train, layout, rec["gpus"])))
    return runs


def predict(run: Run) -> float:
    """Predicted step seconds of ``run`` with the catalog's component-fitted constants."""
    return estimate(run.model, run.cluster, run.train, run.layout).time.step_s


def band(run: Run) -> str:
    params = run.model.params
    return next(name for name, lo, hi in BANDS if lo <= params < hi)


def summary(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return sum(absolute) / len(absolute), max(absolute)


def report(runs: list[Run]) -> dict[str, tuple[int, float, float]]:
    """{group: (runs, mean |error|, worst |error|)} for all runs, each band, and all without inferred inputs."""
    errors = {r.id: predict(r) / r.published_step_s - 1 for r in runs}
    groups = {"all": runs} | {name: [r for r in runs if band(r) == name] for name, _, _ in BANDS}
    groups["all, MT-NLG left out"] = [r for r in runs if not r.id.startswith(INFERRED)]
    return {name: (len(group), *summary([errors[r.id] for r in group])) for name, group in groups.items() if group}


def main(argv: list[str]) -> None:
    runs = load_runs()
    print("| run | GPU | layout | band | published s | predicted s | error |")
    print("|---|---|---|---|---:|---:|---:|")
    for r in runs:
        p = predict(r)
        print(f"| {r.id} | {r.gpu} x {r.cluster.world_size} | `{r.layout}` | {band(r)} | {r.published_step_s:.3f} | "
              f"{p:.3f} | {p / r.published_step_s - 1:+.1%} |")
    print("\nTest set (nothing fitted to these runs):")
    for name, (n, mean, worst) in report(runs).items():
        print(f"  {name:22s} {n:2d} runs: mean |error| {mean:.1%}, worst {worst:.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
