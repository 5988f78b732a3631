"""Context parallelism: ring attention over the ``cp`` mesh dimension, with causal load balancing.

Why not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it only replaces
the CUDA SDPA kernels (flash, memory-efficient, cuDNN). On CPU, SDPA lowers to
``aten._scaled_dot_product_flash_attention_for_cpu``, for which it has neither a ring handler nor a
DTensor sharding strategy ("does not have a sharding strategy registered"); forcing the math
backend breaks inside DTensor ("got mixed torch.Tensor and DTensor"); the efficient kernel has no
CPU build. ``scripts/probe_context_parallel.py`` reproduces this in two gloo processes. So
meshwise runs its own ring on torch's P2P ops (``batch_isend_irecv``), the same code on gloo and
NCCL (docs/runtime.md).

Load balancing (the head-tail split of torch's CP and Megatron-Core): the sequence is cut into
2·cp chunks of s/(2·cp) tokens and cp rank i holds chunks i and 2·cp−1−i, so every rank has the
same causal work. :func:`shard_sequence` does the split, :func:`positions` gives the rotary
positions of the local tokens.

Forward (exact, online softmax as in flash attention): step 0 attends the local Q to the local
K/V; at each of the cp−1 further steps the K/V block of rank i−t arrives from the previous rank
(posted before the current block is computed, so the transfer overlaps it), and the partial
output is merged with running row max and sum. Saved: Q, K, V, the output and its log-sum-exp.
Backward (exact, flash-attention's formulas with the saved log-sum-exp): K/V go around the ring
again (cp−1 sends), and each block's dK/dV accumulator travels with it and goes home at the end
(cp sends), while dQ stays local. Per attention and rank: forward cp−1 K/V sends, backward cp−1
K/V sends and cp dK/dV sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

KV_TAG, GRAD_TAG = 11, 12


@dataclass(frozen=True)
class RingGroup:
    """This rank's place on the cp ring: its cp coordinate, the ring size, global ranks of its neighbours."""

    group: dist.ProcessGroup
    rank: int
    size: int
    next_rank: int
    prev_rank: int


def ring_group(cp_mesh) -> RingGroup:
    """The ring of the 1-D ``cp`` DeviceMesh."""
    group = cp_mesh.get_group()
    ranks = dist.get_process_group_ranks(group)
    me, n = cp_mesh.get_local_rank(), cp_mesh.size()
    return RingGroup(group, me, n, ranks[(me + 1) % n], ranks[(me - 1) % n])


