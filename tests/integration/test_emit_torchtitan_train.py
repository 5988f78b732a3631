"""torchtitan 0.3.0 runs ``plan --emit torchtitan``'s configuration of its debug model at dp=2 (two
processes, FSDP over gloo on CPU): its own trainer builds the planned mesh, shards the model and
derives the planned accumulation from the emitted batch flags.

On a CPU-only torch, torchtitan 0.3.0 cannot take a training step: every language-model config it
registers uses FlexAttention (or varlen attention), and torch's FlexAttention has no CPU backward
(``NotImplementedError: FlexAttention does not support backward on CPU``). So here the test checks
everything up to that backward, and the error itself; with two CUDA devices it checks 3 steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests._torchtitan import DEBUG, STUBS, command_args, config_manager

from meshwise.layout import parse
from meshwise.plan import emit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = [f"the quick brown fox {i} jumps over the lazy dog number {i * 7} and keeps running" for i in range(200)]


def _assets(tmp_path) -> tuple[str, str]:
    """A 500-token BPE tokenizer (torchtitan's debug model has 2,048 embeddings) and a text data set."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok_dir, data_dir = tmp_path / "tokenizer", tmp_path / "data"
    tok_dir.mkdir()
    data_dir.mkdir()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TEXT, trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"])
    )
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    )
    (data_dir / "rows.txt").write_text("\n".join(TEXT))
    return str(tok_dir), str(data_dir)


def test_torchtitan_runs_the_emitted_debug_model_at_dp2(tmp_path):
    config_manager()  # skips without torchtitan
    import torch

    target = emit.Target(DEBUG, parse("dp=2,zero=3", 2), 4, 128, "bf16-mixed", 2, 8)
    args = command_args(emit.emit("torchtitan", target), "torchtitan.train")
    tok, data = _assets(tmp_path)
    local = [
        "--training.steps",
        "3",
        "--hf_assets_path",
        tok,
        "--dataloader.dataset_path",
        data,
        "--dump_folder",
        str(tmp_path / "out"),
        "--metrics.log_freq",
        "1",
    ]
    args = args[:-1] + local + args[-1:]  # the checkpointing subcommand stays last
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([STUBS, ROOT, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        os.path.join(ROOT, "tests", "_titan_cpu_train.py"),
        *args,
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    log = run.stdout + run.stderr
    # torchtitan's own trainer: the planned mesh, FSDP, and the accumulation it derives from the flags
    mesh = "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=1"
    assert mesh in log, log[-3000:]
    assert "Applied FSDP to the model" in log
    assert (
        "Trainer is initialized with local batch size 1, global batch size 4, gradient accumulation steps 2, "
        "sequence length 128, total steps 3"
    ) in log
    assert "Training starts at step 1" in log
    if torch.cuda.device_count() >= 2:
        assert run.returncode == 0 and re.search(r"step:\s*3\b", log), log[-3000:]
    else:
        assert run.returncode != 0
        assert "FlexAttention does not support backward on CPU" in log, log[-3000:]
