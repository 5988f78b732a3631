"""The exceptions the CLI turns into one line on stderr and an exit status, without a traceback,
and the one wrapper that does it."""

from __future__ import annotations

import sys
from collections.abc import Callable

NOTHING_FITS = 3  # `meshwise plan`'s exit status when no layout fits the devices (the plan says what would)


class MeshwiseError(ValueError):
    """Bad input, named by field: ``"--gpus: 12 is not divisible by tp*pp = 8"``. Exit status 2."""


class RunStopped(RuntimeError):
    """A run that started and then stopped early: preempted by a signal (status 128 + signal number,
    the shell's convention), a rank that stopped answering, a full disk, a worker that died (status 1).
    The message is one line; the CLI prints it and exits with ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def run_command(command: Callable[[], int]) -> int:
    """Run a command; a :class:`MeshwiseError` becomes one line ``meshwise: error: ...`` on stderr and
    exit status 2, a :class:`RunStopped` one line and its own status, without a traceback."""
    try:
        return command()
    except MeshwiseError as e:
        print(f"meshwise: error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"meshwise: error: {e}", file=sys.stderr)
        return e.status
