"""``verify``'s predicted memory is ``plan --json``'s for the same layout and rank: the
prediction is fixed before anything is traced. Single process, no tracing: a record with the
measured side left empty is compared, so only the predicted column is read."""

from __future__ import annotations

import json

import pytest

from meshwise.cli import main
from meshwise.layout import parse
from meshwise.measure import verify as v
from meshwise.measure.compare import MEMORY
from meshwise.spec import default_seq_len, load_cluster, load_model

# (model, gpus, layout, global batch): dense without and with PP, ZeRO-1/2/3, TP, interleaved, full
# checkpointing, and the Llama 3 70B layout (plan 68.03 GB, verify 63.48 GB before the fix)
CASES = [
    ("llama3-70b", 64, "dp=32,zero=3,tp=2,mbs=1,ac=selective", 512),
    ("llama3-70b", 64, "pp=4,dp=2,zero=1,tp=8", 8),
    ("llama3-70b", 64, "dp=64,zero=3", 64),
    ("llama3-8b", 16, "pp=2,dp=4,zero=2,tp=2,ac=full", 64),
    ("llama3-405b", 512, "pp=8,vpp=2,dp=8,zero=1,tp=8,schedule=interleaved-1f1b,ac=selective", 64),
]


def _plan(capsys, model: str, gpus: int, layout: str, batch: int) -> dict:
    assert (
        main(
            ["plan", "--model", model, "--gpus", str(gpus), "--layout", layout, "--global-batch", str(batch), "--json"]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)["candidates"][0]


@pytest.mark.parametrize("model_name,gpus,text,batch", CASES, ids=[c[2] for c in CASES])
def test_verify_predicts_what_plan_prints(model_name: str, gpus: int, text: str, batch: int, capsys) -> None:
    planned = _plan(capsys, model_name, gpus, text, batch)
    model, cluster = load_model(model_name), load_cluster("h100", gpus)
    layout = parse(text, gpus)
    train = v.verify_train(cluster, batch, default_seq_len(model))
    per_stage = gpus // layout.pp
    ranks = planned["rank_memory"]
    assert sorted(p for r in ranks for p in r["pp_ranks"]) == list(range(layout.pp))  # every rank, once
    largest = max(ranks, key=lambda r: r["total"])
    assert planned["memory"] == {k: v_ for k, v_ in largest.items() if k != "pp_ranks"}
    for entry in ranks:
        for pp_rank in entry["pp_ranks"]:  # the lowest stands for the others (rank_shapes): the same figures
            record = {
                "layout": layout.format(),
                "rank": pp_rank * per_stage + per_stage - 1,
                "pp_rank": pp_rank,
                "memory": {},
                "comm": [],
            }
            rows = {r.figure: r.predicted for r in v.verify_rows(model, cluster, train, record)}
            for c in (*MEMORY, "total"):
                assert rows[f"memory.{c}"] == pytest.approx(entry[c], abs=1.0), (pp_rank, c)
            assert not any(f.startswith("peak_moved.") for f in rows)  # nothing was traced: no moment seen


def test_a_moved_peak_is_reported_beside_the_plans() -> None:
    """The issue's layout peaks (by the plan) at the end of a forward; a trace whose peak fell inside
    a module's backward keeps the plan's rows and adds the largest predicted of the moments that
    can be (late in a block's backward here), whatever the measured total."""
    model, cluster = load_model("llama3-70b"), load_cluster("h100", 64)
    layout = parse("dp=32,zero=3,tp=2,mbs=1,ac=selective", 64)
    train = v.verify_train(cluster, 512, 4096)
    base = {"layout": layout.format(), "rank": 0, "pp_rank": 0, "memory": {"Activation": 68e9}, "comm": []}
    plain = {r.figure: r for r in v.verify_rows(model, cluster, train, base)}
    same = {r.figure: r for r in v.verify_rows(model, cluster, train, {**base, "peak_moments": ["forward"]})}
    assert same == plain
    for measured in (60e9, 68e9, 75e9):  # the moved moment is chosen by prediction, not by the measurement
        record = {**base, "memory": {"Activation": measured}, "peak_moments": ["backward"]}
        rows = {r.figure: r for r in v.verify_rows(model, cluster, train, record)}
        assert {f: r.predicted for f, r in plain.items()} == {f: rows[f].predicted for f in plain}
        moved = sorted(f for f in rows if f.startswith("peak_moved."))
        assert moved == sorted(f"peak_moved.block.{c}" for c in (*MEMORY, "total"))
        assert rows["peak_moved.block.total"].predicted < rows["memory.total"].predicted
