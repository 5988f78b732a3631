"""Layout text form and validation (docs/design.md)."""

from dataclasses import fields

import pytest

from meshwise.errors import MeshwiseError
from meshwise.layout import Degrees, Layout, chunk_rank, parse, stage_layers, validate
from meshwise.spec import load_model


def test_defaults_and_round_trip():
    lay = parse("tp=2,pp=2", world_size=16)
    assert (lay.dp, lay.zero, lay.shard, lay.sp, lay.vpp, lay.schedule, lay.mbs, lay.ac) == (
        4,
        0,
        4,
        True,
        1,
        "1f1b",
        1,
        "none",
    )
    assert parse(lay.format()) == lay
    assert parse("pp=2,vpp=2", world_size=4).schedule == "interleaved-1f1b"
    hsdp = parse("dp=4,zero=3,shard=2")
    assert hsdp.replicate == 2 and hsdp.mesh_shape == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 1}
    assert parse(hsdp.short()) == hsdp


@pytest.mark.parametrize(
    "text, match",
    [
        ("tp=two", "tp"),
        ("foo=1", "unknown key 'foo'"),
        ("zero=4", "zero=4"),
        ("dp=4,shard=3,zero=1", "shard=3"),
        ("schedule=zigzag", "schedule"),
        ("ac=some", "ac"),
        ("pp=2,vpp=2,schedule=1f1b", "vpp"),
        ("dp", "key=value"),
        ("pp=2,schedule=interleaved-1f1b", "vpp >= 2"),
        ("dp=4,shard=2", "zero"),
        ("dp=4,ep=3", "ep=3 must divide .*dp_shard = 4.*valid ep: 1, 2, 4"),
        ("dp=4,zero=1,shard=2,ep=4", "ep=4"),
        ("ep=0", "ep=0 must be at least 1"),
    ],
)
def test_parse_errors_name_the_field(text, match):
    with pytest.raises(MeshwiseError, match=match):
        parse(text)


def test_validate():
    tiny = load_model("tiny")  # 4 layers, 4 heads, 2 KV heads
    validate(parse("dp=2,tp=2"), tiny, 4, 8)
    with pytest.raises(MeshwiseError, match="world size is 8"):
        validate(parse("dp=2,tp=2"), tiny, 8, 8)
    with pytest.raises(MeshwiseError, match="kv_heads"):
        validate(parse("tp=4"), tiny, 4, 8)
    with pytest.raises(MeshwiseError, match="heads"):
        validate(parse("tp=3"), load_model("llama3-8b"), 3, 8)
    with pytest.raises(MeshwiseError, match="not divisible by mbs\\*dp"):
        validate(parse("dp=4,mbs=4"), tiny, 4, 8)
    with pytest.raises(MeshwiseError, match="more than the model's 4 layers"):
        validate(parse("pp=4,vpp=2"), tiny, 4, 8)


def test_stage_split_balances_and_keeps_ends_light():
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layers(4, 2) == [2, 2]
    assert sum(stage_layers(105, 35 * 3)) == 105
    counts = stage_layers(10, 4)
    assert counts == [2, 3, 3, 2] and max(counts) - min(counts) <= 1


def test_chunk_placement():
    assert [chunk_rank(c, 2, 2, "interleaved-1f1b") for c in range(4)] == [0, 1, 0, 1]
    assert [chunk_rank(c, 2, 2, "zero-bubble") for c in range(4)] == [0, 1, 1, 0]
    assert Layout().world_size == 1


def test_ep_round_trip_and_validation():
    from meshwise.layout import expert_mesh_shape

    lay = parse("dp=8,zero=3,shard=4,ep=2,tp=2", world_size=16)
    assert lay.ep == 2 and parse(lay.format()) == lay and parse(lay.short()) == lay and "ep=2" in lay.short()
    assert parse("tp=2").ep == 1 and "ep" not in parse("tp=2").short()
    assert expert_mesh_shape(lay) == {"pp": 1, "dp_replicate": 2, "dp_shard_mod_ep": 2, "ep": 2, "tp": 2}
    moe = load_model("tiny-moe")  # 4 experts
    validate(parse("dp=4,ep=4"), moe, 4, 8)
    with pytest.raises(MeshwiseError, match="needs a mixture-of-experts model"):
        validate(parse("dp=2,ep=2"), load_model("tiny"), 2, 8)
    with pytest.raises(MeshwiseError, match="ep=8 does not divide the model's 4 experts; valid ep: 1, 2, 4"):
        validate(parse("dp=8,ep=8"), moe, 8, 8)
    with pytest.raises(
        MeshwiseError,
        match=r"ep=3 must divide the ranks it is carved from \(dp_shard = 4\); "
        "valid ep: 1, 2, 4",
    ):
        parse("dp=4,ep=3")


