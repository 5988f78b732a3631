"""Regenerate the README's pictures from the code: python docs/pictures.py"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def plan_pictures() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "plan.html"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "meshwise.cli",
                "plan",
                "--model",
                "llama3-70b",
                "--gpu",
                "h100",
                "--gpus",
                "64",
                "--seq-len",
                "4096",
                "--global-batch",
                "32",
                "--top",
                "4",
                "--layout",
                "dp=2,zero=1,tp=8,pp=4,vpp=2,ac=selective",
                "--report",
                str(html),
            ],
            check=True,
            capture_output=True,
        )
        names = ["plan-memory.png", "plan-timeline.png", "plan-scaling.png"]
        for name, data in zip(names, re.findall(r'base64,([A-Za-z0-9+/=]+)"', html.read_text())):
            (HERE / "img" / name).write_bytes(base64.b64decode(data))
            print("wrote", HERE / "img" / name)


def measure_pictures() -> None:
    """One measured run (tiny, pp=2 1F1B on 2 CPU processes): its memory bars and its measured pipeline."""
    from meshwise.layout import parse
    from meshwise.measure.compare import rows_for
    from meshwise.measure.run import run_workers
    from meshwise.report.measure_report import write_measure_report
    from meshwise.spec import TrainSpec, load_cluster, load_model

    text, batch, seq = "pp=2,schedule=1f1b", 8, 64
    model, cluster = load_model("tiny"), load_cluster("cpu", 2)
    train = TrainSpec(batch, seq, precision="fp32")
    records = run_workers(2, [text], "tiny", batch, seq, 3)[0]
    rows = [row for rec in records for row in rows_for(rec, model, cluster, train)]
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "measure.html"
        write_measure_report(html, rows, records, model, parse(text, 2), cluster, train)
        images = re.findall(r'base64,([A-Za-z0-9+/=]+)"', html.read_text())
    # order in the page: memory, comm, time bars, then the measured and the predicted timeline
    for name, data in (("measure-memory.png", images[0]), ("measure-timeline.png", images[3])):
        (HERE / "img" / name).write_bytes(base64.b64decode(data))
        print("wrote", HERE / "img" / name)


if __name__ == "__main__":
    plan_pictures()
    measure_pictures()
