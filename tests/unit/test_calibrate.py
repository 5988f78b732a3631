"""meshwise calibrate: the fit, the profile it writes (readable by plan --gpu), refusals, one tiny run."""

from __future__ import annotations

import tomllib

import pytest

from _transport import once_more_on_transport_error

from meshwise.cli import main
from meshwise.cost import comm
from meshwise.errors import MeshwiseError
from meshwise.measure import calibrate as cal
from meshwise.spec import LinkSpec, load_cluster
from meshwise.spec.cluster import _ACCEL_KEYS, ACCEL_GPU_KEYS
from meshwise.spec.gpu_keys import GPU_KEYS

RESULT = {"matmul_flops_per_s": 30e9, "fwd_bwd_s": 0.5, "model_flops": 9e9, "copy_bytes_per_s": 5e9,
          "collectives": [], "what": "synthetic", "model_ops": 1000, "blocks": 4,
          "host_s": {"none": 0.01, "full": 0.01, "selective": 0.01}, "cores": 2,
          "matmul_all_threads_flops_per_s": 48e9}


def _samples(alpha: float, beta: float, n: int) -> list[tuple[str, int, float, float]]:
    link = LinkSpec(beta, alpha)
    out = []
    for size in (4e3, 256e3, 4e6, 32e6):
        out.append(("all_gather", n, size, comm.collective_seconds("all_gather", n, size, link)))
        ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta
        out.append(("all_reduce", n, size, ring))
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_fit_recovers_alpha_and_beta_of_the_cost_model(n):
    alpha, beta = cal.fit_alpha_beta(_samples(80e-6, 1.5e9, n))
    assert alpha == pytest.approx(80e-6, rel=1e-6)
    assert beta == pytest.approx(1.5e9, rel=1e-6)


def test_fit_never_returns_a_negative_latency():
    samples = [("all_reduce", 2, s, s / 1e9) for s in (1e3, 1e6)]  # pure bandwidth, noise-free
    samples[0] = ("all_reduce", 2, 1e3, 0.5e3 / 1e9)  # faster than bandwidth allows: alpha would be < 0
    alpha, beta = cal.fit_alpha_beta(samples)
    assert alpha == 0.0 and beta > 0


