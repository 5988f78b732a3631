"""Activation checkpointing (recomputation in backward), per transformer block, with
``torch.utils.checkpoint`` (non-reentrant). The recipes, written down once here; the cost model
(``cost/activations.py``) counts what they keep.

``full``: the block keeps only its input; backward reruns the whole block.
``selective``: an op-level policy through ``create_selective_checkpoint_contexts``: the outputs of
the ops in ``SELECTIVE_SAVE_OPS`` (the matrix multiplies and the fused attention) are kept, every
other op (norms, rotary, SiLU/GeLU, the gating multiply, and under SP the sequence all-gathers)
reruns: cheap elementwise work is redone, no matmul FLOPs are.

Each block is replaced by a :class:`Recomputed` wrapper whose child is named ``_recomputed``;
:func:`meshwise.runtime.model.canonical_name` strips that prefix so names stay layout-independent.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from meshwise.runtime.model import Transformer

# aten op names (without the ``aten.`` prefix and overload) whose outputs ``selective`` keeps; the
# SDPA kernels are alternatives (one per backend), so a build has some of them, not all.
SELECTIVE_SAVE_OPS = (
    "mm",
    "_scaled_mm",  # float8 GEMMs (torchao), kept like mm: same output, see meshwise.runtime.float8
    "addmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def _save_ops() -> frozenset:
    """The aten overload packets named in SELECTIVE_SAVE_OPS (those this torch build has)."""
    return frozenset(getattr(torch.ops.aten, name) for name in SELECTIVE_SAVE_OPS if hasattr(torch.ops.aten, name))


def selective_policy(save_ops: frozenset) -> Callable[..., CheckpointPolicy]:
    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        packet = getattr(op, "overloadpacket", op)
        return CheckpointPolicy.MUST_SAVE if packet in save_ops else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


class Recomputed(nn.Module):
    """Runs ``_recomputed`` under ``torch.utils.checkpoint.checkpoint`` (full, or with a selective policy)."""

    def __init__(self, block: nn.Module, mode: str) -> None:
        super().__init__()
        self._recomputed = block
        self.mode = mode
        self._context_fn = None
        if mode == "selective":
            self._context_fn = partial(create_selective_checkpoint_contexts, selective_policy(_save_ops()))

    def forward(self, *args: Any) -> Any:
        kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": False}
        if self._context_fn is not None:
            kwargs["context_fn"] = self._context_fn
        return checkpoint(self._recomputed, *args, **kwargs)


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """Wrap every block of ``model`` for ``mode`` in {none, selective, full}; none leaves it alone."""
    if mode == "none":
        return
    if mode not in ("selective", "full"):
        raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    for name in list(model.layers):
        model.layers[name] = Recomputed(model.layers[name], mode)
