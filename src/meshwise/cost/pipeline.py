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
