"""Host time: what a step costs beyond its FLOPs when every operator is launched from Python.

On a CPU rank (and, far less, on a GPU whose kernels are short) each aten operator pays a fixed
dispatch + autograd cost before any arithmetic. At the small micro-batches a CPU can afford, that
cost decides between layouts: eight micro-batches of one sequence launch eight times the operators
of one micro-batch of eight. Per micro-batch, a rank launches

    ops = blocks * (F + B) + [embedding] * (F_e + B_e) + [head] * (F_h + B_h)

where F, B are the forward and backward aten operators of one block of this runtime, counted once
with a ``TorchDispatchMode`` (``tests/unit/test_host_cost.py`` recounts them on every run). Activation
checkpointing adds, per checkpointed block call:

- ``full``: the forward again (F ops) and the wrapper's own cost, ``checkpoint_call_s``;
- ``selective``: the forward again (its saved matmul/attention outputs are looked up, not redone,
  but every op still passes through the policy) and, on every op of the forward and the recompute,
  the policy's Python dispatch mode, ``selective_op_s`` each, plus ``checkpoint_call_s``.

Under tensor parallelism every block operator is a DTensor operator: its sharding propagation and
redistribution run in Python, ``tp_op_s`` more per operator (the embedding and head too, which are
sharded as well). Sequence parallelism adds its redistributions of the residual stream,
``tp_sp_block_s`` per block call (:func:`sequence_parallel_seconds_per_block`).
A zero-bubble schedule splits each backward in two passes, ``zb_split_block_s`` more per block
call (:func:`split_backward_seconds`).
Under pipeline parallelism the schedule itself works around every stage call (one chunk's forward
or backward of one micro-batch): its P2P sends and receives launched, their buffers, its checks,
``pp_call_s`` per call (:func:`pipeline_call_seconds`).

``host_seconds = m * (ops * (op_overhead_s + [tp > 1] tp_op_s) + recompute extras)``.

Activation checkpointing's recomputed forward runs the same operators, DTensor ones under TP:
``F * (op_overhead_s + [tp > 1] tp_op_s)`` per recomputed block.

The optimizer step pays the same per-operator cost: off CUDA, torch's AdamW runs its single-tensor
loop (``foreach`` defaults to on only for CUDA-like devices), ``ADAMW_OPS_PER_TENSOR`` aten
operators per parameter tensor, and when the parameters are DTensors (FSDP2's
``fully_shard``/``replicate`` under dp > 1, and tp > 1) each of them is a DTensor dispatch:
``optimizer_dtensor_s`` more per tensor, measured on an AdamW step over FSDP2's parameters
(pointwise operators on one placement: about a quarter of a block operator's ``tp_op_s`` on a
2-core x86 host):
``optimizer_host_seconds = tensors * (ADAMW_OPS_PER_TENSOR * op_overhead_s + [DTensor] optimizer_dtensor_s)``.

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

Data parallelism (FSDP2's ``fully_shard`` and ``replicate``) adds its own host work around every
collective of a unit, on the rank's main thread: ``fsdp_host_seconds`` per call and per parameter
tensor, and ``fsdp_copy_seconds`` for the bytes copied in and out of its flat buffers; both are
compute on the rank's core (measure's split times them inside the forward and backward).

The constants are measured
per machine by ``meshwise calibrate`` (0 in GPU profiles: there the launch queue runs ahead of the
kernels, which the op model in cost/kernels.py costs instead).
"""

from __future__ import annotations

from meshwise.cost import kernels
from meshwise.cost.comm import Collective
from meshwise.cost.rank_work import RankWork
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


