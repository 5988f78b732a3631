"""meshwise calibrate: the fit, the profile it writes (readable by plan --gpu), refusals, one tiny run."""

from __future__ import annotations

import tomllib

import pytest

from meshwise.cli import main
from meshwise.cost import comm
from meshwise.errors import MeshwiseError
from meshwise.measure import calibrate as cal
from meshwise.spec import LinkSpec, load_cluster
from meshwise.spec.cluster import _ACCEL_KEYS, ACCEL_GPU_KEYS
from meshwise.spec.gpu_keys import GPU_KEYS
from meshwise.spec.host_keys import PROBE_KEYS


def _gemm_grid(rate: float, call_s: float, bytes_per_s: float) -> list[list[float]]:
    """The GEMM benchmark's figures as cost/host.py's model makes them, over calibrate's grid."""

    def seconds(m: int, n: int, k: int) -> float:
        moved = 4.0 * (m * k + k * n + m * n)
        return 2 * m * n * k / rate + call_s + (moved / bytes_per_s if bytes_per_s else 0)

    return [[m, n, k, seconds(m, n, k)] for m, n, k in cal.gemm_grid(quick=False)]


RESULT = {
    "gemm_grid": _gemm_grid(40e9, 3e-6, 50e9),
    "dram_copy_bytes_per_s": 2e9,
    "gemm_reference_shapes": [[128, 192, 192], [128, 512, 192]],
    "matmul_flops_per_s": 30e9,
    "fwd_bwd_s": 0.5,
    "model_flops": 9e9,
    "copy_bytes_per_s": 5e9,
    "collectives": [],
    "what": "synthetic",
    "model_ops": 1000,
    "blocks": 4,
    "host_s": {"none": 0.01, "full": 0.01, "selective": 0.01},
    "cores": 2,
    "matmul_all_threads_flops_per_s": 48e9,
    "ring": [[4.0 * s * s, d, 1e-4 + 4.0 * s * s * (8e-9 + d * 2e-10)] for s, d in ((64, 16), (512, 16), (256, 64))],
    "sdpa": [[4.0 * s * s, d, 5e-5 + 4.0 * s * s * (3e-9 + d * 1e-10)] for s, d in ((64, 16), (512, 16), (256, 64))],
    "loss": [[128.0, 256.0, 1e-4], [128.0, 65536.0, 0.06]],
    "ring_includes_sends": True,
}


def _samples(
    alpha: float, beta: float, n: int, rs_ratio: float = 0.0, a2a_ratio: float = 0.0
) -> list[tuple[str, int, float, float]]:
    """All-gathers and all-reduces by the ring formulas; with ``rs_ratio`` reduce-scatters timed as
    gloo's, ``rs_ratio`` x the all-reduce of the same tensor (not the ring's half of one); with
    ``a2a_ratio`` all-to-alls at that times the pairwise exchange."""
    link = LinkSpec(beta, alpha)
    out = []
    for size in (4e3, 256e3, 4e6, 32e6):
        out.append(("all_gather", n, size, comm.collective_seconds("all_gather", n, size, link)))
        ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta
        out.append(("all_reduce", n, size, ring))
        if rs_ratio:
            out.append(("reduce_scatter", n, size, rs_ratio * ring))
        if a2a_ratio:
            out.append(("all_to_all", n, size, a2a_ratio * comm.collective_seconds("all_to_all", n, size, link)))
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_fit_recovers_alpha_and_beta_of_the_cost_model(n):
    alpha, beta = cal.fit_alpha_beta(_samples(80e-6, 1.5e9, n))
    assert alpha == pytest.approx(80e-6, rel=1e-6)
    assert beta == pytest.approx(1.5e9, rel=1e-6)


@pytest.mark.parametrize("rate, call_s, bytes_per_s", [(40e9, 3e-6, 50e9), (90e9, 0.0, 0.0), (60e9, 5e-6, 0.0)])
def test_gemm_fit_recovers_the_model_and_the_profile_reads_it(rate, call_s, bytes_per_s):
    got_rate, got_call, got_bw, error = cal.fit_gemm(_gemm_grid(rate, call_s, bytes_per_s))
    assert got_rate == pytest.approx(rate, rel=1e-6) and got_call == pytest.approx(call_s, abs=1e-12)
    inverse = (1 / got_bw if got_bw else 0.0), (1 / bytes_per_s if bytes_per_s else 0.0)  # seconds per byte
    assert inverse[0] == pytest.approx(inverse[1], rel=1e-6, abs=1e-18) and error < 1e-9
    assert len(cal.gemm_grid(quick=False)) > len(cal.gemm_grid(quick=True)) > 40
    assert {16, 2048} <= {side for shape in cal.gemm_grid(quick=True) for side in shape}


@pytest.mark.parametrize("step_s,score_s,dim_s", [(1e-4, 8e-9, 2e-10), (0.0, 5e-9, 0.0), (2e-4, 1e-8, 0.0)])
def test_ring_fit_recovers_its_model(step_s, score_s, dim_s):
    """cost/context_parallel.py's per-step ring model, fitted to exact samples over the calibration's shapes,
    gives back its constants (a term whose true value is 0 is left out, not fitted negative)."""
    samples = [(4.0 * s * s, d, step_s + 4.0 * s * s * (score_s + d * dim_s)) for s, d in cal.RING_SHAPES]
    got = cal.fit_ring(samples)
    assert got[:3] == pytest.approx((step_s, score_s, dim_s), rel=1e-6, abs=1e-14) and got[3] < 1e-9