def test_ep_is_carved_from_dp_shard_and_cp():
    """With cp the EP group spans the cp ranks first, then dp_shard ones, tp apart; experts are
    sharded by ZeRO over the dp_shard * cp / ep ranks left; ep must divide dp_shard * cp."""
    from meshwise.layout import MESH_DIMS, expert_group_ranks, expert_mesh_shape

    moe = load_model("tiny-moe")  # 4 experts
    lay = parse("dp=4,zero=3,cp=2,ep=4", 8)  # mesh (pp 1, dp_replicate 1, dp_shard 4, cp 2, tp 1)
    validate(lay, moe, 8, 8)
    assert lay.format().startswith("dp=4,zero=3,shard=4,ep=4,cp=2") and parse(lay.short(), 8) == lay
    assert expert_mesh_shape(lay) == {"pp": 1, "dp_replicate": 1, "dp_shard_mod_ep": 2, "ep": 4, "tp": 1}
    assert expert_group_ranks(lay, 5, "ep") == (4, 5, 6, 7)  # dp_shard 2-3 x cp 0-1
    assert expert_group_ranks(lay, 5, "dp_shard_mod_ep") == (1, 5)
    two = parse("dp=2,cp=2,ep=2,tp=2", 8)  # rank = (dp_shard * 2 + cp) * 2 + tp
    assert expert_group_ranks(two, 1, "ep") == (1, 3)  # the cp pair of dp_shard 0, tp 1: the cp group
    assert expert_group_ranks(two, 1, "dp_shard_mod_ep") == (1, 5)
    hsdp = parse("dp=4,zero=3,shard=2,cp=2,ep=2,pp=2", 16)
    assert expert_mesh_shape(hsdp) == {"pp": 2, "dp_replicate": 2, "dp_shard_mod_ep": 2, "ep": 2, "tp": 1}
    assert expert_group_ranks(hsdp, 9, "ep") == (8, 9) and expert_group_ranks(hsdp, 9, "dp_shard_mod_ep") == (9, 11)
    shape = [lay.mesh_shape[d] for d in MESH_DIMS]  # same ranks, same order: a reshape of dp_shard x cp
    assert shape[2] * shape[3] == expert_mesh_shape(lay)["dp_shard_mod_ep"] * expert_mesh_shape(lay)["ep"]
    for world, text in ((8, "dp=2,cp=4,ep=4"), (8, "dp=2,cp=4,ep=8"), (4, "dp=1,cp=4,ep=2")):
        validate(parse(text, world), load_model("tiny-moe") if "ep=8" not in text else _moe(8), world, 8)
    with pytest.raises(
        MeshwiseError,
        match=r"ep=8 must divide the ranks it is carved from "
        r"\(dp_shard x cp = 2 x 2 = 4\); valid ep: 1, 2, 4",
    ):
        parse("dp=2,cp=2,ep=8", 4)
    with pytest.raises(MeshwiseError, match="ep=8 does not divide the model's 4 experts; valid ep: 1, 2, 4$"):
        validate(parse("dp=4,cp=2,ep=8", 8), moe, 8, 8)


def _moe(experts: int):
    from dataclasses import replace

    return replace(load_model("tiny-moe"), experts=experts)


def test_cp_key() -> None:
    """cp: a mesh dim between dp_shard and tp, in the world size, the dp default and the round trip;
    the sequence must split into 2*cp chunks, and under SP each rank's part over tp."""
    from meshwise.layout import MESH_DIMS, runtime_refusal
    from meshwise.spec import load_model

    layout = parse("cp=2,zero=3,tp=2", 8)
    assert (layout.dp, layout.cp, layout.world_size) == (2, 2, 8)
    assert MESH_DIMS == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert list(layout.mesh_shape.values()) == [1, 1, 2, 2, 2]
    assert parse(layout.format()) == layout and "cp=2" in layout.short()
    model = load_model("tiny")
    assert runtime_refusal(layout, model, 32) is None
    assert "divisible by 2*cp = 4" in runtime_refusal(layout, model, 30)
    assert "per cp rank (36 / cp=2) divisible by tp=4" in runtime_refusal(parse("cp=2,tp=4", 8), model, 36)
    with pytest.raises(MeshwiseError, match="cp=0 must be at least 1"):
        parse("cp=0")


def test_degrees_are_the_layout_but_mbs_and_ac():
    """Degrees holds Layout's fields but mbs and ac (and etp, a run's stated expert TP that the search never
    sets), in Layout's order and under its names, and the two convert both ways without losing a field."""
    assert Degrees._fields == tuple(f.name for f in fields(Layout) if f.name not in ("mbs", "ac", "etp"))
    lay = parse("dp=8,zero=3,shard=4,ep=2,cp=2,tp=2,sp=off,pp=2,vpp=2,schedule=interleaved-1f1b,mbs=2,ac=full", 64)
    assert lay.degrees.layout(lay.mbs, lay.ac) == lay
    assert lay.degrees.layout() == Layout(**{**lay.__dict__, "mbs": 1, "ac": "none"})
    assert hash(lay.degrees) == hash(parse(lay.format(), 64).degrees)
