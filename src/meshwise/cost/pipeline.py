"""The pipeline-schedule model: micro-batches kept in flight, and the bubble.

``m`` is the number of micro-batches per step, ``p`` the pipeline ranks, ``v`` the chunks per rank
(vpp). Activation memory is counted in "chunk-micro-batches": one micro-batch's activations of one
chunk.

- GPipe: all forwards, then all backwards: every rank keeps all ``m`` (Huang et al. 2019).
- 1F1B: rank ``r`` keeps ``min(m, p - r)`` (Narayanan et al. 2021, Sec. 2.2.1).
- interleaved 1F1B: rank ``r`` runs ``(v - 1) * p + 2 * (p - 1 - r)`` warm-up chunk-forwards and
  keeps one more in steady state (Megatron-LM's and torch's warm-up count).
- zero-bubble: with v = 1, ZB-H1 (Qi et al. 2023, arXiv 2401.10241) keeps what 1F1B keeps; with
  v = 2, ZB-V keeps ``2p`` chunk-micro-batches (each half a rank's layers: 1F1B's peak).

Bubble, as a fraction of the ideal (bubble-free) compute time:
GPipe and 1F1B ``(p - 1) / m``; interleaved ``(p - 1) / (v * m)`` (Narayanan et al. 2021, Sec. 2.2);
zero-bubble ``(p - 1) / (3 * v * m)``: ZB-H1's bubble is ``(p - 1) * (T_F + T_B - T_W)``, a third of
1F1B's when forward, input-gradient and weight-gradient passes cost the same (Qi et al., Sec. 3);
ZB-V's V placement halves it again. Real ZB-V is closer to zero; this stays conservative.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from meshwise.layout import rank_chunks


def in_flight(schedule: str, p: int, v: int, m: int, rank: int) -> int:
    """Chunk-micro-batches of activations pipeline rank ``rank`` holds at its peak."""
    if p == 1:
        return 1
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b" or (schedule == "zero-bubble" and v == 1):
        return min(m, p - rank)
    if schedule == "zero-bubble":
        return min(m * v, v * p)
    return min(m * v, (v - 1) * p + 2 * (p - 1 - rank) + 1)


def bubble_fraction(schedule: str, p: int, v: int, m: int) -> float:
    """Idle time over ideal compute time for one step.

    With fewer micro-batches than stages (m < p) a micro-batch still crosses all p*v chunks in
    turn: the step lasts p*v + m - 1 chunk-steps for m*v of work, a bubble of
    (p - m)/m + (m - 1)/(m*v), which is (p - 1)/m without interleaving."""
    if p == 1:
        return 0.0
    if m < p or schedule in ("gpipe", "1f1b"):
        return (max(p - m, 0) + (min(m, p) - 1) / v) / m
    if schedule == "interleaved-1f1b":
        return (p - 1) / (v * m)
    return (p - 1) / (3 * v * m)


# ------------------------------------------------------------------------ timeline simulation
@dataclass(frozen=True)
class Op:
    """One pass of one micro-batch through one chunk: ``F`` forward, ``B`` backward (input gradient
    only under zero-bubble), ``W`` weight gradient (zero-bubble)."""

    rank: int
    chunk: int
    microbatch: int
    kind: str
    start: float
    end: float


def _rank_order(schedule: str, p: int, v: int, m: int, r: int) -> list[tuple[str, int, int]]:
    """The (kind, chunk, micro-batch) order rank ``r`` follows. Interleaved: rounds of ``g`` micro-
    batches (``g = p`` when p divides m; torch's ``m // max(1, m // p)`` otherwise); the k-th forward
    goes to chunk ``(k // g) % v`` and micro-batch ``(k // (g v)) g + k % g`` (Megatron's mapping),
    backward in reverse chunk order; warm-up ``(v - 1) g + 2 (p - 1 - r)`` forwards, then 1F1B."""
    chunks = rank_chunks(r, p, v, schedule)
    if schedule == "gpipe":
        return [("F", chunks[0], i) for i in range(m)] + [("B", chunks[0], i) for i in range(m)]
    if v == 1:
        c = chunks[0]
        warm = min(p - r - 1, m)
        order = [("F", c, i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", c, warm + i), ("B", c, i)]
        return order + [("B", c, i) for i in range(m - warm, m)]
    if schedule == "zero-bubble":
        raise ValueError("ZB-V has no fixed order: see _simulate_greedy")
    g = m // max(1, m // p)  # micro-batches per round (torch's flexible interleaving)

    def fwd_at(k: int) -> tuple[str, int, int]:
        group, within = divmod(k, g * v)
        local = within // g
        return ("F", chunks[local], group * g + within % g)

    def bwd_at(k: int) -> tuple[str, int, int]:
        _, c, i = fwd_at(k)
        return ("B", chunks[v - 1 - chunks.index(c)], i)

    fwd = [fwd_at(k) for k in range(m * v)]
    bwd = [bwd_at(k) for k in range(m * v)]
    warm = min(m * v, (v - 1) * g + 2 * (p - 1 - r))
    order = fwd[:warm]
    for k in range(len(fwd) - warm):
        order += [fwd[warm + k], bwd[k]]
    return order + bwd[len(fwd) - warm :]


def _ready(done: dict[tuple[str, int, int], float], last: int, kind: str, c: int, i: int) -> float | None:
    """When pass ``kind`` of chunk ``c`` on micro-batch ``i`` may start (None: not yet known): a
    forward after the previous chunk's forward, a backward after the next chunk's backward (the last
    chunk's after its own forward). The one dependency rule of both simulators."""
    if kind == "F":
        return 0.0 if c == 0 else done.get(("F", c - 1, i))
    return done.get(("F", c, i)) if c == last else done.get(("B", c + 1, i))


def simulate(schedule: str, p: int, v: int, m: int, forward_s: float = 1.0, backward_s: float = 2.0) -> list[Op]:
    """Run the schedule on ``p`` ranks with ``m`` micro-batches of ``forward_s`` / ``backward_s`` per
    chunk (communication free): each rank follows its order, an op starts when its rank is free and
    its input is ready. Under zero-bubble the backward splits into B and W of half the time each,
    and a rank runs a pending W whenever its next op must wait (what removes the bubble)."""
    if schedule == "zero-bubble" and v == 2:
        return _simulate_greedy(p, m, forward_s, backward_s)
    split = schedule == "zero-bubble"
    last = p * v - 1
    orders = [_rank_order(schedule, p, v, m, r) for r in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    pending_w: list[list[tuple[int, int, float]]] = [[] for _ in range(p)]
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    b_time = backward_s / 2 if split else backward_s

    while remaining:
        # advance the rank that can start its next op earliest
        best = None
        for r in range(p):
            if pos[r] < len(orders[r]):
                kind, c, i = orders[r][pos[r]]
                t = _ready(done, last, kind, c, i)
                if t is not None:
                    start = max(free[r], t)
                    if best is None or start < best[0]:
                        best = (start, r)
        if best is None:
            raise RuntimeError(f"schedule {schedule} deadlocks with p={p}, v={v}, m={m}")
        start, r = best
        if split and pending_w[r] and start > free[r]:
            c, i, _ = pending_w[r].pop(0)
            ops.append(Op(r, c, i, "W", free[r], free[r] + b_time))
            free[r] += b_time
            continue
        kind, c, i = orders[r][pos[r]]
        dur = forward_s if kind == "F" else b_time
        ops.append(Op(r, c, i, kind, start, start + dur))
        done[(kind, c, i)] = start + dur
        free[r] = start + dur
        pos[r] += 1
        remaining -= 1
        if split and kind == "B":
            pending_w[r].append((c, i, start + dur))
    for r in range(p):
        for c, i, _ in pending_w[r]:
            ops.append(Op(r, c, i, "W", free[r], free[r] + b_time))
            free[r] += b_time
    return ops


def _simulate_greedy(p: int, m: int, forward_s: float, backward_s: float) -> list[Op]:
    """ZB-V (Qi et al. 2023, Sec. 4): chunks placed in a V (rank r holds r and 2p-1-r); each rank,
    when free, runs its ready input-gradient pass first, else a forward while it holds fewer than
    ``2p`` chunk-micro-batches (1F1B's peak), else a pending weight-gradient pass."""
    last = 2 * p - 1
    half = backward_s / 2
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    held = [0] * p
    next_f = [[0, 0] for _ in range(p)]  # next micro-batch per (down, up) chunk
    next_b = [[0, 0] for _ in range(p)]
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    ops: list[Op] = []
    chunks = [(r, last - r) for r in range(p)]

    total = 2 * m * p * 3
    while len(ops) < total:
        best = None
        for r in range(p):
            cands = []
            for j, c in enumerate(chunks[r]):
                i = next_b[r][j]
                if i < m and (t := _ready(done, last, "B", c, i)) is not None:
                    cands.append((max(free[r], t), 0, "B", c, i, j))
                i = next_f[r][j]
                if i < m and held[r] < 2 * p and (t := _ready(done, last, "F", c, i)) is not None:
                    cands.append((max(free[r], t), 1 + (1 - j), "F", c, i, j))
            if pending_w[r]:
                cands.append((free[r], 3, "W", *pending_w[r][0], -1))
            if cands:
                cand = min(cands)
                if best is None or (cand[0], cand[1]) < (best[1][0], best[1][1]):
                    best = (r, cand)
        if best is None:
            raise RuntimeError(f"ZB-V deadlocks with p={p}, m={m}")
        r, (start, _, kind, c, i, j) = best
        dur = forward_s if kind == "F" else half
        ops.append(Op(r, c, i, kind, start, start + dur))
        free[r] = start + dur
        if kind == "F":
            done[("F", c, i)] = start + dur
            next_f[r][j] += 1
            held[r] += 1
        elif kind == "B":
            done[("B", c, i)] = start + dur
            next_b[r][j] += 1
            pending_w[r].append((c, i))
        else:
            pending_w[r].pop(0)
            held[r] -= 1
    return ops


def simulated_bubble_fraction(schedule: str, p: int, v: int, m: int) -> float:
    """Idle over busy time of the slowest rank in the simulation (forward 1, backward 2 per chunk)."""
    ops = simulate(schedule, p, v, m, 1.0 / v, 2.0 / v)
    makespan = max(op.end for op in ops)
    busy = m * 3.0
    return makespan / busy - 1


# ------------------------------------------------------------- what an interleaved rank holds
ACTIVE_CHUNKS = 3  # torch 2.13's _add_unshard_reshard: chunks kept gathered at once (max_active_stages)


class Moment(NamedTuple):
    """What an interleaved-1F1B rank holds at one moment of its step, in local chunk indices (the
    rank's chunks ascending): ``kind`` "F" at the end of a forward, "B" at the start of a backward;
    ``in_flight`` chunk-micro-batches of activations; ``gathered`` chunks whose weights are
    unsharded; ``accumulating`` chunks whose unsharded gradients exist (one backward or more done,
    and not yet reduced to a shard); ``reduced`` chunks whose gradients are reduced to a shard.
    (A named tuple: a step makes one per new busiest moment, thousands per search.)"""

    kind: str
    in_flight: int
    gathered: frozenset
    accumulating: frozenset
    reduced: frozenset = frozenset()
    pending: frozenset = frozenset()  # of ``gathered``, those prefetched and not yet computed with
    flight: tuple = ()  # chunk-micro-batches in flight, by chunk


WALK_ROUNDS = 8  # rounds of p micro-batches an interleaved walk takes at most (walked_microbatches)


def walked_microbatches(p: int, m: int) -> int:
    """The micro-batch count whose interleaved walk stands for ``m``'s: ``m`` itself up to
    ``WALK_ROUNDS`` rounds of ``p``, else ``WALK_ROUNDS * p``. Past ``p (p + 1)`` micro-batches every
    count the schedule admits is a multiple of ``p`` (layout.check_microbatches), each round of ``p``
    micro-batches visits the chunks in the same order, and the steady state between warm-up and
    cool-down repeats round after round: the moments a walk finds (what is in flight, gathered,
    accumulating or reduced) are the same for any number of middle rounds, and a chunk's gathers
    grow by the same count each round (:func:`interleaved_gathers`). So a step of a million
    micro-batches is walked in the time of eight rounds (tests/unit/test_pipeline_schedule.py
    checks the equality against the full walk)."""
    if m % p or m <= WALK_ROUNDS * p or m < p * (p + 1):
        return m
    return WALK_ROUNDS * p


@lru_cache(maxsize=1024)
def _local_order(p: int, v: int, m: int, rank: int) -> tuple[tuple[str, int], ...]:
    """Rank ``rank``'s interleaved order (_rank_order) as (kind, local chunk index)."""
    local = {c: j for j, c in enumerate(rank_chunks(rank, p, v, "interleaved-1f1b"))}
    return tuple((kind, local[c]) for kind, c, _ in _rank_order("interleaved-1f1b", p, v, m, rank))


@lru_cache(maxsize=1024)
def _lookahead_of(p: int, v: int, m: int, rank: int) -> tuple[frozenset, ...]:
    return tuple(_lookahead([c for _, c in _local_order(p, v, m, rank)]))


def _lookahead(chunks: list[int]) -> list[frozenset]:
    """For each position of a rank's chunk sequence, the next ACTIVE_CHUNKS distinct chunks from
    it on (what torch's _add_unshard_reshard keeps gathered there), walked backwards once."""
    out: list[frozenset] = [frozenset()] * len(chunks)
    nxt: list[int] = []  # distinct chunks from position i on, nearest first
    for i in range(len(chunks) - 1, -1, -1):
        c = chunks[i]
        if c in nxt:
            nxt.remove(c)
        nxt.insert(0, c)
        out[i] = frozenset(nxt[:ACTIVE_CHUNKS])
    return out


@lru_cache(maxsize=4096)
def interleaved_moments(p: int, v: int, m: int, rank: int, evict: bool, reduce_frees: bool) -> tuple[Moment, ...]:
    """The moments of rank ``rank``'s interleaved-1F1B step (``_rank_order``) that no other
    moment of the same kind holds as much as: by the chunk-micro-batches in flight and the counts
    of chunks gathered, accumulating and reduced, chunks counted as equal but for the rank's first
    and last (which hold the embedding or the head); a moment with each at least another's holds
    at least as much.

    torch 2.13 runs the interleaved schedule through its pipeline runtime. With FSDP it keeps at
    most ACTIVE_CHUNKS chunks gathered (``evict``, where FSDP2 would otherwise keep them through
    the step: ZeRO-1/2): before each action the next three distinct chunks the rank computes are
    gathered and the others resharded (``schedules._add_unshard_reshard``); and it reduces a
    chunk's gradients right after its ``m``-th backward (``_add_reduce_grad``), which leaves a
    shard (``reduce_frees``). Without FSDP every
    chunk stays whole and gradients accumulate to the end. Found by meshwise verify on Llama 3 405B
    (16,384 H100, tp=8, pp=8 and 16): three chunks' weights and one chunk's gradients at the peak,
    and 26 all-gathers on dp where gathering each chunk once would make 16. A long step is walked
    as :func:`walked_microbatches`' shorter one, which has the same moments."""
    m = walked_microbatches(p, m)
    order = _local_order(p, v, m, rank)
    held, done, flight = 0, [0] * v, [0] * v
    gathered: frozenset = frozenset() if evict else frozenset(range(v))  # a step starts with every chunk resharded
    pending: set[int] = set()
    accumulating: set[int] = set()
    reduced: set[int] = set()
    ends = (0, v - 1)
    rest: tuple[int, ...] = ()
    frozen: tuple[frozenset, frozenset] = (frozenset(), frozenset())
    changed = True
    best: dict[tuple, Moment] = {}  # by kind and features but in_flight: the one with the most in flight
    ahead_of = _lookahead_of(p, v, m, rank) if evict else ()
    for i, (kind, c) in enumerate(order):
        if evict and ahead_of[i] != gathered:
            ahead = ahead_of[i]
            pending |= ahead - gathered  # gathered ahead of use: the all-gather's output, not yet the weights
            gathered, changed = ahead, True
        pending.discard(c)
        if kind == "F":
            held += 1
            flight[c] += 1
        if changed:
            sets = (gathered, accumulating, reduced)
            rest = (*(len(s) for s in sets), *(int(e in s) for s in sets for e in ends))
            frozen = (frozenset(accumulating), frozenset(reduced))
            changed = False
        key = (kind, *rest)
        now = best.get(key)
        if now is None or held > now.in_flight:
            best[key] = Moment(kind, held, gathered, frozen[0], frozen[1], frozenset(pending), tuple(flight))
        if kind == "B":
            held -= 1
            flight[c] -= 1
            done[c] += 1
            if c not in accumulating:
                accumulating.add(c)
                changed = True
            if reduce_frees and done[c] == m:
                accumulating.discard(c)
                reduced.add(c)
                changed = True
    kept: list[tuple[str, tuple[int, ...], Moment]] = []
    # the largest feature sums first: a moment can be covered only by one already kept (or its equal)
    found = sorted(((key[0], (mo.in_flight, *key[1:]), mo) for key, mo in best.items()), key=lambda x: -sum(x[1]))
    for kind, f, mo in found:
        if not any(k == kind and all(a >= b for a, b in zip(g, f)) for k, g, _ in kept):
            kept.append((kind, f, mo))
    return tuple(mo for _, _, mo in kept)


@lru_cache(maxsize=4096)
def interleaved_gathers(p: int, v: int, m: int, rank: int) -> tuple[int, ...]:
    """How many times rank ``rank``'s interleaved runtime gathers each local chunk in a step where
    FSDP would keep it gathered (ZeRO-1/2; interleaved_moments' ``evict``): once when it first
    comes among the next ACTIVE_CHUNKS chunks to compute, and again each time it comes back after
    being resharded (torch 2.13's ``_add_unshard_reshard``). A long step: the walk of
    :func:`walked_microbatches` and one round more, and the difference per round for the rest."""
    walked = walked_microbatches(p, m)
    if walked != m:
        short, longer = _gathers(p, v, walked, rank), _gathers(p, v, walked + p, rank)
        rounds = (m - walked) // p
        return tuple(a + rounds * (b - a) for a, b in zip(short, longer))
    return _gathers(p, v, m, rank)


def _gathers(p: int, v: int, m: int, rank: int) -> tuple[int, ...]:
    active: set[int] = set()
    counts = [0] * v
    for ahead in _lookahead_of(p, v, m, rank):
        active &= ahead
        for c in ahead - active:
            active.add(c)
            counts[c] += 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def busiest_blocks(p: int, v: int, m: int, rank: int, chunk_blocks: tuple[int, ...]) -> int:
    """Blocks of the chunk-micro-batches in flight at rank ``rank``'s busiest moment of an
    interleaved-1F1B step (the most chunk-micro-batches, then the most blocks): where a rank's chunks
    hold unequal block counts, the warm-up fills the early chunks (meshwise verify, Llama 3 405B,
    pp=16, vpp=4, the last rank: 48 micro-batches of its 2-block chunks and one of its 1-block last)."""
    flights = _busiest_flights(p, v, walked_microbatches(p, m), rank)
    return max(sum(n * b for n, b in zip(flight, chunk_blocks)) for flight in flights)


@lru_cache(maxsize=1024)
def _busiest_flights(p: int, v: int, m: int, rank: int) -> frozenset:
    """The chunk-micro-batches in flight, by chunk, at each moment of rank ``rank``'s interleaved step
    with the most in flight."""
    held, top, flight = 0, 0, [0] * v
    found: set[tuple[int, ...]] = set()
    for kind, c in _local_order(p, v, m, rank):
        if kind == "F":
            held += 1
            flight[c] += 1
        if held > top:
            top, found = held, set()
        if held == top:
            found.add(tuple(flight))
        if kind == "B":
            held -= 1
            flight[c] -= 1
    return frozenset(found)
