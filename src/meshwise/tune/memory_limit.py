"""``--memory-limit SIZE``: the bytes a rank may use, as text (``2GB``, ``512MiB``, ``3e9``)."""

from __future__ import annotations

import math
import re

from meshwise.errors import MeshwiseError

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_bytes(text: str | None) -> int:
    """``2GB``, ``512MiB``, ``3e9`` -> bytes; refused in one line."""
    if text is None:
        return 0
    m = _SIZE.match(text)
    value = float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()] if m else 0.0
    if not (math.isfinite(value) and value >= 1):
        raise MeshwiseError(f"--memory-limit: {text!r} is not a size per rank, e.g. 2GB, 512MiB or 3e9 (bytes)")
    return int(value)
