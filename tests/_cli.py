"""``meshwise ARGS`` inside the test's own process, for commands that start no worker process
(one-process train, export, generate, tokenize, refusals): the same ``meshwise.cli.main`` a
subprocess would run, without the Python and torch start-up (about 6 s each on a 2-core machine).

``meshwise_launch`` does the same for a command that launches workers (``train --nproc-per-node
N``): meshwise's launcher runs in this process, as ``meshwise measure``'s does in test_measure, and
starts the workers as new processes, as it does for a user; their output is collected too.

What a launch shares with its launcher's process (signals to it, a killed launcher, torchrun's
restarts) still needs a subprocess; so does anything checking what a fresh interpreter imports.
Python warnings go to pytest's warning summary here, where a subprocess would have printed them
on stderr.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
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


@contextmanager
def _descriptors_to_files() -> Iterator[tuple[io.BufferedRandom, io.BufferedRandom]]:
    """File descriptors 1 and 2 (what child processes inherit) point at two temporary files meanwhile."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield out, err
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def meshwise_launch(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``meshwise_here`` for a command whose launcher starts worker processes: ``env`` is set
    meanwhile (as ``subprocess.run(env=...)`` would add it); stdout and stderr are the launcher's
    lines followed by the workers' (which went to file descriptors 1 and 2)."""
    saved_env = dict(os.environ)
    os.environ.update(env or {})
    try:
        with _descriptors_to_files() as (out, err):
            done = meshwise_here(*args, cwd=cwd)
            for f in (out, err):
                f.flush()
                f.seek(0)
            workers_out, workers_err = (f.read().decode(errors="replace") for f in (out, err))
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout + workers_out, done.stderr + workers_err)


def run_nodes(cmd: list[str], cwd, env: dict, nodes: int = 2, timeout_s: float = 300) -> list[str]:
    """``cmd`` started ``nodes`` times at once (torchrun "nodes" meeting on a loopback rendezvous), each
    waited for up to ``timeout_s``; their outputs, after asserting every one exited 0 (a straggler is
    killed)."""
    agents = [
        subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(nodes)
    ]
    outs = []
    try:
        for agent in agents:
            outs.append(agent.communicate(timeout=timeout_s)[0])
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-3000:] for o in outs)
    return outs
