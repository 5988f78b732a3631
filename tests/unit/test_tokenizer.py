"""A Hugging Face tokenizer end to end: JSONL data encoded with it, generate encodes and decodes
with it and stops at eos, export copies it beside the weights."""

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from _cli import meshwise_here  # noqa: E402
from meshwise.train.config import DataConfig  # noqa: E402
from meshwise.train.data import load_tokens  # noqa: E402
from meshwise.train.generate import generate_ids  # noqa: E402
from meshwise.train.tokenizer import HFTokenizer  # noqa: E402

LINES = [f"{a} + {b} = {a + b}." for a in range(12) for b in range(12)]


def make_tokenizer(folder) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # spaces kept as U+2581
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<eos>"])
    tok.train_from_iterator([line + "\n" for line in LINES] * 4, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_jsonl_is_encoded_by_the_tokenizer(tmp_path):
    tok_path = make_tokenizer(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": line + "\n"}) + "\n" for line in LINES))
    ids = load_tokens(DataConfig(path=str(data), tokenizer=tok_path))
    tok = HFTokenizer(tok_path)
    assert ids.tolist() == [i for line in LINES for i in tok.encode(line + "\n")]
    assert tok.decode(ids[:20].tolist()) == "".join(line + "\n" for line in LINES)[:len(tok.decode(ids[:20].tolist()))]
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


def test_train_generate_export_with_a_tokenizer(tmp_path):
    tok_path = make_tokenizer(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": line + "\n"}) for line in LINES * 3).replace("}{", "}\n{") + "\n")
    r = run("train", "--model", "tiny", "--data", str(data), "--data.tokenizer", tok_path, "--seq-len", "16",
            "--steps", "2", "--nproc-per-node", "1", "--layout", "dp=1", "--checkpoint-dir", "ck",
            "--eval-every", "0", "--prompt", "3 + 4 =", "--generate.tokens", "5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Sample from" in r.stdout and "3 + 4 =" in r.stdout
    r = run("generate", "--checkpoint", "ck", "--prompt", "3 + 4 =", "--tokens", "4", "--temperature", "0",
            cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("3 + 4 ="), r.stderr
    r = run("export", "--checkpoint", "ck", "--out", "out/model.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()


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
