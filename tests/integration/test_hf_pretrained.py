"""Pretrained weights in: ``meshwise train --model.from DIR`` on a tiny model saved by transformers.

- ``--steps 0`` converts the folder into a checkpoint; ``export`` of it gives back the same tensors,
  bit for bit (one process, and under a sharded layout);
- 3 fine-tuning steps give the same losses under two layouts (1e-4);
- a folder whose weights disagree with its config is refused in one line, before any worker.
"""

import json
import subprocess
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from _cli import meshwise_here, meshwise_launch  # noqa: E402
from meshwise.train.export import read_safetensors  # noqa: E402

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=64,
)


def save_tiny(folder: Path, cls: str = "Qwen3Config", **kw) -> Path:
    cfg = getattr(transformers, cls)(**{**TINY, **kw})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return folder


def meshwise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command that launches workers: the launcher in this process, the workers new processes (tests/_cli.py)."""
    return meshwise_launch(*args, cwd=cwd, env={"OMP_NUM_THREADS": "1"})


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(read_safetensors(f)[0])
    return tensors


COMMON = ("--seq-len", "16", "--global-batch", "4", "--eval-every", "0", "--prompt", "")


@pytest.mark.parametrize(
    "cls, nproc, layout",
    [
        ("Qwen3Config", "1", "dp=1"),
        ("Phi3Config", "1", "dp=1"),
        ("Qwen3Config", "2", "dp=2,zero=3"),
        ("Qwen3Config", "2", "tp=2,sp=on"),
        ("Phi3Config", "2", "pp=2,schedule=1f1b"),
    ],
)
def test_steps_0_is_a_bit_exact_conversion(tmp_path, cls, nproc, layout):
    kw = {"pad_token_id": 0} if cls == "Phi3Config" else {"head_dim": 24}
    hf = save_tiny(tmp_path / "hf", cls, **kw)
    run = meshwise_here if nproc == "1" else meshwise  # one process starts no worker: tests/_cli.py
    r = run(
        "train",
        "--model.from",
        str(hf),
        "--steps",
        "0",
        "--nproc-per-node",
        nproc,
        "--layout",
        layout,
        "--checkpoint-dir",
        "ck",
        *COMMON,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ck" / "step-0").is_dir()
    r = meshwise_here("export", "--checkpoint", "ck", "--out", "out/model.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    want, got = hf_tensors(hf), hf_tensors(tmp_path / "out")
    assert set(got) == set(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["model_type"] == json.loads((hf / "config.json").read_text())["model_type"]


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def test_fine_tune_equal_under_two_layouts(tmp_path):
    hf = save_tiny(tmp_path / "hf", head_dim=24)
    runs = {}
    for layout in ("dp=2,zero=3", "tp=2,sp=on"):
        metrics = tmp_path / f"{layout}.jsonl"
        r = meshwise(
            "train",
            "--model.from",
            str(hf),
            "--steps",
            "3",
            "--nproc-per-node",
            "2",
            "--layout",
            layout,
            "--checkpoint-dir",
            "",
            "--metrics",
            str(metrics),
            *COMMON,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        runs[layout] = losses(metrics)
    print("fine-tuning losses per layout:", runs)
    a, b = runs.values()
    assert len(a) == 3 and a[0] < 6.0  # ln 256 = 5.5: a pretrained-size loss, not a crash
    assert a == pytest.approx(b, rel=1e-4)


def test_mismatched_folder_is_refused(tmp_path):
    hf = save_tiny(tmp_path / "hf", head_dim=24)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (hf / "config.json").write_text(json.dumps(cfg))
    # refused before any worker starts, so in this process (tests/_cli.py)
    r = meshwise_here("train", "--model.from", str(hf), "--steps", "1", "--nproc-per-node", "2", *COMMON, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "has shape" in r.stderr, r.stderr
    r = meshwise_here("train", "--model.from", str(tmp_path), "--steps", "1", *COMMON, cwd=tmp_path)
    assert r.returncode == 2 and "no config.json" in r.stderr, r.stderr


def test_step_0_eval_loss_equals_transformers_under_pp(tmp_path):
    """The forward under a layout is transformers' forward: the held-out loss printed at step 0
    (4 decimals) equals transformers' loss on the same held-out rows."""
    import re

    from meshwise.train.config import DataConfig
    from meshwise.train.data import build_corpus

    hf = save_tiny(tmp_path / "hf", head_dim=24)
    r = meshwise(
        "train",
        "--model.from",
        str(hf),
        "--steps",
        "0",
        "--nproc-per-node",
        "2",
        "--layout",
        "pp=2,schedule=1f1b",
        "--checkpoint-dir",
        "",
        "--seq-len",
        "16",
        "--global-batch",
        "4",
        "--eval-every",
        "1",
        "--schedule.eval_batches",
        "2",
        "--prompt",
        "",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    printed = float(re.search(r"eval loss at step 0: ([0-9.]+)", r.stdout).group(1))
    corpus = build_corpus(DataConfig(seq_len=16), 256)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(2):
            x, y = corpus.eval_rows(b, 4, range(4))
            logits = model(x).logits
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
    assert printed == pytest.approx(total / count, abs=6e-5)
