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
        subprocess.run([sys.executable, "-m", "meshwise.cli", "plan", "--model", "llama3-70b", "--gpu", "h100",
                        "--gpus", "64", "--seq-len", "4096", "--global-batch", "32", "--top", "4",
                        "--layout", "dp=2,zero=1,tp=8,pp=4,vpp=2,ac=selective", "--report", str(html)],
                       check=True, capture_output=True)
        names = ["plan-memory.png", "plan-timeline.png", "plan-scaling.png"]
        for name, data in zip(names, re.findall(r'base64,([A-Za-z0-9+/=]+)"', html.read_text())):
            (HERE / "img" / name).write_bytes(base64.b64decode(data))
            print("wrote", HERE / "img" / name)


if __name__ == "__main__":
    plan_pictures()