def test_ring_kernels_replace_the_attention_core_under_cp():
    """Under cp the ring's timed kernels (per step: fixed + per score element) are charged instead of
    the attention core's FLOPs: a profile with ring constants adds exactly
    ``m * blocks * cp * (step + E * (score + d * dim))`` less those FLOPs' seconds; cp=1, and a
    profile without the constants, are unchanged; full recompute runs the ring's forward again."""
    import dataclasses

    from meshwise.cost import compute
    from meshwise.cost.estimate import _efficiency, estimate
    from meshwise.cost.host import core_share, gemm_shape_factor
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    base = load_cluster("cpu", 2, 2)
    ring = dataclasses.replace(
        base, accelerator=dataclasses.replace(base.accelerator, cp_step_s=1e-4, cp_score_s=8e-9, cp_score_dim_s=2e-10)
    )
    model, train = load_model("tiny"), TrainSpec(4, 256, precision="fp32")
    for text in ("dp=2", "tp=2"):
        assert estimate(model, ring, train, parse(text, 2)).time == estimate(model, base, train, parse(text, 2)).time
    extra = {}
    for ac in ("none", "full"):
        layout = parse(f"cp=2,ac={ac}", 2)
        a, b = (estimate(model, c, train, layout).time.compute_s for c in (base, ring))
        m, blocks, e = 4, model.layers, model.heads * 128.0**2  # mbs 1, 128 local tokens
        charged = m * blocks * 2 * (1 + (ac != "none") / 3) * (1e-4 + e * (8e-9 + model.head_dim * 2e-10))
        accel = base.accelerator
        rate = accel.peak_fp32_flops_per_s * _efficiency(model, base, layout) * gemm_shape_factor(model, accel, 128, 1)
        core_s = 128 * m * compute.recompute_factor(ac) * blocks * 4.0 * 256 * model.hidden / rate
        extra[ac] = b - a
        assert b - a == pytest.approx(core_share(accel, 2) * (charged - core_s), rel=1e-9)
    assert extra["full"] > extra["none"]


