"""``torch.compile`` per transformer block, in the order torch's own recipes use:
TP/SP -> activation checkpointing -> compile each block -> FSDP2 / replicate (torchtitan's
``parallelize`` order; the TP tutorial applies TP before ``fully_shard`` the same way). TP is
refused under compile for now (below); the hook sits where torchtitan's order puts it.

Each block's ``forward`` is replaced by its compiled version (``torch.compile(block.forward)``), so
- parameter names stay those of the plain model (no ``_orig_mod.`` prefix in checkpoints);
- the hooks FSDP2 puts on the block (all-gather before forward, reshard after) run eagerly
  around the compiled region, as with torchtitan's per-block compile;
- an activation-checkpoint wrapper (full, or selective with its policy) is traced into it.

All blocks have the same code and shapes, so dynamo compiles one graph for the training forward
(and its backward) and one for the no-grad evaluation forward, then reuses them.

Compilation happens on first use: :func:`warm_up` runs one forward and backward on a real
micro-batch and throws the gradients away, so the trainer can report compile time on its own and
step 1 is timed like every other step.

Refused (:func:`check`, one line): pipeline parallelism (``torch.distributed.pipelining`` stages
were not validated under compile here) and tensor parallelism: with torch 2.13 on CPU/gloo the
backward of a compiled TP block fails inside DTensor's redistribute (``'Tensor' object has no
attribute '_local_tensor'``), with SP on or off, with or without recompute.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout


def check(layout: Layout) -> None:
    """Refuse the layouts compile is not supported with, in one line."""
    if layout.pp > 1:
        raise MeshwiseError(f"compile: not supported with pipeline parallelism (pp={layout.pp}); "
                            "use --compile with pp=1 layouts or run pp layouts without it")
    if layout.tp > 1:
        raise MeshwiseError(f"compile: not supported with tensor parallelism (tp={layout.tp}) on this torch "
                            "(the backward of a compiled TP block fails); use --compile with tp=1 layouts")
    if layout.cp > 1:
        raise MeshwiseError(f"compile: not supported with context parallelism (cp={layout.cp}; its ring "
                            "attention is not compiled); use --compile with cp=1 layouts")


def compile_blocks(model: nn.Module) -> int:
    """Compile every block of ``model.layers`` in place (after TP and recompute wrappers, before
    DP wrapping); returns how many blocks were compiled."""
    blocks = list(model.layers.values())
    for block in blocks:
        block.forward = torch.compile(block.forward)
    return len(blocks)


def warm_up(pm: Any, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Trigger compilation with one forward and backward of the step's first micro-batch, then
    drop the gradients: weights, optimizer state and RNG are untouched. Returns the seconds taken
    (the world's slowest rank is what the next collective waits for)."""
    start = time.perf_counter()
    rows = pm.layout.mbs
    pm.optimizer.zero_grad(set_to_none=True)
    device = next(iter(pm.parameters())).device
    model = pm.modules[0]
    from meshwise.runtime.model import loss_sum

    loss = loss_sum(model(inputs[:rows].to(device)), targets[:rows].to(device))
    loss.backward()
    pm.optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start
