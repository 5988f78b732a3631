"""A Hugging Face tokenizer end to end: train on JSONL data encoded with it, generate with it,
export copies it beside the weights (one process, tests/_cli.py)."""

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("torch")

from _cli import meshwise_here  # noqa: E402
from _tokenizer import LINES, make_tokenizer  # noqa: E402


def run(*args, cwd):
    """One-process commands: in this process (tests/_cli.py)."""
    return meshwise_here(*args, cwd=cwd)


def test_train_generate_export_with_a_tokenizer(tmp_path):
    tok_path = make_tokenizer(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": line + "\n"}) for line in LINES * 3).replace("}{", "}\n{") + "\n")
    r = run(
        "train",
        "--model",
        "tiny",
        "--data",
        str(data),
        "--data.tokenizer",
        tok_path,
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--nproc-per-node",
        "1",
        "--layout",
        "dp=1",
        "--checkpoint-dir",
        "ck",
        "--eval-every",
        "0",
        "--prompt",
        "3 + 4 =",
        "--generate.tokens",
        "5",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Sample from" in r.stdout and "3 + 4 =" in r.stdout
    r = run(
        "generate", "--checkpoint", "ck", "--prompt", "3 + 4 =", "--tokens", "4", "--temperature", "0", cwd=tmp_path
    )
    assert r.returncode == 0 and r.stdout.startswith("3 + 4 ="), r.stderr
    r = run("export", "--checkpoint", "ck", "--out", "out/model.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
