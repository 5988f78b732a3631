"""A mixture-of-experts block on a CPU rank of meshwise's runtime (runtime/moe.py), part by part.

The runtime runs one MoE block of ``T = mbs * s`` tokens (s/cp under context parallelism; under TP
every rank runs the block whole) as:

- **router**: the gate GEMM ``(T, E, h)``, softmax over the ``E`` scores in fp32, top-k and the
  renormalisation, and the sequence-wise balancing loss (scatter of the routing counts, means);
- **permute**: the stable sort of the ``T k`` expert ids, the counts, the gather
  ``tokens[order // k]``, the scatter ``routed[order] = out`` and the weighted sum over the k copies;
- **experts**: a Python loop over the rank's ``E / ep`` experts, each three GEMMs (gate and up
  ``(R, f, h)``, down ``(R, h, f)``) at ``R = T k ep / E`` rows (balanced routing: ``T k`` copies over
  the rank's experts), SwiGLU's ``silu`` and product, the split and concatenation around the loop;
  under ep > 1 also the received chunks regrouped by local expert and back;
- **shared**: the shared expert, a dense MLP of ``shared_ffn_hidden`` over the ``T`` tokens, and its
  sigmoid gate;
- **dispatch / combine**: the all-to-alls on the EP group (cost/experts.py ``ep_collectives``, gloo's
  fitted link): the counts, then the token copies out and back, in backward in reverse.

Each compute part is priced from the CPU profile's components, forward + backward:

    ops * op_overhead_s + GEMMs + bytes / hbm_bytes_per_s

- ``ops``: aten operators the part launches (``*_OPS``: forward, backward), counted on the runtime's
  block with a ``TorchDispatchMode`` (tests/unit/test_host_moe.py recounts them);
- GEMMs: :func:`gemm_seconds`, the calibrated GEMM grid (cost/host.py ``cpu_gemm_seconds``) at each
  GEMM's own shape (forward ``(M, N, K)``, backward ``(M, K, N)`` and ``(K, N, M)``), scaled as the
  dense blocks' GEMMs are (the calibration model's measured arithmetic over the grid's prediction
  of it): the experts' GEMMs of tens of rows pay the grid's fixed cost per call, which the FLOP rate
  of a dense GEMM does not see;
- bytes: the memory-bound passes of cost/moe_block.py (``ROUTER_BYTES``, ``PERMUTE_PASSES``,
  ``EP_REGROUP_PASSES``) and the SwiGLU's (cost/kernels.py ``PASSES``), backward twice the forward.

Where the profile holds the block timed at this call's shape (``moe_part_table``: measure/moe_parts.py
times the runtime's own block alone at a run's shapes, measure/plan_shapes.py ``top_up``), each part
is read from it instead (:func:`measured_parts`): its generic operators are not what the router's
softmax and top-k, the sort, the gathers and the scatter with accumulation cost, and on a 2-core x86
host the priced router, permute and all-to-alls read 2-6x fast (docs/fidelity.md). The row also
holds dispatch / combine less its blocking waits, ``dispatch_host_s``: the counts' exchange and
``.tolist()`` host syncs, the splits and regrouping, the functional collectives' issue and wrappers,
compute on the rank's core, which the priced parts held only as ``EP_OPS`` generic operators. The
waits stay priced as collectives (cost/experts.py on the calibrated link).

A MoE block's dense-MLP share of the block's operators (``MLP_OPS``), FLOPs and activation bytes,
which the CPU path counts for every block (cost/host.py), is taken out where these parts are added
(:func:`dense_mlp_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.cost import kernels
from meshwise.cost.host import cpu_gemm_seconds
from meshwise.cost.moe_block import EP_REGROUP_PASSES, PERMUTE_PASSES, ROUTER_BYTES, PartSeconds
from meshwise.spec import AcceleratorSpec, ModelSpec
from meshwise.spec.host_keys import MOE_PART_SECONDS, MOE_PART_SHAPE
from meshwise.spec.model import MLP_KINDS

# aten operators (forward, backward) of runtime/moe.py's parts on one micro-batch, counted with a
# TorchDispatchMode on its MoE module (tests/unit/test_host_moe.py: 37 + 11 E forward, 46 + 29 E backward)
ROUTER_OPS = (24, 32)  # gate linear, softmax, top-k, renormalise; the balancing loss's scatter and means
PERMUTE_OPS = (11, 12)  # sort, counts, gather, scatter, weighted sum over the k copies
EXPERTS_OPS = (2, 2)  # the split into experts' rows and the concatenation of their outputs
EXPERT_OPS = (11, 29)  # per expert: three weight selects, three GEMMs, silu, product; backward sums
EP_OPS = (16, 8)  # ep > 1: counts exchanged and summed, splits and regroups around the all-to-alls
MLP_OPS = (14, 32)  # a dense SwiGLU MLP (runtime/model.py MLP): what a MoE block's count replaces
SHARED_GATE_OPS = (5, 10)  # the shared expert's sigmoid gate: linear, sigmoid, product, sum


@dataclass(frozen=True)
class CpuMoeParts(PartSeconds):
    """Seconds of one MoE block's compute parts for one micro-batch on one CPU rank, forward +
    backward, and the forward alone (what full recompute runs again); on a core of its own."""

    router_s: float
    permute_s: float
    experts_s: float
    shared_s: float
    dispatch_host_s: float  # the all-to-alls' own host work where they were timed (else 0: in EP_OPS)
    forward_s: float


def part_key(model: ModelSpec, tokens: float, ep: int) -> tuple[float, ...]:
    """The shape of one MoE block call on a rank as ``moe_part_table`` rows hold it (spec/host_keys.py
    ``MOE_PART_SHAPE``): the tokens it routes, the model's MoE widths and counts, the shared expert's
    activation and bias, the EP group's size."""
    return (
        float(tokens),
        float(model.hidden),
        float(model.experts),
        float(model.experts_per_token),
        float(model.expert_ffn_hidden),
        float(model.shared_ffn_hidden),
        float(model.shared_expert_gate),
        float(MLP_KINDS.index(model.mlp)),
        float(model.mlp_bias),
        float(ep),
    )


