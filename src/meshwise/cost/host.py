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

Under tensor parallelism every block operator is a DTensor operator: its sharding propagation and
redistribution run in Python, ``tp_op_s`` more per operator (the embedding and head too, which are
sharded as well).

``host_seconds = m * (ops * (op_overhead_s + [tp > 1] tp_op_s) + recompute extras)``.

The optimizer step pays the same per-operator cost: off CUDA, torch's AdamW runs its single-tensor
loop (``foreach`` defaults to on only for CUDA-like devices), ``ADAMW_OPS_PER_TENSOR`` aten
operators per parameter tensor, each a DTensor operator (``tp_op_s`` more) when the parameters are
DTensors (FSDP2's ``fully_shard``/``replicate`` under dp > 1, and tp > 1):
``optimizer_host_seconds = tensors * ADAMW_OPS_PER_TENSOR * (op_overhead_s + [DTensor] tp_op_s)``.

More ranks than cores (a CPU profile's ``cores_per_node``, from ``os.cpu_count()``): the profile
holds a rank's speed on a core of its own (``calibrate`` runs its per-rank benchmarks on at most
one rank per core), and ranks that compute at once time-share the cores:
``core_share = max(1, ranks_per_node / cores_per_node)`` multiplies everything a rank does on its
core (arithmetic, operator launches, the optimizer, FSDP2's copies); collectives are as calibrated
at that process count, since their calibration already ran every rank.

Memory-bound work (norms, residual adds, rotary, the MLP's activation, the embedding, the loss's
softmax / cross-entropy) is charged by the bytes it moves over the calibrated copy bandwidth
(``hbm_bytes_per_s``), with cost/kernels.py's byte counts (``PASSES["meshwise"]``), for the tokens
each rank really processes: under TP with SP off every TP rank runs the norms and residual adds
over all of its micro-batch's tokens, and (the head's output gathered, runtime/tensor_parallel.py)
the loss over the full vocabulary; with SP on the norms and residual adds run over ``tokens / tp``.
``memory_bound_seconds = m * rank_memory_bound_bytes / hbm_bytes_per_s``. The arithmetic is the
rest: FLOPs over the calibrated matmul rate x efficiency, the calibration having subtracted the
same term from its measured forward + backward (measure/calibrate.py).

The constants are measured
per machine by ``meshwise calibrate`` (0 in GPU profiles: there the launch queue runs ahead of the
kernels, which the op model in cost/kernels.py costs instead).
"""

from __future__ import annotations

from meshwise.cost import kernels
from meshwise.cost.comm import Collective
from meshwise.spec import AcceleratorSpec, ModelSpec, TrainSpec

# aten operators of one Llama-style block (RMSNorm, GQA attention with rotary, SwiGLU) per micro-batch.
BLOCK_FORWARD_OPS = 74
BLOCK_BACKWARD_OPS = 135
# embedding lookup (first stage); final norm, head, cross-entropy (last stage).
EMBEDDING_OPS = 6
HEAD_OPS = 45


ADAMW_OPS_PER_TENSOR = 10  # lerp_, mul_ x2, addcmul_, add_, div, sqrt, addcdiv_, step add_, a scalar read


def is_host_bound(accel: AcceleratorSpec) -> bool:
    """A rank that launches every operator from Python at a measured cost (a CPU profile: calibrated
    or the catalog's ``cpu``); GPU profiles state no host time and keep their own compute model."""
    return accel.op_overhead_s > 0 or accel.tp_op_s > 0


def core_share(accel: AcceleratorSpec, ranks_per_node: int) -> float:
    """How many ranks each core serves when all compute: ``max(1, ranks_per_node / cores_per_node)``
    (1 when the profile states no cores: GPUs)."""
    cores = accel.cores_per_node
    return max(1.0, ranks_per_node / cores) if cores else 1.0


def parameter_tensors(model, blocks: int, has_embedding: bool, has_head: bool) -> int:
    """Parameter tensors one rank's optimizer steps over: per block the norms, Q/K/V/O (with their
    biases and q/k norms), the MLP's two or three matrices (biases), the routed experts' when the
    model has them; the embedding; the final norm and an untied head."""
    gated = 3 if model.mlp == "swiglu" else 2
    per_block = (model.norms_per_layer * (2 if model.norm == "layernorm" else 1) + 4 + 3 * model.qkv_bias
                 + model.o_bias + 2 * model.qk_norm + gated * (1 + model.mlp_bias)
                 + (gated * getattr(model, "experts", 0) + 1 if getattr(model, "experts", 0) else 0))
    head = (1 + (not model.tied_embeddings)) if has_head else 0
    return blocks * per_block + int(has_embedding) + head


def optimizer_host_seconds(accel: AcceleratorSpec, tensors: int, dtensor: bool) -> float:
    """Host seconds of one AdamW step over ``tensors`` parameter tensors (module docstring)."""
    return tensors * ADAMW_OPS_PER_TENSOR * (accel.op_overhead_s + (accel.tp_op_s if dtensor else 0.0))


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
                 microbatches: int, tp: int = 1) -> float:
    """Host seconds of one step on one rank:
    ``m * (ops * (op_overhead_s + [tp > 1] tp_op_s) + blocks * recompute extra)``."""
    per_op_s = accel.op_overhead_s + (accel.tp_op_s if tp > 1 else 0.0)
    if per_op_s == 0 and accel.checkpoint_call_s == 0 and accel.selective_op_s == 0:
        return 0.0
    per_mb = (ops_per_microbatch(blocks, has_embedding, has_head) * per_op_s
              + blocks * recompute_seconds_per_block(accel, ac))
    return microbatches * per_mb


def fsdp_copy_seconds(dp_ops: list[Collective], memory_bytes_per_s: float) -> float:
    """FSDP2's copy-in and copy-out around each of its all-gathers and reduce-scatters: the
    parameters (gradients) are copied into the flat communication buffer and back out, about twice
    the gathered bytes through memory. Charged where nothing overlaps (``comm_overlap = false``,
    CPU ranks), where they run on the same cores as everything else."""
    moved = sum(op.bytes_per_step for op in dp_ops if op.kind in ("all_gather", "reduce_scatter"))
    return 2.0 * moved / memory_bytes_per_s


def loss_vocab(model: ModelSpec, runtime: str, tp: int) -> float:
    """Logits per token one TP rank's loss runs over: meshwise gathers the head's output (every rank
    the full vocabulary), Megatron's vocab-parallel cross-entropy keeps ``vocab / tp``."""
    return model.vocab if runtime == "meshwise" else model.vocab / tp


def memory_bound_seconds(model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, mbs: int, tp: int, sp: bool,
                         ac: str, blocks: int, has_embedding: bool, has_head: bool, microbatches: int) -> float:
    """Seconds of one step's memory-bound operations on one CPU rank (``train``: the rank's tokens
    per sequence): ``m * kernels.rank_memory_bound_bytes / hbm_bytes_per_s`` (module docstring)."""
    moved = kernels.rank_memory_bound_bytes(model, train.runtime, train.activation_bytes, mbs * train.seq_len, tp, sp,
                                            ac, blocks, has_embedding, has_head, loss_vocab(model, train.runtime, tp))
    return microbatches * moved / accel.hbm_bytes_per_s