def sync_skew_seconds(accel: AcceleratorSpec, ranks_per_node: int, own_compute_s: float, collectives: float) -> float:
    """With more ranks than cores (:func:`core_share` > 1), what a rank waits at its collectives for
    peers the scheduler has not run yet, beyond the collectives' calibrated time:
    ``sync_skew_ratio * min(own_compute_s, collectives * sync_skew_slice_s)``, ``own_compute_s`` the
    rank's compute per step on a core of its own. ``meshwise calibrate`` measures the ratio at the
    profile's process count: every rank computing a slice then joining an all-reduce, against the
    same slices and the all-reduce apart (measure/calibrate.py ``sync_skew``), for slices up to
    ``sync_skew_slice_s`` of own-core compute; a longer slice is read as that one. 0 otherwise."""
    if core_share(accel, ranks_per_node) <= 1 or not accel.sync_skew_ratio or collectives <= 0:
        return 0.0
    return accel.sync_skew_ratio * min(own_compute_s, collectives * accel.sync_skew_slice_s)


def parameter_tensors(model, blocks: int, has_embedding: bool, has_head: bool) -> int:
    """Parameter tensors one rank's optimizer steps over: per block the norms, Q/K/V/O (with their
    biases and q/k norms) and the MLP's two or three matrices (biases); a MoE block instead its
    router, the routed experts stored grouped (three tensors: runtime/moe.py ``GroupedExperts``),
    the shared expert's MLP and its gate where the model has them (a rank's blocks taken at the
    model's share of MoE blocks); the embedding; the final norm and an untied head."""
    gated = 3 if model.mlp == "swiglu" else 2
    mlp = gated * (1 + model.mlp_bias)
    per_block = (
        model.norms_per_layer * (2 if model.norm == "layernorm" else 1)
        + 4
        + 3 * model.qkv_bias
        + model.o_bias
        + 2 * model.qk_norm
    )
    moe_share = model.moe_layers / model.layers if getattr(model, "experts", 0) else 0.0
    moe_mlp = 1 + 3 + (mlp if model.shared_ffn_hidden else 0) + model.shared_expert_gate
    head = (1 + (not model.tied_embeddings)) if has_head else 0
    mlps = round(blocks * ((1 - moe_share) * mlp + moe_share * moe_mlp))
    return blocks * per_block + mlps + int(has_embedding) + head


def optimizer_host_seconds(accel: AcceleratorSpec, tensors: int, dtensor: bool) -> float:
    """Host seconds of one AdamW step over ``tensors`` parameter tensors (module docstring)."""
    return tensors * (ADAMW_OPS_PER_TENSOR * accel.op_overhead_s + (accel.optimizer_dtensor_s if dtensor else 0.0))


# Elements read + written per parameter by torch's single-tensor AdamW (torch/optim/adamw.py, off CUDA):
# weight decay mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, div 2, add_ 2, addcdiv_ 4
ADAMW_ELEMENT_PASSES = 20
STATE_FIRST_PASS_ELEMENTS = 7  # read param, grad, both moments; write param, both moments: from DRAM once
NORM_ELEMENT_PASSES = 3  # the gradient norm reads each gradient, the clipping mul_ reads and writes it


def optimizer_memory_seconds(accel: AcceleratorSpec, params: float, elem_bytes: int) -> float:
    """Memory seconds of one AdamW step over ``params`` local parameters on a CPU rank whose profile
    states a DRAM bandwidth: the states' first pass streams from DRAM
    (``STATE_FIRST_PASS_ELEMENTS``), the loop's operators then run on a tensor the cache holds
    (``ADAMW_ELEMENT_PASSES`` at the cache bandwidth ``hbm_bytes_per_s``)."""
    return (
        params
        * elem_bytes
        * (STATE_FIRST_PASS_ELEMENTS / accel.dram_bytes_per_s + ADAMW_ELEMENT_PASSES / accel.hbm_bytes_per_s)
    )


GRAD_ACCUMULATION_PASSES = 3  # autograd's AccumulateGrad: grad += new reads both and writes the sum


