"""``torch.compile`` per transformer block, in the order torch's own recipes use:
TP/SP -> activation checkpointing -> compile -> FSDP2 / replicate (torchtitan's ``parallelize``
order; the TP tutorial applies TP before ``fully_shard`` the same way).

Without TP, each block's ``forward`` is replaced by its compiled version
(``torch.compile(block.forward)``), so
- parameter names stay those of the plain model (no ``_orig_mod.`` prefix in checkpoints);
- the hooks FSDP2 puts on the block (all-gather before forward, reshard after) run eagerly
  around the compiled region, as with torchtitan's per-block compile;
- an activation-checkpoint wrapper (full, or selective with its policy) is traced into it.

With TP, the compiled regions are the block's local compute between the DTensor boundaries:
rotation + attention (``Attention.attend``) and the MLP's activation (``MLP.activate``); the TP
projections, norms and their redistributions stay eager. Compiling across the boundaries is wrong
in torch 2.13 on CPU/gloo, measured here: the embedding's async output collective reaches the
compiled graph and its backward fails (``'Tensor' object has no attribute '_local_tensor'``),
and once that is waited for, the backward of the compiled block drops the reduction of the
column-parallel inputs' gradients (gradient norm 0.51 against 0.62 at step 1 of the tiny model,
with inductor and with ``aot_eager`` alike). The parity tests hold the regions compiled here.

All blocks have the same code and shapes, so dynamo compiles one graph for the training forward
(and its backward) and one for the no-grad evaluation forward, then reuses them.

Compilation happens on first use: :func:`warm_up` runs one forward and backward on a real
micro-batch and throws the gradients away, so the trainer can report compile time on its own and
step 1 is timed like every other step.

Refused (:func:`check`, one line): pipeline parallelism (``torch.distributed.pipelining`` stages
were not validated under compile here).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout
from meshwise.runtime.model import MLP, Attention, loss_sum


def check(layout: Layout) -> None:
    """Refuse the layouts compile is not supported with, in one line."""
    if layout.pp > 1:
        raise MeshwiseError(
            f"compile: not supported with pipeline parallelism (pp={layout.pp}); "
            "use --compile with pp=1 layouts or run pp layouts without it"
        )
    if layout.cp > 1:
        raise MeshwiseError(
            f"compile: not supported with context parallelism (cp={layout.cp}; its ring "
            "attention is not compiled); use --compile with cp=1 layouts"
        )


def compile_blocks(model: nn.Module, tensor_parallel: bool = False) -> int:
    """Compile every block of ``model.layers`` in place (after TP and recompute wrappers, before
    DP wrapping): the whole block, or under TP its local regions (module docstring). Returns how
    many blocks were compiled."""
    blocks = list(model.layers.values())
    for block in blocks:
        if tensor_parallel:
            attention, mlp = _inner(block, Attention), _inner(block, MLP)
            attention.attend = torch.compile(attention.attend)
            mlp.activate = torch.compile(mlp.activate)
        else:
            block.forward = torch.compile(block.forward)
    return len(blocks)


def _inner(block: nn.Module, kind: type[nn.Module]) -> Any:
    """The block's one ``kind`` module (Attention or MLP), through a recompute wrapper if any."""
    (found,) = [m for m in block.modules() if isinstance(m, kind)]
    return found


def warm_up(pm: Any, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Trigger compilation with one forward and backward of the step's first micro-batch, then
    drop the gradients: weights, optimizer state and RNG are untouched. Returns the seconds taken
    (the world's slowest rank is what the next collective waits for)."""
    start = time.perf_counter()
    rows = pm.layout.mbs
    pm.optimizer.zero_grad(set_to_none=True)
    device = next(iter(pm.parameters())).device
    model = pm.modules[0]
    loss = loss_sum(model(inputs[:rows].to(device)), targets[:rows].to(device))
    loss.backward()
    pm.optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start
