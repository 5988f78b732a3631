"""meshwise verify of a mixture of experts in float8 with expert parallelism: Qwen3-30B-A3B
(its published config.json) at dp=16,zero=3,ep=8 on 16 H100 under --precision fp8, one rank traced on
fake devices with balanced routing (measure/verify_worker.py; the plan prices the same). The plan's
total per rank, float8 copies included (cost/fp8.float8_copy_bytes: the routed experts, bf16 in
meshwise's runtime, have none), against the traced peak; and the all-to-all's bytes, exact. About 90 s
on one idle core (2026-12-07: plan 73.70 GB, traced 70.49 GB, +4.6%)."""

from __future__ import annotations

import pytest
from tests._moe_configs import CONFIGS

from meshwise.layout import parse
from meshwise.measure import verify as v
from meshwise.spec import TrainSpec, load_cluster
from meshwise.spec.hf_config import model_from_hf_config

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")


def test_fp8_moe_memory_within_ten_percent_of_the_trace():
    model = model_from_hf_config(CONFIGS["qwen3-30b-a3b"], "qwen3-30b-a3b")
    cluster = load_cluster("h100", 16)
    train = TrainSpec(global_batch=32, seq_len=4096, precision="fp8")
    rows, _ = v.verify(model, cluster, train, parse("dp=16,zero=3,ep=8", 16), [0])
    by = {r.figure: r for r in rows}
    total = by["memory.total"]
    assert abs(total.predicted / total.measured - 1) < 0.10, (total.predicted, total.measured)
    a2a = [
        r for f, r in by.items() if f.startswith("comm.all_to_all.") and f.endswith(".bytes_per_step") and r.predicted
    ]
    assert a2a and all(r.predicted == pytest.approx(r.measured, rel=1e-6) or r.measured == 0 for r in a2a)
    traced = sum(
        r.measured for f, r in by.items() if f.startswith("comm.all_to_all.") and f.endswith(".bytes_per_step")
    )
    assert traced == pytest.approx(sum(r.predicted for r in a2a), rel=1e-6)
