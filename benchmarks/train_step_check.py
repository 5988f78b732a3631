"""The first number a user sees: the step time the default ``meshwise train`` prints against the
step time it then runs at.

Runs ``meshwise train --checkpoint-dir "" --schedule.eval_every 0 --steps 15 --metrics.file F``
(everything else default: the planner chooses processes, threads and layout on this machine's
calibrated profile) and compares the predicted ``s/step`` of its ``Chosen:`` line with the median
``step_s`` of steps 5-14 in the metrics file (steps 0-4 are warm-up).

    flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/train_step_check.py [extra train options] \
        > benchmarks/results/train-step-check-cpu2core.txt
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(extra: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="meshwise-train-check-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "meshwise.cli",
            "train",
            "--checkpoint-dir",
            "",
            "--schedule.eval_every",
            "0",
            "--steps",
            "15",
            "--metrics.file",
            str(metrics),
            "--generate.prompt",
            "",
            *extra,
        ]
        print("$ meshwise " + " ".join(cmd[3:]), flush=True)
        print(f"load average before: {load()}", flush=True)
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        print(f"ran in {time.perf_counter() - start:.0f} s; load average after: {load()}")
        text = out.stdout + out.stderr
        if out.returncode:
            print(text[-3000:])
            return out.returncode
        for line in text.splitlines():
            if line.startswith(("Profile:", "Processes:", "Layout", "Chosen:", "Calibrat")):
                print("  " + line)
        chosen = re.search(r"Chosen: .*? - ([0-9.eE+-]+) s/step", text) or re.search(
            r"Processes: .*?, ([0-9.eE+-]+) s/step", text
        )
        steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [s["step_s"] for s in steps if 5 <= s.get("step", -1) <= 14]
    if not chosen or not times:
        print("could not read the predicted step time or the measured steps")
        return 1
    predicted, measured = float(chosen.group(1)), statistics.median(times)
    print(f"steps 5-14: {', '.join(f'{t:.3f}' for t in times)}")
    print(
        f"predicted {predicted:.3f} s/step, measured median {measured:.3f} s/step: error {predicted / measured - 1:+.1%}"
        f" (bound 15%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
