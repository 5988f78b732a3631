"""Regret: how much slower the layout ``--layout auto`` picks runs than the best of an obvious field.

    regret = (median step time of auto's pick) / (median step time of the fastest layout measured)

For each scenario (model, processes x threads, global batch, sequence, optional profile), on this
machine: ``meshwise train`` with ``--layout auto`` (as a user runs it; in the default scenario it
also chooses the processes) and a fixed field of alternatives (pure DP at mbs = B/dp without
recompute, ZeRO-1 and ZeRO-3, tp=2, pp=2, and in the default scenario, where meshwise also chooses
the processes, one process with every core). Every layout runs ``--steps`` steps; its figure is the median step time of the
steps after the first ``WARMUP_STEPS`` (from ``--metrics.file``). Rounds are interleaved (round 1
runs every layout of every scenario, then round 2...) so a busy machine shifts them together, and
each round starts its scenario's launches one place further along (the first launch of a scenario
ran 1.2-1.3x slow in some rounds on a 2-core VM); the median over rounds is reported with min and max.
Where auto picked exactly a field entry in every round (the same layout on the same processes:
after the choice, the same command line), the two are one configuration and their runs are pooled;
timing it twice and comparing auto's median with the field's would make regret the noise between
two launches of one layout.

The memory-tight scenario plans with a CPU profile of small memory (the catalog's ``cpu`` with
``memory_bytes`` cut), so the planner must trade time for memory; its field keeps only the layouts
that profile says fit.

A benchmark that prints, not a test:

    .venv/bin/python benchmarks/regret.py [--rounds 3] [--steps 10] [--only default,one,two,tight] \
        > benchmarks/results/regret-cpu2core.txt
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from meshwise.cost.estimate import estimate
from meshwise.layout import parse, runtime_refusal
from meshwise.spec import TrainSpec, load_cluster, load_model

WARMUP_STEPS = 3
CPU_ENTRY = Path(__file__).resolve().parents[1] / "src/meshwise/catalog/accelerators.toml"


@dataclass
class Scenario:
    key: str
    name: str
    model: str
    batch: int
    seq: int
    nproc: int | None  # None: meshwise chooses (the default command)
    field: list[tuple[str, int]]  # (layout, processes)
    memory_bytes: float | None = None
    picks: list[str] = field(default_factory=list)
    labels: dict[tuple[str, int], str] = field(default_factory=dict)  # field entry -> layout it ran


def scenarios(cores: int) -> list[Scenario]:
    two = [("dp=2,mbs=4", 2), ("dp=2,zero=1,mbs=4", 2), ("dp=2,zero=3,mbs=4", 2), ("tp=2,mbs=8", 2), ("pp=2,mbs=2", 2)]
    return [
        Scenario(
            "default",
            "default `meshwise train` (small, B=8, seq 128)",
            "small",
            8,
            128,
            None,
            [("dp=1,mbs=8", 1), ("dp=1,mbs=4", 1)] + two,
        ),
        Scenario(
            "one",
            "one process (small, B=8, seq 128)",
            "small",
            8,
            128,
            1,
            [("dp=1,mbs=8", 1), ("dp=1,mbs=4", 1), ("dp=1,mbs=2", 1), ("dp=1,mbs=8,ac=full", 1)],
        ),
        Scenario(
            "two",
            "two processes (medium, B=8, seq 256)",
            "medium",
            8,
            256,
            2,
            [
                ("dp=2,mbs=4", 2),
                ("dp=2,zero=1,mbs=4", 2),
                ("dp=2,zero=3,mbs=4", 2),
                ("dp=2,mbs=2", 2),
                ("tp=2,mbs=8", 2),
                ("pp=2,mbs=2", 2),
            ],
        ),
        Scenario(
            "tight",
            "memory-tight (medium, B=8, seq 256, one process, 550 MB profile)",
            "medium",
            8,
            256,
            1,
            [
                ("dp=1,mbs=8", 1),
                ("dp=1,mbs=4", 1),
                ("dp=1,mbs=2", 1),
                ("dp=1,mbs=1", 1),
                ("dp=1,mbs=8,ac=full", 1),
                ("dp=1,mbs=8,ac=selective", 1),
                ("dp=1,mbs=4,ac=full", 1),
            ],
            memory_bytes=550e6,
        ),
    ]


def write_profile(folder: Path, memory_bytes: float) -> str:
    table = dict(tomllib.loads(CPU_ENTRY.read_text())["cpu"])
    table["memory_bytes"] = memory_bytes
    lines = [
        f"{k} = {json.dumps(v) if isinstance(v, str) else ('true' if v is True else 'false' if v is False else v)}"
        for k, v in table.items()
    ]
    path = folder / "tight.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def fits(s: Scenario, layout_text: str, nproc: int, profile: str) -> bool:
    model = load_model(s.model)
    cluster = load_cluster(profile, nproc, nproc)
    return estimate(model, cluster, TrainSpec(s.batch, s.seq, "fp32"), parse(layout_text, nproc)).fits


def run_once(
    s: Scenario, layout_text: str, nproc: int | None, steps: int, profile: str, folder: Path
) -> tuple[float, str]:
    """(median step seconds after the warm-up, the layout line printed)."""
    metrics = folder / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "meshwise.cli",
        "train",
        "--model.name",
        s.model,
        "--layout",
        layout_text,
        "--schedule.global_batch",
        str(s.batch),
        "--data.seq_len",
        str(s.seq),
        "--schedule.steps",
        str(steps),
        "--schedule.eval_every",
        "0",
        "--checkpoint.dir",
        "",
        "--metrics.file",
        str(metrics),
        "--generate.tokens",
        "0",
    ]
    if nproc is not None:
        cmd += ["--nproc-per-node", str(nproc)]
    if profile:
        cmd += ["--layout.profile", profile]
    env = {k: v for k, v in os.environ.items() if k != "MESHWISE_THREADS"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{layout_text}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    times = [json.loads(line)["step_s"] for line in metrics.read_text().splitlines() if '"step_s"' in line]
    chosen = re.search(r"^Layout \((?:auto|given).*?\): (\S+)", proc.stdout, re.M)
    procs = re.search(r"Processes: (\d+ x \d+)", proc.stdout)
    label = (chosen.group(1) if chosen else layout_text) + (f" [{procs.group(1)} threads]" if procs else "")
    return statistics.median(times[WARMUP_STEPS:]), label


def field_key(layout_text: str, nproc: int) -> str:
    """A field entry's row: its layout as given and its processes."""
    return f"{layout_text} [{nproc}p]"


