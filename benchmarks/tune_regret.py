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
measurement and marked ``*``). A trial is a layout measured (meshwise.tune.trials.trials_used, the
rule ``--trials`` counts by), as the exhaustive run's N counts its layouts; the run-off measures two
of them again, interleaved, and is printed beside it with its warm-up and timed steps; steps used
(trials.steps_used) counts every warm-up and timed step of the tune, the run-off's included, over
those of the exhaustive run of the same round, beside the tune's own budget. The profile's error
is ``(predicted - measured) / measured`` of the exhaustive steps, mean absolute, under the base
profile and under the tune's refitted one, over the layouts the tune tried and over all N; beside
them the refitted profile's error on the tune's own measured steps (its summary's
``error_after``: the steps it was fitted to, measured minutes after the exhaustive run's). The
target: tune within 3% of the best, at most a third of the field's trials and steps; the
refitted profile within 10% on the tried layouts.

Scenarios: ``one`` (1 process, ``medium``, this machine's calibration), ``two`` (2 processes,
``small``, this machine's calibration), ``four`` (4 processes, ``small``, planned from the
catalog's ``cpu`` profile: the one where the catalog's first ranking is wrong, as the exhaustive
field shows: regret(auto) > 0). A benchmark that prints, not a test; run it on a quiet host:

    .venv/bin/python benchmarks/tune_regret.py [--rounds 3] [--steps 5] [--warmup 2] [--field 12]
                                               [--only one,two,four] [--keep DIR] [--new-rounds K]

With ``--keep DIR`` every tune's JSON summary is kept there and a round already kept is read, not
run again; ``--new-rounds K`` runs at most K rounds per scenario, so a long benchmark runs in
pieces (the last one prints every round).
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
from meshwise.tune.trials import steps_used, trial_from_json


@dataclass(frozen=True)
class Scenario:
    name: str
    nproc: int
    model: str
    seq: int
    batch: int
    catalog: bool = False  # plan from the catalog's cpu profile instead of this machine's calibration


SCENARIOS = (
    Scenario("one", 1, "medium", 128, 8),
    Scenario("two", 2, "small", 128, 8),
    Scenario("four", 4, "small", 128, 8, catalog=True),
)


def _tune(s: Scenario, out: Path, args: argparse.Namespace, profile: str | None, extra: list[str]) -> dict:
    """The tune's JSON summary: kept in ``out.json`` (read from there when kept before)."""
    kept = out.with_suffix(".json")
    if kept.exists():
        return json.loads(kept.read_text())
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
    summary = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    kept.write_text(json.dumps(summary))
    return summary


def _steps(rows: list[dict], warmup: int) -> int:
    """Warm-up and timed steps of a tune's trials or run-off (trials.steps_used)."""
    return steps_used([trial_from_json(t) for t in rows], warmup)


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
    exhaustive: list[dict] = []
    new = 0
    for r in range(args.rounds):
        ex_out, tune_out = folder / f"{s.name}-exhaustive-{r}", folder / f"{s.name}-tune-{r}"
        if not (ex_out.with_suffix(".json").exists() and tune_out.with_suffix(".json").exists()):
            if new >= args.new_rounds:
                break
            new += 1
        ex = _tune(s, ex_out, args, profile, ["--exhaustive", str(args.field)])
        for t in ex["trials"]:
            if t["measured_step_s"]:
                steps.setdefault(t["layout"], []).append(t["measured_step_s"])
        exhaustive.append(ex)
        tunes.append(_tune(s, tune_out, args, profile, []))
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
    order = [t["layout"] for t in exhaustive[0]["trials"]] if exhaustive else []
    print("the exhaustive field in the base profile's order (its first is --layout auto's pick when they match):")
    for text in order:
        rounds = " ".join(f"{x:.4g}" for x in steps.get(text, []))
        print(f"  {text:<72} median {measured.get(text, float('nan')):.4g} s  rounds {rounds}")
    print(
        "round  trials used (layouts)  run-off (steps)  steps used (all) / budget  regret(tune)  regret(auto)  "
        "error before/after (tried)  (all N)  after, on the tune's own steps"
    )
    for r, tune in enumerate(tunes):
        pick = tune["pick"]
        pick_s = measured.get(pick, tune["pick_step_s"])
        mark = "" if pick in measured else "*"
        auto_s = measured.get(tune["auto"], float("nan"))
        tried = [t["layout"] for t in tune["trials"]]
        runoff = tune["runoff"]
        used = f"{len(tried)} / {len(measured)}"
        runoff_used = f"{len(runoff)} ({_steps(runoff, args.warmup)})" if runoff else "-"
        spent = _steps(tune["trials"] + runoff, args.warmup)
        whole = _steps(exhaustive[r]["trials"], args.warmup)
        spent_text = f"{spent} / {whole} ({spent / whole:.0%}) / {tune['step_budget']}"
        start = _base_table(tune["base_profile"])
        refitted = read_toml(Path(tune["profile"]), "profile")
        print(
            f"{r + 1:>5}  {used:<22}  {runoff_used:<15}  {spent_text:<25}  {pick_s / best - 1:>+11.1%}{mark:1}  "
            f"{auto_s / best - 1:>+11.1%}  {_errors(start, tried, measured, predictor):>11.1%} / "
            f"{_errors(refitted, tried, measured, predictor):<13.1%}  "
            f"{_errors(start, list(measured), measured, predictor):.1%} / "
            f"{_errors(refitted, list(measured), measured, predictor):.1%}  "
            f"{sum(map(abs, tune['error_after'])) / max(1, len(tune['error_after'])):.1%}"
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
    ap.add_argument("--field", type=int, default=12, help="layouts measured exhaustively per scenario (>= 8)")
    ap.add_argument("--new-rounds", type=int, default=1_000, help="with --keep: run at most this many rounds now")
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
