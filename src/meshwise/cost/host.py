"""Host time: what a step costs beyond its FLOPs when every operator is launched from Python.

On a CPU rank (and, far less, on a GPU whose kernels are short) each aten operator pays a fixed
dispatch + autograd cost before any arithmetic. At the small micro-batches a CPU can afford, that
cost decides between layouts: eight micro-batches of one sequence launch eight times the operators
of one micro-batch of eight. Per micro-batch, a rank launches

    ops = blocks * (F + B) + [embedding] * (F_e + B_e) + [head] * (F_h + B_h)

where F, B are the forward and backward aten operators of one block of this runtime, counted once
with a ``TorchDispatchMode`` (``tests/test_host_cost.py`` recounts them on every run). Activation
checkpointing adds, per checkpointed block call:

- ``full``: the forward again (F ops) and the wrapper's own cost, ``checkpoint_call_s``;
- ``selective``: the forward again (its saved matmul/attention outputs are looked up, not redone,
  but every op still passes through the policy) and, on every op of the forward and the recompute,
  the policy's Python dispatch mode, ``selective_op_s`` each, plus ``checkpoint_call_s``.

``host_seconds = m * (ops * op_overhead_s + recompute extras)``; the three constants are measured
per machine by ``meshwise calibrate`` (0 in GPU profiles: there the launch queue runs ahead of the
kernels, which the op model in cost/kernels.py costs instead).
"""

from __future__ import annotations

from meshwise.spec import AcceleratorSpec

# aten operators of one Llama-style block (RMSNorm, GQA attention with rotary, SwiGLU) per micro-batch.
BLOCK_FORWARD_OPS = 74
BLOCK_BACKWARD_OPS = 135
# embedding lookup (first stage); final norm, head, cross-entropy (last stage).
EMBEDDING_OPS = 6
HEAD_OPS = 45


def ops_per_microbatch(blocks: int, has_embedding: bool, has_head: bool) -> int:
    """aten operators one rank launches per micro-batch, forward + backward, without recompute."""
    return (blocks * (BLOCK_FORWARD_OPS + BLOCK_BACKWARD_OPS) + EMBEDDING_OPS * int(has_embedding)
            + HEAD_OPS * int(has_head))


def recompute_seconds_per_block(accel: AcceleratorSpec, ac: str) -> float:
    """Host seconds activation checkpointing adds to one block call (forward + backward)."""
    if ac == "none":
        return 0.0
    extra = BLOCK_FORWARD_OPS * accel.op_overhead_s + accel.checkpoint_call_s
    if ac == "selective":
        extra += 2 * BLOCK_FORWARD_OPS * accel.selective_op_s
    return extra


def host_seconds(accel: AcceleratorSpec, blocks: int, has_embedding: bool, has_head: bool, ac: str,
                 microbatches: int) -> float:
    """Host seconds of one step on one rank: ``m * (ops * op_overhead_s + blocks * recompute extra)``."""
    if accel.op_overhead_s == 0 and accel.checkpoint_call_s == 0 and accel.selective_op_s == 0:
        return 0.0
    per_mb = (ops_per_microbatch(blocks, has_embedding, has_head) * accel.op_overhead_s
              + blocks * recompute_seconds_per_block(accel, ac))
    return microbatches * per_mb
