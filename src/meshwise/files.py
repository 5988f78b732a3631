"""Files: output paths checked before any work starts, files a reader never sees half-written, and
the TOML inputs a user gives, read with one line naming the option when they are bad."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from meshwise.errors import MeshwiseError

_PSEUDO = ("/proc", "/sys", "/dev")  # kernel file systems: nothing meshwise writes belongs there


def _writable_dir(field: str, folder: Path, shown: str) -> None:
    real = os.path.realpath(folder)
    if any(real == p or real.startswith(p + "/") for p in _PSEUDO):
        raise MeshwiseError(f"{field}: {shown} is on a kernel file system ({real}); give a folder on a disk")
    if not folder.is_dir():
        raise MeshwiseError(f"{field}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MeshwiseError(f"{field}: {folder} is not writable")


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(field: str, path: str) -> None:
    """A folder meshwise will create (parents included) and write into: not a file, not under a
    kernel file system, and its nearest existing ancestor writable. "" (none) passes."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise MeshwiseError(f"{field}: {path} exists and is not a folder")
    _writable_dir(field, p if p.is_dir() else _nearest_existing(p), path)


def check_output_file(field: str, path: str | None, parent_must_exist: bool = False) -> None:
    """A file meshwise will write: not a folder, in a writable folder (created if missing, unless
    ``parent_must_exist``). "" or None (none) passes."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise MeshwiseError(f"{field}: {path} is a folder; give a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise MeshwiseError(f"{field}: {path} is not writable")
    parent = p.absolute().parent
    if parent_must_exist and not parent.is_dir():
        raise MeshwiseError(f"{field}: folder {str(p.parent)!r} does not exist")
    _writable_dir(field, parent if parent.is_dir() else _nearest_existing(parent), path)


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then rename it over ``path``;
    on any failure the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_toml(path: Path, option: str) -> dict[str, Any]:
    """A TOML file's table, or one line naming the option: missing file, invalid TOML."""
    if path.is_dir():
        raise MeshwiseError(f"{option}: {path} is a folder; give a TOML file")
    if not path.is_file():
        raise MeshwiseError(f"{option}: file {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise MeshwiseError(f"{option}: {path} is not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise MeshwiseError(f"{option}: {path} is not UTF-8 text") from None
    except OSError as e:
        raise MeshwiseError(f"{option}: {path} cannot be read ({e.strerror})") from None
