"""The catalog: models.toml, accelerators.toml and published_runs.toml, data each with its source,
and the functions that read them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

_CATALOG_DIR = Path(__file__).parent  # the package's own files: importlib.resources and
# the zipfile it imports took ~0.02 s of each start


def read_catalog(name: str) -> dict[str, dict[str, Any]]:
    """One of this folder's TOML files as a table (``models.toml``, ``accelerators.toml``, ...)."""
    return tomllib.loads((_CATALOG_DIR / name).read_text(encoding="utf-8"))


def model_names() -> list[str]:
    return list(read_catalog("models.toml"))


def accelerator_names() -> list[str]:
    return list(read_catalog("accelerators.toml"))
