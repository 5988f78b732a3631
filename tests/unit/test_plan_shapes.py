"""Calibration at the run's own shapes (measure/plan_shapes.py, measure/auto_profile.py ``at_shapes``):
the loss and SDPA are timed where the profile's tables stop short of the run, and only there."""

import pytest

from meshwise.measure import auto_profile, plan_shapes
from meshwise.measure.calibrate import write_profile
from meshwise.measure.plan_shapes import PlanShapes, top_up
from meshwise.spec import load_cluster, load_model

TABLE = {
    "loss_token_table": [[128.0, 256.0, 2.6e-7], [128.0, 65536.0, 4.6e-4]],
    "sdpa_call_s": 1e-4,
    "sdpa_head_table": [[64.0, 16.0, 1e-5], [1024.0, 16.0, 6e-3], [64.0, 64.0, 2e-4], [1024.0, 64.0, 2e-2]],
}


class _Timers:
    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def loss(self, tokens: int, vocab: int) -> float:
        self.asked.append(("loss", tokens, vocab))
        return 0.05

    def sdpa(self, seq: int, width: int) -> float:
        self.asked.append(("sdpa", seq, width))
        return 0.5


def test_the_plans_vocabulary_and_sequence_are_timed():
    timers = _Timers()
    out, said = top_up(TABLE, PlanShapes(tokens=512, vocab=131072, seq=2048), (timers.loss, timers.sdpa))
    # 512 x 131,072 logits pass LOSS_MAX_LOGITS (2**25): the tokens are cut to 256
    assert timers.asked == [("loss", 256, 131072), ("sdpa", 2048, 16), ("sdpa", 2048, 64)]
    assert [256.0, 131072.0, 0.05 / 256] in out["loss_token_table"]
    assert [2048.0, 16.0, (0.5 - 1e-4) / 4] in out["sdpa_head_table"]
    assert len(said) == 3 and TABLE["loss_token_table"] == [[128.0, 256.0, 2.6e-7], [128.0, 65536.0, 4.6e-4]]


def test_shapes_the_tables_reach_are_not_timed_again():
    timers = _Timers()
    out, said = top_up(TABLE, PlanShapes(tokens=128, vocab=32768, seq=1024), (timers.loss, timers.sdpa))
    assert timers.asked == [] and said == [] and out == TABLE
    # a profile without the tables (a GPU's, an older calibration's) is left alone
    assert top_up({"name": "h100"}, PlanShapes(512, 131072, 8192), (timers.loss, timers.sdpa)) == ({"name": "h100"}, [])


def test_sequences_past_the_cap_are_timed_at_the_cap():
    timers = _Timers()
    top_up(TABLE, PlanShapes(tokens=8192, vocab=256, seq=8192), (timers.loss, timers.sdpa))
    assert timers.asked == [("sdpa", plan_shapes.SDPA_MAX_SEQ, 16), ("sdpa", plan_shapes.SDPA_MAX_SEQ, 64)]


def test_shapes_of_a_run():
    model = load_model("small")
    assert plan_shapes.shapes_of(model, 256, 2) == PlanShapes(tokens=512, vocab=256, seq=256)
    assert plan_shapes.shapes_of(model, 256, 2, cp=2) == PlanShapes(tokens=256, vocab=256, seq=256, ring_seq=128)
    assert plan_shapes.shapes_of(model, 256, 2, tp=2, runtime="megatron").vocab == 128


