"""A mixture of experts on this CPU, part by part: ``meshwise measure`` of the grid's small MoE
(benchmarks/cpu_time_grid.py ``64-moe8``: hidden 64, 4 blocks, 8 experts of width 64, top-2) under
the three layouts of the grid's MoE points, each part of its blocks timed beside its prediction.

Each layout is one ``meshwise measure --json`` run (its own process count: 2, 2 and 4), predicted
with this machine's calibration at that count (measure/auto_profile.py, as ``measure`` uses it).
The step is the median of ``--steps`` timed steps; the MoE parts (router, permute, experts,
dispatch / combine: runtime/moe.py ``timed_parts``) the median of as many steps of their own,
predicted by cost/host_moe.py from the block timed alone at the run's shapes (measure/moe_parts.py,
the profile's ``moe_part_table``, topped up by ``measure`` before the run; its line is printed) and,
for the all-to-alls' waits, cost/experts.py on the calibrated gloo link (cost/comm.py
``all_to_all_ratio``). Printed for the slowest rank; the acceptance: the whole step within
``STEP_BOUND``.

    flock /work/cpu.lock python benchmarks/moe_parts_cpu.py --report benchmarks/results/moe-parts-cpu2core.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_time_grid import model_toml  # noqa: E402

# (processes, layout, global batch, sequence): the grid's MoE points
POINTS = [
    (2, "dp=2,ep=2,mbs=1", 4, 128),
    (2, "dp=2,zero=3,ep=2,mbs=2", 8, 64),
    (4, "dp=2,tp=2,ep=2,mbs=1", 4, 128),
]
STEP_BOUND = 0.20
PARTS = ("router_s", "permute_s", "experts_s", "shared_s", "dispatch_combine_s")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(model: str, n: int, layout: str, gb: int, seq: int, steps: int) -> tuple[dict, list[str]]:
    """``meshwise measure --json`` of one point, and its lines about the profile (calibration, top-up)."""
    argv = ["measure", "--model", model, "--layout", layout, "--nproc", str(n)]
    argv += ["--global-batch", str(gb), "--seq-len", str(seq), "--steps", str(steps), "--json"]
    code = "import sys; from meshwise.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    said = [line for line in out.stderr.splitlines() if line.startswith(("Profile", "Calibrat", "The machine"))]
    return json.loads(out.stdout.strip().splitlines()[-1]), said


def slowest(rows: list[dict]) -> tuple[int, dict[str, dict]]:
    """(rank, its time.* rows by figure) of the rank with the longest measured step."""
    steps = {r["rank"]: r["measured"] for r in rows if r["figure"] == "time.step_s"}
    rank = max(steps, key=steps.get)
    return rank, {r["figure"]: r for r in rows if r["rank"] == rank and r["figure"].startswith("time.")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="timed steps, and as many MoE-parts steps (default 7)")
    ap.add_argument("--report", help="also write the report to this file")
    args = ap.parse_args()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    say(f"uptime at the start: {uptime()}")
    within = 0
    with tempfile.TemporaryDirectory(prefix="meshwise-moe-parts-") as tmp:
        model = str(Path(tmp) / "grid-h64-moe8.toml")
        Path(model).write_text(model_toml("64-moe8"))
        for n, layout, gb, seq in POINTS:
            result, said = measure(model, n, layout, gb, seq, args.steps)
            rank, t = slowest(result["rows"])
            step = t["time.step_s"]
            err = step["predicted"] / step["measured"] - 1
            within += abs(err) <= STEP_BOUND
            say(f"\n{n} processes, {layout}, global batch {gb} x {seq} (slowest rank {rank}; seconds per step)")
            for line in said:
                say(f"  # {line}")
            say(f"  {'step':<22} {step['predicted']:8.4f} {step['measured']:8.4f} {err:+7.1%}")
            for part in ("compute_s", "comm_s", "optimizer_s", "fixed_s"):
                r = t[f"time.{part}"]
                say(f"  {part:<22} {r['predicted']:8.4f} {r['measured']:8.4f}")
            for part in PARTS:
                r = t.get(f"time.moe.{part}")
                if r:
                    e = r["predicted"] / r["measured"] - 1 if r["measured"] else float("inf")
                    say(f"  moe.{part:<18} {r['predicted']:8.4f} {r['measured']:8.4f} {e:+7.1%}")
    say(f"\nuptime at the end: {uptime()}")
    say(f"SUMMARY: {within} of {len(POINTS)} steps within {STEP_BOUND:.0%} (predicted / measured, error)")
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
