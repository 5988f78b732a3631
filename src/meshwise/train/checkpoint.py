"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): sharded save, resharding load, atomic commit.

Layout of a checkpoint folder ``DIR/step-N``: DCP's files (``.metadata`` and one ``__R_0.distcp``
per writing rank) and ``meshwise.json`` (step, model shape, layout, world size). Commit protocol:

1. every rank writes into ``DIR/step-N.tmp`` (DCP ``save``; its coordinator writes ``.metadata``);
2. a barrier; rank 0 writes ``meshwise.json`` into the temporary folder and fsyncs it;
3. rank 0 renames ``step-N.tmp`` to ``step-N`` (atomic on one file system) and fsyncs ``DIR``.

Only folders named ``step-N`` that hold ``meshwise.json`` count as complete, so a crash at any
point before step 3 leaves the previous checkpoint as the latest one. The last ``keep`` complete
checkpoints are kept.

What is saved: the model and optimizer state from ``get_state_dict`` with
``flatten_optimizer_state_dict=True`` (one key per parameter FQN and state: ``state.<fqn>.exp_avg``,
``param_groups.<fqn>.lr``), and the run state (step, samples consumed, RNG). Parameter names are
the plain model's (``layers.3.mlp.w1.weight``) under every layout: a pipeline rank holds a subset,
TP/FSDP shards are DTensors, activation-checkpointing wrappers are removed from the names. DCP
reshards on load, so a run resumes under any layout or world size.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from meshwise.errors import MeshwiseError
from meshwise.runtime.model import canonical_name
from meshwise.spec import ModelSpec

COMMIT_FILE = "meshwise.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "mlp", "vocab", "tied_embeddings",
                "family", "head_dim", "norm", "position", "qkv_bias", "o_bias", "mlp_bias", "qk_norm")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


# ----------------------------------------------------------------------------------- folders
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


def read_meta(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not (p / COMMIT_FILE).is_file():
        raise MeshwiseError(f"checkpoint: {path} is not a complete meshwise checkpoint (no {COMMIT_FILE})")
    return json.loads((p / COMMIT_FILE).read_text())


def resolve_resume(resume: str, root: str) -> Path | None:
    """``""`` -> None (fresh run); ``"auto"`` -> the latest complete checkpoint in ``root`` (None if
    there is none yet); otherwise the named checkpoint folder, which must be complete."""
    if not resume:
        return None
    if resume == "auto":
        return latest(root) if root else None
    read_meta(resume)
    return Path(resume)


def check_shape(meta: dict[str, Any], spec: ModelSpec, path: str | Path) -> None:
    """Refuse a checkpoint of another model shape, naming the first field that differs."""
    saved = meta.get("model", {})
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    defaults["head_dim"] = saved.get("hidden", 0) // max(1, saved.get("heads", 1))  # before head_dim was saved
    for name in SHAPE_FIELDS:
        value = saved.get(name, defaults[name])
        if value != getattr(spec, name):
            raise MeshwiseError(f"checkpoint {path}: a model with {name}={value!r}, but this run's "
                                f"model {spec.name!r} has {name}={getattr(spec, name)!r}")


def model_meta(spec: ModelSpec) -> dict[str, Any]:
    return {k: v for k, v in asdict(spec).items() if k != "param_count"}


# --------------------------------------------------------------------------------- state dicts
class _Chunks(nn.Module):
    """This rank's pipeline chunks as one module with the plain model's parameter names (the chunks'
    own submodules, registered again; nothing is copied)."""

    def __init__(self, chunks: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        for chunk in chunks:
            for name in ("tok_embeddings", "pos_embeddings", "norm", "output"):
                if getattr(chunk, name, None) is not None:
                    setattr(self, name, getattr(chunk, name))
            for key, block in chunk.layers.items():
                self.layers[key] = block


def _canonical(sd: dict[str, Any]) -> dict[str, Any]:
    return {canonical_name(k): v for k, v in sd.items()}


def _restore_names(canonical: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    return {k: canonical[canonical_name(k)] for k in template}


def _states(modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> tuple[nn.Module, dict, dict]:
    container = _Chunks(modules)
    model_sd, optim_sd = get_state_dict(container, optimizer, options=_OPTIONS)
    return container, model_sd, optim_sd


def save(modules: list[nn.Module], optimizer: torch.optim.Optimizer, root: str | Path, step: int,
         run_state: dict[str, Any], meta: dict[str, Any], keep: int, before_commit=None) -> Path:
    """Save, commit (rename) and prune; collective over the default group. Returns the folder."""
    root = Path(root)
    tmp = root / f"step-{step}.tmp"
    final = step_dir(root, step)
    rank = dist.get_rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by an earlier crash
    dist.barrier()
    _, model_sd, optim_sd = _states(modules, optimizer)
    state = {"model": _canonical(model_sd), "optim": _canonical(optim_sd), "run": run_state}
    dcp.save(state, checkpoint_id=str(tmp))
    dist.barrier()
    if before_commit is not None:
        before_commit(step)
    if rank == 0:
        marker = tmp / COMMIT_FILE
        with open(marker, "w") as f:
            json.dump({**meta, "step": step}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(modules: list[nn.Module], optimizer: torch.optim.Optimizer, path: str | Path,
         run_state: dict[str, Any]) -> dict[str, Any]:
    """Load model, optimizer and run state from ``path`` into this rank's shards (DCP reshards).

    ``run_state`` is the template of the run state (its keys and types); the loaded one is returned.
    """
    container, model_sd, optim_sd = _states(modules, optimizer)  # initialises the optimizer states
    state = {"model": _canonical(model_sd), "optim": _canonical(optim_sd), "run": dict(run_state)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(container, optimizer, model_state_dict=_restore_names(state["model"], model_sd),
                   optim_state_dict=_restore_names(state["optim"], optim_sd), options=_OPTIONS)
    return state["run"]


def load_full_model(path: str | Path, model: nn.Module) -> None:
    """Fill a plain single-process model from a checkpoint (no process group needed, or used)."""
    import warnings

    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["model"])