def grad_accumulation_seconds(accel: AcceleratorSpec, grad_params: float, elem_bytes: int, microbatches: int) -> float:
    """Memory seconds of summing a rank's gradients over ``microbatches`` micro-batches in a step:
    every micro-batch after the first adds its gradient into the one held (autograd's AccumulateGrad
    ``grad += new``, ``GRAD_ACCUMULATION_PASSES`` passes over ``grad_params`` elements), at the DRAM
    copy bandwidth where the profile states one (a model's gradients outgrow the cache first), else
    ``hbm_bytes_per_s``: ``(m - 1) * 3 * grad_params * elem_bytes / bandwidth``. On CPU ranks only
    (cost/estimate.py): Megatron-LM fuses the sum into the weight-gradient GEMM
    (``--gradient-accumulation-fusion``)."""
    bandwidth = accel.dram_bytes_per_s or accel.hbm_bytes_per_s
    return max(microbatches - 1, 0) * GRAD_ACCUMULATION_PASSES * grad_params * elem_bytes / bandwidth


FIXED_OPS_PER_TENSOR = 2  # per step, per parameter tensor: its share of the gradient norm, the clipping mul_


def fixed_host_seconds(
    accel: AcceleratorSpec, tensors: int, dtensor: bool, params: float = 0.0, elem_bytes: int = 4
) -> float:
    """Host seconds of a step's fixed work on one rank (runtime/parallelize.py ``step``): zeroing
    gradients (set to None: no operator), the gradient norm and its clipping, ``FIXED_OPS_PER_TENSOR``
    operators per parameter tensor, plus the ``to_local`` of a DTensor gradient (about one DTensor
    operator, ``tp_op_s``): ``tensors * (FIXED_OPS_PER_TENSOR * op_overhead_s + [DTensor] tp_op_s)``,
    plus the gradients' ``NORM_ELEMENT_PASSES`` over the copy bandwidth. Its two all-reduces (norm,
    loss) are communication (cost/estimate.py)."""
    launches = tensors * (FIXED_OPS_PER_TENSOR * accel.op_overhead_s + (accel.tp_op_s if dtensor else 0.0))
    return launches + params * elem_bytes * NORM_ELEMENT_PASSES / accel.hbm_bytes_per_s


def ops_per_microbatch(blocks: int, has_embedding: bool, has_head: bool) -> int:
    """aten operators one rank launches per micro-batch, forward + backward, without recompute."""
    return (
        blocks * (BLOCK_FORWARD_OPS + BLOCK_BACKWARD_OPS)
        + EMBEDDING_OPS * int(has_embedding)
        + HEAD_OPS * int(has_head)
    )


def recompute_seconds_per_block(accel: AcceleratorSpec, ac: str, tp: int = 1) -> float:
    """Host seconds activation checkpointing adds to one block call (forward + backward): the
    forward's operators again (DTensor ones under ``tp > 1``), the wrapper, and under the selective
    policy its dispatch mode on every operator of both forwards."""
    if ac == "none":
        return 0.0
    extra = BLOCK_FORWARD_OPS * (accel.op_overhead_s + (accel.tp_op_s if tp > 1 else 0.0)) + accel.checkpoint_call_s
    if ac == "selective":
        extra += 2 * BLOCK_FORWARD_OPS * accel.selective_op_s
    return extra


def sequence_parallel_seconds_per_block(accel: AcceleratorSpec, ac: str) -> float:
    """Host seconds sequence parallelism adds to one block call under tp > 1 (forward + backward):
    the redistributions around attention and the MLP (an all-gather of the sequence before each,
    a reduce-scatter after, and their transposes in the backward), DTensor work the operators'
    count does not hold, ``tp_sp_block_s`` as ``meshwise calibrate`` times it (the tp=2 pass with SP
    less the one without, net of the time blocked on their collectives, per block). Checkpointing
    runs the forward's half again: ``tp_sp_block_s * (1 + [ac != none] / 2)``."""
    return accel.tp_sp_block_s * (1.0 + (ac != "none") / 2.0)