def measured_parts(accel: AcceleratorSpec, model: ModelSpec, tokens: float, ep: int) -> dict[str, float] | None:
    """The profile's timed row at this call's :func:`part_key` (``MOE_PART_SECONDS`` by name), or None."""
    key = part_key(model, tokens, ep)
    for row in accel.moe_part_table:
        if holds(row, key):
            return dict(zip(MOE_PART_SECONDS, row[len(MOE_PART_SHAPE) :]))
    return None


def holds(row, key: tuple[float, ...]) -> bool:
    """Whether a ``moe_part_table`` row is at the shape ``key`` (to a part in a million)."""
    return all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(row[: len(MOE_PART_SHAPE)], key))


def arithmetic_scale(accel: AcceleratorSpec) -> float:
    """Seconds of the calibration model's measured arithmetic per second the GEMM grid predicts for it:
    ``cpu_gemm_flops_per_s * gemm_reference_efficiency / (peak * efficiency_max)``, the factor by which
    cost/estimate.py's CPU path already reads every dense GEMM (cost/host.py ``gemm_shape_factor``)."""
    peak = accel.peak_fp32_flops_per_s
    return accel.cpu_gemm_flops_per_s * accel.gemm_reference_efficiency / (peak * accel.efficiency_max)


def gemm_seconds(accel: AcceleratorSpec, m: float, n: float, k: float) -> tuple[float, float]:
    """(forward, backward) seconds of one linear ``X (m x k) @ W^T (k -> n)`` on a CPU rank: the grid
    at ``(m, n, k)``, and at ``(m, k, n)`` and ``(k, n, m)`` for the gradients (cost/host.py
    ``linear_gemm_shapes``' layout), times :func:`arithmetic_scale`; without a grid, the FLOPs at the
    calibrated rate."""
    if not accel.cpu_gemm_flops_per_s:
        rate = accel.peak_fp32_flops_per_s * accel.efficiency_max
        return 2.0 * m * n * k / rate, 4.0 * m * n * k / rate
    scale = arithmetic_scale(accel)
    forward = cpu_gemm_seconds(accel, m, n, k)
    backward = cpu_gemm_seconds(accel, m, k, n) + cpu_gemm_seconds(accel, k, n, m)
    return scale * forward, scale * backward


def _priced(accel: AcceleratorSpec, ops: tuple[float, float], gemms: tuple[float, float], bytes_fwd: float):
    """(forward, forward + backward) seconds of a part: its operators, GEMMs and bytes (backward 2x)."""
    op, bw = accel.op_overhead_s, accel.hbm_bytes_per_s
    forward = ops[0] * op + gemms[0] + bytes_fwd / bw
    return forward, forward + ops[1] * op + gemms[1] + 2.0 * bytes_fwd / bw