def same_launch(s: Scenario) -> str | None:
    """The field's key for auto's pick when every round picked the same layout and process count as
    that field entry (after the choice both run one command line), else None. Timing it twice and
    keeping the faster of two noisy medians for the field would charge auto for the host's noise."""
    picks = {re.sub(r" \[(\d+) x \d+ threads\]$", r" [\1p]", p) for p in s.picks}
    if len(picks) != 1:
        return None
    pick = picks.pop()
    if not pick.endswith("p]"):  # no process line: the scenario fixed the processes
        pick = field_key(pick, s.nproc)
    for text, n in s.field:
        if field_key(s.labels.get((text, n), text), n) == pick:
            return field_key(text, n)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated scenario keys: default, one, two, tight")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    keys = set(args.only.split(",")) if args.only else None
    chosen = [s for s in scenarios(cores) if keys is None or s.key in keys]
    with tempfile.TemporaryDirectory(prefix="meshwise-regret-") as tmp:
        folder = Path(tmp)
        profiles = {s.name: write_profile(folder, s.memory_bytes) if s.memory_bytes else "" for s in chosen}
        for s in chosen:
            # "pp=2 where it runs": the runtime refuses some layouts of some models (pp with tied embeddings)
            s.field = [(t, n) for t, n in s.field if runtime_refusal(parse(t, n), load_model(s.model), s.seq) is None]
            if profiles[s.name]:
                s.field = [(t, n) for t, n in s.field if fits(s, t, n, profiles[s.name])]
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for s in chosen:
                runs = [("auto", s.nproc)] + [(t, n) for t, n in s.field]
                runs = runs[r % len(runs) :] + runs[: r % len(runs)]  # auto is not always the first launch
                for text, n in runs:
                    t, label = run_once(s, text, n, args.steps, profiles[s.name], folder)
                    key = "auto" if text == "auto" else field_key(text, n)
                    if text == "auto":
                        s.picks.append(label)
                    else:
                        s.labels[(text, n)] = label
                    times.setdefault((s.name, key), []).append(t)
                    print(f"round {r + 1} {s.name[:30]:30s} {key:34s} {t * 1e3:8.1f} ms  {label}", flush=True)
        print()
        worst = 0.0
        for s in chosen:
            rows = {k: v for (name, k), v in times.items() if name == s.name}
            twin = same_launch(s)
            if twin is not None:  # one command line after the choice: one layout, one set of samples
                rows["auto"] = rows[twin] = rows["auto"] + rows[twin]
            med = {k: statistics.median(v) for k, v in rows.items()}
            order = sorted(med, key=med.get)
            best = order[0]
            regret = med["auto"] / med[best]
            worst = max(worst, regret)
            print(f"## {s.name}")
            print(f"auto picked: {', '.join(sorted(set(s.picks)))}")
            if twin is not None:
                print(f"  (the field's {twin} every round: the same launch, its {len(rows[twin])} runs pooled)")
            for k in order:
                v = rows[k]
                print(f"  {k:40s} median {med[k] * 1e3:8.1f} ms  (min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f})")
            print(f"  auto's rank {order.index('auto') + 1} of {len(order)}; regret = {regret:.2f}\n")
        print(f"worst regret over {len(chosen)} scenario(s): {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
