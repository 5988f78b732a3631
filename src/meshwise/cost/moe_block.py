"""A mixture-of-experts block's compute on a GPU, part by part (the op model, cost/kernels.py).

One MoE block, one micro-batch, one rank, which routes ``T_r`` tokens: the micro-batch's ``T = mbs * s``
(s/cp under context parallelism), or ``T / tp`` where expert parallelism is folded over the TP ranks
(Layout.ep_folds_tp, expert TP 1). Otherwise meshwise's runtime runs the block whole on every TP rank
(runtime/moe.py, compute.py), and Megatron-Core splits the experts' and shared experts' width over the
TP ranks (its ``expert_tensor_parallel_size`` defaults to the TP size: model_parallel_config.py); there
each TP rank routes and permutes its own ``T / tp`` sequence-parallel tokens, and the expert-TP group
all-gathers the received copies after the dispatch (token_dispatcher.py, MoEAlltoAllTokenDispatcher
``dispatch_postprocess``), so ``T_r = T / tp`` and the experts see the whole ``T``.
With ``E`` experts, ``k`` per token, hidden ``h``, expert width ``f``, ``ep`` ranks of experts:

- **router**: the gate GEMM ``(T_r, E, h)`` (and a gated shared expert's ``(T_r, 1, h)``), then
  softmax or sigmoid and top-k, memory-bound over ``T_r E`` scores: meshwise's ``ROUTER_BYTES`` per score
  forward (the logits read, the fp32 scores written, read again by top-k), twice that backward;
  Megatron-Core's bytes and kernels as counted on its own code by router kind (``ROUTER_SCORE_BYTES``,
  ``ROUTER_KERNELS``: the softmax top-k with its auxiliary loss, or DeepSeek-V3's sigmoid with grouped
  top-k, expert bias and sequence-wise loss), forward and backward apart;
- **permute and unpermute**: memory-bound passes over the ``T_r k`` token copies of ``h`` elements:
  ``PERMUTE_PASSES`` per runtime (reads + writes per copy element, the weighted sum's write of one
  token per ``k`` copies included), ``EP_REGROUP_PASSES`` more under ep > 1 over the ``T_e k`` copies
  the experts see (the received chunks sorted by local expert and back; ``T_e`` below); backward moves
  twice the forward's bytes; ``PERMUTE_KERNELS`` kernel floors each way (Megatron's counted); under
  DeepEP (``TrainSpec.moe_dispatcher``) its fused permute instead (cost/moe_dispatch.py);
- **experts**: ``E / ep`` experts on the rank, each multiplying ``R = c * T_e k ep / E`` rows
  (balanced routing would give ``T_e k / E`` per expert from each of the ``ep`` ranks; ``T_e`` is
  ``T_r`` times the expert-TP ranks whose tokens Megatron gathers, so the whole micro-batch's ``T``).
  ``c`` is the run's capacity factor where the experts' inputs are padded to it
  (``TrainSpec.moe_capacity_factor``: every expert runs exactly its capacity), else, dropless, the
  busiest EP rank's load over the mean under ep > 1: the measured max/mean of the run's balancing
  (``TrainSpec.moe_balancing``, catalog/moe_imbalance.toml), and 1 under ep = 1. A grouped kernel over
  every expert's tokens padded to the busiest expert's count (``grouped-padded``, KempnerForge's
  ``grouped_expert_forward_packed``: a zero ``(E, max_tokens, h)`` buffer into ``torch._grouped_mm``) runs
  every expert at that busiest load, ``c`` the same measured max/mean, under any ep. Gated: the gate and
  up projections ``(R, 2f, h)`` and the down projection ``(R, h, f)``; backward each GEMM's
  ``(R, K, N)`` and ``(K, N, R)``. Megatron-Core's ``--moe-grouped-gemm`` runs them through Transformer
  Engine's GroupedLinear (``TrainSpec.expert_gemm = "te"``), one cuBLAS GEMM per local expert issued round
  robin on ``TE_STREAMS`` streams: cost/kernels.py's tile/wave GEMM of ``R`` rows, ``ceil(E/ep / 4)`` rounds
  of a batch of up to 4 (each round its own waves and floor). A run on one grouped kernel for all local
  experts (``"grouped"``: DeepGEMM's, as the DeepSeek-V3 report's) takes the tile/wave GEMM of ``E / ep``
  groups divided by ``R / (R + GROUPED_ROWS_HALF)``, the efficiency the grouped kernels lose as the rows
  per expert fall (fitted on DeepGEMM's grouped table, components_grouped_gemm.csv, by
  benchmarks/fit_components.py; taken as the same fraction of each dtype's GEMM row). Under meshwise's
  runtime (torchtitan's ``torch._grouped_mm``) a device with rows of torch's own grouped kernels takes
  them (``grouped_row``: Blackwell's, fitted on torchao's B200 tables: bf16 at 0.456 and MXFP8 at 0.439 of
  peak where its dense rows read 0.818 and 0.724).
  meshwise's runtime loops over its experts in Python: three dense GEMMs per expert (gate, up,
  down; cuBLAS, no grouped factor), each with its kernel floor, plus ``LOOP_KERNELS`` elementwise
  kernels per expert (SwiGLU's activation and product, forward and backward) at ``kernel_floor_s``
  each (the per-expert launch work). A run that states its experts' kernel (``TrainSpec.expert_gemm``)
  takes it under either runtime: ``grouped``, or ``cublas-loop`` (one cuBLAS GEMM per local expert in
  turn, the grouped_gemm package's default build: Transformer Engine's path on one stream);
- **shared experts**: a dense MLP of ``shared_ffn_hidden`` over the ``T_r`` tokens.
- **host wait** (Megatron-Core only): both its dispatchers block the host inside every MoE block forward (the
  alltoall dispatcher waits on the token counts' device-to-host copy, ``_DeepepManager`` on
  ``tokens_per_expert.sum().item()``: token_dispatcher.py), so the block's kernels cannot be queued ahead of
  it, and the block takes at least the host's time to issue them: ``HOST_KERNELS`` (the router's, the
  dispatcher's and ``EXPERT_HOST_KERNELS`` per local expert, the shared expert counted as one more, forward +
  backward) times the device's host time per kernel (``host_launch_s``: 37.08 us on GB200's Grace, else
  ``X86_HOST_LAUNCH_S``, a DGX H100's Xeon: the host side of one torch Linear forward, which launches one
  kernel, TransformerEngine issue #2053). What that exceeds the block's priced GPU parts by is ``host_s``.

Under a float8 precision the experts' and shared experts' GEMMs run in the format's row and peak with
their casts (cost/fp8.py), the router in bf16. The dispatch and combine all-to-alls are
communication, priced where every collective is (cost/experts.py on the link the EP group crosses,
cost/comm.py), exposed under both runtimes' defaults: meshwise's all-to-all blocks, and Megatron's
``alltoall`` dispatcher overlaps nothing without ``--overlap-moe-expert-parallel-comm`` (off by default;
with it, ``TrainSpec.overlap_ep_comm``, cost/experts.py ``exposed_s``).
The SwiGLU's bytes are in the block's memory-bound work (cost/kernels.py ``_mlp_width``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

from meshwise.catalog import read_catalog
from meshwise.cost import fp8, moe_dispatch
from meshwise.cost.compute import tp_divides_moe
from meshwise.cost.kernels import gemm_seconds, hbm_bytes_per_s, linear_seconds, mlp_seconds
from meshwise.spec import AcceleratorSpec, ModelSpec, TrainSpec

# Rows per expert at which a grouped GEMM reaches half the tile/wave model's throughput beyond what that
# model already loses: benchmarks/fit_components.py on components_grouped_gemm.csv (DeepGEMM, 10 points,
# 256-8192 rows per expert; time error mean 5.1%, worst 16.6%, against 6.1% / 23.4% without it).
GROUPED_ROWS_HALF = 23.0
# Transformer Engine's compute streams, over which GroupedLinear issues its per-expert cuBLAS GEMMs round
# robin (transformer_engine/common: multi_stream_cublas_gemm, num_compute_streams = 4; its default path,
# NVTE_USE_CUTLASS_GROUPED_GEMM unset)
TE_STREAMS = 4
ROUTER_BYTES = 8.0  # per score beyond the logits' own bytes: fp32 scores written (4) and read by top-k (4)
# Forward reads + writes per element of a token copy, per runtime's code:
# - meshwise (runtime/moe.py): the gather tokens[order // k] (2), the scatter routed[order] = out (2), the
#   outputs concatenated (2), the product with the routing weights (2) and the sum over k (1, plus one token
#   written per k copies);
# - megatron (Megatron-Core's token permutation, moe_utils permute / unpermute): the permute (2) and the
#   unpermute with its weighted sum (1, plus one token written per k copies).
PERMUTE_PASSES = {"meshwise": 9.0, "megatron": 3.0}
EP_REGROUP_PASSES = 4.0  # ep > 1: the received chunks sorted by local expert (2) and back (2), both runtimes
LOOP_KERNELS = 6  # meshwise's loop, per expert: SwiGLU's silu and product forward (2), their backward (4)
# Kernels besides GEMMs (forward, backward) of the router and of the permute / unpermute (besides the EP
# regroup: 2 more forward, 4 backward under ep > 1). meshwise's read off runtime/moe.py (softmax, top-k,
# renormalise, sort, counts, ...; backward twice). Megatron-Core's counted on its own code, megatron-core
# 0.16.1's MoELayer run on CPU with no fusion flags (benchmarks/megatron_moe_kernels.py, which
# tests/unit/test_moe_block.py runs): the router by kind (``router_kind``), its load-balancing loss included;
# the alltoall dispatcher's permute, unpermute and their metadata.
ROUTER_KERNELS = {"meshwise": (8, 16), "softmax": (20, 13), "sigmoid-grouped": (41, 29)}
PERMUTE_KERNELS = {"meshwise": (5, 10), "megatron": (12, 4)}
# Megatron's router: bytes its kernels read and write per score (fp32, T x E; its tensors' sizes at each op,
# counted with the kernels), forward and backward; meshwise's: the logits read and ROUTER_BYTES, backward twice
ROUTER_SCORE_BYTES = {"softmax": (95.1, 44.1), "sigmoid-grouped": (156.2, 116.1)}
# Host time to issue one kernel where the profile states none: the host side of one torch Linear forward (one
# GEMM launched) on a DGX H100's Xeon Platinum 8480C, 13.48 us (TransformerEngine issue #2053, beside GB200's
# Grace at 37.08, accelerators.toml ``host_launch_s``)
X86_HOST_LAUNCH_S = 13.48e-6
# Kernels megatron-core 0.16.1 launches per local expert of a MoE layer call, forward + backward: 4 + 7 besides
# the GEMMs (benchmarks/megatron_moe_kernels.py, ``per_local_expert_in_layer``) and its 6 GEMMs (two projections,
# one forward, two backward); the router's gate GEMM: 3
EXPERT_HOST_KERNELS = 17
ROUTER_GEMM_KERNELS = 3
# The busiest expert's load over the mean under dropless routing, by balancing method (measured in training;
# the figures and their source: catalog/moe_imbalance.toml).
IMBALANCE = {name: row["max_over_mean"] for name, row in read_catalog("moe_imbalance.toml").items()}


class PartSeconds:
    """A MoE block's seconds by part, one float field each, beside ``forward_s`` (the forward alone,
    what full recompute runs again), which is no part: ``total_s`` sums the parts in field order."""

    @property
    def total_s(self) -> float:
        return sum(self.as_json().values())

    def as_json(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "forward_s"}


@dataclass(frozen=True)
class MoeParts(PartSeconds):
    """Seconds of one MoE block's parts for one micro-batch on one rank, forward + backward, and the
    forward alone (what full recompute runs again)."""

    router_s: float
    permute_s: float
    experts_s: float
    shared_s: float
    loop_s: float  # the per-expert kernels of meshwise's loop (0 under Megatron's grouped GEMMs)
    host_s: float  # Megatron: what the host's issue of the block's kernels exceeds its GPU parts by
    forward_s: float


def routed_tokens(tokens: float, tp: int, folded: bool, runtime: str = "meshwise") -> float:
    """Tokens a rank routes: the micro-batch's, or its 1/tp under EP folded over TP or under Megatron
    (each TP rank routes its sequence-parallel shard)."""
    return tokens / tp if folded or runtime == "megatron" else tokens


def load_factor(train: TrainSpec, ep: int) -> float:
    """``c`` of the module docstring: the padded capacity factor, else the measured busiest-rank load
    over the mean under ep > 1 or where every expert is padded to the busiest one's tokens
    (``grouped-padded``) (``IMBALANCE``), else 1."""
    if train.moe_capacity_factor > 0:
        return train.moe_capacity_factor
    return IMBALANCE[train.moe_balancing] if ep > 1 or train.expert_gemm == "grouped-padded" else 1.0


def rows_per_expert(model: ModelSpec, tokens: float, ep: int, load: float) -> float:
    """Rows each of the rank's experts multiplies: ``c * T_e k ep / E`` (module docstring)."""
    return load * tokens * model.experts_per_token * ep / model.experts


