"""A CPU profile's measured components at the shapes of the run it is asked about.

``meshwise calibrate`` times the loss and the fused attention at fixed shapes (measure/calibrate.py
``LOSS_SHAPES``, ``SDPA_SHAPES``: vocabularies up to 64k at 128 tokens, sequences up to 1,024); the
cost model reads both off their tables (cost/host.py ``loss_seconds``, ``sdpa_call_seconds``) and
past a table's end extends it. An extension is a guess where the machine changes regime (the
logits outgrowing the cache), so before a run's prediction :func:`top_up` adds rows at the run's
own shapes where the table does not reach them:

- the loss at the micro-batch's ``tokens x vocab`` logits, when no row holds as many (up to
  ``LOSS_MAX_LOGITS``: past it every pass already streams from DRAM and the cost per logit is flat);
- SDPA at the run's sequence at each head width the table holds, when no row is that long (up to
  ``SDPA_MAX_SEQ``, a few seconds; past it the table's last segment, linear in seq**2, is extended:
  torch's kernel costs less per score element as the sequence grows, and on a 2-core x86 host the
  extension from 1,024 tokens read 2k-8k calls 2-3x slow, benchmarks/results/cpu-components-cpu2core.txt).

Each addition is a few timed calls, seconds in all (``time_loss``, ``time_sdpa``); tests pass fake
timers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOSS_MAX_LOGITS = 1 << 25  # 128 MiB of fp32 logits: far past any last-level cache
SDPA_MAX_SEQ = 4096
SDPA_HEADS, SDPA_KV_HEADS = 4, 2  # as measure/calibrate.py's RING_HEADS, RING_KV_HEADS
TIMED_RUNS = 3


@dataclass(frozen=True)
class PlanShapes:
    """What one rank of the run computes per micro-batch: ``tokens`` (micro-batch x sequence),
    ``vocab`` logits per token in its loss, ``seq`` tokens per attention call."""
    tokens: int
    vocab: int
    seq: int


def _typical_time(fn, runs: int) -> float:
    from meshwise.measure.probe import typical_time

    fn()
    return typical_time(fn, runs, 0.002)


def time_loss(tokens: int, vocab: int, runs: int = TIMED_RUNS) -> float:
    """Seconds of one loss call (runtime/model.py ``loss_sum``) forward + backward over
    ``tokens x vocab`` fp32 logits: the median of ``runs`` timings."""
    import torch

    from meshwise.runtime.model import loss_sum

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tokens, vocab, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, (1, tokens), generator=gen)

    def call() -> None:
        loss_sum(logits, targets).backward()
        logits.grad = None
    return _typical_time(call, runs)


def time_sdpa(seq: int, head_dim: int, runs: int = TIMED_RUNS) -> float:
    """Seconds of one causal attention call (runtime/model.py ``causal_attention``) forward +
    backward, ``SDPA_HEADS`` query heads over ``SDPA_KV_HEADS`` K/V heads of one sequence."""
    import torch

    from meshwise.runtime.model import causal_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, SDPA_HEADS, seq, head_dim, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, SDPA_KV_HEADS, seq, head_dim, generator=gen, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, SDPA_HEADS, seq, head_dim, generator=gen)

    def call() -> None:
        causal_attention(q, k, v).backward(grad)
        q.grad = k.grad = v.grad = None
    return _typical_time(call, runs)


def loss_row(shapes: PlanShapes) -> tuple[int, int] | None:
    """(tokens, vocab) to time the loss at, ``tokens`` cut to stay within ``LOSS_MAX_LOGITS``."""
    tokens = max(1, min(shapes.tokens, LOSS_MAX_LOGITS // max(shapes.vocab, 1)))
    return tokens, shapes.vocab


def top_up(table: dict[str, Any], shapes: PlanShapes, timers: tuple[Callable, Callable] | None = None
           ) -> tuple[dict[str, Any], list[str]]:
    """(``table`` with rows added at ``shapes`` where its loss and SDPA tables do not reach them,
    one line per addition). ``timers``: (loss, SDPA) as :func:`time_loss`, :func:`time_sdpa`.
    A table without a component's rows (a GPU profile, an older calibration) is left as it is."""
    timers = timers or (time_loss, time_sdpa)
    out, said = dict(table), []
    loss_rows = [list(r) for r in table.get("loss_token_table", [])]
    tokens, vocab = loss_row(shapes)
    if loss_rows and max(t * v for t, v, _ in loss_rows) < tokens * vocab:
        seconds = timers[0](tokens, vocab)
        out["loss_token_table"] = sorted(loss_rows + [[float(tokens), float(vocab), seconds / tokens]])
        said.append(f"the loss timed at {tokens} tokens x {vocab} logits: {seconds * 1e3:.1f} ms")
    sdpa_rows = [list(r) for r in table.get("sdpa_head_table", [])]
    seq = min(shapes.seq, SDPA_MAX_SEQ)
    if sdpa_rows and max(s for s, _, _ in sdpa_rows) < seq:
        call_s = float(table.get("sdpa_call_s", 0.0))
        for width in sorted({d for _, d, _ in sdpa_rows}):
            seconds = timers[1](seq, int(width))
            sdpa_rows.append([float(seq), width, max(seconds - call_s, seconds / 10) / SDPA_HEADS])
            said.append(f"SDPA timed at {seq} tokens, head width {int(width)}: {seconds * 1e3:.1f} ms")
        out["sdpa_head_table"] = sorted(sdpa_rows)
    return out, said


def shapes_of(model, seq: int, mbs: int, tp: int = 1, cp: int = 1, runtime: str = "meshwise") -> PlanShapes:
    """The run's :class:`PlanShapes`: a rank's ``mbs * seq / cp`` tokens, the loss's logits per
    token (cost/host.py ``loss_vocab``), the attention's ``seq`` (cp > 1 runs its ring instead)."""
    from meshwise.cost.host import loss_vocab

    return PlanShapes(tokens=mbs * math.ceil(seq / cp), vocab=int(loss_vocab(model, runtime, tp)), seq=seq)
