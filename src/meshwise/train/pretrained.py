"""Pretrained weights in: ``meshwise train --model.from DIR`` (a Hugging Face folder) into any layout.

The folder holds ``config.json`` and ``model.safetensors`` or a sharded
``model.safetensors.index.json``. Before any process group: the config is read like ``--model``,
and the safetensors headers (names, shapes; nothing else is read) must hold exactly the tensors the
family's transformers model has. Then every rank reads only what it holds:

- families stored under one name per meshwise tensor (Llama, Mistral, Qwen2/3, Gemma): through
  ``torch.distributed.checkpoint`` with its ``HuggingFaceStorageReader``, whose planner reads each
  rank's DTensor shard (TP, FSDP2) or pipeline chunk as a slice of the file (``safe_open.get_slice``);
- Phi-3 (fused qkv / gate_up) and GPT-2 (fused, transposed Conv1D): one tensor at a time, the rows
  of the fused tensor that the meshwise tensor is, then this rank's shard of it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.tensor import DTensor, distribute_tensor

from meshwise.errors import MeshwiseError
from meshwise.runtime.model import Transformer, canonical_name
from meshwise.spec import ModelSpec, load_model
from meshwise.train.export import has_hf_family
from meshwise.train.hf_weights import _hf_name, from_hf, to_hf

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a Hugging Face folder (one file, or the shards its index names)."""
    if (folder / INDEX).is_file():
        try:
            weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise MeshwiseError(f"--model.from: {folder / INDEX} is not a safetensors index") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / SINGLE).is_file():
        files = [folder / SINGLE]
    else:
        raise MeshwiseError(f"--model.from: {folder} holds neither {SINGLE} nor {INDEX}")
    for f in files:
        if not f.is_file():
            raise MeshwiseError(f"--model.from: {f} (named by the index) does not exist")
    return files


def header(path: Path) -> dict[str, dict]:
    """A safetensors file's tensor table: the 8-byte length, then that many bytes of JSON."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 2**20:
                raise ValueError("header too long")
            table = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise MeshwiseError(f"--model.from: {path} is not a safetensors file ({e})") from None
    table.pop("__metadata__", None)
    return table


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every tensor the family's model stores (from a meta model)."""
    with torch.device("meta"):
        model = Transformer(spec)
    return {k: tuple(v.shape) for k, v in to_hf(spec, dict(model.named_parameters())).items()}


def check_folder(folder: str) -> ModelSpec:
    """The folder's model, after its weights' names and shapes are checked against its config."""
    path = Path(folder)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise MeshwiseError(f"--model.from: {folder} is not a Hugging Face model folder (no config.json)")
    spec = load_model(str(path))
    if not has_hf_family(spec):
        raise MeshwiseError(f"--model.from: {folder}: {spec.family} cannot be loaded")
    found: dict[str, tuple[int, ...]] = {}
    for f in weight_files(path):
        found.update({k: tuple(v["shape"]) for k, v in header(f).items()})
    if spec.tied_embeddings:
        found.pop("lm_head.weight", None)
    want = expected_shapes(spec)
    missing, extra = sorted(set(want) - set(found)), sorted(set(found) - set(want))
    if missing or extra:
        which = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which its config does not build"
        raise MeshwiseError(f"--model.from: {folder}: the weights {which} ({len(missing)} missing, {len(extra)} extra)")
    for name, shape in want.items():
        if found[name] != shape:
            raise MeshwiseError(
                f"--model.from: {folder}: {name} has shape {list(found[name])}, its config builds {list(shape)}"
            )
    return spec


@torch.no_grad()
def load(modules: list[nn.Module], spec: ModelSpec, folder: str) -> None:
    """Fill this rank's parameters (plain tensors or DTensor shards) from the folder (collective)."""
    params = {canonical_name(n): p for m in modules for n, p in m.named_parameters()}
    if spec.family in ("phi3", "gpt2"):
        _load_by_tensor(params, spec, Path(folder))
        return
    state = {_hf_name(spec, name): p.detach() for name, p in params.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))


def _load_by_tensor(params: dict[str, nn.Parameter], spec: ModelSpec, folder: Path) -> None:
    where = {}
    for f in weight_files(folder):
        where.update({k: f for k in header(f)})
    for hf_name, path in where.items():
        with safe_open(str(path), framework="pt") as f:
            tensors = from_hf(spec, {hf_name: f.get_tensor(hf_name)})
        for name, full in tensors.items():
            if name not in params:
                continue  # another pipeline stage's
            p = params[name]
            if isinstance(p, DTensor):
                local = distribute_tensor(
                    full.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None
                ).to_local()
                p.to_local().copy_(local)
            else:
                p.copy_(full)