def grouped_factor(rows: float) -> float:
    """The fraction of the tile/wave model's throughput a grouped GEMM keeps at ``rows`` per expert."""
    return rows / (rows + GROUPED_ROWS_HALF)


def _expert_gemms(model: ModelSpec, split: int) -> tuple[tuple[float, float], ...]:
    """(N, K) of an expert's projections as Megatron groups them, its width split ``split`` ways (expert
    TP): gate and up as one (gated), down."""
    f, h = model.expert_ffn_hidden / split, model.hidden
    return (((1 if model.mlp == "gelu" else 2) * f, h), (h, f))


def expert_kernel(train: TrainSpec) -> str:
    """How the rank's experts' GEMMs run: ``train.expert_gemm``, its default ``te`` read as the runtime's own
    (Megatron's GroupedLinear, ``te``; meshwise's Python loop, ``loop``)."""
    if train.expert_gemm == "te":
        return "te" if train.runtime == "megatron" else "loop"
    return train.expert_gemm


def grouped_row(accel: AcceleratorSpec, train: TrainSpec, dtype: str) -> str:
    """The GEMM row one grouped kernel's experts take: the device's row of torch's grouped kernels
    (``grouped-bf16``, ``grouped-fp8``: Blackwell's, fitted on torchao's B200 tables) where meshwise's runtime
    runs them (torchtitan's ``torch._grouped_mm``), else ``dtype``'s dense row over the grouped factor."""
    row = f"grouped-{'bf16' if dtype == 'bf16' else 'fp8'}"
    if train.runtime == "megatron" or not accel.has_gemm_row(row):
        return dtype
    return row


