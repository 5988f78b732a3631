"""Predicted beside measured, figure by figure (pure Python: reads the workers' JSON records).

Figures: ``memory.<category>`` (params, grads, optimizer, activations, other),
``comm.<kind>.<dim>.bytes_per_step`` and ``.count_per_step``, and ``time.<part>_s``: the median
step, then its parts, each timed (measure/timing.py): compute (operators' arithmetic and launch),
exposed comm, idle (pipeline wait; predicted: the bubble), optimizer, fixed (zeroing gradients,
the gradient norm, the loss), and untimed (the step less the timed parts; predicted 0), which
:func:`time_verdicts` checks against the step and reads for the largest residual. Measured memory categories are MemTracker's at the step's peak: Parameter -> params,
Gradient -> grads, Optstate -> optimizer, Activation -> activations, and Temp, Buffer, Other and
(``verify``'s, FSDP2's collective buffers) Comm buffer -> other. The prediction for a rank is the cost model's for its pipeline rank (memory.all_rank_shapes),
at the predicted peak moment, or at another moment within 10% of it that is nearer the measured
total (nearest_moment); for a run or trace that saw where its peak fell (``peak_moments``: measure's workers and
``verify`` record it, measure/_torch_tools.peak_moments), at the nearest of those moments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from meshwise.cost.estimate import estimate, rank_collectives
from meshwise.cost.memory import Memory, all_rank_shapes, moment_memories, receive_buffers_idle
from meshwise.layout import Layout, parse
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MEASURED_CATEGORY = {"Parameter": "params", "Gradient": "grads", "Optstate": "optimizer", "Activation": "activations",
                     "Temp": "other", "Buffer": "other", "Other": "other", "Comm buffer": "other"}
MEMORY = ("params", "grads", "optimizer", "activations", "other")
NEAR_PEAK = 0.10  # moments whose predicted totals lie this close to the peak's can each be the peak
TIED = 0.01  # inside a module's backward, moments this close to the largest are a tie the plan cannot break


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
        return {"figure": self.figure, "rank": self.rank, "predicted": self.predicted, "measured": self.measured,
                "rel_error": err if err != float("inf") else None}


def measured_memory(record: dict) -> dict[str, float]:
    out = dict.fromkeys(MEMORY, 0.0)
    for name, value in record["memory"].items():
        out[MEASURED_CATEGORY.get(name, "other")] += value
    return out


def nearest_moment(model: ModelSpec, train: TrainSpec, layout: Layout, shape, m: int, capacity: float,
                   measured_total: float, names: list[str] | None = None, by_role: bool = False) -> Memory:
    """The predicted peak (the largest moment), unless another moment's total is within
    ``NEAR_PEAK`` of it and nearer the measured total: a run's peak can fall on either of two
    nearly equal moments depending on thread timing, and their categories differ. With ``names``
    (a run or trace that saw where its peak fell), the nearest of those moments; with ``names``
    empty, of all; without, of all but the loss's backward. Memory categorised by MemTracker
    (``by_role`` False: measure's runs) files a block's unsharded gradients late in its backward,
    the table's gradient in a TP embedding's backward (and, where the run did not see where its
    peak fell, the loss's backward's tensors) as temporaries, so those moments are left out;
    categorised by role (``verify``'s traces), a peak inside a module's backward is the largest of
    its start, late in a block and the embedding's backward, or of those within TIED of it the
    nearest the measured total (Llama 3 70B pp=4,dp=2,zero=1,tp=8 rank 0: the backward's start and
    the embedding's backward lie 0.1% apart, their gradients 3.6%)."""
    moments = moment_memories(model, train, layout, shape, m, capacity)
    if not by_role and layout.pp > 1:  # measure's tracker starts after the first step (memory.receive_buffers_idle)
        idle = receive_buffers_idle(model, train, layout, shape, m)
        moments = {k: dataclasses.replace(mm, activations=max(mm.activations - idle, 0.0)) for k, mm in moments.items()}
    if names is None:
        moments.pop("loss", None)
    if not by_role:
        moments.pop("block", None)
        moments.pop("embed", None)
    elif names and "backward" in names:  # inside a module's backward: its start, late in a block, the embedding's
        inside = (moments["backward"], moments.pop("block"), moments.pop("embed", moments["backward"]))
        top = max(inside, key=lambda mm: mm.total)
        tied = [mm for mm in inside if mm.total >= (1 - TIED) * top.total]
        moments["backward"] = min(tied, key=lambda mm: abs(mm.total - measured_total))
    if names and "ring" in names and "ring" not in moments:  # no ring moment of its own: the backward stands in
        names = [n for n in names if n != "ring"] + ["backward"]
    if names and any(n in moments for n in names):
        return min((moments[n] for n in names if n in moments), key=lambda mm: abs(mm.total - measured_total))
    peak = max(moments.values(), key=lambda mm: mm.total)
    close = [mm for mm in moments.values() if mm.total >= (1 - NEAR_PEAK) * peak.total]
    return min(close, key=lambda mm: abs(mm.total - measured_total))


def rows_for(record: dict, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> list[Row]:
    """Every figure of one rank's record, predicted beside measured."""
    layout: Layout = parse(record["layout"])
    rank = record["rank"]
    shape = all_rank_shapes(model, layout)[record["pp_rank"]]
    m = layout.accum(train.global_batch)
    meas_mem = measured_memory(record)
    pred_mem = nearest_moment(model, train, layout, shape, m, cluster.accelerator.memory_bytes,
                              sum(meas_mem[c] for c in MEMORY), record.get("peak_moments"),
                              by_role="memory_by_creation" in record)  # verify's records keep MemTracker's split too
    rows = [Row(f"memory.{c}", rank, getattr(pred_mem, c), meas_mem[c]) for c in MEMORY]

    predicted = {(c.kind, c.dim): c for c in rank_collectives(model, cluster, train, layout, shape)}
    measured = {(c["kind"], c["dim"]): c for c in record["comm"]}
    for key in sorted(set(predicted) | set(measured)):
        p, q = predicted.get(key), measured.get(key)
        for field in ("bytes_per_step", "count_per_step"):
            rows.append(Row(f"comm.{key[0]}.{key[1]}.{field}", rank, float(getattr(p, field) if p else 0),
                            float(q[field] if q else 0)))

    t = record.get("time")
    if not t:  # measured without timing (steps = 0)
        return rows
    e = estimate(model, cluster, train, layout)
    predicted_parts = {"compute_s": e.time.compute_s, "comm_s": e.time.comm_exposed_s, "idle_s": e.time.bubble_s,
                       "optimizer_s": e.time.optimizer_s, "fixed_s": e.time.fixed_s, "untimed_s": 0.0}
    rows.append(Row("time.step_s", rank, e.time.step_s, t["step_s"]))
    rows += [Row(f"time.{part}", rank, value, t[part]) for part, value in predicted_parts.items() if part in t]
    return rows


TIME_PARTS = {"compute_s": "compute (arithmetic, operator launches, FSDP2's per-parameter work)",
              "comm_s": "exposed communication", "idle_s": "pipeline idle", "optimizer_s": "the optimizer step",
              "fixed_s": "the step's fixed work (zeroing, gradient norm, loss)"}


def time_verdicts(rows: list[Row]) -> list[str]:
    """Per rank with timed parts: whether they add up to the step timed on its own
    (measure/timing.py ``check_sum``), and the part with the largest residual (measured less
    predicted), named as the component the model misses (or over-counts)."""
    from meshwise.measure.timing import check_sum

    out = []
    for rank in sorted({r.rank for r in rows}):
        t = {r.figure[5:]: r for r in rows if r.rank == rank and r.figure.startswith("time.")}
        if not all(p in t for p in (*TIME_PARTS, "step_s")):
            continue
        missed = check_sum(t["step_s"].measured, {p: t[p].measured for p in TIME_PARTS})
        out.append(f"rank {rank}: " + (f"the split does not hold: {missed}" if missed else
                                       "the timed parts add up to the step (within 5%)"))
        part = max(TIME_PARTS, key=lambda p: abs(t[p].measured - t[p].predicted))
        gap = t[part].measured - t[part].predicted
        share = gap / t["step_s"].measured if t["step_s"].measured else 0.0
        out.append(f"rank {rank}: largest residual {part[:-2]} {gap * 1e3:+.1f} ms ({share:+.0%} of the step): "
                   f"{TIME_PARTS[part]} is {'missing from' if gap > 0 else 'over-counted by'} the model")
    return out
