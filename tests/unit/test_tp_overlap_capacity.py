"""Megatron-LM's TP communication overlap as a run's setting (off by default, as its ``--tp-comm-overlap``
flag is), read alike by the time model and Megatron-Core's memory; and device capacity as what the
device gives the program (CUDA's total, between the marketed GB and nvidia-smi's total)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshwise.cli import main
from meshwise.cost.estimate import estimate
from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.plan import emit
from meshwise.spec import TrainSpec, load_cluster, load_model

MIB = 2**20
ARGS_TABLE = Path(__file__).parent.parent / "data" / "megatron_lm_args.json"
# (catalog name, marketed bytes, nvidia-smi's total in MiB with its source)
CAPACITIES = [
    ("a100-40gb", 40e9, 40_960),  # modal-labs/modal-client#2797
    ("a100-80gb", 80e9, 81_920),  # modal-labs/modal-client#2797
    ("h100", 80e9, 81_559),  # NVIDIA/nccl#1264
    ("h800", 80e9, 81_559),  # the H100 80GB HBM3's memory
    ("h200", 141e9, 143_771),  # thundergolfer.com/blog/nvidia-gpu-memory-capacity
    ("b200", 180e9, 183_359),  # NVIDIA/TensorRT-LLM#10278
]


@pytest.mark.parametrize("gpu, marketed, smi_mib", CAPACITIES)
def test_capacity_is_what_the_program_gets(gpu, marketed, smi_mib):
    """More than the marketed GB (the HBM is that many GiB, less what the driver keeps), less than
    nvidia-smi's total (which counts the driver's reserve)."""
    got = load_cluster(gpu, 8).accelerator.memory_bytes
    assert marketed < got < smi_mib * MIB
    assert got > 0.98 * smi_mib * MIB  # the driver keeps under 2%: 551 MiB of the H100's 81,559


def test_megatron_default_is_no_tp_overlap():
    """Megatron-LM's ``--tp-comm-overlap`` is a store_true flag (tests/data/megatron_lm_args.json, from
    core_v0.16.1's arguments.py) and megatron-core's ModelParallelConfig.tp_comm_overlap defaults to False."""
    table = json.loads(ARGS_TABLE.read_text())["arguments"]["--tp-comm-overlap"]
    assert table["kind"] == "storetrue"
    assert not TrainSpec(64, 4096, runtime="megatron").overlap_tp_comm
    assert TrainSpec(64, 4096, runtime="megatron", overlap_tp_comm=True).overlap_tp_comm
    with pytest.raises(MeshwiseError, match="--tp-comm-overlap"):
        TrainSpec(64, 4096, overlap_tp_comm=True)  # meshwise's runtime (DTensor) has no such overlap


@pytest.mark.parametrize("sp", ["on", "off"])
def test_time_and_memory_agree_on_overlap(sp):
    """With SP, overlap hides TP time and holds userbuffers (12 of ``[s, h]``: 8 all-gather, 4 reduce-scatter,
    bf16); without SP Megatron-LM refuses the overlap, so neither the time nor the memory changes."""
    model, cluster = load_model("llama3-70b"), load_cluster("h100", 64)
    layout = parse(f"dp=2,zero=1,tp=8,sp={sp},pp=4,vpp=5", 64)
    off = estimate(model, cluster, TrainSpec(128, 8192, runtime="megatron"), layout)
    on = estimate(model, cluster, TrainSpec(128, 8192, runtime="megatron", overlap_tp_comm=True), layout)
    assert off.memory.other == 0
    if sp == "on":
        assert on.memory.other == pytest.approx(8192 * model.hidden * 2 * 12)
        assert on.tokens_per_s > off.tokens_per_s
    else:
        assert on.memory.other == 0 and on.tokens_per_s == off.tokens_per_s


def test_emitted_megatron_flag_follows_the_setting():
    """``--tp-comm-overlap`` is emitted only when asked for and the layout has SP (Megatron-LM's rule)."""
    model = load_model("llama3-70b")
    with_sp, without = parse("dp=2,zero=1,tp=8,pp=4,vpp=5", 64), parse("dp=2,zero=1,tp=8,sp=off,pp=4,vpp=5", 64)
    on = emit.emit("megatron", emit.Target(model, with_sp, 128, 8192, "bf16-mixed", 64, 8, tp_comm_overlap=True))
    assert "--tp-comm-overlap" in on
    assert "--tp-comm-overlap" not in emit.emit("megatron", emit.Target(model, with_sp, 128, 8192, "bf16-mixed", 64, 8))
    assert "--tp-comm-overlap" not in emit.emit(
        "megatron", emit.Target(model, without, 128, 8192, "bf16-mixed", 64, 8, tp_comm_overlap=True)
    )


def test_cli_refuses_overlap_without_megatron(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--tp-comm-overlap"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tp-comm-overlap" in err[0] and "--runtime megatron" in err[0]