def test_profile_has_exactly_the_catalog_keys_and_plan_reads_it(tmp_path):
    table = cal.profile_table({**RESULT, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30)
    catalog_keys = set(_ACCEL_KEYS) - GPU_KEYS - ACCEL_GPU_KEYS  # a CPU profile: the flat path, no GPU op model
    assert set(table) == catalog_keys
    assert table["efficiency_max"] == pytest.approx(9e9 / ((0.5 - 1000 * 1e-5) * 30e9))  # host time taken out
    assert table["op_overhead_s"] == pytest.approx(1e-5)
    assert table["thread_efficiency"] == pytest.approx(0.6)  # 48 / 30 = 1 + (2 - 1) x 0.6
    assert table["efficiency_half_width"] == 0.0
    assert table["memory_bytes"] == int(0.8 * (16 << 30) / 2)
    path = tmp_path / "cpu.toml"
    cal.write_profile(path, table)
    assert not (tmp_path / "cpu.toml.tmp").exists()
    assert set(tomllib.loads(path.read_text())) == catalog_keys
    cluster = load_cluster(str(path), 2)
    assert cluster.gpus_per_node == 2 and cluster.nodes == 1
    assert cluster.intra.latency_s == pytest.approx(50e-6, rel=1e-3)
    assert cluster.accelerator.efficiency(192) == pytest.approx(9e9 / (0.49 * 30e9), rel=1e-3)


def test_the_calibrated_profile_predicts_its_own_forward_backward(tmp_path):
    """The efficiency is solved net of host time and the memory-bound term, so the cost model,
    adding both back, predicts the measured forward + backward of the calibration's model."""
    from meshwise.cost.estimate import compute_seconds
    from meshwise.cost.host import ops_per_microbatch
    from meshwise.cost.memory import rank_shapes
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model
    from meshwise.cost.compute import model_flops

    model, seq = load_model("small"), 128
    moved = cal.calibration_memory_bound_bytes(model, seq)
    result = {**RESULT, "model_flops": model_flops(model, seq, seq), "model_ops": ops_per_microbatch(model.layers, True, True),
              "blocks": model.layers, "memory_bound_bytes": moved, "fwd_bwd_s": 0.2}
    table = cal.profile_table(result, nproc=1, ram_bytes=16 << 30)
    assert moved > 0
    path = tmp_path / "cpu.toml"
    cal.write_profile(path, table)
    cluster = load_cluster(str(path), 1, 1)
    layout = parse("dp=1,mbs=1", 1)
    seconds = compute_seconds(model, cluster, TrainSpec(1, seq, precision="fp32"), layout, rank_shapes(model, layout)[0])
    assert seconds == pytest.approx(0.2, rel=1e-4)
    # a profile from before the term, converted as replay does, gives the same efficiency
    old = cal.profile_table({**result, "memory_bound_bytes": 0.0}, nproc=1, ram_bytes=16 << 30)
    assert old["efficiency_max"] < table["efficiency_max"]
    converted = cal.with_memory_bound_term(old, model, seq)
    assert converted["efficiency_max"] == pytest.approx(table["efficiency_max"], rel=1e-4)


def test_one_process_profile_has_no_measured_links():
    table = cal.profile_table(RESULT, nproc=1, ram_bytes=8 << 30)
    assert table["intra_bytes_per_s"] == RESULT["copy_bytes_per_s"]
    assert "not measured" in table["source"]


@pytest.mark.parametrize("argv, field", [
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--out", "profile.txt"], "--out"),
    (["--out", "/no/such/folder/p.toml"], "--out"),
    (["--model", "no-such-model"], "--model"),
    (["--model", "tiny", "--seq-len", "100000"], "--seq-len"),
])
def test_bad_input_is_one_line_and_exit_2(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"meshwise: error: {field}")
    assert list(tmp_path.iterdir()) == []


def test_block_gemms_are_the_models_matmul_parameters():
    from meshwise.spec import load_model

    model = load_model("small")
    from meshwise.measure.calibrate_worker import block_gemm_shapes

    assert sum(k * n for k, n in block_gemm_shapes(model)) == model.attention_params + model.mlp_params


def test_a_tiny_calibration_writes_a_plannable_profile(tmp_path):
    out = tmp_path / "p.toml"
    table = once_more_on_transport_error(lambda: cal.calibrate(2, "tiny", str(out), seq_len=32, quick=True))
    assert out.is_file()
    for key in ("peak_fp32_flops_per_s", "hbm_bytes_per_s", "intra_bytes_per_s"):
        assert table[key] > 0
    assert 0 < table["efficiency_max"] <= 1
    assert main(["plan", "--gpu", str(out), "--gpus", "2", "--model", "tiny", "--global-batch", "8",
                 "--precision", "fp32", "--json"]) == 0


def test_refused_before_any_process_starts(tmp_path):
    with pytest.raises(MeshwiseError, match="--out"):
        cal.calibrate(2, "tiny", str(tmp_path / "p.json"))


def test_host_constants_recover_what_the_cost_model_would_predict():
    """Times made by cost/host.py's own formulas from known constants come back as those constants."""
    from meshwise.cost import host
    from meshwise.spec import AcceleratorSpec

    accel = AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, op_overhead_s=7e-6, checkpoint_call_s=3e-4, selective_op_s=2e-5)
    blocks = 6
    times = {ac: host.host_seconds(accel, blocks, True, True, ac, 1) for ac in ("none", "full", "selective")}
    op, call, sel = cal.host_constants(times, host.ops_per_microbatch(blocks, True, True), blocks)
    assert (op, call, sel) == pytest.approx((7e-6, 3e-4, 2e-5))
