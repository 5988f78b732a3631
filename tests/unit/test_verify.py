"""meshwise verify: ranks of real layouts traced on fake devices, beside the plan.

Llama 3 70B on 64 H100 (world 64, fake process group) under three layouts, at reduced depth; a
tiny model traced at full depth against the reduced-depth extrapolation; the GPU precision path;
refusals before tracing. Each trace is one process-local step on fake tensors (no memory, no
processes); the figures are printed with -s.
"""

from __future__ import annotations

import dataclasses

import pytest

from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.measure import fake_cuda
from meshwise.measure import verify as v
from meshwise.measure.compare import Row
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
            full = v.trace_record(model, layout, rank, batch, 64, "cuda", "full")
            reduced = v.trace_record(model, layout, rank, batch, 64, "cuda", "auto")
            assert full["blocks"] == reduced["blocks"] > 4 * layout.vpp  # auto did extrapolate
            assert reduced["memory"] == pytest.approx(full["memory"], rel=1e-6, abs=16), (text, rank)
            assert reduced["comm"] == full["comm"], (text, rank)


@pytest.mark.parametrize("args,field", [
    (["--layout", "dp=8,zero=3,tp=3"], "layout"),           # tp does not divide the world
    (["--layout", "pp=2,dp=32", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "63"], "global"),
    (["--layout", "dp=64", "--ranks", "64"], "--ranks"),
    (["--layout", "dp=64", "--depth", "half"], "--depth"),
    (["--layout", "pp=2,dp=2", "--model", "tiny-tied", "--gpus", "4", "--gpu", "cpu", "--global-batch", "8"], "tied"),
])
def test_verify_refuses_what_the_runtime_refuses(args: list[str], field: str, capsys) -> None:
    from meshwise.cli import main

    assert main(["verify", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshwise: error:") and field in err and "Traceback" not in err


def test_verify_refuses_a_model_the_runtime_does_not_build() -> None:
    windowed = dataclasses.replace(load_model("mistral-7b"), sliding_window=4096)
    with pytest.raises(MeshwiseError, match="sliding window runs SDPA with a mask"):
        v.check_model_runs(windowed, 8192)
    v.check_model_runs(windowed, 4096)
    with pytest.raises(MeshwiseError, match="attention sinks"):
        v.check_model_runs(dataclasses.replace(load_model("mistral-7b"), attn_sinks=True), 4096)


def test_plan_verify_keeps_what_fits_and_drops_what_the_trace_overflows(monkeypatch) -> None:
    from meshwise.plan import planner

    model, cluster = load_model("tiny"), load_cluster("cpu", 4)
    train = TrainSpec(global_batch=8, seq_len=64, precision="fp32")
    plan = planner.plan(model, cluster, train, top=3)
    traced = v.verify_plan(model, cluster, train, plan, 1, 0.1)  # a real trace of the best candidate
    assert traced.candidates == plan.candidates and "Verified" in traced.explanation[-1]
    first = plan.candidates[0].layout

    def overflowing(model, cluster, train, layout, ranks, depth="auto"):  # the trace of a layout that does not fit
        big = cluster.accelerator.memory_bytes
        return [Row("memory.activations", 0, 1e6, big), Row("memory.params", 0, 1e6, 1e6),
                Row("memory.total", 0, 2e6, big + 1e6)], []

    monkeypatch.setattr(v, "verify", overflowing)
    dropped = v.verify_plan(model, cluster, train, plan, 1, 0.1)
    assert first not in [e.layout for e in dropped.candidates]
    assert dropped.candidates == plan.candidates[1:]
    assert "activations overflowed" in dropped.warnings[-1] and first.short() in dropped.warnings[-1]


@pytest.mark.parametrize("ac", ["selective", "full"])
def test_checkpointed_blocks_trace_under_the_gpu_policy(ac: str) -> None:
    # recompute in backward must rerun what the forward ran (the RMSNorm stand-in included)
    layout = parse(f"dp=2,zero=2,tp=2,ac={ac}", 4)
    record = v.trace_rank(load_model("tiny"), layout, 0, 8, 64, "cuda")
    assert record["activation_dtypes"] == ["bfloat16"] and record["memory"]["Activation"] > 0


def test_without_a_compiler_a_gpu_profile_is_traced_on_the_cpu_device(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no library built yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    device, note = v.fake_device("cuda")
    assert device == "cpu" and "C++ compiler" in note and "cpu device" in note
    assert v.fake_device("cpu") == ("cpu", None)


def test_fsdp2_logits_view_warning_is_filtered_for_meshwise_model_only(capfd) -> None:
    """torch's FSDP2 warns that the TP model's root "returned a view tensor" (issue 32: printed by
    every verify with tp > 1); meshwise's loss reads the logits out of place, so that one warning is
    filtered, in one place (runtime/data_parallel.py), and the same warning about another module is not.
    The trace runs in its own process: its stderr is read at the descriptor."""
    import warnings

    from meshwise.runtime.data_parallel import ignore_logits_view_warning

    model = dataclasses.replace(load_model("tiny"), layers=2)
    v.trace_record(model, parse("dp=2,zero=3,tp=2", 4), 0, 2, 64, "cpu", "full")
    assert "returned a view tensor" not in capfd.readouterr().err
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_logits_view_warning()
        warnings.warn("FSDP2-wrapped module (FSDPTransformer) returned a view tensor. An in-place op", UserWarning)
        warnings.warn("FSDP2-wrapped module (FSDPMine) returned a view tensor. An in-place op", UserWarning)
    assert [str(w.message) for w in seen] == ["FSDP2-wrapped module (FSDPMine) returned a view tensor. An in-place op"]
