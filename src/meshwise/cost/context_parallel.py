"""Context parallelism in the cost model: what a cp ring changes for one rank (torch-free).

The runtime (meshwise.runtime.context_parallel, docs/runtime.md) splits each sequence into 2·cp
chunks, cp rank i holding chunks i and 2·cp−1−i, and runs causal attention around a ring of P2P
sends. For the cost model that means:

- weights: the cp ranks hold the same weights and join the data-parallel group for them, so the
  states, their sharding and their collectives are those of dp·cp replicas with a sharding group
  of shard·cp (:func:`weights_layout`; torchtitan shards over dp_shard x cp the same way);
- activations and every per-token cost: a sequence of s/cp tokens (:func:`local_train`), while
  each local query still attends over the whole sequence (compute.py and kernels.py count it);
- the ring: per block and micro-batch, cp−1 K/V blocks forward (again under recompute, full or selective: the
  selective policy saves no communication), cp−1
  K/V blocks and cp float32 dK/dV accumulators backward (:func:`cp_collectives`), and their
  buffers at the start of a backward (:func:`ring_bytes`);
- overlap: each K/V send is posted before the attention block it overlaps, so only what exceeds
  the rank's attention compute is exposed; the dK/dV accumulators are exposed (:func:`cp_exposed`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from meshwise.cost import comm, compute
from meshwise.cost.comm import Collective
from meshwise.cost.host import score_kernel_seconds, width_table_seconds
from meshwise.layout import Layout, layout_from_fields
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def weights_layout(layout: Layout) -> Layout:
    """The layout as the weights see it: cp ranks share the weights, so they count as data-parallel
    ranks (dp·cp replicas, sharding group shard·cp)."""
    if layout.cp == 1:
        return layout
    # replace(layout, dp=dp * cp, shard=shard * cp, cp=1) through layout_from_fields: cheaper than
    # replace, and than a cache whose hits compare twelve fields
    fields = layout.__dict__.copy()
    fields["dp"], fields["shard"], fields["cp"] = layout.dp * layout.cp, layout.shard * layout.cp, 1
    return layout_from_fields(fields)


def fsdp_wrapped(layout: Layout) -> bool:
    """Whether FSDP2's ``fully_shard``/``replicate`` wraps the weights: over dp x cp, as
    runtime/data_parallel.py does (cp ranks share the weights; :func:`weights_layout`'s dp > 1)."""
    return layout.dp * layout.cp > 1


def dtensor_parameters(layout: Layout) -> bool:
    """Whether a rank's parameters are DTensors, whose every optimizer and gradient-norm operator
    dispatches through DTensor (cost/host.py): FSDP2 wraps them (:func:`fsdp_wrapped`), or TP
    shards them."""
    return fsdp_wrapped(layout) or layout.tp > 1


def tp_overlap_on(train: TrainSpec, layout: Layout) -> bool:
    """Whether the layout's TP collectives overlap its GEMMs: asked for (TrainSpec.overlap_tp_comm) and possible,
    which needs tp > 1 and sequence parallelism (Megatron-LM's validate_args refuses --tp-comm-overlap
    without --sequence-parallel). Time (cost/estimate.py) and memory (the userbuffers,
    cost/megatron_memory.py) both read it, so they agree."""
    return train.overlap_tp_comm and layout.tp > 1 and layout.sp


def local_train(train: TrainSpec, layout: Layout) -> TrainSpec:
    """The training setting one rank sees: a sequence of seq_len / cp tokens."""
    return train if layout.cp == 1 else _local_train(train, layout.cp)


@lru_cache(maxsize=1024)
def _local_train(train: TrainSpec, cp: int) -> TrainSpec:
    return replace(train, seq_len=train.seq_len // cp)


def ring_bytes(model: ModelSpec, local: TrainSpec, layout: Layout) -> float:
    """The cp ring's buffers during one attention backward (meshwise.runtime.context_parallel): the
    K/V block held and the one arriving (``T * 2kv/t * e`` each), and the float32 dK/dV accumulator
    held and the one arriving (``T * 2kv/t * 4`` each), for ``T = mbs * s/cp`` local tokens
    (``local`` is :func:`local_train`'s setting)."""
    if layout.cp == 1 or model.states_only:
        return 0.0
    kv = layout.mbs * local.seq_len * 2 * model.kv_dim / layout.tp
    return 2 * kv * local.activation_bytes + 2 * kv * 4


def cp_collectives(
    model: ModelSpec, local: TrainSpec, layout: Layout, shape, m: int, cluster: ClusterSpec
) -> tuple[list[Collective], list[Collective]]:
    """(K/V sends, dK/dV sends) of the cp ring for one rank (a memory.RankShape) and step, per block and micro-batch
    (meshwise.runtime.context_parallel): forward cp-1 K/V blocks (again under recompute, full or selective),
    backward cp-1 K/V blocks and cp float32 dK/dV accumulators; each K/V block is ``T * 2kv/t * e``
    bytes for ``T = mbs * s/cp`` local tokens. Every send has its matching receive."""
    if layout.cp == 1 or model.states_only:
        return [], []
    link = cluster.link_for(layout.cp, layout.tp)
    elems = layout.mbs * local.seq_len * 2 * model.kv_dim / layout.tp
    passes = 2 if layout.ac == "none" else 3  # recompute (full or selective) re-runs the forward's ring
    kv_calls = shape.blocks * m * passes * (layout.cp - 1)
    grad_calls = shape.blocks * m * layout.cp
    kv = [comm.collective(k, "cp", 2, elems * local.activation_bytes, kv_calls, link) for k in ("send", "recv")]
    grads = [comm.collective(k, "cp", 2, elems * 4, grad_calls, link) for k in ("send", "recv")]
    return kv, grads


def cp_named(ops: list[Collective], layout: Layout) -> list[Collective]:
    """``ops`` of the weights' data-parallel group with their dimension named by :func:`cp_dim`."""
    if layout.cp == 1:
        return ops
    return [o._replace(dim=cp_dim(o.dim, layout)) for o in ops]


def cp_world_dim(layout: Layout) -> str:
    """``world``, or the flattened dp x cp group's name when that group is every rank (the
    measurement names the world group after it)."""
    if layout.cp > 1 and layout.pp == layout.tp == 1 and (layout.zero == 0 or layout.replicate == 1):
        return cp_dim("dp", layout)
    return "world"


def cp_dim(dim: str, layout: Layout) -> str:
    """The data-parallel group's name under context parallelism, where it spans the cp ranks too:
    cp alone when there is no other replica, else the flattened dims the runtime names. The experts'
    data-parallel group (``edp``, expert parallelism) already counts the cp ranks it spans."""
    if layout.cp == 1 or dim in ("dp_replicate", "edp"):
        return dim
    if dim == "dp" and layout.zero == 0:
        return "cp" if layout.dp == 1 else "dp_cp"
    return "cp" if layout.shard == 1 else "dp_shard_cp"


def cp_exposed(
    model: ModelSpec, train: TrainSpec, kv_ops: list[Collective], grad_ops: list[Collective], compute_s: float
) -> float:
    """Seconds of the cp ring on the critical path: K/V sends beyond the attention share of the
    rank's compute (``4sh / (2 P_block + 4sh)`` of a block's FLOPs), and every dK/dV send."""
    if not kv_ops:
        return 0.0
    attention = compute.attention_core_flops_per_token(model, train.seq_len)
    share = attention / compute.block_forward_flops_per_token(model, train.seq_len)
    kv_s = sum(op.seconds_per_step for op in kv_ops if op.kind == "send")
    return max(kv_s - share * compute_s, 0.0) + sum(op.seconds_per_step for op in grad_ops if op.kind == "send")


def ring_scores_per_step(model: ModelSpec, local: TrainSpec, layout: Layout) -> float:
    """Score elements one ring step computes on one rank: ``mbs * heads / tp * (s/cp)^2``, the local
    queries of every local head against one K/V block (``local`` is :func:`local_train`'s)."""
    return layout.mbs * model.heads / layout.tp * local.seq_len**2


def ring_kernel_seconds(model: ModelSpec, accel, local: TrainSpec, layout: Layout, blocks: int, m: int) -> float:
    """Seconds of one rank's ring-attention kernels in a step (meshwise.runtime.context_parallel
    ``forward_block`` and ``backward_block``, which materialise the scores, unlike a fused kernel):

        m * blocks * cp * (1 + [ac != none] / 3) * (cp_step_s + E * (cp_score_s + head_dim * cp_score_dim_s))

    for ``E`` = :func:`ring_scores_per_step` (cp ring steps per attention, each a forward and a
    backward block; recompute runs the forward again, a third by the FLOP convention of
    compute.recompute_factor). The three constants are fitted by ``meshwise calibrate`` to the
    runtime's own code timed over a grid of (local sequence, head width) (measure/calibrate.py
    ``fit_ring``): with two processes or more, its whole ring call over two ranks, sends and
    bookkeeping included (``cp_step_includes_sends``: cost/estimate.py then exposes no ring transfer
    apart); with one, the bare block functions. 0 when the profile has none (GPU profiles): the
    attention core then stays in the FLOP term."""
    if layout.cp == 1 or model.states_only or not (accel.cp_score_s or accel.cp_score_dim_s or accel.cp_ring_table):
        return 0.0
    per_step = ring_step_seconds(accel, ring_scores_per_step(model, local, layout), model.head_dim)
    return m * blocks * layout.cp * (1.0 + (layout.ac != "none") / 3.0) * per_step


def ring_step_seconds(accel, scores: float, head_dim: float) -> float:
    """One ring step (a forward and a backward block) of ``scores`` score elements at ``head_dim``:
    read off the profile's measured table where it has one (``cp_ring_table``, ``meshwise
    calibrate``'s own timings): piecewise linear in the score elements at each measured head width,
    then in the head width, each extended past its ends by its end segment's slope, and never below
    the table's fastest step; else ``cp_step_s + E * (cp_score_s + head_dim * cp_score_dim_s)``.
    The table, not the fitted line: past the last-level cache (local sequences of 512 and more) a
    score element costs more than at the small shapes, and the line, fitted on relative error over
    both, read the 512-token step 20% fast."""
    table = accel.cp_ring_table
    if not table:
        return score_kernel_seconds(accel.cp_step_s, accel.cp_score_s, accel.cp_score_dim_s, scores, head_dim)
    return max(width_table_seconds(table, scores, head_dim), min(s for _, _, s in table))