def host_seconds(
    accel: AcceleratorSpec,
    blocks: int,
    has_embedding: bool,
    has_head: bool,
    ac: str,
    microbatches: int,
    tp: int = 1,
    sp: bool = False,
) -> float:
    """Host seconds of one step on one rank:
    ``m * (ops * (op_overhead_s + [tp > 1] tp_op_s) + blocks * (recompute extra + [tp > 1, sp] SP extra))``."""
    per_op_s = accel.op_overhead_s + (accel.tp_op_s if tp > 1 else 0.0)
    sp_s = sequence_parallel_seconds_per_block(accel, ac) if tp > 1 and sp else 0.0
    if per_op_s == 0 and sp_s == 0 and accel.checkpoint_call_s == 0 and accel.selective_op_s == 0:
        return 0.0
    per_mb = ops_per_microbatch(blocks, has_embedding, has_head) * per_op_s + blocks * (
        recompute_seconds_per_block(accel, ac, tp) + sp_s
    )
    return microbatches * per_mb


def split_backward_seconds(accel: AcceleratorSpec, schedule: str, pp: int, blocks: int, microbatches: int) -> float:
    """Host seconds a zero-bubble schedule adds to one rank's step by splitting each backward in two
    (torch's ``stage_backward_input`` then ``stage_backward_weight``: the first also walks the
    autograd graph for the weights' groups): ``m * blocks * zb_split_block_s`` under
    ``schedule = zero-bubble`` with pp > 1, as ``meshwise calibrate`` times it (the calibration
    model's blocks as a stage, split backward less plain, per block: about 2 ms on a 2-core x86
    host, where a block's whole forward + backward at four tokens is 2.6 ms); 0 otherwise."""
    if schedule != "zero-bubble" or pp <= 1:
        return 0.0
    return microbatches * blocks * accel.zb_split_block_s


def pipeline_call_seconds(accel: AcceleratorSpec, pp: int, chunks: int, microbatches: int) -> float:
    """Host seconds a pipeline schedule adds to one rank's step beyond its stages' own work:
    ``2 * m * chunks * pp_call_s`` (a forward and a backward call per micro-batch and chunk) under
    pp > 1, as ``meshwise calibrate`` times it (the calibration model as two stages under GPipe at
    four tokens, each rank's step net of its waits less the same stage's plain passes, per call:
    0.3-0.6 ms on a quiet 2-core x86 host, where a grid step at pp=2 measured 1-2 ms per call more
    than its stages' predicted work); 0 otherwise."""
    if pp <= 1:
        return 0.0
    return 2 * microbatches * chunks * accel.pp_call_s


def fsdp_ops(dp_ops: list[Collective]) -> list[Collective]:
    """The collectives FSDP2 issues per unit: its all-gathers and reduce-scatters, and ``replicate``'s
    all-reduces (zero 0); not HSDP's all-reduce of the reduced shards across replicas, which rides on
    the reduce-scatter's work."""
    return [
        op
        for op in dp_ops
        if op.kind in ("all_gather", "reduce_scatter") or (op.kind == "all_reduce" and op.dim != "dp_replicate")
    ]


def fsdp_copy_seconds(dp_ops: list[Collective], accel: AcceleratorSpec) -> float:
    """FSDP2's work per byte around each of its collectives (:func:`fsdp_ops`): copying parameters
    (gradients) into the flat communication buffer and back out, concatenating and dividing the
    gradients, and touching fresh buffers. As ``meshwise calibrate`` measured it
    (``fsdp_byte_s``, on the calibration model and on a wider one: measure/calibrate.py
    ``fsdp_constants``; on a 2-core x86 host 0.2-0.3 ms per MB, ten times the copies alone), else
    the copies alone, twice the bytes over the copy bandwidth (``hbm_bytes_per_s``). Charged where
    nothing overlaps (``comm_overlap = false``, CPU ranks), on the same cores as everything else."""
    moved = sum(op.bytes_per_step for op in fsdp_ops(dp_ops))
    return moved * (accel.fsdp_byte_s or 2.0 / accel.hbm_bytes_per_s)


