"""A small BPE tokenizer (the tokenizers package) trained on sums, for the tokenizer tests of both folders."""

from __future__ import annotations

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