def _experts_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, rows: float, local: int, split: int
) -> tuple[float, float]:
    """(forward, backward) seconds of the rank's experts by :func:`expert_kernel`: one grouped kernel,
    per-expert cuBLAS GEMMs (Transformer Engine's round robin on its streams, or one at a time), or
    meshwise's one dense GEMM per projection and expert (gate and up apart, as runtime/moe.py multiplies
    them)."""
    peak, e, dtype = fp8.gemm_peak_flops_per_s(accel, train), fp8.gemm_elem_bytes(train), fp8.gemm_dtype(train)
    hbm, kernel = hbm_bytes_per_s(accel), expert_kernel(train)
    # Transformer Engine's GroupedLinear: one cuBLAS GEMM per local expert, round robin on its streams, so
    # each round of up to TE_STREAMS GEMMs runs as one batch of them, with its own waves and floor; the
    # grouped_gemm package's cuBLAS loop: one GEMM at a time
    streams = TE_STREAMS if kernel == "te" else 1
    rounds, width = math.ceil(local / streams), min(local, streams)
    fwd = bwd = 0.0
    for n, k in _expert_gemms(model, split):
        cf, cb = fp8.linear_cast_bytes(train, rows * local, n, k)
        fwd, bwd = fwd + cf / hbm, bwd + cb / hbm
        if kernel in ("grouped", "grouped-padded"):
            slow, row = 1.0 / grouped_factor(rows), grouped_row(accel, train, dtype)
            fwd += slow * gemm_seconds(rows, n, k, accel, peak, e, local, row)
            bwd += slow * (
                gemm_seconds(rows, k, n, accel, peak, e, local, row)
                + gemm_seconds(k, n, rows, accel, peak, e, local, row)
            )
        elif kernel in ("te", "cublas-loop"):
            fwd += rounds * gemm_seconds(rows, n, k, accel, peak, e, width, dtype)
            bwd += rounds * (
                gemm_seconds(rows, k, n, accel, peak, e, width, dtype)
                + gemm_seconds(k, n, rows, accel, peak, e, width, dtype)
            )
        else:
            split = 2 if n != model.hidden and model.mlp != "gelu" else 1  # gate and up: two GEMMs of f
            f, b = linear_seconds(rows, n / split, k, accel, peak, e, dtype)
            fwd, bwd = fwd + local * split * f, bwd + local * split * b
    return fwd, bwd


