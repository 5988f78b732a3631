"""meshwise calibrate end to end: a quick calibration on two gloo processes writes a profile that
meshwise plan reads."""

from __future__ import annotations

from _transport import once_more_on_transport_error
from meshwise.cli import main
from meshwise.measure import calibrate as cal


def test_a_tiny_calibration_writes_a_plannable_profile(tmp_path):
    out = tmp_path / "p.toml"
    table = once_more_on_transport_error(lambda: cal.calibrate(2, "tiny", str(out), seq_len=32, quick=True))
    assert out.is_file()
    for key in (
        "peak_fp32_flops_per_s",
        "hbm_bytes_per_s",
        "intra_bytes_per_s",
        "dram_bytes_per_s",
        "cpu_gemm_flops_per_s",
        "probe_gemm_flops_per_s",
        "probe_op_s",
        "calibrated_unix_s",
    ):
        assert table[key] > 0, key
    assert table["fsdp_call_s"] >= 0 and table["fsdp_param_s"] >= 0 and 0 < table["gemm_reference_efficiency"] <= 1
    assert table["pp_call_s"] >= 0  # a key of every profile from calibration 17 on
    assert 0 < table["efficiency_max"] <= 1
    assert "GEMM grid of 57 shapes" in table["source"] and table["source"].count("mean |error|") == 4
    assert (
        main(
            [
                "plan",
                "--gpu",
                str(out),
                "--gpus",
                "2",
                "--model",
                "tiny",
                "--global-batch",
                "8",
                "--precision",
                "fp32",
                "--json",
            ]
        )
        == 0
    )


def test_the_pipeline_benchmark_s_idle_ranks_pass_the_same_barriers(tmp_path):
    """With more ranks than cores only ranks 0 and 1 time the pipeline schedule; ranks 2 and 3 must
    pass as many barriers (one too few hung a 4-process calibration until gloo's 600-s timeout)."""
    import json

    from _dist_parity import launch_forked

    launch_forked("_pair_bench", [str(tmp_path)], 4, tmp_path / "logs", "the pipeline benchmark", timeout_s=120)
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert rows[2] == rows[3] == []
    for step_s, plain_s, calls in rows[:2]:  # [step net of waits, plain passes, stage calls]
        assert step_s > 0 and plain_s > 0 and calls == 8
