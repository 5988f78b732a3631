"""cost/kernels.py's byte counts for torchtitan's Llama (``PASSES["torchtitan"]``) against the bytes
torch's own operators read and write when the same operator sequence runs eagerly.

The sequences are those of torchtitan's models/norms.py ``RMSNorm`` and models/llama/model.py
``apply_rotary_emb`` / ``repeat_kv`` (commits 0413364 and 9dec370), as a list of operators: upcast,
square, mean, scale by the reciprocal root, cast back, weight; upcast, complex product, cast back;
expand-and-reshape. A dispatch mode adds up, for every aten operator, the bytes of its outputs and of
its inputs' storages (a broadcast input is read once); an operator whose output shares an input's
storage (a view) moves nothing.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from meshwise.cost import kernels
from meshwise.errors import MeshwiseError
from meshwise.spec import TrainSpec

TOKENS, WIDTH, HEAD = 64, 512, 64


class ByteCounter(TorchDispatchMode):
    """Bytes read and written by the aten operators run under it that allocate their output."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        read = {t.untyped_storage().data_ptr() for t in ins}
        if not any(t.untyped_storage().data_ptr() in read for t in outs):  # views (and _unsafe_view) move nothing
            self.bytes += sum(t.untyped_storage().nbytes() for t in ins) + sum(
                t.numel() * t.element_size() for t in outs
            )
        return out


def moved_units(fn, *tensors) -> float:
    """Bytes ``fn`` moves, in bf16 elements per element of its first argument."""
    with ByteCounter() as counter:
        fn(*tensors)
    return counter.bytes / (tensors[0].numel() * 2)


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    up = x.float()
    return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight


def complex_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x)


def expanded_copy(kv: torch.Tensor, n_rep: int) -> torch.Tensor:
    t, heads, d = kv.shape
    return kv.unsqueeze(2).expand(t, heads, n_rep, d).reshape(t, heads * n_rep, d)


def test_torchtitan_eager_rms_norm_moves_what_passes_charges():
    x, w = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16), torch.ones(WIDTH, dtype=torch.bfloat16)
    assert moved_units(eager_rms_norm, x, w) == pytest.approx(kernels.PASSES["torchtitan"]["norm"], rel=0.03)


def test_torchtitan_complex_rotary_moves_what_passes_charges():
    x = torch.randn(TOKENS, WIDTH // HEAD, HEAD, dtype=torch.bfloat16)
    freqs = torch.polar(torch.ones(TOKENS, 1, HEAD // 2), torch.randn(TOKENS, 1, HEAD // 2))
    units = moved_units(complex_rotary, x, freqs) - freqs.numel() * 8 / (x.numel() * 2)  # the table, read once
    assert units == pytest.approx(kernels.PASSES["torchtitan"]["rotary"], rel=0.03)


def test_repeat_kv_reads_kv_and_writes_the_expanded_heads():
    """``repeat_kv`` = 1: per token, K (and V) moves kv + h elements (read, then the expanded copy)."""
    kv, n_rep = torch.randn(TOKENS, 2, HEAD, dtype=torch.bfloat16), 4
    units = moved_units(expanded_copy, kv, n_rep) * kv.numel() / (kv.numel() * (1 + n_rep))
    assert units == pytest.approx(kernels.PASSES["torchtitan"]["repeat_kv"], rel=0.03)


def test_model_code_picks_the_byte_table_and_only_under_meshwise():
    assert kernels.ops_key(TrainSpec(8, 128, model_code="torchtitan")) == "torchtitan"
    assert kernels.ops_key(TrainSpec(8, 128, runtime="megatron")) == "megatron"
    with pytest.raises(MeshwiseError, match="model_code"):
        TrainSpec(8, 128, model_code="torchtitan", runtime="megatron")
    with pytest.raises(MeshwiseError, match="model_code"):
        TrainSpec(8, 128, model_code="titan")
