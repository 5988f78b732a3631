"""Tokens, sequences and the sample order.

- Tokenizer: bytes (vocabulary 256, no download): a text is its UTF-8 bytes; or, with
  ``data.tokenizer``, a Hugging Face ``tokenizer.json`` (train/tokenizer.py), which also reads
  JSONL and Parquet documents by ``data.text_field``.
- Inputs: the embedded corpus (``data.path = ""``), a text file, a folder of text files (every
  non-hidden file below it, sorted by relative path, joined by a blank line), or a pre-tokenized
  ``.bin`` array of ``uint16``/``uint32`` ids, memory-mapped (``torch.from_file``).
- Sequences: the token stream is cut into windows of ``seq_len + 1`` tokens, ``seq_len`` apart
  (window i = tokens[i*seq_len : (i+1)*seq_len + 1]; inputs are its first seq_len tokens, targets
  its last seq_len). The last ``ceil(eval_fraction * n)`` windows are held out for the eval loss.
- Order: global sample g (counted from the start of the run, over all steps) is training window
  ``perm_e[g mod n]`` with epoch ``e = g div n`` and ``perm_e`` a permutation drawn from a generator
  seeded by crc32("seed:e"). It is a pure function of (seed, g): any layout, world size or resume
  point sees the same samples. Step s uses samples [s*B, (s+1)*B) (B = global batch); data-parallel
  replica r takes rows [r*R, (r+1)*R) of them (R = mbs * accum), so replicas are disjoint.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from meshwise.errors import MeshwiseError
from meshwise.train import embedded_corpus
from meshwise.train.config import DataConfig
from meshwise.train.tokenizer import HFTokenizer, encode_files

VOCAB = 256
_CHUNK = 1 << 24  # tokens per pass of the vocabulary check (bounded memory on large .bin arrays)
_BIN_DTYPES = {"uint16": (torch.uint16, 2), "uint32": (torch.uint32, 4)}


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab = VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def _text_files(folder: Path) -> list[Path]:
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    return files


def describe_source(path: str) -> str:
    return "the embedded corpus" if not path else path


def load_tokens(config: DataConfig) -> torch.Tensor:
    """The whole token stream as a 1-D tensor (uint8 for text; the .bin dtype, memory-mapped, for arrays;
    int32 for text through a tokenizer)."""
    if config.tokenizer and not config.path:
        raise MeshwiseError("--data.tokenizer: needs --data.path (the embedded corpus is for the byte tokenizer)")
    if not config.path:
        raw = embedded_corpus.read()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    path = Path(config.path)
    if not path.exists():
        raise MeshwiseError(f"--data.path: {config.path} does not exist")
    if config.tokenizer and path.suffix != ".bin":
        ids = encode_files(
            _text_files(path) if path.is_dir() else [path], HFTokenizer(config.tokenizer), config.text_field
        )
        if not ids:
            raise MeshwiseError(f"--data.path: {config.path} is empty (no text to train on)")
        return torch.tensor(ids, dtype=torch.int32)
    if path.is_dir():
        files = _text_files(path)
        if not files:
            raise MeshwiseError(f"--data.path: folder {config.path} holds no files")
        raw = b"\n\n".join(f.read_bytes() for f in files)
    elif path.suffix == ".bin":
        dtype, size = _BIN_DTYPES[config.bin_dtype]
        nbytes = path.stat().st_size
        if nbytes % size:
            raise MeshwiseError(
                f"--data.path: {config.path} has {nbytes} bytes, not a whole number of "
                f"{config.bin_dtype} ids (--data.bin_dtype)"
            )
        if nbytes == 0:
            raise MeshwiseError(f"--data.path: {config.path} is empty")
        return torch.from_file(str(path), shared=False, size=nbytes // size, dtype=dtype)
    else:
        raw = path.read_bytes()
    if not raw.strip():
        raise MeshwiseError(f"--data.path: {config.path} is empty (no text to train on)")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@dataclass
class Corpus:
    """Training and held-out windows of one token stream, and the sample order."""

    tokens: torch.Tensor
    seq_len: int
    seed: int
    n_train: int
    n_eval: int
    _perm_epoch: int = -1
    _perm: torch.Tensor | None = None

    @property
    def n_windows(self) -> int:
        return self.n_train + self.n_eval

    def window(self, i: int) -> torch.Tensor:
        start = i * self.seq_len
        return self.tokens[start : start + self.seq_len + 1].to(torch.long)

    def train_window(self, g: int) -> int:
        """Window index of global training sample ``g``: perm_{g div n}[g mod n]."""
        epoch, pos = divmod(g, self.n_train)
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{epoch}".encode()))
            self._perm = torch.randperm(self.n_train, generator=gen)
            self._perm_epoch = epoch
        return int(self._perm[pos])

    def _stack(self, windows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = torch.stack([self.window(i) for i in windows])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def train_rows(self, first_sample: int, rows: range) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (len(rows), seq_len): rows ``rows`` of the global batch that starts at
        global sample ``first_sample`` (step s of a run with a fixed batch B starts at s*B)."""
        return self._stack([self.train_window(first_sample + r) for r in rows])

    def eval_rows(self, batch: int, global_batch: int, rows: range) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of held-out batch ``batch``: held-out windows in order, cycling when there are too few."""
        return self._stack([self.n_train + (batch * global_batch + r) % self.n_eval for r in rows])


def build_corpus(config: DataConfig, vocab: int) -> Corpus:
    """Load, check against the model's vocabulary, split into training and held-out windows."""
    tokens = load_tokens(config)
    source = describe_source(config.path)
    if tokens.numel() == 0:
        raise MeshwiseError(f"--data.path: {source} is empty")
    top = max(int(tokens[i : i + _CHUNK].to(torch.int64).max()) for i in range(0, tokens.numel(), _CHUNK))
    if top >= vocab:
        raise MeshwiseError(f"--data.path: {source} holds token id {top}, outside the model's vocabulary of {vocab}")
    n = (tokens.numel() - 1) // config.seq_len
    n_eval = math.ceil(config.eval_fraction * n)
    if n - n_eval < 1 or n_eval < 1:
        raise MeshwiseError(
            f"--data.path: {source} has {tokens.numel():,} tokens, too few for one training and one "
            f"held-out sequence of {config.seq_len} tokens (--data.seq_len)"
        )
    return Corpus(tokens=tokens, seq_len=config.seq_len, seed=config.seed, n_train=n - n_eval, n_eval=n_eval)