@lru_cache(maxsize=4096)
def moe_parts(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, mbs: int, tp: int, ep: int, folded: bool
) -> MoeParts:
    """One MoE block's :class:`MoeParts` (module docstring); ``train.seq_len`` is the rank's s/cp."""
    runtime = "megatron" if train.runtime == "megatron" else "meshwise"
    routed = routed_tokens(mbs * train.seq_len, tp, folded, runtime)
    expert_tokens = routed if folded else mbs * train.seq_len  # Megatron: gathered over the expert-TP ranks
    router = _router_s(model, accel, train, routed, runtime)
    permute = _permute_s(model, accel, train, routed, expert_tokens, ep)
    local = model.experts // ep
    rows = rows_per_expert(model, expert_tokens, ep, load_factor(train, ep))
    split = tp if tp_divides_moe(folded, runtime) and not folded else 1  # unfolded: the experts' width split
    experts_f, experts_b = _experts_s(model, accel, train, rows, local, split)
    loop_s = local * LOOP_KERNELS * accel.kernel_floor_s if expert_kernel(train) == "loop" else 0.0
    shared = (0.0, 0.0)
    if model.shared_ffn_hidden:
        shared = _shared_s(model, accel, train, expert_tokens, split)
    forward = router[0] + permute[0] + experts_f + shared[0] + loop_s / 3
    gpu_s = sum(router) + sum(permute) + experts_f + experts_b + sum(shared) + loop_s
    host_s = max(0.0, host_issue_s(model, accel, train, ep) - gpu_s) if runtime == "megatron" else 0.0
    return MoeParts(sum(router), sum(permute), experts_f + experts_b, sum(shared), loop_s, host_s, forward)


