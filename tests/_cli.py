"""``meshwise ARGS`` inside the test's own process, for commands that start no worker process
(one-process train, export, generate, tokenize, refusals): the same ``meshwise.cli.main`` a
subprocess would run, without the Python and torch start-up (about 6 s each on a 2-core machine).

What a launch shares between processes (several ranks, signals, a killed launcher) still needs a
subprocess; so does anything checking what a fresh interpreter imports. Python warnings go to
pytest's warning summary here, where a subprocess would have printed them on stderr.
"""

from __future__ import annotations

import io
import os
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def meshwise_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``meshwise ARGS`` in ``cwd``; returns what ``subprocess.run(..., capture_output=True,
    text=True)`` would: the exit status and what the command printed."""
    from meshwise.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["meshwise", *args], code, out.getvalue(), err.getvalue())
