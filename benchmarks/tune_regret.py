"""Regret of ``meshwise tune`` and of ``--layout auto`` over fields measured exhaustively; the
profile's step error before and after the tune's refit.

For each scenario (processes, model, sequence, global batch, base profile), on this machine, each
round runs, one after the other:

1. **exhaustive**: ``meshwise tune --exhaustive N``: the pool's ``N`` fastest predicted layouts
   (N >= 8), every one measured with the same warm-up and timed steps as a tune's trial, no early
   stop; the same runtime, model, data and launch as a tune;
2. **tune**: ``meshwise tune`` as a user runs it (field, early stop, refit, re-ranking).

Per layout, the exhaustive figure is the median over rounds of its median step. The best is the
fastest of them. Then, per round:

    regret(tune) = exhaustive(tune's pick) / best - 1
    regret(auto) = exhaustive(the planner's pick under the base profile) / best - 1
    trials used  = tune's trials / N

(a pick outside the exhaustive field, tried after a re-ranking, is read from the tune's own
measurement and marked ``*``). The profile's error is ``(predicted - measured) / measured`` of
the exhaustive steps, mean absolute, under the base profile and under the tune's refitted one,
over the layouts the tune tried and over all N. The target: tune within 3% of the
best, at most a third of the field's trials; the refitted profile within 10% on the tried layouts.

Scenarios: ``one`` (1 process, ``small``, this machine's calibration), ``two`` (2 processes,
``tiny``), ``four`` (4 processes, ``small``, planned from the catalog's ``cpu`` profile: the one
where the first ranking can be wrong). A benchmark that prints, not a test; run it on a quiet host:

    .venv/bin/python benchmarks/tune_regret.py [--rounds 3] [--steps 5] [--warmup 2] [--field 8]
                                               [--only one,two,four] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from meshwise.catalog import read_catalog
from meshwise.files import read_toml
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_model
from meshwise.tune.refit import Predictor, profile_text


@dataclass(frozen=True)
class Scenario:
    name: str
    nproc: int
    model: str
    seq: int
    batch: int
    catalog: bool = False  # plan from the catalog's cpu profile instead of this machine's calibration


SCENARIOS = (
    Scenario("one", 1, "small", 128, 8),
    Scenario("two", 2, "tiny", 64, 8),
    Scenario("four", 4, "small", 128, 8, catalog=True),
)


def _tune(s: Scenario, out: Path, args: argparse.Namespace, profile: str | None, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "meshwise.cli",
        "tune",
        "--model",
        s.model,
        "--seq-len",
        str(s.seq),
        "--global-batch",
        str(s.batch),
        "--nproc-per-node",
        str(s.nproc),
        "--out",
        str(out),
        "--json",
        "--trial-warmup",
        str(args.warmup),
        "--trial-steps",
        str(args.steps),
        *extra,
    ]
    if profile:
        cmd += ["--layout.profile", profile]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def _errors(table: dict, layouts: list[str], measured: dict[str, float], predictor: Predictor) -> float:
    errors = [abs(predictor.step(table, parse(t)).step_s / measured[t] - 1) for t in layouts if t in measured]
    return sum(errors) / len(errors) if errors else float("nan")


def run_scenario(s: Scenario, args: argparse.Namespace, folder: Path) -> None:
    profile = None
    if s.catalog:
        profile = str(folder / "catalog-cpu.toml")
        Path(profile).write_text(profile_text({"name": "cpu", **read_catalog("accelerators.toml")["cpu"]}))
    steps: dict[str, list[float]] = {}
    tunes: list[dict] = []
    for r in range(args.rounds):
        ex = _tune(s, folder / f"{s.name}-exhaustive-{r}", args, profile, ["--exhaustive", str(args.field)])
        for t in ex["trials"]:
            if t["measured_step_s"]:
                steps.setdefault(t["layout"], []).append(t["measured_step_s"])
        tunes.append(_tune(s, folder / f"{s.name}-tune-{r}", args, profile, []))
    measured = {k: statistics.median(v) for k, v in steps.items()}
    best = min(measured.values())
    threads = max(1, (os.cpu_count() or 1) // s.nproc)
    predictor = Predictor(
        load_model(s.model), TrainSpec(global_batch=s.batch, seq_len=s.seq, precision="fp32"), s.nproc, s.nproc, threads
    )
    print(
        f"\n{s.name}: {s.model}, {s.nproc} process(es) x {threads} thread(s), batch {s.batch} x {s.seq}, "
        f"{len(measured)} layouts measured exhaustively, best {best:.4g} s/step"
    )
    print("round  trials used  regret(tune)  regret(auto)  error before/after (tried)  (all N)")
    for r, tune in enumerate(tunes):
        pick = tune["pick"]
        pick_s = measured.get(pick, tune["pick_step_s"])
        mark = "" if pick in measured else "*"
        auto_s = measured.get(tune["auto"], float("nan"))
        tried = [t["layout"] for t in tune["trials"]]
        start = _base_table(tune["base_profile"])
        refitted = read_toml(Path(tune["profile"]), "profile")
        print(
            f"{r + 1:>5}  {len(tried):>3} / {len(measured):<5}  {pick_s / best - 1:>+11.1%}{mark:1}  "
            f"{auto_s / best - 1:>+11.1%}  {_errors(start, tried, measured, predictor):>11.1%} / "
            f"{_errors(refitted, tried, measured, predictor):<13.1%}  "
            f"{_errors(start, list(measured), measured, predictor):.1%} / "
            f"{_errors(refitted, list(measured), measured, predictor):.1%}"
        )


def _base_table(source: str) -> dict:
    """The profile a tune started from (its summary's ``base_profile``: a file, or ``catalog NAME``)."""
    if source.startswith("catalog "):
        name = source.removeprefix("catalog ")
        return {"name": name, **read_catalog("accelerators.toml")[name]}
    return read_toml(Path(source), "profile")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--field", type=int, default=8, help="layouts measured exhaustively per scenario (>= 8)")
    ap.add_argument("--only", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--keep", help="keep every tune's folder (trials.jsonl, profile.toml) under this folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshwise-tune-regret-") as folder:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
        for s in SCENARIOS:
            if s.name in args.only.split(","):
                run_scenario(s, args, Path(args.keep or folder))


if __name__ == "__main__":
    main()