def host_kernels(model: ModelSpec, train: TrainSpec, ep: int) -> int:
    """Kernels Megatron-Core launches in one MoE block call, forward + backward (module docstring): the router's
    (``ROUTER_KERNELS`` and its gate GEMM), the dispatcher's (``PERMUTE_KERNELS``, 6 more under ep > 1, or
    DeepEP's ``DEEPEP_KERNELS``) and ``EXPERT_HOST_KERNELS`` per local expert and shared expert."""
    kernels = sum(ROUTER_KERNELS[router_kind(model)]) + ROUTER_GEMM_KERNELS
    if train.moe_dispatcher == "deepep":
        kernels += sum(moe_dispatch.DEEPEP_KERNELS)
    else:
        kernels += sum(PERMUTE_KERNELS["megatron"]) + (6 if ep > 1 else 0)
    return kernels + EXPERT_HOST_KERNELS * (model.experts // ep + (1 if model.shared_ffn_hidden else 0))


def host_issue_s(model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, ep: int) -> float:
    """Seconds the host takes to issue one MoE block call's kernels: :func:`host_kernels` x the device's host
    time per kernel (``host_launch_s``, else ``X86_HOST_LAUNCH_S``)."""
    return host_kernels(model, train, ep) * (accel.host_launch_s or X86_HOST_LAUNCH_S)


def _permute_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, routed: float, expert_tokens: float, ep: int
) -> tuple[float, float]:
    """(forward, backward) seconds of the permute and unpermute: the runtime's passes over the ``routed``
    tokens' copies (``PERMUTE_PASSES``) and the EP regroup on the received ones, or DeepEP's fused
    permute (cost/moe_dispatch.py), with their kernel floors; backward twice the forward's bytes."""
    runtime = "megatron" if train.runtime == "megatron" else "meshwise"
    h, top_k, e = model.hidden, model.experts_per_token, train.activation_bytes
    hbm, floor = hbm_bytes_per_s(accel), accel.kernel_floor_s
    if train.moe_dispatcher == "deepep":
        moved_s = moe_dispatch.fused_permute_elements(model, train, routed, ep) * e / hbm
        kernels_f, kernels_b = moe_dispatch.DEEPEP_KERNELS
        return moved_s + kernels_f * floor, 2 * moved_s + kernels_b * floor
    regroup = EP_REGROUP_PASSES * expert_tokens * top_k * h if ep > 1 else 0.0  # on the received copies
    moved_s = (PERMUTE_PASSES[runtime] * routed * top_k * h + routed * h + regroup) * e / hbm
    kernels_f, kernels_b = PERMUTE_KERNELS[runtime]
    if ep > 1:
        kernels_f, kernels_b = kernels_f + 2, kernels_b + 4
    return moved_s + kernels_f * floor, 2 * moved_s + kernels_b * floor


def router_kind(model: ModelSpec) -> str:
    """Megatron's router by what it runs: DeepSeek-V3's sigmoid with group-limited top-k and the expert
    bias (``sigmoid-grouped``), else the softmax top-k with its auxiliary loss."""
    grouped = model.router_score == "sigmoid" and (model.router_groups > 1 or model.expert_bias)
    return "sigmoid-grouped" if grouped else "softmax"