def chunk_ids(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks cp rank ``cp_rank`` holds: (i, 2·cp−1−i)."""
    return cp_rank, 2 * cp - 1 - cp_rank


def shard_sequence(x: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's load-balanced part of ``x`` along ``dim`` (length s → s/cp)."""
    if cp == 1:
        return x
    chunks = x.chunk(2 * cp, dim=dim)
    a, b = chunk_ids(cp, cp_rank)
    return torch.cat((chunks[a], chunks[b]), dim=dim)


def positions(local_len: int, cp: int, cp_rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Global token positions of the ``local_len`` tokens rank ``cp_rank`` holds."""
    c = local_len // 2
    a, b = chunk_ids(cp, cp_rank)
    return torch.cat((torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)))


def _start(ring: RingGroup, send: torch.Tensor, tag: int) -> tuple[list, torch.Tensor]:
    """Send ``send`` to the next rank and receive a tensor like it from the previous one (async)."""
    recv = torch.empty_like(send)
    ops = [
        dist.P2POp(dist.isend, send, ring.next_rank, ring.group, tag),
        dist.P2POp(dist.irecv, recv, ring.prev_rank, ring.group, tag),
    ]
    return dist.batch_isend_irecv(ops), recv


def _finish(works: list) -> None:
    for w in works:
        w.wait()


def _scores(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """Causally masked scores (b, a, sq, sk) of Q against a K block (K heads already expanded)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Softmax statistics and accumulators: fp32, or the input's dtype when wider."""
    return torch.promote_types(t.dtype, torch.float32)


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t.repeat_interleave(groups, dim=1) if groups > 1 else t


def forward_block(
    q: torch.Tensor,
    kb: torch.Tensor,
    vb: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    acc: torch.Tensor,
    row_max: torch.Tensor,
    row_sum: torch.Tensor,
):
    """One ring step of the forward: the local Q (b, heads, sq, d) against one K/V block (b, kv heads,
    sk, d), merged into the running (output accumulator, row max, row sum) by online softmax; returns
    them updated. ``meshwise calibrate`` times this on its own (cost/context_parallel.py ``ring_kernel_seconds``)."""
    scale, groups, f = 1.0 / math.sqrt(q.shape[-1]), q.shape[1] // kb.shape[1], acc.dtype
    s = _scores(q, _expand(kb, groups), q_pos, k_pos, scale).to(f)
    new_max = torch.maximum(row_max, s.amax(-1, keepdim=True))
    p = torch.exp(s - new_max)
    fix = torch.exp(row_max - new_max)
    row_sum = row_sum * fix + p.sum(-1, keepdim=True)
    acc = acc * fix + torch.matmul(p.to(vb.dtype), _expand(vb, groups)).to(f)
    return acc, new_max, row_sum


def backward_block(
    qf: torch.Tensor,
    kb: torch.Tensor,
    vb: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
    lse: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ring step of the backward (flash attention's formulas with the saved log-sum-exp): this
    block's share of dQ and its dK/dV (b, kv heads, sk, 2d), in the accumulators' dtype (``qf``'s)."""
    d, groups, f = kb.shape[-1], qf.shape[1] // kb.shape[1], qf.dtype
    scale = 1.0 / math.sqrt(qf.shape[-1])
    ke, ve = _expand(kb, groups), _expand(vb, groups)
    p = torch.exp(_scores(qf, ke.to(f), q_pos, k_pos, scale) - lse)
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, ve.to(f).transpose(-1, -2)) - delta)
    dq = torch.matmul(ds, ke.to(f)) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qf) * scale
    b, a, sk, _ = dk.shape
    return dq, torch.cat((dk, dv), dim=-1).view(b, a // groups, groups, sk, 2 * d).sum(2)


class RingAttention(torch.autograd.Function):
    """Causal attention of the local Q over the K/V of every cp rank; inputs (b, heads, s/cp, d)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: RingGroup) -> torch.Tensor:
        q_pos = positions(q.shape[2], ring.size, ring.rank, q.device)
        kv = torch.cat((k, v), dim=-1).contiguous()
        f = _acc_dtype(q)
        acc = torch.zeros_like(q, dtype=f)
        row_max = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=f, device=q.device)
        row_sum = torch.zeros_like(row_max)
        for t in range(ring.size):
            pending = _start(ring, kv, KV_TAG) if t < ring.size - 1 else None
            kb, vb = kv.split(k.shape[-1], dim=-1)
            k_pos = positions(q.shape[2], ring.size, (ring.rank - t) % ring.size, q.device)
            acc, row_max, row_sum = forward_block(q, kb, vb, q_pos, k_pos, acc, row_max, row_sum)
            if pending is not None:
                _finish(pending[0])
                kv = pending[1]
        out = (acc / row_sum).to(q.dtype)
        lse = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        ring: RingGroup = ctx.ring
        d = k.shape[-1]
        q_pos = positions(q.shape[2], ring.size, ring.rank, q.device)
        f = _acc_dtype(q)
        dout, qf = dout.to(f), q.to(f)
        delta = (dout * out.to(f)).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        kv = torch.cat((k, v), dim=-1).contiguous()
        dkv = torch.zeros_like(kv, dtype=f)  # the accumulator of the block now held
        for t in range(ring.size):
            pending = _start(ring, kv, KV_TAG) if t < ring.size - 1 else None
            kb, vb = kv.split(d, dim=-1)
            k_pos = positions(q.shape[2], ring.size, (ring.rank - t) % ring.size, q.device)
            dq_part, dkv_part = backward_block(qf, kb, vb, dout, delta, lse, q_pos, k_pos)
            dq += dq_part
            dkv += dkv_part
            works, dkv = _start(ring, dkv, GRAD_TAG)  # the accumulator moves on with its block
            _finish(works)
            if pending is not None:
                _finish(pending[0])
                kv = pending[1]
        dk, dv = dkv.split(d, dim=-1)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: RingGroup) -> torch.Tensor:
    """Causal GQA attention over the whole sequence, each rank holding its load-balanced s/cp tokens."""
    return RingAttention.apply(q, k, v, ring)
