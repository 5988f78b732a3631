"""benchmarks/cpu_time_grid.py's ``--replay``: saves measured in parts keep their own profiles."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cpu_time_grid as grid  # noqa: E402

PROFILE = """name = "cpu-test"
memory_bytes = 8000000000
peak_bf16_flops_per_s = 1e11
peak_fp32_flops_per_s = 1e11
hbm_bytes_per_s = 2e10
gpus_per_node = 2
intra_bytes_per_s = 1e9
intra_latency_s = 3e-4
inter_bytes_per_s = 1e9
inter_latency_s = 3e-4
efficiency_max = 0.5
comm_overlap = false
op_overhead_s = {op}
cores_per_node = 2
"""


def _save(op_s: float) -> dict:
    point = {"point": [2, 64, "dp=2,mbs=1", 4, 128], "steps": [{"step_s": 0.1, "round": 0}]}
    return {"profiles": {"2": [PROFILE.format(op=op_s)]}, "drifts": [], "points": [point]}


def test_parts_at_the_same_process_count_are_predicted_with_their_own_profiles(tmp_path):
    """Two saves at 2 processes, one profile's operators 10x the other's: merged, each point keeps its
    save's profile (keyed by part), so the same point is predicted twice, slower with the slower
    profile, and each as its save alone predicts it."""
    files = {64: str(tmp_path / "h64.toml")}
    Path(files[64]).write_text(grid.model_toml(64))
    fast, slow = _save(5e-6), _save(5e-5)
    both = grid.merged([fast, slow])
    assert sorted(both["profiles"]) == ["0:2", "1:2"] and [p["part"] for p in both["points"]] == [0, 1]
    rows = grid.predict(both, files, tmp_path)
    alone = [grid.predict(s, files, tmp_path)[0]["pred"].step_s for s in (fast, slow)]
    assert [r["pred"].step_s for r in rows] == alone and alone[0] < alone[1]
