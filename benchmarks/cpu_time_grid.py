"""Step time on this CPU over a grid: predicted (this machine's calibration) against measured, for
86 points: 66 over 3 model widths (hidden 64, 192, 512), sequences 32 to 1,024, micro-batches 1 to
16, at 1, 2 and 4 processes, over the parity suite's layout kinds (tests/_parity_cases.py: ZeRO 0-3,
TP with SP off and on, PP under GPipe, 1F1B, interleaved 1F1B and zero-bubble, activation
checkpointing, context parallelism, and their 4-process combinations); and 20 off that first grid
(``WIDE``): vocabularies of 32k and 64k, sequences of 2k to 8k (attention, CP and TP at length), and
a mixture of experts (8 experts, top-2) under ep=2. Each round's calibration is topped up at the
points' own loss and attention shapes (measure/plan_shapes.py). ``--only wide`` times those 20.

Measured in interleaved rounds: each round is one launch per process count (1, then 2, then 4),
which builds all of that count's points, warms each up, then times ``--steps`` steps round robin
over them (benchmarks/_cpu_grid_worker.py). A point's measured step is the median over every
round of the slowest rank's step. Predicted: ``meshwise.cost.estimate`` with the profile ``train``
and ``measure`` use (measure/auto_profile.py's quick calibration), calibrated afresh before every
round (``--calibration fresh``, the default) or re-checked as each ``measure`` run re-checks a
cached one (``--calibration recheck``: recalibrated only where the probe reads the machine moved
beyond the bound). Each round's steps are predicted with the profile in force for that round, and a
point's prediction is the median of its steps' predictions. Why fresh: this 2-core VM's speed moves
by up to 2x within minutes and the probe's one-second look did not foresee the minute after it
(docs/fidelity.md); a calibration per round samples the machine's states as the rounds do, and the
median over rounds meets the measured median on the same footing.

Prints per point predicted and measured step, the error and the parts (predicted / measured:
compute, exposed comm, pipeline idle, optimizer, fixed), then the acceptance counts:
at least 90% of points within 25%, none beyond 50%, Spearman >= 0.9 within each process count.
The acceptance asks for a quiet machine: the report says whether this one was (every round's probe
within ``QUIET_DRIFT`` of its calibration), from the readings a ``--save`` file keeps.

    flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/cpu_time_grid.py \
        --report benchmarks/results/cpu-time-grid-cpu2core.txt

or in parts (one process count each, ``--save``), then one report from them all:
``--replay 1.json --replay 2.json --replay 4.json --report ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from meshwise.cost.estimate import estimate  # noqa: E402
from meshwise.launch import launch_logged  # noqa: E402
from meshwise.layout import check_runnable, parse  # noqa: E402
from meshwise.measure import auto_profile, probe  # noqa: E402
from meshwise.measure.plan_shapes import shapes_of  # noqa: E402
from meshwise.spec import TrainSpec, load_cluster, load_model  # noqa: E402
from rank_cpu_layouts import spearman  # noqa: E402

MODELS = {  # hidden: (layers, heads, kv_heads, ffn_hidden); Llama-style, untied byte vocabulary
    64: (4, 4, 2, 176),
    192: (4, 6, 2, 512),
    512: (4, 8, 4, 1408),
}
# off the first grid: a model's name: (its width in MODELS, fields that differ)
WIDE = {
    "64-v32k": (64, {"vocab": 32768}),
    "192-v32k": (192, {"vocab": 32768}),
    "64-v64k": (64, {"vocab": 65536}),
    "64-s8k": (64, {"max_seq": 8192}),
    "192-s8k": (192, {"max_seq": 8192}),
    "64-moe8": (64, {"experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 64}),
}
# (processes, hidden, layout, global batch, sequence length)
POINTS = [
    (1, 64, "mbs=1", 4, 256),
    (1, 64, "mbs=4", 8, 128),
    (1, 64, "mbs=16", 16, 32),
    (1, 64, "mbs=8,ac=full", 8, 64),
    (1, 64, "mbs=2,ac=selective", 4, 1024),
    (1, 64, "mbs=4", 8, 512),
    (1, 64, "mbs=1", 8, 32),
    (1, 192, "mbs=1", 2, 512),
    (1, 192, "mbs=2", 4, 128),
    (1, 192, "mbs=8", 8, 64),
    (1, 192, "mbs=16", 16, 32),
    (1, 192, "mbs=4,ac=full", 4, 128),
    (1, 192, "mbs=1,ac=selective", 1, 1024),
    (1, 512, "mbs=1", 1, 256),
    (1, 512, "mbs=1", 2, 64),
    (1, 512, "mbs=4", 4, 32),
    (1, 512, "mbs=2,ac=full", 2, 64),
    (1, 512, "mbs=8", 8, 32),
    (1, 512, "mbs=1,ac=selective", 1, 256),
    (1, 192, "mbs=1", 1, 1024),
    (2, 64, "dp=2,zero=0,mbs=4", 8, 64),
    (2, 192, "dp=2,zero=1,mbs=2", 8, 128),
    (2, 512, "dp=2,zero=2,mbs=1", 4, 64),
    (2, 64, "dp=2,zero=3,mbs=1", 8, 128),
    (2, 192, "dp=2,zero=3,mbs=4", 8, 64),
    (2, 512, "dp=2,zero=3,mbs=2", 4, 32),
    (2, 64, "tp=2,sp=off,mbs=8", 16, 32),
    (2, 192, "tp=2,sp=on,mbs=2", 4, 256),
    (2, 512, "tp=2,sp=off,mbs=1", 2, 128),
    (2, 192, "tp=2,sp=off,mbs=1", 1, 1024),
    (2, 64, "pp=2,schedule=gpipe,mbs=2", 8, 128),
    (2, 192, "pp=2,schedule=1f1b,mbs=1", 4, 256),
    (2, 512, "pp=2,schedule=1f1b,mbs=1", 4, 32),
    (2, 64, "pp=2,vpp=2,schedule=interleaved-1f1b,mbs=1", 4, 512),
    (2, 192, "pp=2,vpp=2,schedule=zero-bubble,mbs=2", 8, 64),
    (2, 64, "dp=2,zero=3,ac=selective,mbs=2", 8, 256),
    (2, 192, "tp=2,sp=on,ac=selective,mbs=4", 8, 64),
    (2, 64, "dp=2,zero=0,ac=full,mbs=16", 32, 32),
    (2, 192, "pp=2,schedule=1f1b,ac=full,mbs=2", 8, 64),
    (2, 64, "cp=2,mbs=1", 2, 1024),
    (2, 192, "cp=2,mbs=2", 4, 256),
    (2, 512, "dp=2,zero=0,mbs=1", 2, 256),
    (2, 64, "dp=2,zero=1,mbs=8", 16, 64),
    (2, 192, "dp=2,zero=2,mbs=1", 4, 512),
    (4, 64, "dp=2,tp=2,mbs=2", 8, 64),
    (4, 192, "dp=2,tp=2,mbs=1", 4, 128),
    (4, 512, "dp=2,tp=2,mbs=1", 2, 64),
    (4, 64, "dp=2,zero=3,tp=2,mbs=2", 8, 128),
    (4, 192, "dp=2,zero=3,tp=2,mbs=1", 2, 256),
    (4, 64, "pp=2,tp=2,mbs=2", 8, 64),
    (4, 192, "pp=2,tp=2,mbs=1", 4, 128),
    (4, 64, "pp=2,dp=2,zero=1,mbs=1", 8, 128),
    (4, 192, "pp=2,dp=2,zero=1,mbs=2", 8, 64),
    (4, 512, "pp=2,dp=2,zero=1,mbs=1", 4, 32),
    (4, 64, "pp=2,dp=2,zero=3,mbs=4", 16, 32),
    (4, 192, "pp=2,dp=2,zero=3,mbs=1", 4, 256),
    (4, 64, "dp=4,zero=3,shard=2,mbs=2", 8, 256),
    (4, 192, "dp=4,zero=3,shard=2,mbs=1", 4, 128),
    (4, 64, "dp=2,zero=3,tp=2,ac=full,mbs=4", 8, 64),
    (4, 192, "pp=2,dp=2,zero=1,ac=selective,mbs=1", 4, 128),
    (4, 64, "dp=2,zero=1,tp=2,sp=off,mbs=8", 16, 32),
    (4, 64, "cp=2,dp=2,zero=3,mbs=1", 2, 1024),
    (4, 192, "cp=2,dp=2,zero=1,mbs=1", 2, 512),
    (4, 64, "cp=2,tp=2,mbs=4", 4, 256),
    (4, 64, "cp=2,pp=2,mbs=1", 4, 512),
    (4, 64, "dp=4,zero=1,mbs=16", 64, 32),
    # wide vocabularies: the head's GEMMs and the loss over 32k and 64k logits per token
    (1, "64-v32k", "mbs=1", 2, 256),
    (1, "192-v32k", "mbs=2", 4, 128),
    (1, "64-v64k", "mbs=1", 1, 512),
    (2, "64-v32k", "tp=2,sp=off,mbs=1", 2, 256),
    (2, "192-v32k", "dp=2,zero=3,mbs=1", 4, 128),
    (2, "64-v64k", "pp=2,schedule=1f1b,mbs=1", 4, 128),
    (4, "64-v32k", "dp=2,tp=2,mbs=1", 4, 256),
    # sequences of 2k to 8k: attention, CP's ring and TP at length
    (1, "64-s8k", "mbs=1", 1, 2048),
    (1, "64-s8k", "mbs=1", 1, 4096),
    (1, "192-s8k", "mbs=1", 1, 2048),
    (1, "64-s8k", "mbs=1,ac=full", 1, 8192),
    (2, "64-s8k", "cp=2,mbs=1", 1, 2048),
    (2, "64-s8k", "cp=2,mbs=1", 1, 4096),
    (2, "192-s8k", "tp=2,sp=off,mbs=1", 1, 2048),
    (2, "64-s8k", "tp=2,sp=on,mbs=1", 1, 4096),
    (4, "64-s8k", "cp=2,dp=2,zero=1,mbs=1", 2, 4096),
    (4, "192-s8k", "cp=2,tp=2,mbs=1", 1, 2048),
    # mixture of experts, 8 experts top-2 under ep=2 (priced by cost/experts.py)
    (2, "64-moe8", "dp=2,ep=2,mbs=1", 4, 128),
    (2, "64-moe8", "dp=2,zero=3,ep=2,mbs=2", 8, 64),
    (4, "64-moe8", "dp=2,tp=2,ep=2,mbs=1", 4, 128),
]
WITHIN, NONE_BEYOND, SHARE_WITHIN, SPEARMAN_BOUND = 0.25, 0.50, 0.90, 0.9
# A quiet machine: after every round the probe (measure/probe.py) reads within this of the round's
# calibration. On this 2-core VM quiet rounds read within ±3% and moving ones up to ±122%
# (docs/fidelity.md); a grid on a moving host times the host, not the model.
QUIET_DRIFT = 0.10
PARTS = (
    ("compute_s", "compute_s"),
    ("comm_exposed_s", "comm_s"),
    ("bubble_s", "idle_s"),
    ("optimizer_s", "optimizer_s"),
    ("fixed_s", "fixed_s"),
)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def model_toml(key) -> str:
    """A grid model's TOML: a width of ``MODELS`` (untied byte vocabulary, 1,024 tokens), or one of
    ``WIDE``: such a width with some fields changed."""
    width, changed = (key, {}) if key in MODELS else WIDE[key]
    layers, heads, kv, ffn = MODELS[width]
    fields = {
        "name": f"grid-h{key}",
        "layers": layers,
        "hidden": width,
        "heads": heads,
        "kv_heads": kv,
        "ffn_hidden": ffn,
        "mlp": "swiglu",
        "vocab": 256,
        "tied_embeddings": False,
        "max_seq": 1024,
        **changed,
        "source": "benchmarks/cpu_time_grid.py",
    }
    return "".join(
        f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v).replace(chr(39), chr(34))}\n"
        for k, v in fields.items()
    )


def measure_round(n: int, points: list[tuple], files: dict[int, str], steps: int, tmp: Path) -> list[list[dict]]:
    """One launch of ``n`` processes timing ``points``: per point, the slowest rank's (step, parts) per step."""
    out = tmp / f"round-{n}-{time.monotonic_ns()}"
    argv = ["--out", str(out), "--steps", str(steps)]
    for _, hidden, layout, gb, seq in points:
        argv += ["--point", f"{files[hidden]}|{layout}|{gb}|{seq}"]
    launch_logged("_cpu_grid_worker", argv, n, out / "logs", f"grid round at {n} processes", 20)
    result = []
    for i in range(len(points)):
        ranks = [json.loads(f.read_text())["steps"] for f in sorted((out / str(i)).glob("rank*.json"))]
        result.append([{"step_s": s, **parts} for s, parts in (max(k, key=lambda t: t[0]) for k in zip(*ranks))])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per point per round (default 3)")
    ap.add_argument("--nproc", type=int, action="append", help="process counts (default: 1, 2 and 4)")
    ap.add_argument("--every", type=int, default=1, help="keep every k-th point of each count (a short subset)")
    ap.add_argument(
        "--only",
        choices=("all", "wide", "first"),
        default="all",
        help="all points (default), the 20 off the first grid, or the first grid's 66",
    )
    ap.add_argument("--profile-dir", help="a folder of <n>.toml profiles (default: this machine's calibration)")
    ap.add_argument(
        "--calibration",
        choices=("fresh", "recheck"),
        default="fresh",
        help="before each round: calibrate afresh (default), or re-check the cached calibration",
    )
    ap.add_argument("--save", help="write the measurements and profiles to this JSON file")
    ap.add_argument(
        "--replay",
        action="append",
        help="predict again for the measurements of a --save file (no measuring); repeated, the saves merged",
    )
    ap.add_argument("--report", help="also write the report, with the command and the load, to this file")
    args = ap.parse_args()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    say(f"{platform.node()}, {os.cpu_count()} cores, load average at the start {load()}")
    with tempfile.TemporaryDirectory(prefix="meshwise-cpu-grid-") as tmp_name:
        tmp = Path(tmp_name)
        files = {}
        for hidden in [*MODELS, *WIDE]:
            files[hidden] = str(tmp / f"grid-h{hidden}.toml")
            Path(files[hidden]).write_text(model_toml(hidden))
        if args.replay:
            saved = merged([json.loads(Path(f).read_text()) for f in args.replay])
        else:
            saved = measure(args, files, tmp, say)
            if args.save:  # before predicting: a prediction that fails can be replayed once fixed
                Path(args.save).write_text(json.dumps(saved))
        rows = predict(saved, files, tmp)
    code = report(rows, say, quiet(saved.get("drifts", [])))
    say(f"load average at the end {load()}")
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n")
    return code


