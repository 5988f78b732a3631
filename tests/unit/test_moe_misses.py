"""benchmarks/moe_misses.py: the listing of MoE runs beyond a threshold reads the same error as
benchmarks/fidelity.py, places each EP group by the NVLink domains it spans, and splits the step per layer call."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity import load_runs, predict  # noqa: E402
from moe_misses import ep_span, row  # noqa: E402


def _run(run_id: str, set_name: str):
    (run,) = load_runs(prefix=run_id, set_name=set_name)
    return run


@pytest.mark.parametrize(
    "run_id, set_name, span",
    [
        ("xtuner-h800-qwen3-235b-tp4-ep8-pp8-vp4", "test5", "nvl"),  # ep 8 folded over tp: one node
        ("mcore-modelzoo-qwen3-235b-deepep-ep32-pp8", "test", "x4"),  # ep 32 folded: 32 consecutive ranks
        ("dgxc-grok1-h100-512-bf16", "dev", "x4"),  # ep 8 carved tp 4 apart: 32 ranks, 4 nodes
        ("pai643-h800-qwen3-30b-a3b-pp4-ep4", "test5", "nvl"),
    ],
)
def test_ep_span_counts_the_domains_the_group_crosses(run_id, set_name, span):
    assert ep_span(_run(run_id, set_name)) == span


def test_row_reads_fidelitys_error_and_splits_the_step_per_layer_call():
    run = _run("xtuner-h800-qwen3-235b-tp4-ep8-pp8-vp4", "test5")
    error, lines = row(run)
    assert error == pytest.approx(predict(run) / run.published_step_s - 1)
    assert "| megatron | h800 x 256 | ep 8 nvl etp=1 | E 128 k 8 f 1536 h 4096 |" in lines
    calls = float(re.search(r"m 256, (\d+) layer calls", lines).group(1))
    assert calls == pytest.approx(256 * 94 / 8, abs=0.5)  # m x L_moe / pp
    published, miss = map(float, re.search(r"published ([\d.]+), miss ([+-][\d.]+)", lines).groups())
    assert published == pytest.approx(run.published_step_s * 1e3 / calls, abs=0.01)
    assert published - miss == pytest.approx(predict(run) * 1e3 / calls, abs=0.02)
