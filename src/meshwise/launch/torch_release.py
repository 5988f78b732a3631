"""The torch release the suite has run on, and the one-line warning on any other.

meshwise reaches into torch's private APIs (runtime/_torch_private.py, measure/_torch_tools.py);
tests/unit/test_torch_canary.py checks on the installed torch that every name exists and every
replacement runs. pyproject.toml admits this release only; ``train``, ``measure`` and ``verify``
(which import torch; ``plan`` never does) call :func:`warn_untested_torch` at start-up. The
version is read from the installed package's metadata, so torch is not imported here.
"""

from __future__ import annotations

import importlib.metadata
import sys

TESTED_TORCH = "2.13"  # the minor release the suite has run on (pyproject.toml's train extra: torch>=2.13,<2.14)


def warn_untested_torch(version: str | None = None) -> bool:
    """One line on stderr where torch (``version``: the installed one) is not TESTED_TORCH; whether it warned."""
    if version is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return False  # the command's own import of torch says so
    if version.split("+")[0].split(".")[:2] == TESTED_TORCH.split("."):
        return False
    print(
        f"meshwise: warning: torch {version} is untested (tested: {TESTED_TORCH}.x); the private hooks that time "
        f"and categorise may not run (tests/unit/test_torch_canary.py checks them)",
        file=sys.stderr,
    )
    return True