def fsdp_calls(dp_ops: list[Collective]) -> float:
    """FSDP2's collective calls per step (one per unit per gather or reduction, :func:`fsdp_ops`)."""
    return float(sum(op.count_per_step for op in fsdp_ops(dp_ops)))


def fsdp_host_seconds(accel: AcceleratorSpec, dp_ops: list[Collective], tensors: int, units: int) -> float:
    """FSDP2's own host work on one rank per step, outside its transfers: each all-gather and
    reduce-scatter of a unit runs Python hooks and builds its flat buffer and the unsharded
    parameters (or sharded gradients) tensor by tensor:
    ``calls * (fsdp_call_s + tensors / units * fsdp_param_s)``, both measured by ``meshwise
    calibrate`` (measure/calibrate.py ``fsdp_constants``; 0 in GPU profiles)."""
    if not (accel.fsdp_call_s or accel.fsdp_param_s) or not dp_ops:
        return 0.0
    return fsdp_calls(dp_ops) * (accel.fsdp_call_s + tensors / max(units, 1) * accel.fsdp_param_s)


def cpu_gemm_seconds(accel: AcceleratorSpec, m: float, n: float, k: float) -> float:
    """One GEMM of (M, N, K) on a CPU rank as ``meshwise calibrate`` fits its grid (16 to 2,048 per
    side): ``2 M N K / cpu_gemm_flops_per_s + cpu_gemm_call_s + 4 (M K + K N + M N) / cpu_gemm_bytes_per_s``
    (the bandwidth term left out when 0): small GEMMs pay their fixed cost and their operands'
    traffic over few FLOPs."""
    moved = 4.0 * (m * k + k * n + m * n)
    memory_s = moved / accel.cpu_gemm_bytes_per_s if accel.cpu_gemm_bytes_per_s else 0.0
    return 2.0 * m * n * k / accel.cpu_gemm_flops_per_s + accel.cpu_gemm_call_s + memory_s


def linear_gemm_shapes(model: ModelSpec, tokens: float, tp: int, has_head: bool) -> list[tuple[float, float, float]]:
    """(M, N, K) of one block's linear layers on one TP rank for ``tokens`` tokens, forward
    ``(T, N, K)`` and backward ``(T, K, N)`` (input gradient) and ``(K, N, T)`` (weight gradient),
    as cost/kernels.py's ``block_seconds`` lays them out; with ``has_head`` the LM head's too."""
    h = model.hidden
    gated = 2 if model.mlp == "swiglu" else 1
    layers = [
        ((h + 2 * model.kv_dim) / tp, h),
        (h, h / tp),
        (gated * model.ffn_hidden / tp, h),
        (h, model.ffn_hidden / tp),
    ]
    if has_head:
        layers.append((model.vocab / tp, h))
    return [shape for n, k in layers for shape in ((tokens, n, k), (tokens, k, n), (k, n, tokens))]


def gemm_grid_efficiency(accel: AcceleratorSpec, shapes: list[tuple[float, float, float]]) -> float:
    """The fitted GEMM model's fraction of its own rate over ``shapes`` (FLOP-weighted):
    ``sum(2 M N K) / rate / sum(cpu_gemm_seconds)``."""
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    return flops / accel.cpu_gemm_flops_per_s / sum(cpu_gemm_seconds(accel, *s) for s in shapes)


def gemm_shape_factor(model: ModelSpec, accel: AcceleratorSpec, tokens: float, tp: int) -> float:
    """How much better (> 1) or worse (< 1) than at the calibration's own GEMMs this rank's GEMMs
    run, by the calibrated grid: ``gemm_grid_efficiency(these shapes) / gemm_reference_efficiency``.
    The calibrated ``efficiency_max`` (the calibration model's whole forward + backward) times this
    is the efficiency at these shapes, so the calibration still predicts its own forward + backward.
    1 where no grid was measured (GPU profiles, older calibrations)."""
    if not accel.cpu_gemm_flops_per_s or model.states_only:
        return 1.0
    return gemm_grid_efficiency(accel, linear_gemm_shapes(model, tokens, tp, False)) / accel.gemm_reference_efficiency


