"""Hugging Face tokenizers (``tokenizer.json``, through the ``tokenizers`` library) and the documents
they encode: text files, JSONL and Parquet with a text field.

Documents are encoded one by one and their ids concatenated in order (no separator is added: a
tokenizer whose post-processor adds bos/eos adds them per document). Parquet needs ``pyarrow``.
"""

from __future__ import annotations

import array
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.progress import Progress
from tokenizers import Tokenizer

from meshwise.errors import MeshwiseError


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with meshwise's encode/decode interface."""

    def __init__(self, path: str) -> None:
        self.path = tokenizer_file(path)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as e:  # the Rust library raises its own exception types
            raise MeshwiseError(f"--data.tokenizer: {self.path} is not a tokenizer.json ({str(e)[:120]})") from None
        self.vocab = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def tokenizer_file(path: str) -> Path:
    """``tokenizer.json`` itself, or the one in a folder; one line when there is none."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise MeshwiseError(f"--data.tokenizer: {p} does not exist (a tokenizer.json or its folder is expected)")
    return p


def documents(path: Path, text_field: str) -> Iterator[str]:
    """The texts of one data file: the whole file, one per JSONL line, or one per Parquet row."""
    where = f"--data.path: {path}"
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8", errors="strict") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise MeshwiseError(f"{where}: line {n} is not JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                    raise MeshwiseError(f"{where}: line {n} has no string field {text_field!r} (--data.text_field)")
                yield row[text_field]
    elif path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # optional: only Parquet input needs pyarrow, not a dependency
        except ImportError:
            raise MeshwiseError(f"{where}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        try:
            table = pq.read_table(path, columns=[text_field])
        except Exception as e:  # pyarrow's own error types
            raise MeshwiseError(f"{where}: no readable text column {text_field!r} ({str(e)[:120]})") from None
        for value in table.column(text_field).to_pylist():
            if isinstance(value, str):
                yield value
    else:
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise MeshwiseError(f"{where} is not UTF-8 text (a tokenizer encodes text)") from None


def encode_files(files: list[Path], tok: HFTokenizer, text_field: str, batch: int = 256) -> list[int]:
    """Every document of ``files``, encoded in order."""
    ids: list[int] = []
    pending: list[str] = []
    for f in files:
        for doc in documents(f, text_field):
            pending.append(doc)
            if len(pending) == batch:
                for row in tok.encode_batch(pending):
                    ids.extend(row)
                pending = []
    for row in tok.encode_batch(pending):
        ids.extend(row)
    return ids


def tokenize_main(data: str, tokenizer: str, out: str, text_field: str = "text") -> int:
    """``meshwise tokenize``: every document of ``data`` into ``out`` (a .bin array ``--data`` reads),
    with a progress bar over the files; the array is written beside and renamed when complete."""
    src, dest = Path(data), Path(out)
    if not src.exists():
        raise MeshwiseError(f"--data: {data} does not exist")
    if dest.suffix != ".bin" or not dest.parent.is_dir():
        raise MeshwiseError(f"--out: {out} must be a .bin file in an existing folder")
    tok = HFTokenizer(tokenizer)
    files = [p for p in sorted(src.rglob("*")) if p.is_file() and not p.name.startswith(".")] if src.is_dir() else [src]
    code, dtype = ("H", "uint16") if tok.vocab <= 2**16 else ("I", "uint32")  # .bin arrays are little-endian
    if sys.byteorder != "little" or array.array(code).itemsize != (2 if code == "H" else 4):
        raise MeshwiseError("tokenize: this platform's integer layout is not the .bin format's (little-endian)")
    tmp = dest.with_name(dest.name + ".tmp")
    total = 0
    with open(tmp, "wb") as f, Progress(transient=False) as bar:
        task = bar.add_task("tokenizing", total=len(files))
        for path in files:
            ids = encode_files([path], tok, text_field)
            f.write(array.array(code, ids).tobytes())
            total += len(ids)
            bar.advance(task)
    tmp.replace(dest)
    print(f"wrote {dest}: {total:,} tokens as {dtype} (train with --data {dest} --data.bin_dtype {dtype})")
    return 0
