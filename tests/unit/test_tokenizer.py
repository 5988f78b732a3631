"""A Hugging Face tokenizer: JSONL data encoded with it, generate stops at eos, a pre-tokenized file
equals the on-the-fly encoding (train, generate and export with it: tests/integration/
test_tokenizer_end_to_end.py)."""

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from _cli import meshwise_here  # noqa: E402
from _tokenizer import LINES, make_tokenizer  # noqa: E402
from meshwise.train.config import DataConfig  # noqa: E402
from meshwise.train.data import load_tokens  # noqa: E402
from meshwise.train.generate import generate_ids  # noqa: E402
from meshwise.train.tokenizer import HFTokenizer  # noqa: E402


def test_jsonl_is_encoded_by_the_tokenizer(tmp_path):
    tok_path = make_tokenizer(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": line + "\n"}) + "\n" for line in LINES))
    ids = load_tokens(DataConfig(path=str(data), tokenizer=tok_path))
    tok = HFTokenizer(tok_path)
    assert ids.tolist() == [i for line in LINES for i in tok.encode(line + "\n")]
    assert tok.decode(ids[:20].tolist()) == "".join(line + "\n" for line in LINES)[: len(tok.decode(ids[:20].tolist()))]
    assert ids.numel() < sum(len(line) + 1 for line in LINES) / 2  # BPE merges: far fewer ids than bytes


def test_generation_stops_at_eos():
    class Fixed(torch.nn.Module):
        def forward(self, x):  # always predicts (last id + 1)
            logits = torch.full((1, x.shape[1], 10), -1e9)
            logits[0, -1, (int(x[0, -1]) + 1) % 10] = 0.0
            return logits

    assert generate_ids(Fixed(), [3], 20, 0.0, 0, 0, 8, eos_ids=(6,)) == [3, 4, 5, 6]
    assert len(generate_ids(Fixed(), [3], 5, 0.0, 0, 0, 8)) == 6


def run(*args, cwd):
    """One-process commands: in this process (tests/_cli.py)."""
    return meshwise_here(*args, cwd=cwd)


def test_pretokenized_bin_equals_on_the_fly(tmp_path):
    tok_path = make_tokenizer(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": line + "\n"}) + "\n" for line in LINES))
    r = run("tokenize", "--data", str(data), "--tokenizer", tok_path, "--out", "d.bin", cwd=tmp_path)
    assert r.returncode == 0 and "uint16" in r.stdout, r.stderr
    fly = load_tokens(DataConfig(path=str(data), tokenizer=tok_path))
    pre = load_tokens(DataConfig(path=str(tmp_path / "d.bin"), bin_dtype="uint16"))
    assert pre.to(torch.int64).tolist() == fly.tolist()
    r = run("tokenize", "--data", str(data), "--tokenizer", str(tmp_path / "nope.json"), "--out", "x.bin", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not (tmp_path / "x.bin").exists(), r.stderr