def merged(saves: list[dict]) -> dict:
    """One save from several (a grid measured in parts, e.g. one ``--nproc`` each): their probe
    readings and points together, each save's profiles kept as its own, keyed ``"<part>:<n>"`` (the
    save's index, the process count), and each point told its part, so that two parts measured at
    the same process count are each predicted with their own profiles."""
    out: dict = {"profiles": {}, "drifts": [], "points": []}
    for part, save in enumerate(saves):
        out["profiles"].update({f"{part}:{n}": texts for n, texts in save["profiles"].items()})
        out["drifts"] += save.get("drifts", [])
        out["points"] += [{**point, "part": part} for point in save["points"]]
    return out


def profile_key(entry: dict) -> str:
    """The key of a point's profiles in its save: ``"<part>:<n>"`` in a merged save, else ``"<n>"``."""
    n = entry["point"][0]
    return f"{entry['part']}:{n}" if "part" in entry else str(n)


def drift(profile: str) -> float:
    """How far the machine now reads from the profile's probe (measure/probe.py)."""
    table = tomllib.loads(Path(profile).read_text())
    return probe.drift(table, probe.probe()) if all(k in table for k in probe.PROBE_KEYS) else 0.0


def measure(args, files: dict[int, str], tmp: Path, say) -> dict:
    """Profiles and measurements of every point: ``{"profiles": {n: toml}, "points": [...]}``."""
    counts = args.nproc or [1, 2, 4]
    chosen = [p for p in POINTS if args.only == "all" or (p[1] in WIDE) == (args.only == "wide")]
    by_n = {n: [p for p in chosen if p[0] == n][:: args.every] for n in counts}
    for n, points in by_n.items():  # refuse a bad point before measuring anything
        for _, hidden, layout, gb, seq in points:
            check_runnable(parse(layout, n), load_model(files[hidden]), n, gb, seq)
    profiles: dict[int, list[str]] = {n: [] for n in counts}  # per round, the profile's text
    # the loss and attention at every point's shapes, where the calibration's tables stop short
    shapes = {
        n: sorted(
            {
                shapes_of(load_model(files[h]), seq, lay.mbs, lay.tp, lay.cp, ep=lay.ep, folded=lay.ep_folds_tp)
                for _, h, layout, _, seq in points
                for lay in [parse(layout, n)]
            },
            key=lambda s: (-s.seq, -s.tokens * s.vocab),
        )
        for n, points in by_n.items()
    }

    def profile(n: int) -> str:
        start = time.perf_counter()
        path = (
            str(Path(args.profile_dir) / f"{n}.toml")
            if args.profile_dir
            else str(auto_profile.ensure(n, say, fresh=args.calibration == "fresh", shapes=shapes[n]))
        )
        say(f"[{n} processes] profile {path} ({time.perf_counter() - start:.0f} s to calibrate, check or read)")
        profiles[n].append(Path(path).read_text())
        return path

    steps: dict[tuple, list[dict]] = {p: [] for n in counts for p in by_n[n]}
    drifts: list[list[float]] = []  # [round, processes, the probe's reading after the round]
    start = time.perf_counter()
    for r in range(args.rounds):
        for n in counts:
            path = profile(n)  # calibrated afresh, or re-checked as each `measure` run re-checks it
            t0 = time.perf_counter()
            for p, measured in zip(by_n[n], measure_round(n, by_n[n], files, args.steps, tmp)):
                steps[p] += [{**m, "round": r} for m in measured]
            drifts.append([r, n, drift(path)])
            say(
                f"round {r + 1}, {n} processes: {len(by_n[n])} points in {time.perf_counter() - t0:.0f} s, "
                f"load {load()}, the machine reads {drifts[-1][2]:+.0%} against its calibration"
            )
    say(f"measured in {time.perf_counter() - start:.0f} s")
    return {
        "profiles": {str(n): texts for n, texts in profiles.items()},
        "drifts": drifts,
        "points": [{"point": list(p), "steps": s} for p, s in steps.items()],
    }