def test_the_cached_profile_is_topped_up_at_the_runs_shapes(tmp_path, monkeypatch):
    """``ensure`` with the run's shapes asks for them and writes the rows into the cached profile."""
    profile = tmp_path / "p.toml"
    write_profile(
        profile,
        {
            "name": "cpu-calibrated",
            "memory_bytes": 10**9,
            "peak_bf16_flops_per_s": 1e11,
            "peak_fp32_flops_per_s": 1e11,
            "hbm_bytes_per_s": 2e10,
            "gpus_per_node": 2,
            "intra_bytes_per_s": 1e9,
            "intra_latency_s": 1e-4,
            "inter_bytes_per_s": 1e9,
            "inter_latency_s": 1e-4,
            **TABLE,
        },
    )
    monkeypatch.setattr(auto_profile, "cached", lambda n: profile)
    monkeypatch.setattr(auto_profile, "still_holds", lambda path, say: True)
    timers, lines = _Timers(), []
    monkeypatch.setattr(plan_shapes, "time_loss", timers.loss)
    monkeypatch.setattr(plan_shapes, "time_sdpa", timers.sdpa)
    assert auto_profile.ensure(2, lines.append, shapes=PlanShapes(256, 32768 * 4, 512)) == profile
    assert ("loss", 256, 131072) in timers.asked and lines and "131072 logits" in lines[0]
    accel = load_cluster(str(profile), 1, 1).accelerator
    assert accel.loss_token_table[-1] == pytest.approx((256.0, 131072.0, 0.05 / 256), rel=1e-5)


def test_a_bad_loss_table_is_refused_in_one_line(tmp_path):
    from meshwise.errors import MeshwiseError

    profile = tmp_path / "p.toml"
    write_profile(
        profile,
        {
            "name": "cpu-calibrated",
            "memory_bytes": 10**9,
            "peak_bf16_flops_per_s": 1e11,
            "peak_fp32_flops_per_s": 1e11,
            "hbm_bytes_per_s": 2e10,
            "gpus_per_node": 1,
            "intra_bytes_per_s": 1e9,
            "intra_latency_s": 1e-4,
            "inter_bytes_per_s": 1e9,
            "inter_latency_s": 1e-4,
            "loss_token_table": [[128, 256, 2.0], [128, 0, 1e-4]],
        },
    )
    with pytest.raises(MeshwiseError, match=r"loss_token_table must be two or more rows \[tokens, vocab, seconds\]"):
        load_cluster(str(profile), 1, 1)


def test_the_ring_is_carried_to_the_runs_local_sequence():
    """A row at the run's local sequence per head width: the table's longest step plus the bare
    step's growth from the table's end to there (4 query heads: 4 * 512**2 score elements)."""
    ring = {
        "cp_ring_table": [
            [4.0 * 64 * 64, 16.0, 0.002],
            [4.0 * 512 * 512, 16.0, 0.04],
            [4.0 * 64 * 64, 64.0, 0.003],
            [4.0 * 512 * 512, 64.0, 0.05],
        ]
    }
    asked = []

    def bare(local: int, width: int) -> float:
        asked.append((local, width))
        return {512: 0.01, 1024: 0.05}[local]  # 40 ms more at 1,024 local tokens than at 512

    out, said = top_up(ring, plan_shapes.shapes_of(load_model("small"), 2048, 1, cp=2), (None, None, bare))
    assert sorted(asked) == [(512, 16), (512, 64), (1024, 16), (1024, 64)]
    assert [4.0 * 1024 * 1024, 16.0, pytest.approx(0.04 + 0.04)] in out["cp_ring_table"]
    assert [4.0 * 1024 * 1024, 64.0, pytest.approx(0.05 + 0.04)] in out["cp_ring_table"] and len(said) == 2
    # no context parallelism, or a table that reaches the local sequence: nothing timed
    assert top_up(ring, plan_shapes.shapes_of(load_model("small"), 2048, 1), (None, None, bare))[1] == []
    assert top_up(ring, plan_shapes.shapes_of(load_model("small"), 1024, 1, cp=2), (None, None, bare))[1] == []
    # a row within 25% holds the local sequence; one past it does not (between rows: linear)
    assert top_up(out, plan_shapes.shapes_of(load_model("small"), 1200, 1, cp=2), (None, None, bare))[1] == []
    far = {"cp_ring_table": [[4.0 * 512 * 512, 16.0, 0.04], [4.0 * 2048 * 2048, 16.0, 0.9]]}
    seen = []
    top_up(
        far,
        plan_shapes.shapes_of(load_model("small"), 2048, 1, cp=2),
        (None, None, lambda local, width: seen.append(local) or local * local * 1e-8),
    )
    assert sorted(seen) == [512, 1024]  # from the row short of it, not the one past it
    # a row written to a profile (6 significant digits) still reaches its local sequence
    rounded = {"cp_ring_table": [[4.0 * 64 * 64, 16.0, 0.002], [1.67772e07, 16.0, 0.9]]}
    assert top_up(rounded, plan_shapes.shapes_of(load_model("small"), 4096, 1, cp=2), (None, None, bare))[1] == []


