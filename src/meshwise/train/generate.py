"""Sampling from a trained model: top-k, temperature, bytes or a Hugging Face tokenizer in and out.

p(next = t) ∝ exp(logit_t / temperature) over the ``top_k`` largest logits (greedy when
temperature is 0); the context is cropped to the model's ``max_seq`` most recent tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from meshwise.errors import MeshwiseError
from meshwise.train.data import ByteTokenizer
from meshwise.train.tokenizer import HFTokenizer


@torch.no_grad()
def generate_ids(
    model: nn.Module,
    ids: list[int],
    tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
    max_seq: int,
    eos_ids: tuple[int, ...] = (),
) -> list[int]:
    """``ids`` followed by up to ``tokens`` generated ids; stops after an id in ``eos_ids``."""
    ids = list(ids)
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    for _ in range(tokens):
        context = torch.tensor([ids[-max_seq:]], dtype=torch.long)
        logits = model(context)[0, -1].float()
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        ids.append(nxt)
        if nxt in eos_ids:
            break
    return ids


def sample(
    model: nn.Module,
    prompt: str,
    tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
    max_seq: int,
    tokenizer: str = "",
    eos_ids: tuple[int, ...] = (),
) -> str:
    """The prompt followed by up to ``tokens`` generated tokens, decoded by the run's tokenizer (bytes
    as UTF-8 by default, or a Hugging Face tokenizer.json); stops after an eos id. Nine arguments:
    generate's flags and the run's tokenizer and eos ids."""
    if tokenizer:
        tok = HFTokenizer(tokenizer)
        ids = tok.encode(prompt)
        if not ids:
            raise MeshwiseError("--prompt: encodes to no tokens; give some text")
    else:
        tok = ByteTokenizer()
        ids = tok.encode(prompt) or [ord("\n")]
    return tok.decode(generate_ids(model, ids, tokens, temperature, top_k, seed, max_seq, eos_ids))
