"""What a parallel runtime adds to a rank's compute on this CPU: per layout, the step's compute
(the forward + backward window less its timed waits, as benchmarks/cpu_time_grid.py splits a step)
beside the same rank's work run as a plain model (its ``layers / pp`` blocks, embedding and head
included, over its micro-batches; no TP or CP split, so layouts with tp or cp > 1 are refused),
timed on every rank at once and on each rank alone, in three interleaved rounds in one launch
(benchmarks/_step_overhead_worker.py). Prints per layout the medians over rounds and ranks of the
slowest rank and the ratio step compute / plain work at once: what the runtime (FSDP2's hooks and
copies, pipelining's stage calls and sends) costs the rank beyond the arithmetic and operators;
beside them the cost model's compute for the step (``meshwise.cost.estimate`` with a quick
calibration made just before the launch, measure/auto_profile.py).

    flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/step_overhead.py \\
        --report benchmarks/results/step-overhead-cpu2core.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_time_grid import MODELS, load, model_toml  # noqa: E402
from meshwise.cost.estimate import estimate  # noqa: E402
from meshwise.errors import MeshwiseError  # noqa: E402
from meshwise.launch import launch_logged  # noqa: E402
from meshwise.layout import check_runnable, parse  # noqa: E402
from meshwise.measure import auto_profile  # noqa: E402
from meshwise.spec import TrainSpec, load_cluster, load_model  # noqa: E402

# (hidden, layout, global batch, sequence): points of benchmarks/cpu_time_grid.py at 2 processes
POINTS = [
    (64, "dp=2,zero=0,mbs=4", 8, 64),
    (64, "dp=2,zero=1,mbs=8", 16, 64),
    (192, "dp=2,zero=3,mbs=4", 8, 64),
    (64, "pp=2,schedule=gpipe,mbs=2", 8, 128),
    (192, "pp=2,schedule=1f1b,mbs=1", 4, 256),
    (512, "pp=2,schedule=1f1b,mbs=1", 4, 32),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--point", action="append", help="HIDDEN|LAYOUT|GLOBAL_BATCH|SEQ (default: six grid points)")
    ap.add_argument("--report", help="also write the report, with the command and the load, to this file")
    args = ap.parse_args()
    lines = ["$ " + " ".join([Path(sys.executable).name, *sys.argv]), f"load average at the start {load()}"]
    with tempfile.TemporaryDirectory(prefix="meshwise-step-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        for hidden in MODELS:
            (tmp / f"h{hidden}.toml").write_text(model_toml(hidden))
        try:  # every point refused in one line before anything is measured, as cpu_time_grid.py does
            points = [runnable_point(text, tmp, args.nproc) for text in args.point] if args.point else POINTS
        except ValueError as e:
            print(f"step_overhead: {e}", file=sys.stderr)
            return 2
        argv = ["--out", str(tmp / "out")]
        for hidden, layout, gb, seq in points:
            argv += ["--point", f"{tmp / f'h{hidden}.toml'}|{layout}|{gb}|{seq}"]
        cluster = load_cluster(str(auto_profile.ensure(args.nproc, lines.append, fresh=True)), args.nproc, args.nproc)
        launch_logged("_step_overhead_worker", argv, args.nproc, tmp / "logs", "step overhead")
        lines.append(
            f"{'h':>3} {'layout':<28} {'gb':>3} {'seq':>4} {'step compute':>12} {'plain, at once':>14} "
            f"{'plain, alone':>12} {'ratio':>6} {'predicted compute':>17}"
        )
        for i, (hidden, layout, gb, seq) in enumerate(points):
            ranks = [json.loads(f.read_text()) for f in sorted((tmp / "out" / str(i)).glob("rank*.json"))]
            fig = {
                k: statistics.median(max(v) for v in zip(*(r[k] for r in ranks))) for k in ("compute_s", "bare_both_s")
            }
            alone = statistics.median(x for r in ranks for x in r["bare_alone_s"])
            lines.append(
                f"{hidden:>3} {layout:<28} {gb:>3} {seq:>4} {fig['compute_s'] * 1e3:10.1f} ms "
                f"{fig['bare_both_s'] * 1e3:11.1f} ms {alone * 1e3:9.1f} ms "
                f"{fig['compute_s'] / fig['bare_both_s']:6.2f} "
                f"{predicted_compute_s(cluster, tmp / f'h{hidden}.toml', layout, gb, seq) * 1e3:14.1f} ms"
            )
    lines.append(f"load average at the end {load()}")
    print("\n".join(lines))
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n")
    return 0


def runnable_point(text: str, models: Path, nproc: int) -> tuple[int, str, int, int]:
    """``HIDDEN|LAYOUT|GLOBAL_BATCH|SEQ`` as a point, or ValueError naming what would be valid: a
    grid width, a layout that runs on ``nproc`` processes (layout.check_runnable) without tp or cp
    (the plain model is not split)."""
    fields = text.split("|")
    if len(fields) != 4 or not all(f.strip().isdigit() for f in (fields[0], fields[2], fields[3])):
        raise ValueError(f"--point {text!r}: give HIDDEN|LAYOUT|GLOBAL_BATCH|SEQ, e.g. 64|dp=2,zero=1,mbs=8|16|64")
    hidden, layout, gb, seq = int(fields[0]), fields[1], int(fields[2]), int(fields[3])
    if hidden not in MODELS:
        raise ValueError(f"--point {text!r}: hidden must be one of {', '.join(map(str, MODELS))}")
    try:
        parsed = parse(layout, nproc)
        check_runnable(parsed, load_model(str(models / f"h{hidden}.toml")), nproc, gb, seq)
    except MeshwiseError as e:
        raise ValueError(f"--point {text!r}: {e}") from None
    if parsed.tp > 1 or parsed.cp > 1:
        raise ValueError(f"--point {text!r}: tp and cp must be 1 (the plain model is not split)")
    return hidden, layout, gb, seq


def predicted_compute_s(cluster, model_file: Path, layout: str, gb: int, seq: int) -> float:
    """The cost model's compute part of the step (StepTime.compute_s), fp32."""
    return estimate(
        load_model(str(model_file)), cluster, TrainSpec(gb, seq, precision="fp32"), parse(layout, cluster.world_size)
    ).time.compute_s


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    sys.exit(main())
