"""benchmarks/moe_host_whatif.py: the guide's steps converted to ms per MoE layer call add up to its published
figures, and the what-if's host calls are the op model's counted kernels."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity import load_runs  # noqa: E402
from moe_host_whatif import GUIDE, guide_steps, host_calls, layer_calls  # noqa: E402


def test_guide_steps_start_at_the_published_step_and_save_what_the_table_gains():
    (run,) = load_runs("mcore-dsv3-gb200-guide-alltoall-256")
    rows = guide_steps()
    calls = layer_calls(run)
    assert calls == pytest.approx(64 * 58 / 8)  # m x L_moe / pp
    assert rows[0][1] == pytest.approx(run.published_step_s * 1e3 / calls)
    assert rows[-1][1] == pytest.approx(rows[0][1] * GUIDE[0][1] / GUIDE[-1][1])  # 494.46 -> 970.01 TFLOP/s
    assert sum(saved for _, _, saved in rows) == pytest.approx(rows[0][1] - rows[-1][1])
    (deepep,) = load_runs("mcore-dsv3-gb200-guide-deepep-256")  # the DeepEP row's own entry, same layout
    assert rows[3][1] == pytest.approx(deepep.published_step_s * 1e3 / calls, rel=1e-4)


@pytest.mark.parametrize(
    "run_id, calls",
    [
        ("mcore-dsv3-gb200-guide-alltoall-256", 70 + 16 + 6 + 8 * 6),  # sigmoid router, alltoall permute, 8 experts
        ("mcore-dsv3-gb200-guide-deepep-256", 70 + 14 + 8 * 6),  # DeepEP's kernels instead
        ("dgxc-grok1-gb200-128-bf16", 33 + 16 + 6 + 1 * 6),  # softmax router, 8 experts over ep 8
    ],
)
def test_host_calls_are_the_counted_kernels(run_id, calls):
    (run,) = load_runs(run_id)
    assert host_calls(run) == calls
