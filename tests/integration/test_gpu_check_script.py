"""scripts/gpu_check.sh (benchmarks/gpu_check.py) through its CPU path: the same steps as on a GPU at
toy sizes, end to end (about 60-100 s on a loaded 2-core host, most of it torchtitan's start-up);
and its refusal on a machine without a CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _env(path: str) -> dict[str, str]:
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def test_without_a_cuda_device_it_exits_2_in_one_line(tmp_path):
    bare = tmp_path / "bin"  # a PATH with python but no nvidia-smi
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--out-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=_env(f"{bare}:/usr/bin:/bin"),
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no CUDA device" in done.stderr and "--cpu" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_cpu_path_runs_every_step(tmp_path):
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu", "--no-venv", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(path),
        timeout=400,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    text = (tmp_path / "gpu-check-cpu.txt").read_text()
    assert text.startswith("# gpu check: cpu, ")
    # the calibration's parts, each printed as it ends, and the profile plan --gpu reads (measure predicted with it)
    for part in (
        "GEMMs bf16",
        "grouped GEMMs bf16",
        "GEMMs fp8",
        "attention (SDPA forward, backward)",
        "memory-bound (copy)",
        "sustained clock",
        "collectives (2 ranks)",
    ):
        assert f"calibrate: {part}: " in text, part
    assert "gemm.bf16 = { efficiency = " in text and 'attention.meshwise = { kernel = "sdpa"' in text
    assert "## measure tiny dp=1,mbs=1 auto: exit 0" in text
    assert "  step " in text and " MFU " in text and "memory.total: " in text
    assert "## measure fp8: left out" in text
    assert "torchtitan --module llama3 --config llama3_debugmodel" in text
    assert "FlexAttention has no CPU backward" in text
    assert text.rstrip().splitlines()[-1].startswith("# 3 of 3 steps passed")
