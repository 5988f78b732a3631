"""meshwise train end to end in one process (tests/_cli.py): a non-finite loss stops before its state
is saved; train, export and generate on a micro model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from _cli import meshwise_here
from _models import micro_model
from meshwise.train import checkpoint


def meshwise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """One-process commands: in this process (tests/_cli.py)."""
    return meshwise_here(*args, cwd=cwd)


def test_non_finite_loss_stops_before_saving_that_state(tmp_path) -> None:
    """A real NaN (every weight poisoned before step 2): exit 2, one line naming the step, and
    step 1's checkpoint is the last one; the metrics file holds step 1 only."""
    r = meshwise(
        "train",
        "--model",
        micro_model(tmp_path),
        "--seq-len",
        "16",
        "--steps",
        "4",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        "ck",
        "--checkpoint-every",
        "1",
        "--metrics",
        "m.jsonl",
        "--prompt=",
        "--inject-nan-at-step",
        "2",
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert "\n" not in err and "step 2: non-finite loss nan" in err and "last checkpoint is step-1" in err, err
    assert [s for s, _ in checkpoint.complete_checkpoints(tmp_path / "ck")] == [1]
    assert not list((tmp_path / "ck").glob("step-2*"))
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1]


def test_export_and_generate(tmp_path) -> None:
    from meshwise.train.export import hf_name, read_safetensors

    r = meshwise(
        "train",
        "--model",
        micro_model(tmp_path),
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        "ck",
        "--checkpoint-every",
        "1",
        "--keep",
        "2",
        "--metrics",
        "m.jsonl",
        "--prompt",
        "1 + 1 =",
        "--eval-every",
        "0",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-2", "step-3"]  # the last --keep 2
    assert "Sample from ck/step-3:\n1 + 1 =" in r.stdout
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in records] == [1, 2, 3] and "eval_loss" in records[-1]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_s", "peak_mem_bytes"):
        assert all(isinstance(rec[key], (int, float)) and rec[key] > 0 for rec in records), key

    r = meshwise("export", "--checkpoint", "ck/step-3", "--out", "hf/model.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    tensors, meta = read_safetensors(tmp_path / "hf" / "model.safetensors")
    assert meta["step"] == "3"
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["num_hidden_layers"] == 2 and hf_config["tie_word_embeddings"] is False

    from meshwise.train.export import load_plain_model

    model, _ = load_plain_model(tmp_path / "ck" / "step-3")
    params = dict(model.named_parameters())
    assert set(tensors) == {hf_name(n) for n in params}
    assert "model.layers.1.self_attn.k_proj.weight" in tensors and "lm_head.weight" in tensors
    for name, p in params.items():
        assert torch.equal(tensors[hf_name(name)], p.detach()), name

    r = meshwise(
        "generate",
        "--checkpoint",
        "ck",
        "--prompt",
        "7 + 1",
        "--tokens",
        "10",  # ck: its latest
        "--temperature",
        "0",
        cwd=tmp_path,
    )
    assert r.returncode == 0 and r.stdout.startswith("7 + 1") and len(r.stdout.rstrip("\n")) >= 6, r.stderr
    r = meshwise("export", "--checkpoint", "nowhere", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a complete meshwise checkpoint" in r.stderr
