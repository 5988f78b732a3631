"""torchtitan 0.3.0 as a test oracle (the ``test`` extra; never imported by meshwise).

``config_manager()`` imports it, first putting tests/_stubs on the path when Hugging Face
``datasets`` is missing (tests/_stubs/README.md), and skips the test when torchtitan is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

import pytest

STUBS = os.path.join(os.path.dirname(__file__), "_stubs")


def config_manager():
    pytest.importorskip("torchtitan", reason="torchtitan is the oracle of --emit torchtitan (the test extra)")
    if importlib.util.find_spec("datasets") is None and STUBS not in sys.path:
        sys.path.insert(0, STUBS)
    from torchtitan.config import ConfigManager

    return ConfigManager()


def command_args(text: str, entry: str) -> list[str]:
    """The arguments after ``entry`` in the emitted shell text (comments and line continuations dropped)."""
    body = " ".join(line for line in text.splitlines() if not line.startswith("#")).replace("\\", " ")
    words = shlex.split(body.replace("$MASTER_ADDR", "localhost"))
    return words[words.index(entry) + 1:]
