"""A CPU profile's measured components at the shapes of the run it is asked about.

``meshwise calibrate`` times the loss and the fused attention at fixed shapes (measure/calibrate.py
``LOSS_SHAPES``, ``SDPA_SHAPES``: vocabularies up to 64k at 128 tokens, sequences up to 1,024); the
cost model reads both off their tables (cost/host.py ``loss_seconds``, ``sdpa_call_seconds``) and
past a table's end extends it. An extension is a guess where the machine changes regime (the
logits outgrowing the cache), so before a run's prediction :func:`top_up` adds rows at the run's
own shapes where the table does not reach them:

- the loss at the micro-batch's ``tokens x vocab`` logits, when no row holds as many (up to
  ``LOSS_MAX_LOGITS``: past it every pass already streams from DRAM and the cost per logit is flat);
- the ring step of context parallelism at the run's local sequence (up to ``RING_MAX_SEQ``), when
  ``cp_ring_table`` has no row within ``RING_NEAR`` of it: its blocks materialise their scores, which outgrow the cache, and
  on a 2-core x86 host a step at 2k-4k local tokens cost 2-3x the table's extension from 512
  (:func:`ring_rows`);
- SDPA at the run's sequence at each head width the table holds, when no row is that long (up to
  ``SDPA_MAX_SEQ``, a few seconds; past it the table's last segment, linear in seq**2, is extended:
  torch's kernel costs less per score element as the sequence grows, and on a 2-core x86 host the
  extension from 1,024 tokens read 2k-8k calls 2-3x slow: docs/fidelity.md, the components).
- a mixture of experts' block at the run's routed tokens and EP group, when ``moe_part_table`` has
  no row of that shape (measure/moe_parts.py: the runtime's block alone over ``ep`` processes, its
  parts; a launch of a few seconds), in every CPU profile (one with operator costs).

Each addition is a few timed calls, seconds in all (``time_loss``, ``time_sdpa``); tests pass fake
timers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshwise.cost.host import loss_vocab
from meshwise.cost.host_moe import holds, part_key
from meshwise.cost.moe_block import routed_tokens
from meshwise.measure.probe import typical_time
from meshwise.spec.host_keys import MOE_PART_SECONDS, MOE_PART_SHAPE

LOSS_MAX_LOGITS = 1 << 25  # 128 MiB of fp32 logits: far past any last-level cache
SDPA_MAX_SEQ = 4096
RING_MAX_SEQ = 2048  # local tokens per ring step (a step of 4,096 took seconds)
RING_NEAR = 0.25  # a ring row this close to the run's local sequence (relative) holds it
SDPA_HEADS, SDPA_KV_HEADS = 4, 2  # as measure/calibrate.py's RING_HEADS, RING_KV_HEADS
TIMED_RUNS = 3


@dataclass(frozen=True)
class PlanShapes:
    """What one rank of the run computes per micro-batch: ``tokens`` (micro-batch x sequence),
    ``vocab`` logits per token in its loss, ``seq`` tokens per attention call, ``ring_seq`` local
    tokens per ring step under context parallelism."""

    tokens: int
    vocab: int
    seq: int
    ring_seq: int = 0  # a rank's local sequence under context parallelism (0: none)
    moe_key: tuple = ()  # a MoE block call's shape (cost/host_moe.py part_key; (): a dense model)
    moe_mbs: int = 1  # ... over how many sequences its tokens come


def _typical_time(fn, runs: int) -> float:
    fn()
    return typical_time(fn, runs, 0.002)


def time_loss(tokens: int, vocab: int, runs: int = TIMED_RUNS) -> float:
    """Seconds of one loss call (runtime/model.py ``loss_sum``) forward + backward over
    ``tokens x vocab`` fp32 logits: the median of ``runs`` timings."""
    import torch  # torch: tune's planning imports this (via auto_profile) without torch

    from meshwise.runtime.model import loss_sum  # torch: tune's planning imports this (via auto_profile) without torch

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tokens, vocab, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, (1, tokens), generator=gen)

    def call() -> None:
        loss_sum(logits, targets).backward()
        logits.grad = None

    return _typical_time(call, runs)


def sdpa_call(seq: int, head_dim: int, heads: int, kv_heads: int) -> Callable[[], None]:
    """One causal attention call (runtime/model.py ``causal_attention``) forward + backward, ``heads``
    query heads over ``kv_heads`` K/V heads of one sequence, ready to time."""
    import torch  # torch: tune's planning imports this (via auto_profile) without torch

    # torch: tune's planning imports this (via auto_profile) without torch
    from meshwise.runtime.model import causal_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, seq, head_dim, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, seq, head_dim, generator=gen, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, heads, seq, head_dim, generator=gen)

    def call() -> None:
        causal_attention(q, k, v).backward(grad)
        q.grad = k.grad = v.grad = None

    return call


def time_sdpa(seq: int, head_dim: int, runs: int = TIMED_RUNS) -> float:
    """Seconds of :func:`sdpa_call` at ``SDPA_HEADS`` query heads over ``SDPA_KV_HEADS`` K/V heads."""
    return _typical_time(sdpa_call(seq, head_dim, SDPA_HEADS, SDPA_KV_HEADS), runs)


def ring_step(seq: int, head_dim: int, heads: int, kv_heads: int) -> Callable[[], None]:
    """One bare ring step of context parallelism's attention (meshwise.runtime.context_parallel
    ``forward_block`` then ``backward_block`` of one half-masked K/V block, fp32, no transfer) over
    ``seq`` local tokens, ``heads`` query heads over ``kv_heads`` K/V heads, ready to time."""
    import torch  # torch: tune's planning imports this (via auto_profile) without torch

    # torch: tune's planning imports this (via auto_profile) without torch
    from meshwise.runtime.context_parallel import backward_block, forward_block, positions

    gen = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(1, heads, seq, head_dim, generator=gen) for _ in range(2))
    kb, vb = (torch.randn(1, kv_heads, seq, head_dim, generator=gen) for _ in range(2))
    q_pos, k_pos = positions(seq, 2, 0), positions(seq, 2, 1)  # a block half masked, as most are
    stats = torch.full((1, heads, seq, 1), float("-inf")), torch.zeros(1, heads, seq, 1)
    acc, row_max, row_sum = forward_block(q, kb, vb, q_pos, k_pos, torch.zeros_like(q), *stats)
    lse, delta = row_max + torch.log(row_sum), (dout * acc / row_sum).sum(-1, keepdim=True)

    def step() -> None:
        forward_block(q, kb, vb, q_pos, k_pos, torch.zeros_like(q), *stats)
        backward_block(q, kb, vb, dout, delta, lse, q_pos, k_pos)

    return step


def time_ring(local: int, head_dim: int, runs: int = TIMED_RUNS) -> float:
    """Seconds of one bare ring step of context parallelism's attention (runtime/context_parallel.py
    ``forward_block`` then ``backward_block`` of one half-masked K/V block, no transfer) over
    ``local`` tokens, ``SDPA_HEADS`` query heads over ``SDPA_KV_HEADS`` K/V heads."""
    step = ring_step(local, head_dim, SDPA_HEADS, SDPA_KV_HEADS)
    return _typical_time(step, runs)


def ring_rows(table: dict[str, Any], local: int, timer: Callable) -> tuple[list[list[float]], list[str]]:
    """``cp_ring_table`` rows at ``local`` tokens per ring step, one per head width the table holds:
    the table's step at its longest local sequence of that width short of ``local``, plus what the
    bare step grows by from there to ``local`` (``timer`` as :func:`time_ring`). The table's steps were timed as whole
    ring calls over two ranks (measure/calibrate.py): their sends and bookkeeping, 1.1-2.3x the bare
    blocks at local 64-512 on a 2-core x86 host, are carried as they were at the table's end, not
    scaled with the blocks' scores (scaled, they read the cp=2 grid points 2-5x slow)."""
    rows, said = [], []
    for width in sorted({d for _, d, _ in table["cp_ring_table"]}):
        below = [(e, t) for e, d, t in table["cp_ring_table"] if d == width and e < SDPA_HEADS * local * local]
        if not below:
            continue
        scores, seconds = max(below)
        ref = max(1, round(math.sqrt(scores / SDPA_HEADS)))
        at_ref, at_local = timer(ref, int(width)), timer(local, int(width))
        rows.append([float(SDPA_HEADS * local * local), width, seconds + max(at_local - at_ref, 0.0)])
        said.append(
            f"a bare ring step timed at {local} local tokens, head width {int(width)}: "
            f"{at_local * 1e3:.1f} ms, {at_ref * 1e3:.1f} ms at {ref}"
        )
    return rows, said


