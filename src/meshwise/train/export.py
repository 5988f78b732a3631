"""``meshwise export``: one consolidated safetensors file from a (sharded) DCP checkpoint.

safetensors format (https://github.com/huggingface/safetensors, the format's README): an 8-byte
little-endian unsigned header length N, N bytes of JSON header
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``
(offsets relative to the byte after the header; padded here with spaces to a multiple of 8),
then the tensors' raw little-endian bytes, C order, back to back. Written here directly (a few
lines) rather than adding a dependency.

Names: for SwiGLU models (the Llama architecture) the Hugging Face ``LlamaForCausalLM`` names, and
a ``config.json`` beside the file; the rotary convention is already the half-split one Hugging
Face's Llama uses, so no weight permutation is needed. Other models keep meshwise's names.
"""

from __future__ import annotations

import ctypes
import json
import re
import struct
from pathlib import Path

import torch

from meshwise.spec import ModelSpec
from meshwise.train import checkpoint
from meshwise.train.checkpoint_files import model_spec

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
           torch.int32: "I32"}
_FROM_NAME = {v: k for k, v in _DTYPES.items()}

_HF_BLOCK = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
             "attention.wo": "self_attn.o_proj", "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj",
             "mlp.w2": "mlp.down_proj", "attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def hf_name(name: str) -> str:
    """meshwise parameter name -> Hugging Face Llama name."""
    if name == "tok_embeddings.weight":
        return "model.embed_tokens.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.weight", name)
    if m and m.group(2) in _HF_BLOCK:
        return f"model.layers.{m.group(1)}.{_HF_BLOCK[m.group(2)]}.weight"
    raise KeyError(name)


def hf_config(spec: ModelSpec) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": spec.hidden,
            "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "vocab_size": spec.vocab,
            "max_position_embeddings": spec.max_seq, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "hidden_act": "silu", "tie_word_embeddings": spec.tied_embeddings, "attention_bias": False,
            "mlp_bias": False, "torch_dtype": "float32"}


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
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = _FROM_NAME[info["dtype"]]
        out[name] = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype).reshape(info["shape"]) \
            if end > begin else torch.empty(info["shape"], dtype=dtype)
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
    from meshwise.runtime.model import build_model

    path = resolve(path)
    checkpoint.verify_sound(path)  # before any memory is spent on the model
    spec = model_spec(path, checkpoint.read_meta(path))
    model = build_model(spec, seed=0)
    checkpoint.load_full_model(path, model)
    return model, spec


def export(path: str | Path, out: str | Path) -> list[str]:
    """Write ``out`` (and config.json beside it for Llama-shaped models); returns lines to print."""
    path = resolve(path)
    model, spec = load_plain_model(path)
    llama = spec.mlp == "swiglu"
    tensors = {}
    for name, p in model.named_parameters():  # a tied head is the embedding: named once
        tensors[hf_name(name) if llama else name] = p
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = checkpoint.read_meta(path)
    write_safetensors(out, tensors, {"format": "pt", "source": str(path), "step": str(meta.get("step"))})
    lines = [f"wrote {out}: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values()):,} parameters "
             f"({'Hugging Face Llama names' if llama else 'meshwise names'})"]
    if llama:
        cfg_path = out.parent / "config.json"
        cfg_path.write_text(json.dumps(hf_config(spec), indent=1) + "\n")
        lines.append(f"wrote {cfg_path}")
    return lines
