"""The one exception for bad input, and the one wrapper that turns it into a line and exit status 2."""

from __future__ import annotations

import sys
from typing import Callable


class MeshwiseError(ValueError):
    """Bad input, named by field: ``"--gpus: 12 is not divisible by tp*pp = 8"``."""


def run_command(command: Callable[[], int]) -> int:
    """Run a command; a :class:`MeshwiseError` becomes one line ``meshwise: error: ...`` on stderr and
    exit status 2, without a traceback."""
    try:
        return command()
    except MeshwiseError as e:
        print(f"meshwise: error: {e}", file=sys.stderr)
        return 2
