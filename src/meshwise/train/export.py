"""``meshwise export``: one consolidated safetensors file from a (sharded) DCP checkpoint.

safetensors format (https://github.com/huggingface/safetensors, the format's README): an 8-byte
little-endian unsigned header length N, N bytes of JSON header
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``
(offsets relative to the byte after the header; padded here with spaces to a multiple of 8),
then the tensors' raw little-endian bytes, C order, back to back. Written here directly (a few
lines) rather than adding a dependency.

Names and config.json (train/hf_weights.py): every Hugging Face family the runtime builds is written
under that family's own names with a config.json that says what was trained (family, rope theta
and scaling, eps, head_dim, biases, tie, bos/eos), so transformers loads it with no missing or
unexpected keys. A tied head is written once, as the embedding. Above ``max_shard_bytes`` the
tensors go into ``model-0000i-of-0000n.safetensors`` files with a ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``), Hugging Face's sharded layout.
Models with no Hugging Face family (a plain GeLU MLP under the llama family, the Narayanan GPT
rows) keep meshwise's names and get no config.json.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import struct
from pathlib import Path

import torch

from meshwise.runtime.model import build_model
from meshwise.spec import ModelSpec
from meshwise.train import checkpoint
from meshwise.train.checkpoint_files import model_spec
from meshwise.train.hf_weights import _hf_name, hf_config, to_hf
from meshwise.train.tokenizer import tokenizer_file

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64", torch.int32: "I32"}
_FROM_NAME = {v: k for k, v in _DTYPES.items()}

DEFAULT_MAX_SHARD_BYTES = 5 * 2**30  # transformers 4's save_pretrained default, 5 GB


def hf_name(name: str, spec: ModelSpec | None = None) -> str:
    """meshwise parameter name -> Hugging Face name (Llama's, unless ``spec`` names another family)."""
    return _hf_name(
        spec or ModelSpec(name="llama", layers=1, hidden=1, heads=1, kv_heads=1, ffn_hidden=1, vocab=1, max_seq=1), name
    )


def has_hf_family(spec: ModelSpec) -> bool:
    """True when meshwise maps this model's weights to transformers' names: a gated MLP in the
    Llama-like families, or GPT-2 (not yet the mixtures of experts: their experts keep meshwise names)."""
    return not spec.moe and (spec.family == "gpt2" or spec.mlp != "gelu")


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file (the inverse of :func:`write_safetensors`)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = raw[8 + n :]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = _FROM_NAME[info["dtype"]]
        out[name] = (
            torch.frombuffer(bytearray(body[begin:end]), dtype=dtype).reshape(info["shape"])
            if end > begin
            else torch.empty(info["shape"], dtype=dtype)
        )
    return out, meta


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a checkpoint directory (then its latest complete checkpoint)."""
    p = Path(path)
    if not (p / checkpoint.COMMIT_FILE).is_file():
        latest = checkpoint.latest(p)
        if latest is not None:
            return latest
    checkpoint.read_meta(p)  # refuses, in one line, what is not a complete checkpoint
    return p


def load_plain_model(path: str | Path) -> tuple[torch.nn.Module, ModelSpec]:
    """The single-process model of a checkpoint, with its shape from the checkpoint's own metadata."""
    path = resolve(path)
    checkpoint.verify_sound(path)  # before any memory is spent on the model
    spec = model_spec(path, checkpoint.read_meta(path))
    model = build_model(spec, seed=0)
    checkpoint.load_full_model(path, model)
    return model, spec


def write_model(
    out: str | Path,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[Path]:
    """One safetensors file at ``out``, or shards beside it and an index when the tensors exceed
    ``max_shard_bytes`` (a tensor larger than that gets a shard of its own). Returns the files written."""
    out = Path(out)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total <= max_shard_bytes:
        write_safetensors(out, tensors, metadata)
        return [out]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    stem = out.name.removesuffix(".safetensors")
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        path = out.with_name(f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors")
        write_safetensors(path, shard, metadata)
        files.append(path)
        weight_map.update({name: path.name for name in shard})
    index = out.with_name(out.name + ".index.json")
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    return files + [index]


def export_model(
    model: torch.nn.Module,
    spec: ModelSpec,
    out: str | Path,
    metadata: dict[str, str],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Write a plain model's weights (and config.json for a Hugging Face family); returns lines to print."""
    hf = has_hf_family(spec)
    params = {name: p.detach() for name, p in model.named_parameters()}  # a tied head: named once
    tensors = to_hf(spec, params) if hf else params
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    files = write_model(out, tensors, metadata, max_shard_bytes)
    where = files[0] if len(files) == 1 else f"{len(files) - 1} shards and {files[-1]}"
    lines = [
        f"wrote {where}: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values()):,} parameters "
        f"({f'Hugging Face {spec.family} names' if hf else 'meshwise names'})"
    ]
    if hf:
        cfg_path = out.parent / "config.json"
        cfg_path.write_text(json.dumps(hf_config(spec), indent=1) + "\n")
        lines.append(f"wrote {cfg_path}")
    return lines


def export(path: str | Path, out: str | Path, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write ``out`` (and config.json beside it for a Hugging Face family); returns lines to print."""
    path = resolve(path)
    model, spec = load_plain_model(path)
    meta = checkpoint.read_meta(path)
    lines = export_model(
        model, spec, out, {"format": "pt", "source": str(path), "step": str(meta.get("step"))}, max_shard_bytes
    )
    tokenizer = (meta.get("data") or {}).get("tokenizer", "")
    if tokenizer:  # the run's tokenizer files beside the weights, as a Hugging Face folder holds them
        source = tokenizer_file(tokenizer)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            f = source.parent / name if name != "tokenizer.json" else source
            if f.is_file():
                shutil.copyfile(f, Path(out).parent / name)
                lines.append(f"wrote {Path(out).parent / name}")
    return lines
