"""Checkpoint folders on disk: which are meshwise's, which are complete, and are they readable.

A checkpoint folder ``DIR/step-N`` holds DCP's files (``.metadata`` and ``__R_0.distcp`` per
writing rank) and ``meshwise.json`` (step, model shape, layout, world size), written last. While it
is written it is ``DIR/step-N.tmp`` and holds ``.meshwise-partial`` from the start. Only those two
kinds of folder are meshwise's own; nothing else in ``DIR`` is ever deleted.

Trust: ``.metadata`` is a pickle (DCP's format). It is read here with an unpickler that admits only
DCP's metadata classes, torch dtypes, layouts and sizes, and plain containers; anything else is
refused before it can run. The ``.distcp`` shards are read by torch with ``weights_only=True``.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from meshwise.errors import MeshwiseError
from meshwise.spec import ModelSpec

COMMIT_FILE = "meshwise.json"
PARTIAL_FILE = ".meshwise-partial"
METADATA_FILE = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^step-(\d+)\.tmp$")
_DCP_METADATA = {
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "MetadataIndex",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
}
_ALLOWED = {("torch.distributed.checkpoint.metadata", n) for n in _DCP_METADATA} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every committed checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / COMMIT_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: str | Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1][1] if done else None


def own_folders(root: str | Path) -> list[Path]:
    """meshwise's own folders under ``root``: ``step-<int>`` holding meshwise.json, and
    ``step-<int>.tmp`` holding meshwise's partial marker (or meshwise.json)."""
    root = Path(root)
    if not root.is_dir():
        return []
    own = []
    for p in root.iterdir():
        if not p.is_dir() or p.is_symlink():
            continue
        if _STEP_DIR.match(p.name) and (p / COMMIT_FILE).is_file():
            own.append(p)
        elif _TMP_DIR.match(p.name) and ((p / PARTIAL_FILE).is_file() or (p / COMMIT_FILE).is_file()):
            own.append(p)
    return sorted(own)


def remove_own(path: Path) -> None:
    """Delete one of meshwise's own folders (refuses anything else: a guard, not a user path)."""
    if path not in own_folders(path.parent):
        raise RuntimeError(f"refusing to delete {path}: not a meshwise checkpoint folder")
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------- reading
class _Refused(pickle.UnpicklingError):
    """A global the metadata has no business naming."""


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes, torch dtypes, layouts and sizes, paths and plain containers."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise _Refused(f"{module}.{name} is not part of a checkpoint's metadata")


def read_dcp_metadata(folder: str | Path) -> Any:
    """DCP's ``Metadata`` of a checkpoint folder, read with the restricted unpickler."""
    path = Path(folder) / METADATA_FILE
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise MeshwiseError(f"checkpoint {path}: missing (DCP's index of the shards)") from None
    except OSError as e:
        raise MeshwiseError(f"checkpoint {path}: cannot be read ({e.strerror})") from None
    except _Refused as e:
        raise MeshwiseError(f"checkpoint {path}: refused, not DCP metadata ({e})") from None
    except Exception as e:  # truncated or garbage bytes: EOFError, ValueError, KeyError, ...
        raise MeshwiseError(f"checkpoint {path}: damaged ({type(e).__name__})") from None
    if type(metadata).__name__ != "Metadata" or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise MeshwiseError(f"checkpoint {path}: not DCP metadata")
    return metadata


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The checkpoint's ``meshwise.json``: an object with a ``model`` object."""
    path = Path(folder) / COMMIT_FILE
    if not path.is_file():
        raise MeshwiseError(f"checkpoint: {folder} is not a complete meshwise checkpoint (no {COMMIT_FILE})")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MeshwiseError(f"checkpoint {path}: cannot be read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MeshwiseError(f"checkpoint {path}: not valid JSON") from None
    if not isinstance(meta, dict):
        raise MeshwiseError(f"checkpoint {path}: expected a JSON object, got {type(meta).__name__}")
    if not isinstance(meta.get("model"), dict):
        raise MeshwiseError(f"checkpoint {path}: no 'model' object (the model's shape)")
    return meta


def model_spec(folder: str | Path, meta: dict[str, Any]):
    """The ModelSpec recorded in ``meta`` (refused in one line if its fields are not a model's)."""
    try:
        return ModelSpec(**meta["model"])
    except TypeError as e:
        raise MeshwiseError(f"checkpoint {Path(folder) / COMMIT_FILE}: 'model' is not a model shape ({e})") from None


def verify(folder: str | Path, expected_shapes: dict[str, tuple[int, ...]] | None = None) -> Any:
    """Check a checkpoint before anything is built from it: meshwise.json, DCP's metadata, every
    shard file present and long enough for what the metadata places in it, and (if given) the
    model tensors' shapes. Returns the DCP metadata; raises MeshwiseError naming the file."""
    folder = Path(folder)
    read_meta(folder)
    metadata = read_dcp_metadata(folder)
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = str(getattr(info, "relative_path", ""))
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        needed[rel] = max(needed.get(rel, 0), end)
    for rel, end in sorted(needed.items()):
        shard = folder / rel
        if shard.parent != folder:
            raise MeshwiseError(f"checkpoint {folder / METADATA_FILE}: names a shard outside the folder ({rel!r})")
        if not shard.is_file():
            raise MeshwiseError(f"checkpoint {shard}: missing")
        if shard.stat().st_size < end:
            raise MeshwiseError(f"checkpoint {shard}: truncated ({shard.stat().st_size:,} bytes, needs {end:,})")
    for name, shape in (expected_shapes or {}).items():
        entry = metadata.state_dict_metadata.get(name)
        saved = tuple(getattr(entry, "size", ()) or ())
        if entry is None or saved != tuple(shape):
            raise MeshwiseError(
                f"checkpoint {folder}: {name} has shape {list(saved)} in {METADATA_FILE} but "
                f"{list(shape)} by {COMMIT_FILE}'s model"
            )
    return metadata
