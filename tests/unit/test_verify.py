"""meshwise verify: refusals before tracing, plan --verify, checkpointed blocks on the GPU policy
(the 70B traces and the reduced-depth check: tests/integration/test_verify_traces.py)."""

from __future__ import annotations

import dataclasses

import pytest

from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.measure import verify as v
from meshwise.measure.compare import Row
from meshwise.measure.rank_trace import RankTrace
from meshwise.spec import TrainSpec, load_cluster, load_model

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "args,field",
    [
        (["--layout", "dp=8,zero=3,tp=3"], "layout"),  # tp does not divide the world
        (["--layout", "pp=2,dp=32", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "63"], "global"),
        (["--layout", "dp=64", "--ranks", "64"], "--ranks"),
        (["--layout", "dp=64", "--depth", "half"], "--depth"),
        (
            ["--layout", "pp=2,dp=2", "--model", "tiny-tied", "--gpus", "4", "--gpu", "cpu", "--global-batch", "8"],
            "tied",
        ),
    ],
)
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
        return [
            Row("memory.activations", 0, 1e6, big),
            Row("memory.params", 0, 1e6, 1e6),
            Row("memory.total", 0, 2e6, big + 1e6),
        ], []

    monkeypatch.setattr(v, "verify", overflowing)
    dropped = v.verify_plan(model, cluster, train, plan, 1, 0.1)
    assert first not in [e.layout for e in dropped.candidates]
    assert dropped.candidates == plan.candidates[1:]
    assert "activations overflowed" in dropped.warnings[-1] and first.short() in dropped.warnings[-1]


@pytest.mark.parametrize("ac", ["selective", "full"])
def test_checkpointed_blocks_trace_under_the_gpu_policy(ac: str) -> None:
    # recompute in backward must rerun what the forward ran (the RMSNorm stand-in included)
    layout = parse(f"dp=2,zero=2,tp=2,ac={ac}", 4)
    record = v.trace_rank(RankTrace(load_model("tiny"), layout, 0, 8, 64, "cuda"))
    assert record["activation_dtypes"] == ["bfloat16"] and record["memory"]["Activation"] > 0


def test_without_a_compiler_a_gpu_profile_is_traced_on_the_cpu_device(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no library built yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    device, note = v.fake_device("cuda")
    assert device == "cpu" and "C++ compiler" in note and "cpu device" in note
    assert v.fake_device("cpu") == ("cpu", None)


def test_fsdp2_logits_view_warning_is_filtered_for_meshwise_model_only(capfd) -> None:
    """torch's FSDP2 warns that the TP model's root "returned a view tensor" (once printed by
    every verify with tp > 1); meshwise's loss reads the logits out of place, so that one warning is
    filtered, in one place (runtime/data_parallel.py), and the same warning about another module is not.
    The trace runs in its own process: its stderr is read at the descriptor."""
    import warnings

    from meshwise.runtime.data_parallel import ignore_logits_view_warning

    model = dataclasses.replace(load_model("tiny"), layers=2)
    v.trace_record(RankTrace(model, parse("dp=2,zero=3,tp=2", 4), 0, 2, 64, "cpu"), "full")
    assert "returned a view tensor" not in capfd.readouterr().err
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_logits_view_warning()
        warnings.warn("FSDP2-wrapped module (FSDPTransformer) returned a view tensor. An in-place op", UserWarning)
        warnings.warn("FSDP2-wrapped module (FSDPMine) returned a view tensor. An in-place op", UserWarning)
    assert [str(w.message) for w in seen] == ["FSDP2-wrapped module (FSDPMine) returned a view tensor. An in-place op"]