def loss_row(shapes: PlanShapes) -> tuple[int, int]:
    """(tokens, vocab) to time the loss at, ``tokens`` cut to stay within ``LOSS_MAX_LOGITS``."""
    tokens = max(1, min(shapes.tokens, LOSS_MAX_LOGITS // max(shapes.vocab, 1)))
    return tokens, shapes.vocab


def top_up(
    table: dict[str, Any], shapes: PlanShapes, timers: tuple[Callable, ...] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """(``table`` with rows added at ``shapes`` where its loss, SDPA (without context parallelism),
    ring (with it) and MoE tables do not reach them, one line per addition). ``timers``: (loss, SDPA,
    bare ring step, MoE block) as :func:`time_loss`, :func:`time_sdpa`, :func:`time_ring`, :func:`time_moe`.
    A table without a component's rows (a GPU profile, an older calibration) is left as it is."""
    timers = timers or (time_loss, time_sdpa, time_ring, time_moe)
    out, said = dict(table), []
    loss_rows = [list(r) for r in table.get("loss_token_table", [])]
    tokens, vocab = loss_row(shapes)
    if loss_rows and max(t * v for t, v, _ in loss_rows) < tokens * vocab * (1 - 1e-4):
        seconds = timers[0](tokens, vocab)
        out["loss_token_table"] = sorted(loss_rows + [[float(tokens), float(vocab), seconds / tokens]])
        said.append(f"the loss timed at {tokens} tokens x {vocab} logits: {seconds * 1e3:.1f} ms")
    sdpa_rows = [list(r) for r in table.get("sdpa_head_table", [])]
    seq = 0 if shapes.ring_seq else min(shapes.seq, SDPA_MAX_SEQ)
    if sdpa_rows and seq and max(s for s, _, _ in sdpa_rows) < seq * (1 - 1e-4):
        call_s = float(table.get("sdpa_call_s", 0.0))
        for width in sorted({d for _, d, _ in sdpa_rows}):
            seconds = timers[1](seq, int(width))
            sdpa_rows.append([float(seq), width, max(seconds - call_s, seconds / 10) / SDPA_HEADS])
            said.append(f"SDPA timed at {seq} tokens, head width {int(width)}: {seconds * 1e3:.1f} ms")
        out["sdpa_head_table"] = sorted(sdpa_rows)
    ring = [list(r) for r in table.get("cp_ring_table", [])]
    local = min(shapes.ring_seq, RING_MAX_SEQ)
    # a row within RING_NEAR of the local sequence, or the step is timed there: between the table's
    # rows the step is read linearly in the score elements, which a cliff between them breaks
    if ring and local and not any(abs(math.sqrt(e / SDPA_HEADS) / local - 1) <= RING_NEAR for e, _, _ in ring):
        rows, lines = ring_rows(table, local, timers[2])
        out["cp_ring_table"], said = sorted(ring + rows), said + lines
    moe = [list(r) for r in table.get("moe_part_table", [])]
    if shapes.moe_key and table.get("op_overhead_s") and not any(holds(r, shapes.moe_key) for r in moe):
        row = timers[3](shapes.moe_key, shapes.moe_mbs)
        out["moe_part_table"] = sorted(moe + [row])
        said.append(moe_said(row))
    return out, said


def time_moe(key: tuple, mbs: int) -> list[float]:
    """measure/moe_parts.py ``time_parts``: a ``moe_part_table`` row at ``key``."""
    from meshwise.measure.moe_parts import (
        time_parts,
    )  # torch: tune's planning imports this (via auto_profile) without torch

    return time_parts(key, mbs)


def moe_said(row: list[float]) -> str:
    """One line for a timed ``moe_part_table`` row: its shape and parts in milliseconds."""
    shape = dict(zip(MOE_PART_SHAPE, row))
    parts = ", ".join(f"{k[:-2]} {v * 1e3:.2f}" for k, v in zip(MOE_PART_SECONDS, row[len(MOE_PART_SHAPE) :]))
    return (
        f"a MoE block timed at {int(shape['tokens'])} tokens, {int(shape['experts'])} experts, "
        f"ep={int(shape['ep'])} (ms per call: {parts})"
    )


def shapes_of(
    model, seq: int, mbs: int, tp: int = 1, cp: int = 1, runtime: str = "meshwise", ep: int = 0, folded: bool = False
) -> PlanShapes:
    """The run's :class:`PlanShapes`: a rank's ``mbs * seq / cp`` tokens, the loss's logits per
    token (cost/host.py ``loss_vocab``), the attention's ``seq`` (cp > 1 runs its ring instead), and
    for a mixture of experts its block call on an EP group of ``ep`` (``folded``: EP over the TP
    ranks, each routing 1/tp of the tokens, cost/moe_block.py ``routed_tokens``; ``ep`` 0, before a
    layout is chosen: no block call, nothing timed)."""
    tokens = mbs * math.ceil(seq / cp)
    moe = bool(ep and model.moe and not model.states_only and runtime == "meshwise")
    return PlanShapes(
        tokens=tokens,
        vocab=int(loss_vocab(model, runtime, tp)),
        seq=seq,
        ring_seq=math.ceil(seq / cp) if cp > 1 else 0,
        moe_key=part_key(model, routed_tokens(tokens, tp, folded), ep) if moe else (),
        moe_mbs=mbs if moe else 1,
    )