def test_ring_steps_timed_with_their_sends_expose_no_ring_transfer_again(tmp_path):
    """A profile whose ring steps were timed as whole calls (``cp_step_includes_sends``) holds the
    sends in compute: the ring's exposed seconds go, the compute and the collectives counted stay;
    the flag is read from a profile file, and anything but true or false is refused by name."""
    import dataclasses

    from meshwise.cost.estimate import estimate
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    base = load_cluster("cpu", 2, 2)
    timed = dataclasses.replace(base.accelerator, cp_step_s=1e-4, cp_score_s=8e-9, cp_score_dim_s=2e-10)
    model, train, layout = load_model("tiny"), TrainSpec(4, 256, precision="fp32"), parse("cp=2", 2)
    bare, whole = (
        estimate(model, dataclasses.replace(base, accelerator=a), train, layout)
        for a in (timed, dataclasses.replace(timed, cp_step_includes_sends=True))
    )
    assert bare.time.comm_exposed_s > whole.time.comm_exposed_s
    assert whole.time.compute_s == bare.time.compute_s
    assert whole.time.step_s < bare.time.step_s
    table = cal.profile_table({**RESULT, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30)
    assert table["cp_step_includes_sends"] is True
    path = tmp_path / "p.toml"
    cal.write_profile(path, table)
    assert load_cluster(str(path), 2, 2).accelerator.cp_step_includes_sends is True
    path.write_text(path.read_text().replace("cp_step_includes_sends = true", "cp_step_includes_sends = 1"))
    with pytest.raises(MeshwiseError, match="cp_step_includes_sends must be true or false"):
        load_cluster(str(path), 2, 2)


def test_sdpa_kernel_replaces_the_attention_core_without_cp():
    """Without cp a profile with SDPA constants charges ``m * blocks * (1 + [full] / 3) * (call + E *
    (score + d * dim))`` instead of the attention core's FLOPs; the profile reads them from its
    calibration result; the selective policy keeps the attention output (no recompute)."""
    import dataclasses

    from meshwise.cost import compute
    from meshwise.cost.estimate import _efficiency, estimate
    from meshwise.cost.host import core_share, gemm_shape_factor
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    table = cal.profile_table({**RESULT, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30)
    fitted = (table["sdpa_call_s"], table["sdpa_score_s"], table["sdpa_score_dim_s"])
    assert fitted == pytest.approx((5e-5, 3e-9, 1e-10), rel=1e-6)
    base = load_cluster("cpu", 1, 1)
    timed = dataclasses.replace(
        base,
        accelerator=dataclasses.replace(base.accelerator, sdpa_call_s=5e-5, sdpa_score_s=3e-9, sdpa_score_dim_s=1e-10),
    )
    model, train = load_model("tiny"), TrainSpec(4, 256, precision="fp32")
    for ac, again in (("none", 0), ("selective", 0), ("full", 1)):
        layout = parse(f"mbs=2,ac={ac}", 1)
        a, b = (estimate(model, c, train, layout).time.compute_s for c in (base, timed))
        m, blocks, e = 2, model.layers, 2 * model.heads * 256.0**2
        charged = m * blocks * (1 + again / 3) * (5e-5 + e * (3e-9 + model.head_dim * 1e-10))
        accel = base.accelerator
        rate = accel.peak_fp32_flops_per_s * _efficiency(model, base, layout) * gemm_shape_factor(model, accel, 512, 1)
        core_s = 512 * m * compute.recompute_factor(ac) * blocks * 4.0 * 256 * model.hidden / rate
        assert b - a == pytest.approx(core_share(accel, 1) * (charged - core_s), rel=1e-9)


def test_small_gemms_run_below_the_calibration_s_efficiency():
    """Efficiency by shape: by the fitted grid a 64-wide model at 32 tokens reaches less of the rate
    than the calibration's own GEMMs (factor < 1), a 512-wide one at 1,024 tokens more (> 1); a
    profile without a grid reads 1 everywhere."""
    import dataclasses

    from meshwise.cost.host import gemm_shape_factor
    from meshwise.spec import load_model

    fields = cal.gemm_fields(
        {"gemm_grid": _gemm_grid(40e9, 3e-6, 50e9), "gemm_reference_shapes": cal_reference("small", 128)}
    )
    accel = dataclasses.replace(
        load_cluster("cpu", 2, 2).accelerator, **{k: v for k, v in fields.items() if k != "note"}
    )
    tiny, small = load_model("tiny"), load_model("small")
    wide = dataclasses.replace(small, hidden=512, ffn_hidden=1408, heads=8, kv_heads=4)
    assert gemm_shape_factor(small, accel, 128, 1) == pytest.approx(1.0)
    assert gemm_shape_factor(tiny, accel, 32, 1) < 0.9 < 1.0 < gemm_shape_factor(wide, accel, 1024, 1)
    assert gemm_shape_factor(tiny, load_cluster("cpu", 2, 2).accelerator, 32, 1) == 1.0


def cal_reference(model: str, seq: int) -> list:
    from meshwise.cost.host import linear_gemm_shapes
    from meshwise.spec import load_model

    return linear_gemm_shapes(load_model(model), seq, 1, False)


def test_fit_never_returns_a_negative_latency():
    samples = [("all_reduce", 2, s, s / 1e9) for s in (1e3, 1e6)]  # pure bandwidth, noise-free
    samples[0] = ("all_reduce", 2, 1e3, 0.5e3 / 1e9)  # faster than bandwidth allows: alpha would be < 0
    alpha, beta = cal.fit_alpha_beta(samples)
    assert alpha == 0.0 and beta > 0


def _fsdp_result(
    call_s: float, param_s: float, plain_s: float, tensors: int, units: int, byte_s: float, wide: bool = True
) -> dict[str, list[float]]:
    """The FSDP2 benchmark's figures as cost/host.py's model makes them (calls: ZeRO-3 per unit, two
    gathers and a reduction each, the root once each; ``units`` - 1 blocks, wrapped one or two a unit;
    ``wide``: the blocks wrapping again over five times the bytes, its own plain pass slower)."""
    out = {}
    pairs = -(-(units - 1) // 2)
    rows = [("blocks", 3 * (units - 1) + 2, units, 3e6, plain_s), ("pairs", 3 * pairs + 2, pairs + 1, 3e6, plain_s)]
    if wide:
        rows.append(("wide", 3 * (units - 1) + 2, units, 15e6, 3 * plain_s))
    for mode, calls, n_units, moved, plain in rows:
        out[mode] = [plain + moved * byte_s + calls * (call_s + tensors / n_units * param_s), calls, moved, plain]
    return out


@pytest.mark.parametrize(
    "call_s, param_s, byte_s", [(150e-6, 8e-6, 3e-10), (0.0, 12e-6, 2e-10), (300e-6, 0.0, 4e-10), (150e-6, 8e-6, 0.0)]
)
def test_fsdp_constants_recover_the_per_call_per_tensor_and_per_byte_costs(call_s, param_s, byte_s):
    fake = _fsdp_result(call_s, param_s, plain_s=0.02, tensors=57, units=7, byte_s=byte_s)
    got = cal.fsdp_constants(fake, 0.02, 57, 6, 20e9)
    assert got == pytest.approx((call_s, param_s, byte_s), abs=1e-9, rel=1e-6)


def test_fsdp_bytes_cost_their_copies_without_the_wide_wrapping():
    """Results without the wide wrapping (or its plain pass) price a byte as its copy in and out."""
    fake = _fsdp_result(150e-6, 8e-6, plain_s=0.02, tensors=57, units=7, byte_s=2 / 20e9, wide=False)
    old = {mode: row[:3] for mode, row in fake.items()}  # before the plain pass was timed per wrapping
    for result in (fake, old):
        assert cal.fsdp_constants(result, 0.02, 57, 6, 20e9) == pytest.approx((150e-6, 8e-6, 2 / 20e9), rel=1e-6)


def test_fsdp_constants_are_never_negative():
    """Noise that makes fewer calls cost more gives no negative cost."""
    fake = {"blocks": [0.025, 20, 0.0], "pairs": [0.03, 11, 0.0]}  # fewer calls, more time
    call_s, param_s, byte_s = cal.fsdp_constants(fake, 0.02, 57, 6, 20e9)
    assert call_s >= 0 and param_s >= 0 and call_s + param_s > 0 and byte_s > 0
    fake["wide"] = [0.026, 20, 1e6, 0.03]  # a wide pass faster than its plain one: no per-byte fit
    assert min(cal.fsdp_constants(fake, 0.02, 57, 6, 20e9)) >= 0


def test_fsdp_host_cost_follows_the_calls_of_each_zero_stage():
    """The cost model charges FSDP2's work per collective call: ZeRO-3 (two gathers and a reduction
    per unit per micro-batch) pays more than ZeRO-1 (one of each per step), replication its
    all-reduces, one process nothing; the seconds land in compute, where measure times them."""
    import dataclasses

    from meshwise.cost.estimate import estimate
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    cluster = load_cluster("cpu", 2, 2)
    costly = dataclasses.replace(
        cluster, accelerator=dataclasses.replace(cluster.accelerator, fsdp_call_s=200e-6, fsdp_param_s=10e-6)
    )
    model, train = load_model("tiny"), TrainSpec(8, 64, precision="fp32")
    extra = {}
    for text in ("dp=2,zero=0", "dp=2,zero=1", "dp=2,zero=3", "tp=2"):
        a, b = (estimate(model, c, train, parse(text, 2)).time for c in (cluster, costly))
        extra[text] = b.compute_s - a.compute_s
        assert b.step_s - a.step_s == pytest.approx(extra[text])
    calls = {"dp=2,zero=0": 5, "dp=2,zero=1": 10, "dp=2,zero=3": 4 * 15}  # 5 units, m = 4 micro-batches
    for text, n in calls.items():
        assert extra[text] == pytest.approx(n * (200e-6 + 39 / 5 * 10e-6))
    assert extra["tp=2"] == 0
    # a measured cost per byte replaces the copies' (twice the bytes over the copy bandwidth)
    from meshwise.cost import host

    per_byte = dataclasses.replace(cluster, accelerator=dataclasses.replace(cluster.accelerator, fsdp_byte_s=3e-10))
    for text in ("dp=2,zero=0", "dp=2,zero=3"):
        a, b = (estimate(model, c, train, parse(text, 2)) for c in (cluster, per_byte))
        moved = sum(op.bytes_per_step for op in host.fsdp_ops(list(a.comm)))
        assert moved > 0
        assert b.time.compute_s - a.time.compute_s == pytest.approx(
            moved * (3e-10 - 2 / cluster.accelerator.hbm_bytes_per_s), rel=1e-4
        )


def test_reduce_scatter_is_charged_as_the_all_reduce_gloo_times_it_as(tmp_path):
    """The ring fit is made on the all-reduces and all-gathers alone, and a reduce-scatter is then
    priced at the measured share of an all-reduce: the profile predicts the samples it was made from
    (2 ranks: the ring all-reduce is the cheaper), the ring formula (half an all-reduce) would not."""
    n = 2
    samples = _samples(80e-6, 1.5e9, n, rs_ratio=1.1)
    table = cal.profile_table({**RESULT, "collectives": samples}, nproc=n, ram_bytes=16 << 30)
    assert table["reduce_scatter_ratio"] == pytest.approx(1.1)
    assert table["intra_latency_s"] == pytest.approx(80e-6, rel=1e-6)
    path = tmp_path / "cpu.toml"
    cal.write_profile(path, table)
    link = load_cluster(str(path), n).intra
    for kind, _, size, seconds in samples:
        assert comm.collective_seconds(kind, n, size, link) == pytest.approx(seconds, rel=1e-4)
    ring = comm.collective_seconds("reduce_scatter", n, 4e6, LinkSpec(1.5e9, 80e-6))
    assert comm.collective_seconds("reduce_scatter", n, 4e6, link) > 1.9 * ring


def test_no_reduce_scatter_samples_keep_the_ring_formula():
    assert cal.reduce_scatter_ratio(_samples(80e-6, 1.5e9, 2)) == 0.0
    table = cal.profile_table({**RESULT, "collectives": _samples(80e-6, 1.5e9, 2)}, nproc=2, ram_bytes=16 << 30)
    assert "reduce_scatter_ratio" not in table


def test_profile_has_exactly_the_catalog_keys_and_plan_reads_it(tmp_path):
    table = cal.profile_table(
        {**RESULT, "collectives": _samples(50e-6, 2e9, 2, rs_ratio=1.0, a2a_ratio=1.7)}, nproc=2, ram_bytes=16 << 30
    )
    # a CPU profile: the flat path, no GPU op model; calibrate() adds the probe (measure/probe.py), a
    # run's top-up its MoE rows (measure/plan_shapes.py)
    catalog_keys = set(_ACCEL_KEYS) - GPU_KEYS - ACCEL_GPU_KEYS - set(PROBE_KEYS) - {"moe_part_table"}
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
    # the all-to-alls are left out of the link's fit and read back as their ratio to it (cost/comm.py)
    assert cluster.intra.all_to_all_ratio == pytest.approx(1.7, rel=1e-3)
    assert comm.collective_seconds("all_to_all", 2, 4e6, cluster.intra) == pytest.approx(
        1.7 * (50e-6 + 2e6 / 2e9), rel=1e-3
    )
    assert cluster.accelerator.efficiency(192) == pytest.approx(9e9 / (0.49 * 30e9), rel=1e-3)


def test_the_calibrated_profile_predicts_its_own_forward_backward(tmp_path):
    """The efficiency is solved net of host time and the memory-bound term, so the cost model,
    adding both back, predicts the measured forward + backward of the calibration's model; the GEMM
    grid's shape factor is 1 at the calibration's own GEMMs."""
    from meshwise.cost.compute import model_flops
    from meshwise.cost.estimate import compute_seconds
    from meshwise.cost.host import ops_per_microbatch
    from meshwise.cost.memory import rank_shapes
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    model, seq = load_model("small"), 128
    moved = cal.calibration_memory_bound_bytes(model, seq)
    result = {
        **RESULT,
        "model_flops": model_flops(model, seq, seq),
        "model_ops": ops_per_microbatch(model.layers, True, True),
        "blocks": model.layers,
        "memory_bound_bytes": moved,
        "fwd_bwd_s": 0.2,
        "loss_logits": [seq, model.vocab],
        "sdpa_model": [model.heads, seq, model.head_dim, 3 * model.layers * seq * 4.0 * seq * model.hidden],
        "gemm_reference_shapes": cal_reference("small", seq),
    }  # with the GEMM grid's factor (1 here)
    table = cal.profile_table(result, nproc=1, ram_bytes=16 << 30)
    assert moved > 0
    path = tmp_path / "cpu.toml"
    cal.write_profile(path, table)
    cluster = load_cluster(str(path), 1, 1)
    layout = parse("dp=1,mbs=1", 1)
    seconds = compute_seconds(
        model, cluster, TrainSpec(1, seq, precision="fp32"), layout, rank_shapes(model, layout)[0]
    )
    assert seconds == pytest.approx(0.2, rel=1e-4)
    # a profile from before the term (and before SDPA's constants), converted as replay does, gives
    # the same efficiency as one calibrated now without the SDPA grid
    plain = cal.profile_table({**result, "sdpa": []}, nproc=1, ram_bytes=16 << 30)
    old = cal.profile_table({**result, "sdpa": [], "memory_bound_bytes": 0.0}, nproc=1, ram_bytes=16 << 30)
    assert old["efficiency_max"] < plain["efficiency_max"]
    converted = cal.with_memory_bound_term(old, model, seq)
    assert converted["efficiency_max"] == pytest.approx(plain["efficiency_max"], rel=1e-4)


def test_one_process_profile_has_no_measured_links():
    table = cal.profile_table(RESULT, nproc=1, ram_bytes=8 << 30)
    assert table["intra_bytes_per_s"] == RESULT["copy_bytes_per_s"]
    assert "not measured" in table["source"]


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--out", "profile.txt"], "--out"),
        (["--out", "/no/such/folder/p.toml"], "--out"),
        (["--model", "no-such-model"], "--model"),
        (["--model", "tiny", "--seq-len", "100000"], "--seq-len"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"meshwise: error: {field}")
    assert list(tmp_path.iterdir()) == []


def test_block_gemms_are_the_models_matmul_parameters():
    from meshwise.spec import load_model

    model = load_model("small")
    from meshwise.measure.probe import block_gemm_shapes

    assert sum(k * n for k, n in block_gemm_shapes(model)) == model.attention_params + model.mlp_params


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


def test_host_constants_are_net_of_the_host_benchmark_s_own_gemms_and_attention():
    """The four-token pass still runs its GEMMs and SDPA calls: times made of cost/host.py's launches
    plus those kernels by the fitted GEMM grid and SDPA constants give back the launch constants."""
    from meshwise.cost import host
    from meshwise.measure.calibrate_worker import HOST_TOKENS
    from meshwise.spec import AcceleratorSpec, load_model

    model, blocks = load_model("small"), load_model("small").layers
    gemm, ring = cal.gemm_fields(RESULT), cal.ring_fields(RESULT)
    result = {
        **RESULT,
        "blocks": blocks,
        "host_block_gemms": host.linear_gemm_shapes(model, HOST_TOKENS, 1, False),
        "host_head_gemms": host.linear_gemm_shapes(model, HOST_TOKENS, 1, True)[-3:],
        "host_sdpa": [model.heads, HOST_TOKENS, model.head_dim],
    }
    whole_s, block_forward_s = cal.host_arithmetic_seconds(result, gemm, ring)
    fitted = AcceleratorSpec(
        "fit",
        1,
        40e9,
        40e9,
        1.0,
        cpu_gemm_flops_per_s=gemm["cpu_gemm_flops_per_s"],
        cpu_gemm_call_s=gemm["cpu_gemm_call_s"],
        cpu_gemm_bytes_per_s=gemm["cpu_gemm_bytes_per_s"],
    )
    gemms_s = sum(host.cpu_gemm_seconds(fitted, *s) for s in host.linear_gemm_shapes(model, HOST_TOKENS, 1, True)[-3:])
    assert whole_s > gemms_s > 0 and 0 < block_forward_s < whole_s / blocks
    accel = AcceleratorSpec("x", 1, 1.0, 1.0, 1.0, op_overhead_s=4e-6, checkpoint_call_s=3e-4, selective_op_s=2e-5)
    launches = {ac: host.host_seconds(accel, blocks, True, True, ac, 1) for ac in ("none", "full", "selective")}
    times = {
        "none": launches["none"] + whole_s,
        "full": launches["full"] + whole_s + blocks * block_forward_s,
        "selective": launches["selective"] + whole_s + blocks * block_forward_s,
    }
    ops = host.ops_per_microbatch(blocks, True, True)
    assert cal.host_constants(times, ops, blocks, (whole_s, block_forward_s)) == pytest.approx((4e-6, 3e-4, 2e-5))
    assert cal.host_constants(times, ops, blocks)[0] > 4e-6 * 1.1  # the kernels left in: a per-op cost too high


def test_the_cli_prints_each_component_and_each_fit_s_own_error(monkeypatch, capsys, tmp_path):
    table = cal.profile_table({**RESULT, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30)
    monkeypatch.setattr(cal, "calibrate", lambda *args, **kwargs: table)
    assert main(["calibrate", "--out", str(tmp_path / "p.toml")]) == 0
    out = capsys.readouterr().out
    assert "FSDP2" in out and "GFLOP/s + 3.0 us" in out  # the GEMM grid's fit: 40 GFLOP/s + 3 us per call
    assert "GEMM grid of 118 shapes" in out and "fitted over gloo with mean |error| 0%" in out


def test_ring_steps_are_read_off_the_measured_table(tmp_path):
    """A profile with ``cp_ring_table`` reads each measured ring step back exactly, interpolates
    between (linearly in score elements, then head width), extends the end segments past the
    table, and never goes below its fastest step; the table survives the profile file, and a
    malformed one is refused by name."""
    import dataclasses

    from meshwise.cost.context_parallel import ring_step_seconds

    rows = [
        [4.0 * s * s, d, 1e-4 + 4.0 * s * s * (8e-9 + d * 2e-10) * (1.5 if s >= 512 else 1.0)]
        for s, d in ((64, 16), (256, 16), (512, 16), (64, 64), (256, 64), (512, 64))
    ]
    accel = dataclasses.replace(
        load_cluster("cpu", 2, 2).accelerator,
        cp_step_s=1e-4,
        cp_score_s=8e-9,
        cp_ring_table=tuple(tuple(r) for r in rows),
    )
    for e, d, s in rows:
        assert ring_step_seconds(accel, e, d) == pytest.approx(s)
    e0, e1 = 4.0 * 256**2, 4.0 * 512**2
    mid = ring_step_seconds(accel, (e0 + e1) / 2, 16)
    assert mid == pytest.approx((rows[1][2] + rows[2][2]) / 2)
    assert ring_step_seconds(accel, e1, 40) == pytest.approx((rows[2][2] + rows[5][2]) / 2)
    beyond = ring_step_seconds(accel, 2 * e1, 16)
    assert beyond == pytest.approx(rows[2][2] + (rows[2][2] - rows[1][2]) * e1 / (e1 - e0))
    assert ring_step_seconds(accel, 1.0, 1.0) == pytest.approx(min(r[2] for r in rows))
    line = dataclasses.replace(accel, cp_ring_table=())  # without a table, the fitted line
    assert ring_step_seconds(line, e1, 16) == pytest.approx(1e-4 + e1 * (8e-9 + 16 * accel.cp_score_dim_s))
    table = cal.profile_table(
        {**RESULT, "ring": rows, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30
    )
    path = tmp_path / "p.toml"
    cal.write_profile(path, table)
    read = load_cluster(str(path), 2, 2).accelerator.cp_ring_table
    assert [x for r in read for x in r] == pytest.approx([x for r in rows for x in r], rel=1e-5)
    path.write_text(path.read_text().replace("cp_ring_table = [[", "cp_ring_table = [[-"))
    with pytest.raises(MeshwiseError, match="cp_ring_table must be two or more rows"):
        load_cluster(str(path), 2, 2)


def test_thread_efficiency_is_the_second_best_paired_speedup():
    """Five (one thread, every core) pairs: pairs whose all-threads timing met a busy core (three of
    five here) do not pull the efficiency down, and one pair whose one-thread timing was the
    disturbed one does not push it up; without pairs (older results) the two rates are compared as
    before."""

    def efficiency(speedups: list[float]) -> float:
        return cal.profile_table(
            {**RESULT, "thread_speedups": speedups, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30
        )["thread_efficiency"]

    assert efficiency([1.7, 1.2, 1.25, 1.72, 1.3]) == pytest.approx(0.70)
    assert efficiency([1.7, 1.68, 1.2, 1.72, 1.69]) == pytest.approx(0.70)
    assert efficiency([1.7, 1.68, 2.0, 1.66, 1.69]) == pytest.approx(0.70)  # the 2.0: a slow one-thread timing
    assert efficiency([1.02, 1.01, 1.0, 1.02, 1.01]) == pytest.approx(0.05)  # no speed-up: the floor
    old = cal.profile_table({**RESULT, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30)
    assert old["thread_efficiency"] == pytest.approx(48e9 / old["peak_fp32_flops_per_s"] - 1)


def test_sdpa_calls_are_read_off_their_measured_table(tmp_path):
    """A profile with ``sdpa_head_table`` gives back each timed call at its shape, adds each query
    head's share to one call cost (a batch of four sequences costs four sequences' heads, not the
    fitted line's score elements), interpolates in the sequence's score elements and the head width,
    scales down in proportion below the table, and survives the profile file; a malformed table is
    refused by name."""
    import dataclasses

    from meshwise.cost.host import sdpa_call_seconds
    from meshwise.measure.calibrate import RING_HEADS

    def timed(s, d):  # a score element dearer at 512 tokens than at 1,024, as torch's CPU kernel on a 2-core host
        return 5e-5 + RING_HEADS * s * s * (3e-9 + d * 1e-10) * (1.3 if s == 512 else 1.0)

    rows = [
        [RING_HEADS * s * s, d, timed(s, d)]
        for s, d in ((64, 16), (256, 16), (512, 16), (1024, 16), (64, 64), (256, 64), (512, 64), (1024, 64))
    ]
    fields = cal.ring_fields({"sdpa": rows})
    accel = dataclasses.replace(
        load_cluster("cpu", 1, 1).accelerator,
        sdpa_call_s=fields["sdpa_call_s"],
        sdpa_score_s=fields["sdpa_score_s"],
        sdpa_score_dim_s=fields["sdpa_score_dim_s"],
        sdpa_head_table=tuple(tuple(r) for r in fields["sdpa_head_table"]),
    )
    for s, d in ((256, 16), (512, 16), (1024, 64)):
        assert sdpa_call_seconds(accel, RING_HEADS, s, d) == pytest.approx(timed(s, d))
    four = sdpa_call_seconds(accel, 4 * RING_HEADS, 512, 16)
    assert four == pytest.approx(accel.sdpa_call_s + 4 * (timed(512, 16) - accel.sdpa_call_s))
    line = dataclasses.replace(accel, sdpa_head_table=())
    assert sdpa_call_seconds(line, 4 * RING_HEADS, 512, 16) < 0.9 * four  # the line reads it fast
    middle = sdpa_call_seconds(accel, RING_HEADS, 512, 40)
    assert middle == pytest.approx((timed(512, 16) + timed(512, 64)) / 2)
    short = sdpa_call_seconds(accel, RING_HEADS, 32, 16) - accel.sdpa_call_s
    assert short == pytest.approx((sdpa_call_seconds(accel, RING_HEADS, 64, 16) - accel.sdpa_call_s) / 4)
    table = cal.profile_table(
        {**RESULT, "sdpa": rows, "collectives": _samples(50e-6, 2e9, 2)}, nproc=2, ram_bytes=16 << 30
    )
    path = tmp_path / "p.toml"
    cal.write_profile(path, table)
    read = load_cluster(str(path), 2, 2).accelerator.sdpa_head_table
    assert [x for r in read for x in r] == pytest.approx([x for r in fields["sdpa_head_table"] for x in r], rel=1e-5)
    path.write_text(path.read_text().replace("sdpa_head_table = [[", "sdpa_head_table = [[-"))
    with pytest.raises(MeshwiseError, match=r"sdpa_head_table must be two or more rows \[sequence"):
        load_cluster(str(path), 2, 2)


def test_sync_skew_is_the_wait_beyond_the_slice_and_the_collective():
    """The wait per second of own-core compute is fitted through the origin from the slices timed
    with and without the all-reduce; the cap is the longest slice; no rows, no wait."""
    rate = 100e9
    rows = [[0.0, 0.0, 5e-3]] + [[f, 2 * f / rate, 2 * f / rate + 5e-3 + 0.6 * f / rate] for f in (1.3e8, 5e8)]
    ratio, slice_s = cal.sync_skew(rows, rate)
    assert ratio == pytest.approx(0.6) and slice_s == pytest.approx(5e8 / rate)
    assert cal.sync_skew([], rate) == (0.0, 0.0)
    faster = [[0.0, 0.0, 5e-3], [1e8, 2e-3, 6e-3]]  # quicker than apart: no negative wait
    assert cal.sync_skew(faster, rate) == (0.0, pytest.approx(1e-3))


def test_sync_skew_is_the_median_of_its_passes():
    """Calibration 13 times the benchmark in passes (the fifth column) and keeps the median pass's
    ratio: one pass far off (a scheduler's hiccup) does not move it."""
    rate = 100e9

    def one_pass(index: float, ratio: float) -> list[list[float]]:
        return [[0.0, 0.0, 5e-3, index]] + [
            [f, 2 * f / rate, 2 * f / rate + 5e-3 + ratio * f / rate, index] for f in (1.3e8, 5e8)
        ]

    rows = [row for i, r in enumerate((0.5, 0.6, 3.0, 0.0, 0.55)) for row in one_pass(float(i), r)]
    ratio, slice_s = cal.sync_skew(rows, rate)
    assert ratio == pytest.approx(0.55) and slice_s == pytest.approx(5e8 / rate)
    assert cal.sync_skew(one_pass(0.0, 3.0), rate)[0] == pytest.approx(3.0)  # one pass: its own ratio


def test_ranks_beyond_the_cores_wait_at_each_collective():
    """With more ranks than cores the estimate adds ratio * min(own-core compute, collectives *
    slice) to exposed communication; at one rank per core, nothing."""
    import dataclasses

    from meshwise.cost import host
    from meshwise.cost.estimate import estimate
    from meshwise.layout import parse
    from meshwise.spec import TrainSpec, load_model

    model, train = load_model("tiny"), TrainSpec(8, 64, precision="fp32")
    for n, expect_wait in ((4, True), (2, False)):
        cluster = load_cluster("cpu", n, n)
        cores = dataclasses.replace(cluster.accelerator, cores_per_node=2)
        plain = dataclasses.replace(cluster, accelerator=cores)
        skewed = dataclasses.replace(
            cluster, accelerator=dataclasses.replace(cores, sync_skew_ratio=0.7, sync_skew_slice_s=2e-3)
        )
        layout = parse("dp=2,tp=2" if n == 4 else "dp=2", n)
        a, b = (estimate(model, c, train, layout) for c in (plain, skewed))
        wait = b.time.comm_exposed_s - a.time.comm_exposed_s
        assert b.time.step_s - a.time.step_s == pytest.approx(wait)
        if not expect_wait:
            assert wait == 0
            continue
        calls = sum(op.count_per_step for op in a.comm if op.kind != "recv")
        own = a.time.compute_s / host.core_share(cores, n)
        assert wait == pytest.approx(0.7 * min(own, calls * 2e-3)) and wait > 0


def test_dtensor_costs_are_net_of_their_collectives_waits_and_the_optimizer_s_own():
    """tp_op_s: the tp=2 pass less the plain one and the time blocked on its collectives, per operator
    (the estimate charges the collectives themselves); optimizer_dtensor_s: the DTensor AdamW step
    less the plain one, per tensor; neither below 0."""
    base = {**RESULT, "collectives": _samples(50e-6, 2e9, 2), "tp_collectives": 20}
    table = cal.profile_table(
        {**base, "tp_host_s": 0.05, "tp_waits_s": 0.01, "optimizer_host_s": [0.006, 0.002, 40.0]},
        nproc=2,
        ram_bytes=16 << 30,
    )
    assert table["tp_op_s"] == pytest.approx((0.05 - 0.01 - 0.01) / 1000)
    assert table["optimizer_dtensor_s"] == pytest.approx(0.004 / 40)
    older = cal.profile_table({**base, "tp_host_s": 0.05}, nproc=2, ram_bytes=16 << 30)  # no waits timed
    assert older["tp_op_s"] == pytest.approx((0.05 - 0.01 - 20 * 50e-6) / 1000, rel=1e-3)
    assert older["optimizer_dtensor_s"] == 0.0
    assert cal.optimizer_dtensor_seconds([0.001, 0.002, 40.0]) == 0.0
    assert (
        cal.profile_table({**base, "optimizer_host_s": [0.006, 0.002, 40.0]}, nproc=1, ram_bytes=16 << 30)[
            "optimizer_dtensor_s"
        ]
        == 0.0
    )


def test_zero_bubble_cost_is_the_split_backward_less_the_plain_one_per_block():
    """zb_split_block_s: (split pass - plain pass) / blocks, at every process count; 0 without the
    row (older results) and never below 0."""
    one = cal.profile_table({**RESULT, "split_backward_s": [0.016, 0.028]}, nproc=1, ram_bytes=16 << 30)
    assert one["zb_split_block_s"] == pytest.approx(0.012 / RESULT["blocks"])
    assert cal.profile_table(RESULT, nproc=1, ram_bytes=16 << 30)["zb_split_block_s"] == 0.0
    assert (
        cal.profile_table({**RESULT, "split_backward_s": [0.02, 0.019]}, nproc=1, ram_bytes=16 << 30)[
            "zb_split_block_s"
        ]
        == 0.0
    )


def test_pipeline_cost_is_the_schedule_s_step_less_the_plain_passes_per_stage_call():
    """pp_call_s: the ranks' median (GPipe step net of waits - plain passes) / stage calls; 0 without
    the rows (one process, older results) and never below 0."""
    base = {**RESULT, "collectives": _samples(50e-6, 2e9, 2)}
    rows = [[0.030, 0.022, 8], [0.036, 0.024, 8]]  # rank 0: 1 ms per call, rank 1: 1.5 ms
    assert cal.profile_table({**base, "pp_host_s": rows}, nproc=2, ram_bytes=16 << 30)["pp_call_s"] == pytest.approx(
        0.010 / 8
    )
    assert cal.profile_table(base, nproc=2, ram_bytes=16 << 30)["pp_call_s"] == 0.0
    assert cal.pipeline_call_seconds({"pp_host_s": [[0.02, 0.021, 8]]}) == 0.0


def test_sequence_parallel_cost_is_the_sp_pass_less_the_plain_tp_pass_net_of_waits_per_block():
    """tp_sp_block_s: (SP pass - its waits) - (TP pass - its waits), per block of the calibration
    model; 0 where the SP pass was not timed (older results, one process) and never below 0."""
    base = {
        **RESULT,
        "collectives": _samples(50e-6, 2e9, 2),
        "tp_collectives": 20,
        "tp_host_s": 0.05,
        "tp_waits_s": 0.01,
    }
    table = cal.profile_table({**base, "tp_sp_host_s": 0.09, "tp_sp_waits_s": 0.02}, nproc=2, ram_bytes=16 << 30)
    assert table["tp_sp_block_s"] == pytest.approx((0.07 - 0.04) / RESULT["blocks"])
    assert cal.profile_table(base, nproc=2, ram_bytes=16 << 30)["tp_sp_block_s"] == 0.0
    faster = {**base, "tp_sp_host_s": 0.05, "tp_sp_waits_s": 0.02}
    assert cal.profile_table(faster, nproc=2, ram_bytes=16 << 30)["tp_sp_block_s"] == 0.0
    assert cal.profile_table({**base, "tp_sp_host_s": 0.09}, nproc=1, ram_bytes=16 << 30)["tp_sp_block_s"] == 0.0


def test_thread_speedups_are_timed_by_the_calibrating_process_alone(monkeypatch):
    """Calibration 12: the calling process times the paired speed-ups itself, while no worker of
    its own runs, and leaves its own thread count as it found it; one core has none to time."""
    import torch

    from meshwise.spec import load_model

    model = load_model("tiny")
    before = torch.get_num_threads()
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 2)
    got = cal.thread_speedups_alone(model, 8, quick=True)
    assert torch.get_num_threads() == before
    assert len(got) == 5 and all(x > 0 for x in got)
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 1)
    assert cal.thread_speedups_alone(model, 8, quick=True) == []


def test_the_loss_table_is_seconds_per_token():
    """The worker's loss calls ``[tokens, vocab, seconds]`` become ``[tokens, vocab, seconds / tokens]``."""
    table = cal.profile_table(RESULT, nproc=1, ram_bytes=16 << 30)
    assert table["loss_token_table"] == [[128.0, 256.0, 1e-4 / 128], [128.0, 65536.0, 0.06 / 128]]