LOSS_CACHE_BYTES = 4 << 20  # fp32 logits the last-level cache holds: measure/calibrate.py's cache copy (COPY_BYTES)


def loss_vocab(model: ModelSpec, runtime: str, tp: int) -> float:
    """Logits per token one TP rank's loss runs over: meshwise gathers the head's output (every rank
    the full vocabulary), Megatron's vocab-parallel cross-entropy keeps ``vocab / tp``."""
    return model.vocab if runtime == "meshwise" else model.vocab / tp


def loss_seconds(accel: AcceleratorSpec, tokens: float, vocab: float) -> float:
    """Seconds of the loss's softmax / cross-entropy, forward + backward, over ``L = tokens x vocab``
    logits on a CPU rank. Where the profile holds its measured calls (``loss_token_table``, rows
    ``(tokens, vocab, seconds per token)``, ``meshwise calibrate`` and measure/plan_shapes.py):
    ``L * c(L)``, ``c`` the cost per logit (``seconds per token / vocab``) piecewise linear in the
    rows' logits and flat past the table's ends: once the logits outgrow the last-level cache every
    pass over them streams from DRAM, and on a 2-core x86 host a logit cost about 3 ns up to 2M
    logits and 6-10 ns from 8M on (docs/fidelity.md, the components at width and length). Else the bytes of
    cost/kernels.py (``loss_bytes`` per logit) over the copy bandwidth, ``hbm_bytes_per_s`` while
    the fp32 logits fit in ``LOSS_CACHE_BYTES``, ``dram_bytes_per_s`` (where measured) past it."""
    logits = tokens * vocab
    if accel.loss_token_table:
        points = sorted((t * v, s / v) for t, v, s in accel.loss_token_table)
        first, last = points[0], points[-1]
        per_logit = (
            first[1] if logits <= first[0] else last[1] if logits >= last[0] else piecewise_linear(points, logits)
        )
        return logits * per_logit
    bandwidth = (
        accel.dram_bytes_per_s if accel.dram_bytes_per_s and 4.0 * logits > LOSS_CACHE_BYTES else accel.hbm_bytes_per_s
    )
    return logits * kernels.PASSES["meshwise"]["loss_bytes"] / bandwidth


def memory_bound_seconds(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, work: RankWork, microbatches: int
) -> float:
    """Seconds of one step's memory-bound operations on one CPU rank (``train``: the rank's tokens
    per sequence): ``m * (rank_memory_bound_bytes / hbm_bytes_per_s + [head] loss_seconds)``, the
    bytes of kernels.rank_memory_bound_bytes without the loss's, which :func:`loss_seconds` prices
    over the micro-batch's tokens and the logits per token of :func:`loss_vocab`."""
    moved = kernels.rank_memory_bound_bytes(
        model, kernels.ops_key(train), train.activation_bytes, train.seq_len, work, 0.0
    )
    tokens = work.mbs * train.seq_len
    loss_s = loss_seconds(accel, tokens, loss_vocab(model, train.runtime, work.tp)) if work.has_head else 0.0
    return microbatches * (moved / accel.hbm_bytes_per_s + loss_s)


def score_kernel_seconds(call_s: float, score_s: float, score_dim_s: float, scores: float, head_dim: float) -> float:
    """One score-sized attention kernel, as ``meshwise calibrate`` fits both the SDPA call and the
    ring step (measure/calibrate.py ``fit_ring``): ``call + E * (score + head_dim * dim)`` for ``E``
    score elements."""
    return call_s + scores * (score_s + head_dim * score_dim_s)