def _router_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, routed: float, runtime: str
) -> tuple[float, float]:
    """(forward, backward) seconds of the router over ``routed`` tokens: the gate GEMM (and a gated shared
    expert's), then its kernels over the ``routed * E`` scores (``ROUTER_KERNELS``, ``ROUTER_SCORE_BYTES``)."""
    h, experts, e = model.hidden, model.experts, train.activation_bytes
    hbm, floor, peak = hbm_bytes_per_s(accel), accel.kernel_floor_s, accel.peak_flops_per_s(train.precision)
    rf, rb = linear_seconds(routed, experts, h, accel, peak, e)
    if model.shared_expert_gate:
        gf, gb = linear_seconds(routed, 1, h, accel, peak, e)
        rf, rb = rf + gf, rb + gb
    scores = routed * experts
    if runtime == "meshwise":
        scores_f = scores * (e + ROUTER_BYTES) / hbm
        bytes_f, bytes_b, (kernels_f, kernels_b) = scores_f, 2 * scores_f, ROUTER_KERNELS["meshwise"]
    else:
        kind = router_kind(model)
        per_f, per_b = ROUTER_SCORE_BYTES[kind]
        bytes_f, bytes_b, (kernels_f, kernels_b) = scores * per_f / hbm, scores * per_b / hbm, ROUTER_KERNELS[kind]
    return rf + bytes_f + kernels_f * floor, rb + bytes_b + kernels_b * floor


def _shared_s(
    model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, routed: float, split: int
) -> tuple[float, float]:
    """(forward, backward) seconds of the shared expert(s): a dense MLP of ``shared_ffn_hidden``, split
    ``split`` ways (Megatron's TP)."""
    peak, e, dtype = fp8.gemm_peak_flops_per_s(accel, train), fp8.gemm_elem_bytes(train), fp8.gemm_dtype(train)
    hbm = hbm_bytes_per_s(accel)
    width, h = model.shared_ffn_hidden / split, model.hidden
    fwd = bwd = 0.0
    for n, k in (((1 if model.mlp == "gelu" else 2) * width, h), (h, width)):
        f, b = linear_seconds(routed, n, k, accel, peak, e, dtype)
        cf, cb = fp8.linear_cast_bytes(train, routed, n, k)
        fwd, bwd = fwd + f + cf / hbm, bwd + b + cb / hbm
    return fwd, bwd


def moe_blocks_of(model: ModelSpec, expert_params: float) -> int:
    """MoE blocks among a rank's blocks, from the routed-expert parameters it holds."""
    if not model.moe:
        return 0
    return round(expert_params / (model.experts * model._mlp(model.expert_ffn_hidden)))


@lru_cache(maxsize=4096)
def rank_mlp_seconds(
    model: ModelSpec,
    accel: AcceleratorSpec,
    train: TrainSpec,
    mbs: int,
    tp: int,
    ep: int,
    folded: bool,
    ac: str,
    blocks: int,
    moe_blocks: int,
) -> float:
    """One micro-batch's MLPs on a rank of ``blocks`` blocks, ``moe_blocks`` of them MoE blocks (the
    rest dense MLPs of ``ffn_hidden`` split by TP); ``full`` recompute runs each forward again. Ten
    arguments: the fields of the layout and rank shape it reads, kept apart as the cache's key."""
    again = 1.0 if ac == "full" else 0.0
    total = 0.0
    if blocks > moe_blocks:
        f, b = mlp_seconds(model, accel, train, mbs * train.seq_len, tp, model.ffn_hidden)
        total += (blocks - moe_blocks) * ((1 + again) * f + b)
    if moe_blocks:
        parts = moe_parts(model, accel, train, mbs, tp, ep, folded)
        total += moe_blocks * (parts.total_s + again * parts.forward_s)
    return total


def step_parts(parts: MoeParts, calls: int, all_to_all_s: float) -> tuple[tuple[str, float], ...]:
    """The plan's time split of a rank's MoE blocks per step: each of one block's ``parts`` (:func:`moe_parts`)
    times ``calls`` (MoE blocks x micro-batches; forward + backward, recompute left out), and the dispatch
    and combine all-to-alls' seconds (cost/experts.py)."""
    out = tuple((name, calls * seconds) for name, seconds in parts.as_json().items())
    return out + (("dispatch_combine_s", all_to_all_s),)
