"""meshwise verify: ranks of real layouts traced on fake devices, beside the plan.

Llama 3 70B on 64 H100 (world 64, fake process group) under three layouts, at reduced depth; a
tiny model traced at full depth against the reduced-depth extrapolation; the GPU precision path;
refusals before tracing. Each trace is one process-local step on fake tensors (no memory, no
processes); the figures are printed with -s.
"""

from __future__ import annotations

import dataclasses

import pytest

from meshwise.layout import parse
from meshwise.measure import fake_cuda
from meshwise.measure import verify as v
from meshwise.measure.compare import Row
from meshwise.measure.rank_trace import RankTrace
from meshwise.spec import TrainSpec, load_cluster, load_model

torch = pytest.importorskip("torch")

SEQ = 4096
# (layout, global batch, ranks): the batch keeps the micro-batches few (the trace's cost is its op count)
LAYOUTS_70B = [("dp=8,zero=3,tp=8", 8, [0]), ("pp=4,dp=2,zero=1,tp=8", 8, [0, 48]), ("dp=64,zero=3", 64, [0])]


@pytest.fixture(scope="module")
def traced_70b():
    """Each 70B layout traced once for the module; its tests share the traces."""
    traced: dict[str, tuple] = {}

    def trace(text: str, batch: int, ranks: list[int]):
        if text not in traced:
            model, cluster = load_model("llama3-70b"), load_cluster("h100", 64)
            train = TrainSpec(global_batch=batch, seq_len=SEQ, precision="bf16-mixed")
            traced[text] = v.verify(model, cluster, train, parse(text, 64), ranks)
        return traced[text]

    return trace


def _show(rows) -> None:
    for r in rows:
        print(f"{r.rank:>3} {r.figure:<40} {r.predicted:>18,.0f} {r.measured:>18,.0f} {r.rel_error:+.2%}")


# |plan - trace| / trace per (layout, rank). The prediction is the plan's own, fixed before the
# trace (compare.plan_peak): ``total`` is its total against the traced peak's. Where the trace saw
# its peak fall at another moment, the categories are compared at that moment's prediction
# (``peak_moved.<moment>.*``), else at the plan's; ``other`` is bounded as a share of the traced
# total (a few hundred MB of FSDP2's buffers are filed elsewhere by the trace). The traces are
# deterministic; the comments give the errors of 2026-12-05 (torch 2.13), and each bound is the
# next step above its error.
BOUNDS = {
    # the peak fell in the loss's backward (outside any module): the plan's forward end over-predicts
    ("dp=8,zero=3,tp=8", 0): {"total": 0.03, "states": 0.01, "activations": 0.01, "other": 0.011},  # +2.6%, 0, +0.9%
    # +0.1%, +1.2%, -1.6%: the trace's peak falls in a backward outside any module (the schedule's)
    ("pp=4,dp=2,zero=1,tp=8", 0): {"total": 0.01, "states": 0.02, "activations": 0.02, "other": 0.001},
    ("pp=4,dp=2,zero=1,tp=8", 48): {"total": 0.01, "states": 0.01, "activations": 0.01, "other": 0.001},  # 0, 0, 0
    # activations: the plan's block keeps 4.6% more than the traced one at tp=1 (1.427 GB, 1.364 GB)
    ("dp=64,zero=3", 0): {"total": 0.05, "states": 0.01, "activations": 0.10, "other": 0.001},  # +4.0%, 0, +5.1%
}
MOVED = {"dp=8,zero=3,tp=8": "loss"}  # where the trace's peak fell, when not at the plan's peak moment


def _at_peak(by: dict, rank: int, category: str) -> Row:
    """The row of ``category`` at the moment the trace's peak fell (states: the sum of three)."""
    if category == "states":
        parts = [_at_peak(by, rank, c) for c in ("params", "grads", "optimizer")]
        return Row("states", rank, sum(p.predicted for p in parts), sum(p.measured for p in parts))
    moved = [f for (r, f) in by if r == rank and f.startswith("peak_moved.") and f.endswith(f".{category}")]
    return by[rank, moved[0] if moved else f"memory.{category}"]


@pytest.mark.parametrize("text,batch,ranks", LAYOUTS_70B)
def test_70b_collectives_are_exact_and_memory_close(text: str, batch: int, ranks: list[int], traced_70b) -> None:
    rows, records = traced_70b(text, batch, ranks)
    print(f"\n{text}: traced in {[round(r['trace_s'], 1) for r in records]} s")
    _show(rows)
    assert {r["rank"] for r in records} == set(ranks)
    comm = [r for r in rows if r.figure.startswith("comm.")]
    assert comm and all(r.predicted == r.measured for r in comm), [r for r in comm if r.predicted != r.measured]
    by = {(r.rank, r.figure): r for r in rows}
    for rank in ranks:
        moved = {f.split(".")[1] for (r, f) in by if r == rank and f.startswith("peak_moved.")}
        assert moved == ({MOVED[text]} if text in MOVED else set()), (rank, moved)
        bounds = BOUNDS[text, rank]
        total = by[rank, "memory.total"]
        assert abs(total.rel_error) < bounds["total"], (rank, total)
        for figure in ("states", "activations"):
            row = _at_peak(by, rank, figure)
            assert abs(row.rel_error) < bounds[figure], (rank, figure, row)
        other = _at_peak(by, rank, "other")
        assert abs(other.predicted - other.measured) < bounds["other"] * total.measured, (rank, other)


def test_the_gpu_precision_path_ran(traced_70b) -> None:
    rows, records = traced_70b(*LAYOUTS_70B[0])
    record = records[0]
    # the step ran on fake cuda tensors (measure/fake_cuda.py), or where no C++ compiler can build
    # the fake device, on the cpu device with a note saying so
    if fake_cuda.compiler() is None:
        assert record["activation_devices"] == ["cpu"] and "C++ compiler" in record["device_note"]
    else:
        assert "device_note" not in record, record.get("device_note")
        assert record["activation_devices"] == ["cuda:0"]
        assert record["device"] == record["param_device"] == "cuda:0"
    # bf16 parameters for compute, float32 reductions: the matmuls ran in bf16 (FSDP2's policy for cuda)
    assert record["activation_dtypes"] == ["bfloat16"]
    assert record["step_returns"] == ["FakeTensor", "FakeTensor"]  # step returned tensors, nothing synced


def test_reduced_depth_matches_full_depth_on_a_small_model() -> None:
    for text, layers in (("dp=2,zero=3,tp=2", 6), ("pp=2,dp=2,zero=1", 10)):
        model = dataclasses.replace(load_model("tiny"), layers=layers)
        layout = parse(text, 4)
        batch = 4 if layout.pp > 1 else 2
        for rank in v.auto_ranks(layout):
            full = v.trace_record(RankTrace(model, layout, rank, batch, 64, "cuda"), "full")
            reduced = v.trace_record(RankTrace(model, layout, rank, batch, 64, "cuda"), "auto")
            assert full["blocks"] == reduced["blocks"] > 4 * layout.vpp  # auto did extrapolate
            assert reduced["memory"] == pytest.approx(full["memory"], rel=1e-6, abs=16), (text, rank)
            assert reduced["comm"] == full["comm"], (text, rank)