def test_a_ring_row_over_a_second_still_loads(tmp_path):
    """A ring step at 2,048 local tokens can take over a second on a loaded host: the profile holding
    it still loads (rows up to TABLE_MAX_S), and one beyond is refused in one line."""
    from meshwise.errors import MeshwiseError
    from meshwise.spec.host_keys import TABLE_MAX_S

    base = {
        "name": "cpu-calibrated",
        "memory_bytes": 10**9,
        "peak_bf16_flops_per_s": 1e11,
        "peak_fp32_flops_per_s": 1e11,
        "hbm_bytes_per_s": 2e10,
        "gpus_per_node": 1,
        "intra_bytes_per_s": 1e9,
        "intra_latency_s": 1e-4,
        "inter_bytes_per_s": 1e9,
        "inter_latency_s": 1e-4,
    }
    profile = tmp_path / "p.toml"
    write_profile(profile, {**base, "cp_ring_table": [[1048576.0, 16.0, 0.05], [16777216.0, 16.0, 1.5]]})
    assert load_cluster(str(profile), 1, 1).accelerator.cp_ring_table[-1][2] == 1.5
    write_profile(profile, {**base, "cp_ring_table": [[1048576.0, 16.0, 0.05], [16777216.0, 16.0, TABLE_MAX_S]]})
    with pytest.raises(MeshwiseError, match="seconds below 60"):
        load_cluster(str(profile), 1, 1)


def test_context_parallelism_times_the_ring_not_sdpa():
    timers = _Timers()
    asked = []
    ring = {**TABLE, "cp_ring_table": [[4.0 * 64 * 64, 16.0, 0.002], [4.0 * 512 * 512, 16.0, 0.04]]}
    top_up(
        ring,
        plan_shapes.shapes_of(load_model("small"), 4096, 1, cp=2),
        (timers.loss, timers.sdpa, lambda local, width: asked.append(local) or 0.01),
    )
    assert timers.asked == [] and sorted(asked) == [512, 2048]


def test_a_mixture_of_experts_is_timed_once_at_its_routed_tokens_and_ep():
    """A MoE run's block is timed at its routed tokens and EP group when the CPU profile has no row
    of that shape, once; a profile without operator costs (a GPU's) is left as it is."""
    import dataclasses

    from meshwise.cost.host_moe import part_key

    model = dataclasses.replace(load_model("tiny-moe"), experts=8)
    asked = []

    def moe(key, mbs):
        asked.append((key, mbs))
        return [*key, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3]

    shapes = plan_shapes.shapes_of(model, 64, 2, ep=2)
    assert shapes.moe_key == part_key(model, 128, 2) and shapes.moe_mbs == 2
    assert plan_shapes.shapes_of(model, 64, 2, tp=2, ep=2, folded=True).moe_key == part_key(model, 64, 2)
    assert plan_shapes.shapes_of(load_model("small"), 64, 2, ep=1).moe_key == ()
    assert plan_shapes.shapes_of(model, 64, 2).moe_key == ()  # no EP group given (train, before its layout)
    cpu = {"op_overhead_s": 5e-6}
    out, said = top_up(cpu, shapes, (None, None, None, moe))
    assert asked == [(part_key(model, 128, 2), 2)] and len(said) == 1 and "128 tokens" in said[0]
    assert out["moe_part_table"] == [[*part_key(model, 128, 2), 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3]]
    assert top_up(out, shapes, (None, None, None, moe)) == (out, [])  # the row is there: no timing
    assert top_up({"name": "h100"}, shapes, (None, None, None, moe)) == ({"name": "h100"}, [])
    assert len(asked) == 1
