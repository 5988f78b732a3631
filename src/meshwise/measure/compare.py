"""Predicted beside measured, figure by figure (pure Python: reads the workers' JSON records).

Figures: ``memory.<category>`` (params, grads, optimizer, activations, other),
``comm.<kind>.<dim>.bytes_per_step`` and ``.count_per_step``, and ``time.<part>_s``: the median
step, then its parts, each timed (measure/timing.py): compute (operators' arithmetic and launch),
exposed comm, idle (pipeline wait; predicted: the bubble), optimizer, fixed (zeroing gradients,
the gradient norm, the loss), and untimed (the step less the timed parts; predicted 0), which
:func:`time_verdicts` checks against the step and reads for the largest residual; for a mixture
of experts ``time.moe.<part>_s``, its blocks' router, permute, experts, shared expert and
dispatch / combine per step (timed in steps of their own: runtime/moe.py ``timed_parts``) beside
cost/host_moe.py's prediction (cost/moe_block.py's on a GPU profile).
Measured memory categories are MemTracker's at the step's peak: Parameter -> params, Gradient ->
grads, Optstate -> optimizer, Activation -> activations, and Temp, Buffer, Other and (``verify``'s,
FSDP2's collective buffers) Comm buffer -> other; ``memory.total`` is their sum.

The prediction is fixed before the measurement: for a rank it is the plan's own, what ``plan --json``
prints in ``rank_memory`` for the entry whose ``pp_ranks`` hold the rank's pipeline rank (the lowest
rank of the same blocks and model ends stands for the others: memory.plan_rank_shape), at the
moment ``plan`` decides fit at, the largest (plan_peak). Where a run or trace saw its peak fall at
another moment (``peak_moments``: measure's workers and ``verify`` record it,
measure/_torch_tools.peak_moments), the rows ``peak_moved.<moment>.<category>`` add that moment's
prediction beside the same measurement; the ``memory.*`` rows keep the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshwise.cost.estimate import estimate, rank_collectives
from meshwise.cost.memory import Memory, moment_memories, plan_rank_shape
from meshwise.layout import Layout, parse
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MEASURED_CATEGORY = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "other",
    "Buffer": "other",
    "Other": "other",
    "Comm buffer": "other",
}
MEMORY = ("params", "grads", "optimizer", "activations", "other")


@dataclass(frozen=True)
class Row:
    figure: str
    rank: int
    predicted: float
    measured: float

    @property
    def rel_error(self) -> float:
        """(predicted - measured) / measured: positive when the model over-predicts; 0 when both are 0,
        +inf when only the measurement is 0."""
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return (self.predicted - self.measured) / self.measured

    def as_json(self) -> dict:
        err = self.rel_error
        return {
            "figure": self.figure,
            "rank": self.rank,
            "predicted": self.predicted,
            "measured": self.measured,
            "rel_error": err if err != float("inf") else None,
        }


def measured_memory(record: dict) -> dict[str, float]:
    out = dict.fromkeys(MEMORY, 0.0)
    for name, value in record["memory"].items():
        out[MEASURED_CATEGORY.get(name, "other")] += value
    return out


def plan_peak(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape, m: int, capacity: float
) -> tuple[str, Memory, dict[str, Memory]]:
    """(the moment ``plan`` decides fit at, its memory, every moment's): the largest of the rank's
    moments (memory.rank_memory, what ``plan --json`` prints for the rank), fixed before anything
    is measured."""
    moments = moment_memories(model, train, layout, shape, m, capacity)
    name = max(moments, key=lambda k: moments[k].total)
    return name, moments[name], moments


def moments_seen(names: list[str] | None, moments: dict[str, Memory], pp: int = 1) -> list[str]:
    """The plan's moments a run's or trace's ``peak_moments`` can stand for: "forward" the end of a
    forward; "backward" (inside a module's backward) its start, late in a block or the embedding's
    backward; "ring" inside a ring attention's backward (without a ring moment of its own, the
    backward's start); [] (in a backward outside any module) without PP the loss's backward or the
    end of the step, under PP any. None (not known) gives []."""
    seen: list[str] = []
    if names is not None and not names and pp == 1:
        seen = ["loss", "end"]
    for n in names or ():
        if n == "backward":
            seen += ["backward", "block", "embed"]
        else:
            seen.append(n if n != "ring" or "ring" in moments else "backward")
    return [n for n in dict.fromkeys(seen) if n in moments]


def peak_moved(names: list[str] | None, moments: dict[str, Memory], planned: str, pp: int = 1) -> str | None:
    """Where the measured peak fell, when that is known and is not the plan's peak moment: the
    largest predicted of the moments it can stand for (chosen by prediction alone), else None."""
    seen = moments_seen(names, moments, pp)
    if not seen or planned in seen:
        return None
    return max(seen, key=lambda k: moments[k].total)


def rows_for(record: dict, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> list[Row]:
    """Every figure of one rank's record, predicted beside measured."""
    layout: Layout = parse(record["layout"])
    rank = record["rank"]
    shape = plan_rank_shape(model, layout, record["pp_rank"])
    m = layout.accum(train.global_batch)
    meas_mem = measured_memory(record)
    planned, pred_mem, moments = plan_peak(model, train, layout, shape, m, cluster.accelerator.memory_bytes)
    rows = [Row(f"memory.{c}", rank, getattr(pred_mem, c), meas_mem[c]) for c in MEMORY]
    rows.append(Row("memory.total", rank, pred_mem.total, sum(meas_mem.values())))
    for key in ("cuda_peak_allocated", "cuda_peak_reserved"):  # a CUDA device's allocator, beside the plan's peak
        if record.get(key) is not None:
            rows.append(Row(f"memory.{key}", rank, pred_mem.total, float(record[key])))
    moved = peak_moved(record.get("peak_moments"), moments, planned, layout.pp)
    if moved:  # the measured peak fell at another moment: its prediction beside, the plan's row unchanged
        at = moments[moved]
        rows += [Row(f"peak_moved.{moved}.{c}", rank, getattr(at, c), meas_mem[c]) for c in MEMORY]
        rows.append(Row(f"peak_moved.{moved}.total", rank, at.total, sum(meas_mem.values())))

    predicted = {(c.kind, c.dim): c for c in rank_collectives(model, cluster, train, layout, shape)}
    measured = {(c["kind"], c["dim"]): c for c in record["comm"]}
    for key in sorted(set(predicted) | set(measured)):
        p, q = predicted.get(key), measured.get(key)
        for field in ("bytes_per_step", "count_per_step"):
            rows.append(
                Row(
                    f"comm.{key[0]}.{key[1]}.{field}",
                    rank,
                    float(getattr(p, field) if p else 0),
                    float(q[field] if q else 0),
                )
            )

    t = record.get("time")
    if not t:  # measured without timing (steps = 0)
        return rows
    e = estimate(model, cluster, train, layout)
    predicted_parts = {
        "compute_s": e.time.compute_s,
        "comm_s": e.time.comm_exposed_s,
        "idle_s": e.time.bubble_s,
        "optimizer_s": e.time.optimizer_s,
        "fixed_s": e.time.fixed_s,
        "untimed_s": 0.0,
    }
    rows.append(Row("time.step_s", rank, e.time.step_s, t["step_s"]))
    rows += [Row(f"time.{part}", rank, value, t[part]) for part, value in predicted_parts.items() if part in t]
    predicted_moe = dict(e.time.moe_block_s)
    for part, seconds in (t.get("moe_parts") or {}).items():  # a mixture of experts' parts, per step
        if part in predicted_moe and (seconds or predicted_moe[part]):
            rows.append(Row(f"time.moe.{part}", rank, predicted_moe[part], seconds))
    return rows


TIME_PARTS = {
    "compute_s": "compute (arithmetic, operator launches, FSDP2's per-parameter work)",
    "comm_s": "exposed communication",
    "idle_s": "pipeline idle",
    "optimizer_s": "the optimizer step",
    "fixed_s": "the step's fixed work (zeroing, gradient norm, loss)",
}


def time_verdicts(rows: list[Row]) -> list[str]:
    """Per rank with timed parts: whether they add up to the step timed on its own
    (measure/timing.py ``check_sum``), and the part with the largest residual (measured less
    predicted), named as the component the model misses (or over-counts)."""
    from meshwise.measure.timing import check_sum  # torch: measure's and verify's commands import this before torch

    out = []
    for rank in sorted({r.rank for r in rows}):
        t = {r.figure[5:]: r for r in rows if r.rank == rank and r.figure.startswith("time.")}
        if not all(p in t for p in (*TIME_PARTS, "step_s")):
            continue
        missed = check_sum(t["step_s"].measured, {p: t[p].measured for p in TIME_PARTS})
        out.append(
            f"rank {rank}: "
            + (f"the split does not hold: {missed}" if missed else "the timed parts add up to the step (within 5%)")
        )
        part = max(TIME_PARTS, key=lambda p: abs(t[p].measured - t[p].predicted))
        gap = t[part].measured - t[part].predicted
        share = gap / t["step_s"].measured if t["step_s"].measured else 0.0
        out.append(
            f"rank {rank}: largest residual {part[:-2]} {gap * 1e3:+.1f} ms ({share:+.0%} of the step): "
            f"{TIME_PARTS[part]} is {'missing from' if gap > 0 else 'over-counted by'} the model"
        )
    return out
