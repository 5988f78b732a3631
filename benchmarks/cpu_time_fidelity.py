"""Step time on this CPU: predicted (after calibration) against measured, for 13 layouts at 2 and 4
processes, every layout of a process count measured back to back in ONE launch.

Layouts: at 2 processes dp with ZeRO 0-3, tp=2 with SP off and on, pp=2 with GPipe, 1F1B,
interleaved 1F1B and zero-bubble; at 4 processes dp=4 ZeRO-1, dp=2 x tp=2 and pp=2 x dp=2; at 8
processes the 3-D dp=2 x tp=2 x pp=2 (1F1B, micro-batches of 2: m = 2 per replica, as pp=2 x dp=2),
in a launch of its own (``--nproc 8``; the default runs 2 and 4). The model is rank_cpu_layouts.py's untied byte model of 3,082,496 parameters,
global batch 8 x 256 tokens, fp32, AdamW, one thread per process.

The profile is this machine's calibration at each process count, as ``train`` and ``measure`` use
it without a profile (``measure/auto_profile.py``: measured at first use, then cached), unless
``--profile-dir`` names a folder of ``<n>.toml`` profiles or ``--calibrate-model`` asks for a full
``meshwise calibrate`` on the benchmark's own model. Measured: the median of ``--steps`` timed steps
of the slowest rank (``meshwise measure``'s worker), split into parts that add up to it.

Prints, per layout, predicted and measured step time and parts; Spearman's rank correlation; for
every pair of layouts the measured step-time ratio against the predicted one; and the counts
passing the issue's bounds (25% per layout, 30% per pair, Spearman >= 0.9).

    flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/cpu_time_fidelity.py \
        > benchmarks/results/cpu-time-fidelity-cpu2core.txt   # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meshwise.cost.estimate import estimate  # noqa: E402
from meshwise.layout import parse  # noqa: E402
from meshwise.measure import auto_profile  # noqa: E402
from meshwise.measure.calibrate import calibrate, format_toml, with_memory_bound_term, with_per_rank_of  # noqa: E402
from meshwise.measure.run import run_workers  # noqa: E402
from meshwise.spec import TrainSpec, load_cluster, load_model  # noqa: E402
from rank_cpu_layouts import MODEL_TOML, spearman  # noqa: E402

GLOBAL_BATCH, SEQ_LEN = 8, 256
LAYOUTS = {
    2: (
        "dp=2,zero=0,mbs=4",
        "dp=2,zero=1,mbs=4",
        "dp=2,zero=2,mbs=4",
        "dp=2,zero=3,mbs=4",
        "tp=2,sp=off,mbs=8",
        "tp=2,sp=on,mbs=8",
        "pp=2,schedule=gpipe,mbs=2",
        "pp=2,schedule=1f1b,mbs=2",
        "pp=2,vpp=2,schedule=interleaved-1f1b,mbs=2",
        "pp=2,vpp=2,schedule=zero-bubble,mbs=2",
    ),
    4: ("dp=4,zero=1,mbs=2", "dp=2,tp=2,mbs=4", "pp=2,dp=2,mbs=2"),
    8: ("dp=2,tp=2,pp=2,mbs=2",),
}
LAYOUT_BOUND, PAIR_BOUND, SPEARMAN_BOUND = 0.25, 0.30, 0.9
PARTS = (
    ("compute_s", "compute_s"),
    ("comm_exposed_s", "comm_s"),
    ("bubble_s", "idle_s"),
    ("optimizer_s", "optimizer_s"),
)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="timed steps per layout (median; default 7)")
    ap.add_argument("--nproc", type=int, action="append", help="process counts: 2, 4, 8 (default: 2 and 4)")
    ap.add_argument("--profile-dir", help="a folder of <n>.toml profiles (default: this machine's cached calibration)")
    ap.add_argument("--calibrate-model", action="store_true", help="calibrate now on the benchmark's model instead")
    ap.add_argument("--save", help="write the measurements and profiles to this JSON file")
    ap.add_argument("--replay", help="predict again for the measurements of a --save file (no measuring)")
    args = ap.parse_args()
    if args.replay:
        return replay(args.replay)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    counts = args.nproc or [2, 4]
    rows: list[dict] = []
    saved: dict = {"profiles": {}, "measured": [], "calibration_version": auto_profile.CALIBRATION_VERSION}
    with tempfile.TemporaryDirectory(prefix="meshwise-cpu-fidelity-") as tmp:
        model_file = Path(tmp) / "bench-cpu.toml"
        model_file.write_text(MODEL_TOML)
        model = load_model(str(model_file))
        train = TrainSpec(GLOBAL_BATCH, SEQ_LEN, precision="fp32")
        for n in counts:
            start = time.perf_counter()
            if args.profile_dir:
                profile = str(Path(args.profile_dir) / f"{n}.toml")
            elif args.calibrate_model:
                profile = str(Path(tmp) / f"{n}.toml")
                calibrate(n, str(model_file), profile, SEQ_LEN)
            else:
                profile = str(auto_profile.ensure(n))
            cal_s = time.perf_counter() - start
            cluster = load_cluster(profile, n, n)
            saved["profiles"][str(n)] = Path(profile).read_text()
            a = cluster.accelerator
            print(
                f"[{n} processes] profile {profile} ({cal_s:.1f} s to calibrate or read): matmul "
                f"{a.peak_fp32_flops_per_s / 1e9:.1f} GFLOP/s x {a.efficiency_max:.2f}, copy {a.hbm_bytes_per_s / 1e9:.1f}"
                f" GB/s, gloo {cluster.intra.bytes_per_s / 1e9:.2f} GB/s + {cluster.intra.latency_s * 1e6:.0f} us, "
                f"{a.op_overhead_s * 1e6:.1f} us/op, {a.tp_op_s * 1e6:.0f} us/DTensor op",
                flush=True,
            )
            print(f"  load average before the launch: {load()}", flush=True)
            start = time.perf_counter()
            records = run_workers(n, list(LAYOUTS[n]), str(model_file), GLOBAL_BATCH, SEQ_LEN, args.steps)
            print(
                f"  measured {len(LAYOUTS[n])} layouts in one launch in {time.perf_counter() - start:.0f} s; "
                f"load average after: {load()}",
                flush=True,
            )
            for text, recs in zip(LAYOUTS[n], records):
                slowest = max(recs, key=lambda r: r["time"]["step_s"])
                rows.append(
                    {
                        "n": n,
                        "layout": text,
                        "pred": estimate(model, cluster, train, parse(text, n)).time,
                        "meas": slowest["time"],
                    }
                )
                saved["measured"].append({"n": n, "layout": text, "time": slowest["time"]})
            if args.save:
                Path(args.save).write_text(json.dumps(saved))
    return report(rows)


def alone_profiles(profiles: dict[str, str], version: int) -> dict[str, str]:
    """Saved profiles as the current calibration (version 5) reads them. Version 4: a profile of
    more ranks than cores takes its per-rank figures from the same run's ``cores``-process profile
    (``auto_profile``); before version 3 the 4-process profile measured them with all four ranks at
    once (shared cores, or a core caught alone); in version 3 with two ranks alone, but in a launch
    of its own. Version 5: the efficiency net of the memory-bound term (``with_memory_bound_term``,
    on the auto-calibration's model and sequence length, which every saved run used)."""
    tables = {n: tomllib.loads(text) for n, text in profiles.items()}
    if version < 4:
        for n, table in list(tables.items()):
            cores = int(table.get("cores_per_node", 0))
            if cores and int(n) > cores and str(cores) in tables:
                tables[n] = with_per_rank_of(table, tables[str(cores)], f"from the {cores}-process profile (replay)")
    if version < 5:
        model = load_model(auto_profile.MODEL)
        for n, table in tables.items():
            if f"of {auto_profile.MODEL} at {auto_profile.SEQ_LEN} tokens" not in table["source"]:
                raise SystemExit(f"replay: the {n}-process profile is not an auto-calibration: {table['source']}")
            tables[n] = with_memory_bound_term(table, model, auto_profile.SEQ_LEN)
    return {n: format_toml(table) for n, table in tables.items()}


def replay(path: str) -> int:
    """The report for saved measurements, predicted with the current cost model and the saved
    profiles (those of calibration version < 4 read as :func:`alone_profiles`)."""
    saved = json.loads(Path(path).read_text())
    with tempfile.TemporaryDirectory(prefix="meshwise-cpu-fidelity-") as tmp:
        model_file = Path(tmp) / "bench-cpu.toml"
        model_file.write_text(MODEL_TOML)
        model = load_model(str(model_file))
        train = TrainSpec(GLOBAL_BATCH, SEQ_LEN, precision="fp32")
        clusters = {}
        for n, text in alone_profiles(saved["profiles"], saved.get("calibration_version", 2)).items():
            (Path(tmp) / f"{n}.toml").write_text(text)
            clusters[int(n)] = load_cluster(str(Path(tmp) / f"{n}.toml"), int(n), int(n))
        rows = [
            {
                "n": r["n"],
                "layout": r["layout"],
                "meas": r["time"],
                "pred": estimate(model, clusters[r["n"]], train, parse(r["layout"], r["n"])).time,
            }
            for r in saved["measured"]
        ]
    return report(rows)


def report(rows: list[dict]) -> int:
    print(
        f"\n{'n':>2} {'layout':<44} {'pred s':>7} {'meas s':>7} {'error':>7}   "
        "predicted / measured: compute, comm, bubble|idle, optimizer (+ measured other)"
    )
    ok = 0
    for r in rows:
        p, m = r["pred"], r["meas"]
        err = p.step_s / m["step_s"] - 1
        ok += abs(err) <= LAYOUT_BOUND
        parts = ", ".join(f"{getattr(p, a):.3f}/{m[b]:.3f}" for a, b in PARTS)
        print(
            f"{r['n']:>2} {r['layout']:<44} {p.step_s:7.3f} {m['step_s']:7.3f} {err:+7.1%}{'' if abs(err) <= LAYOUT_BOUND else ' x'}"
            f"   {parts} (+{m.get('fixed_s', m.get('other_s', 0.0)):.3f} fixed)"
            f"; steps {', '.join(f'{s:.3f}' for s in m['steps_s'])}"
        )
    pred = [r["pred"].step_s for r in rows]
    meas = [r["meas"]["step_s"] for r in rows]
    rho = spearman(pred, meas)
    print(f"\nper layout within {LAYOUT_BOUND:.0%}: {ok} of {len(rows)}")
    print(f"Spearman (all {len(rows)}): {rho:.3f} (bound {SPEARMAN_BOUND})")
    for n in sorted({r["n"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["n"] == n]
        if len(idx) > 2:
            print(
                f"Spearman ({n} processes, {len(idx)} layouts): {spearman([pred[i] for i in idx], [meas[i] for i in idx]):.3f}"
            )
    print(f"\nevery pair (a, b): measured step(a)/step(b) against predicted; 'x' beyond {PAIR_BOUND:.0%}")
    passes, total, same = 0, 0, [0, 0]
    for i, j in itertools.combinations(range(len(rows)), 2):
        pr, mr = pred[i] / pred[j], meas[i] / meas[j]
        err = pr / mr - 1
        good = abs(err) <= PAIR_BOUND
        passes += good
        total += 1
        if rows[i]["n"] == rows[j]["n"]:
            same[0] += good
            same[1] += 1
        print(
            f"  {rows[i]['n']}:{rows[i]['layout']:<44} / {rows[j]['n']}:{rows[j]['layout']:<44} "
            f"meas {mr:6.3f} pred {pr:6.3f} {err:+7.1%}{'' if good else ' x'}"
        )
    print(f"\npairs within {PAIR_BOUND:.0%}: {passes} of {total} (same launch: {same[0]} of {same[1]})")
    print(
        f"SUMMARY layouts {ok}/{len(rows)} within {LAYOUT_BOUND:.0%}; Spearman {rho:.3f}; "
        f"pairs {passes}/{total} within {PAIR_BOUND:.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