def quiet(drifts: list[list[float]]) -> tuple[bool | None, str]:
    """(whether the machine held still, one line saying so) from measure's per-round probe readings;
    (None, "") for a save made before they were kept."""
    if not drifts:
        return None, ""
    r, n, worst = max(drifts, key=lambda d: abs(d[2]))
    if abs(worst) <= QUIET_DRIFT:
        return True, (
            f"a quiet machine: after every round the probe read within ±{QUIET_DRIFT:.0%} of the round's "
            f"calibration (largest {worst:+.0%})"
        )
    return False, (
        f"NOT a quiet machine: after round {int(r) + 1} at {int(n)} processes the probe read {worst:+.0%} "
        f"against the round's calibration (quiet: within ±{QUIET_DRIFT:.0%}); these figures time "
        "the host's moves as much as the model"
    )


def predict(saved: dict, files: dict[int, str], tmp: Path) -> list[dict]:
    """Per point, the measured median step and the median of its steps' predictions, each step
    predicted with the profile of its round (a save from before the per-round re-check holds one
    profile per process count, for every round)."""
    clusters: dict[str, list] = {}
    for key, texts in saved["profiles"].items():
        n = int(key.split(":")[-1])
        clusters[key] = []
        for r, text in enumerate([texts] if isinstance(texts, str) else texts):
            path = tmp / f"{key.replace(':', '-')}-{r}.toml"
            path.write_text(text)
            clusters[key].append(load_cluster(str(path), n, n))
    rows = []
    for entry in saved["points"]:
        n, hidden, layout, gb, seq = entry["point"]
        own = clusters[profile_key(entry)]
        median = sorted(entry["steps"], key=lambda s: s["step_s"])[len(entry["steps"]) // 2]
        rounds = [min(s.get("round", 0), len(own) - 1) for s in entry["steps"]]
        by_round = {
            r: estimate(load_model(files[hidden]), own[r], TrainSpec(gb, seq, precision="fp32"), parse(layout, n)).time
            for r in set(rounds)
        }
        each = sorted((by_round[r] for r in rounds), key=lambda t: t.step_s)
        rows.append(
            {
                "point": entry["point"],
                "pred": each[len(each) // 2],
                "meas": median,
                "all": [s["step_s"] for s in entry["steps"]],
            }
        )
    return rows


def report(rows: list[dict], say, machine: tuple[bool | None, str] = (None, "")) -> int:
    say(
        f"\n{'n':>1} {'model':>8} {'layout':<44} {'gb':>3} {'seq':>4} {'pred s':>7} {'meas s':>7} {'error':>7}  "
        "predicted/measured: compute, comm, idle, optimizer, fixed; spread of the measured steps"
    )
    errors = []
    for r in rows:
        n, hidden, layout, gb, seq = r["point"]
        p, m = r["pred"], r["meas"]
        err = p.step_s / m["step_s"] - 1
        errors.append(err)
        parts = ", ".join(f"{getattr(p, a, 0.0):.3f}/{m.get(b, 0.0):.3f}" for a, b in PARTS)
        spread = (max(r["all"]) - min(r["all"])) / statistics.median(r["all"])
        flag = "" if abs(err) <= WITHIN else (" x" if abs(err) <= NONE_BEYOND else " X")
        say(
            f"{n:>1} {hidden!s:>8} {layout:<44} {gb:>3} {seq:>4} {p.step_s:7.3f} {m['step_s']:7.3f} {err:+7.1%}{flag:2}"
            f" {parts}; {spread:.0%}"
        )
    within = sum(abs(e) <= WITHIN for e in errors)
    beyond = sum(abs(e) > NONE_BEYOND for e in errors)
    ok = within >= SHARE_WITHIN * len(rows) and beyond == 0
    say(
        f"\nwithin {WITHIN:.0%}: {within} of {len(rows)} ({within / len(rows):.0%}; bound {SHARE_WITHIN:.0%}); "
        f"beyond {NONE_BEYOND:.0%}: {beyond} (bound 0); mean |error| "
        f"{sum(abs(e) for e in errors) / len(errors):.1%}"
    )
    for n in sorted({r["point"][0] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["point"][0] == n]
        rho = spearman([rows[i]["pred"].step_s for i in idx], [rows[i]["meas"]["step_s"] for i in idx])
        ok &= rho >= SPEARMAN_BOUND
        say(f"Spearman ({n} process(es), {len(idx)} points): {rho:.3f} (bound {SPEARMAN_BOUND})")
    if machine[1]:
        say(machine[1])
    held = {True: "; a quiet machine", False: "; the machine moved", None: ""}[machine[0]]
    say(
        f"SUMMARY {'pass' if ok else 'FAIL'}: {within}/{len(rows)} within {WITHIN:.0%}, "
        f"{beyond} beyond {NONE_BEYOND:.0%}{held}"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    sys.exit(main())
