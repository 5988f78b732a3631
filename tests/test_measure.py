"""Prediction beside measurement (meshwise measure), on the parity suite's layouts (tiny model, CPU, gloo).

For every layout and rank: predicted bytes per step of each collective kind and mesh dimension
within 1% of the measured (counts too), params, grads and optimizer within 10%, activations within
20%. Workers are launched once per world size and measure every layout of it in turn; the table is
printed (pytest -s) and is the fidelity table of docs/fidelity.md.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _transport import once_more_on_transport_error
from _parity_cases import CASES, MODEL_CASES

from meshwise.measure.compare import rows_for
from meshwise.measure.run import run_workers
from meshwise.spec import TrainSpec, load_cluster, load_model

MODEL = load_model("tiny")
TRAIN = TrainSpec(global_batch=8, seq_len=64, precision="fp32")
LAYOUTS = {w: [c.name for c in cases if not c.corrupt and c.measured] for w, cases in CASES.items()}
# The 8-rank launch also measures the other model cases of its size (``model:layout``: the mixture
# of experts under ep with cp); the other model cases are parity only.
LAYOUTS[8] += [c.name for c in MODEL_CASES.get(8, []) if not c.corrupt and c.measured]
TOLERANCE = {"comm": 0.01, "memory.params": 0.10, "memory.grads": 0.10, "memory.optimizer": 0.10,
             "memory.activations": 0.20}
_records: dict[int, list[list[dict]]] = {}


def records(world: int) -> list[list[dict]]:
    if world not in _records:
        _records[world] = once_more_on_transport_error(
            lambda: run_workers(world, LAYOUTS[world], "tiny", TRAIN.global_batch, TRAIN.seq_len, steps=0,
                                timeout_s=600))
    return _records[world]


def tolerance(figure: str) -> float | None:
    for prefix, tol in TOLERANCE.items():
        if figure.startswith(prefix):
            return tol
    return None


CASES_FLAT = [(w, i, name) for w, names in LAYOUTS.items() for i, name in enumerate(names)]


@pytest.mark.parametrize("world,index,layout", CASES_FLAT, ids=[f"{w}:{n}" for w, _, n in CASES_FLAT])
def test_prediction_matches_measurement(world: int, index: int, layout: str) -> None:
    cluster = load_cluster("cpu", world, world)
    model = load_model(layout.partition(":")[0]) if ":" in layout else MODEL
    bad = []
    for record in records(world)[index]:
        rows = rows_for(record, model, cluster, TRAIN)
        assert any(r.figure.startswith("comm.") for r in rows) or world == 1
        for r in rows:
            tol = tolerance(r.figure)
            if tol is not None and abs(r.rel_error) > tol:
                bad.append(f"rank {r.rank} {r.figure}: predicted {r.predicted:,.0f}, measured {r.measured:,.0f} "
                           f"({r.rel_error:+.1%}, tolerance {tol:.0%})")
        worst = {c: max(abs(r.rel_error) for r in rows if r.figure == f"memory.{c}")
                 for c in ("params", "grads", "optimizer", "activations")}
        print(f"{layout} rank {record['rank']}: " + ", ".join(f"{c} {e:.1%}" for c, e in worst.items()))
    assert not bad, "\n".join(bad)


def test_a_wrong_prediction_is_caught() -> None:
    """The comparison can fail: the same records judged for another layout disagree."""
    record = dict(records(2)[LAYOUTS[2].index("dp=2,zero=0")][0])
    record["layout"] = "dp=2,zero=3,shard=2,tp=1,sp=off,pp=1,vpp=1,schedule=1f1b,mbs=1,ac=none"
    rows = rows_for(record, MODEL, load_cluster("cpu", 2, 2), TRAIN)
    assert any(abs(r.rel_error) > 0.10 for r in rows if r.figure.startswith(("comm.", "memory.params")))


def test_measure_cli_json_and_bad_input() -> None:
    r = subprocess.run([sys.executable, "-m", "meshwise.cli", "measure", "--layout", "dp=2,zero=2", "--steps", "1",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    figures = {row["figure"] for row in rows}
    assert {"memory.params", "memory.grads", "memory.optimizer", "memory.activations", "memory.other",
            "comm.all_gather.dp.bytes_per_step", "comm.reduce_scatter.dp.count_per_step",
            "time.step_s", "time.compute_s", "time.comm_s", "time.idle_s"} <= figures
    assert {row["rank"] for row in rows} == {0, 1}
    for rank in (0, 1):  # the step's parts add up to it, measured and predicted
        time = {row["figure"]: row for row in rows if row["rank"] == rank and row["figure"].startswith("time.")}
        parts = [time[f"time.{p}"] for p in ("compute_s", "comm_s", "idle_s", "optimizer_s", "other_s")]
        for side in ("predicted", "measured"):
            assert abs(sum(p[side] for p in parts) - time["time.step_s"][side]) <= 1e-9 * time["time.step_s"][side]
    assert all(set(row) == {"figure", "rank", "predicted", "measured", "rel_error"} for row in rows)
    bad = subprocess.run([sys.executable, "-m", "meshwise.cli", "measure", "--layout", "tp=3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "tp" in bad.stderr and "Traceback" not in bad.stderr
