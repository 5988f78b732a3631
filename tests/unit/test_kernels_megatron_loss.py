"""Megatron's loss bytes per logit, counted on megatron-core's own cross-entropy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshwise.cost import kernels
from meshwise.spec import TrainSpec


def test_unfused_loss_bytes_are_megatron_cores_own():
    """benchmarks/megatron_loss_bytes.py runs the installed megatron-core's vocab_parallel_cross_entropy on
    CPU and counts the bytes its ops move per logit: the sum is PASSES["megatron"]["loss_bytes"]."""
    pytest.importorskip("megatron.core", reason="megatron-core is the oracle of --runtime megatron")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "megatron_loss_bytes.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    counted = json.loads(run.stdout.strip().splitlines()[-1])
    assert counted["forward"] + counted["backward"] == pytest.approx(kernels.PASSES["megatron"]["loss_bytes"])


def test_loss_fusion_picks_the_fused_bytes():
    """A run with --cross-entropy-loss-fusion moves the logits once each way; meshwise's runtime refuses it."""
    fused = TrainSpec(8, 4096, runtime="megatron", loss_fusion=True)
    assert kernels.ops_key(fused) == "megatron-fused-loss"
    assert kernels.PASSES[kernels.ops_key(fused)]["loss_bytes"] < kernels.PASSES["megatron"]["loss_bytes"]
    assert kernels.ops_key(TrainSpec(8, 4096, runtime="megatron")) == "megatron"
    with pytest.raises(Exception, match="loss_fusion"):
        TrainSpec(8, 4096, loss_fusion=True)