def piecewise_linear(points: list[tuple[float, float]], x: float) -> float:
    """The polyline through ``points`` (x ascending) at ``x``, its end segments extended."""
    if len(points) == 1:
        return points[0][1]
    i = next((j for j in range(1, len(points) - 1) if x < points[j][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _scaled_polyline(points: list[tuple[float, float]], x: float) -> float:
    """:func:`piecewise_linear` above the first point; below it proportional to ``x`` (a kernel's
    work per head scales with its score elements and its head width, down to nothing)."""
    x0, y0 = points[0]
    return y0 * x / x0 if x < x0 else piecewise_linear(points, x)


def width_table_seconds(rows, x: float, width: float, read=piecewise_linear) -> float:
    """A measured table of rows ``(x, head width, seconds)`` read at (``x``, ``width``): ``read``
    (a polyline through x-ascending points) along ``x`` at each measured width, then along the
    widths. The one reading of cost/context_parallel.py's ring table and SDPA's per-head table."""
    widths = sorted({w for _, w, _ in rows})
    by_width = [(w, read(sorted((a, t) for a, v, t in rows if v == w), x)) for w in widths]
    return read(by_width, width)


def head_table_seconds(table: tuple, seq: float, head_dim: float) -> float:
    """Seconds per query head of one sequence of ``seq`` tokens at ``head_dim``, read off a measured
    table of rows ``(sequence, head width, seconds per head)``: at each measured head width
    piecewise linear in ``seq**2`` (the score elements of one head), then in the head width; end
    segments extended upward, and below the table's smallest sequence or width proportional to
    it. Never below 0."""
    rows = [(s * s, d, t) for s, d, t in table]
    return max(width_table_seconds(rows, seq * seq, head_dim, _scaled_polyline), 0.0)


def sdpa_call_seconds(accel: AcceleratorSpec, heads: float, seq: float, head_dim: float) -> float:
    """One fused causal attention call (forward + backward) over ``heads`` query heads (sequences x
    heads per rank) of ``seq`` tokens at ``head_dim``. Where the profile holds its measured calls
    (``sdpa_head_table``, ``meshwise calibrate``): ``sdpa_call_s + heads * head_table_seconds``; the
    table, not the fitted line, because torch's CPU kernel tiles by sequence length and its cost
    per score element is not one constant (on a 2-core x86 host the line read the 512-token call
    20% fast and the 1,024-token one right). Else the fitted line :func:`score_kernel_seconds` over
    ``E = heads * seq**2`` score elements."""
    if accel.sdpa_head_table:
        return accel.sdpa_call_s + heads * head_table_seconds(accel.sdpa_head_table, seq, head_dim)
    return score_kernel_seconds(
        accel.sdpa_call_s, accel.sdpa_score_s, accel.sdpa_score_dim_s, heads * float(seq) ** 2, head_dim
    )


def sdpa_seconds(
    model: ModelSpec, accel: AcceleratorSpec, seq: int, mbs: int, tp: int, ac: str, blocks: int, microbatches: int
) -> float:
    """Seconds of one rank's fused causal attention calls in a step (torch's SDPA, runtime/model.py
    ``causal_attention``) on a CPU profile that measured them:

        m * blocks * (1 + [ac == full] / 3) * sdpa_call_seconds(mbs * heads / tp, s, head_dim)

    (forward + backward; full recompute runs the forward again, a third by the FLOP convention;
    the selective policy keeps its output). Timed by ``meshwise calibrate`` as the runtime's own
    call over a grid of (sequence, head width) (measure/calibrate.py ``ring_fields``): on one core
    its rate falls well below the GEMMs' for narrow heads, which the FLOP term cannot see. 0 (the
    attention core stays in the FLOP term) for profiles without the constants (GPU profiles), and
    for windowed or latent attention."""
    if (
        not (accel.sdpa_score_s or accel.sdpa_score_dim_s or accel.sdpa_head_table)
        or model.states_only
        or model.sliding_window
        or model.mla
    ):
        return 0.0
    per_call = sdpa_call_seconds(accel, mbs * model.heads / tp, seq, model.head_dim)
    return microbatches * blocks * (1.0 + (ac == "full") / 3.0) * per_call