def _mlp(accel: AcceleratorSpec, model: ModelSpec, rows: float, width: float) -> tuple[float, float]:
    """(forward, backward) GEMM seconds of one SwiGLU MLP of ``width`` over ``rows`` (three GEMMs)."""
    h = model.hidden
    shapes = [(width, h)] * (2 if model.mlp != "gelu" else 1) + [(h, width)]
    out = [gemm_seconds(accel, rows, n, k) for n, k in shapes]
    return sum(f for f, _ in out), sum(b for _, b in out)


def cpu_moe_parts(model: ModelSpec, accel: AcceleratorSpec, tokens: float, ep: int, e: int = 4) -> CpuMoeParts:
    """One MoE block's :class:`CpuMoeParts` for ``tokens`` tokens on a rank of an EP group of ``ep``
    (module docstring): as timed where the profile holds the shape, else priced; ``e`` bytes per
    activation element (fp32 on a CPU)."""
    timed = measured_parts(accel, model, tokens, ep)
    if timed:
        return CpuMoeParts(**timed)
    h, experts, k = model.hidden, model.experts, model.experts_per_token
    passes = kernels.PASSES["meshwise"][model.mlp]
    router = _priced(accel, ROUTER_OPS, gemm_seconds(accel, tokens, experts, h), tokens * experts * (e + ROUTER_BYTES))
    copies = tokens * k
    permute = _priced(accel, PERMUTE_OPS, (0.0, 0.0), (PERMUTE_PASSES["meshwise"] * copies * h + tokens * h) * e)
    local = experts // ep
    rows = copies * ep / experts  # balanced: the T k copies the rank receives over its E / ep experts
    f, b = _mlp(accel, model, rows, model.expert_ffn_hidden)
    ops = tuple(EXPERTS_OPS[i] + local * EXPERT_OPS[i] + (EP_OPS[i] if ep > 1 else 0) for i in range(2))
    moved = local * rows * model.expert_ffn_hidden * passes + (EP_REGROUP_PASSES * copies * h if ep > 1 else 0.0)
    expert = _priced(accel, ops, (local * f, local * b), moved * e)
    shared = (0.0, 0.0)
    if model.shared_ffn_hidden:
        gemms = _mlp(accel, model, tokens, model.shared_ffn_hidden)
        ops = MLP_OPS
        if model.shared_expert_gate:
            gate = gemm_seconds(accel, tokens, 1, h)
            gemms = (gemms[0] + gate[0], gemms[1] + gate[1])
            ops = (MLP_OPS[0] + SHARED_GATE_OPS[0], MLP_OPS[1] + SHARED_GATE_OPS[1])
        shared = _priced(accel, ops, gemms, tokens * model.shared_ffn_hidden * passes * e)
    forward = router[0] + permute[0] + expert[0] + shared[0]
    return CpuMoeParts(router[1], permute[1], expert[1], shared[1], 0.0, forward)


def dense_mlp_seconds(model: ModelSpec, accel: AcceleratorSpec, tokens: float, tp: int, ac: str, e: int = 4) -> float:
    """Seconds, beyond its FLOPs, the CPU path (cost/estimate.py ``compute_seconds``, cost/host.py)
    charges a block for a dense MLP, forward + backward, that a MoE block does not run: the
    operators of a dense MLP (``MLP_OPS``, DTensor ones under tp > 1, as the block's count prices
    them) and its activation's bytes at the active width (cost/kernels.py ``_mlp_width``, passes as
    ``rank_memory_bound_bytes``); the MoE block's parts replace them (the FLOPs are taken out where
    they are counted)."""
    launches = (MLP_OPS[0] + MLP_OPS[1]) * (accel.op_overhead_s + (accel.tp_op_s if tp > 1 else 0.0))
    passes = 3.0 + (ac != "none")
    moved = passes * kernels.PASSES["meshwise"][model.mlp] * tokens * kernels._mlp_width(model) / tp * e
    return launches + moved / accel.hbm_bytes_per_s


def moe_replaced_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs per block the CPU path counts for a MoE block's MLP (cost/compute.py
    ``tp_rank_flops_per_token``: the active MLP, whole on every TP rank), which :func:`cpu_moe_parts`
    prices instead: ``2 T (active_mlp_params - dense_mlp_params)``."""
    return 2.0 * tokens * (model.active_mlp_params - model.dense_mlp_params)
