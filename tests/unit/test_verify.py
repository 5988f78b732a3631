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


# |plan - trace| / trace per (layout, rank) and memory figure, the memory categorised by what each
# storage is (meshwise.measure.verify). The targets are states within 1% and activations within
# 10% (issue 12); they hold on every rank (2026-12-03: the errors in the comments), the traces being
# deterministic, and where a figure holds tighter its bound is tighter.
BOUNDS = {
    ("dp=8,zero=3,tp=8", 0): {"states": 0.01, "activations": 0.01, "total": 0.02},        # -0.0%, +0.9%, +1.6%
    ("pp=4,dp=2,zero=1,tp=8", 0): {"states": 0.01, "activations": 0.01, "total": 0.01},   # +0.0%, -0.1%, -0.0%
    ("pp=4,dp=2,zero=1,tp=8", 48): {"states": 0.01, "activations": 0.01, "total": 0.01},  # +0.0%, -0.0%, -0.0%
    # activations: the plan's block keeps 4.6% more than the traced one at tp=1 (1.427 GB, 1.364 GB)
    ("dp=64,zero=3", 0): {"states": 0.01, "activations": 0.10, "total": 0.05},            # +0.0%, +5.1%, +4.0%
}


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
        for figure, bound in BOUNDS[text, rank].items():
            assert abs(by[rank, f"memory.{figure}"].rel_error) < bound, (rank, figure, by[rank, f"memory.{figure}"])


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
    from meshwise.measure.compare import Row

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
