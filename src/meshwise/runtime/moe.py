"""The mixture-of-experts block: a top-k router with a load-balancing loss, grouped experts,
an optional (gated) shared expert, and expert parallelism by all-to-all.

Routing (Mixtral, Qwen3-MoE with ``norm_topk_prob``): p = softmax(x W_r) over the ``E`` experts in
fp32, the ``k`` largest kept and renormalised to sum to 1; the block's output is
``sum_k p_k * expert_k(x)`` (+ the shared expert, times ``sigmoid(x w_g)`` where it is gated,
as in Qwen2-MoE). Experts are SwiGLU MLPs stored grouped: ``w1``, ``w3`` (E, f, h), ``w2`` (E, h, f).
Dropless: every token reaches its k experts (no capacity limit).

Load balancing: the sequence-wise auxiliary loss of DeepSeek-V3 (arXiv 2412.19437, Eqs. 17-20):
for each sequence of s tokens, ``L = sum_i f_i P_i`` with ``f_i = E / (k s) * (tokens routed to
i)`` and ``P_i`` the mean router probability of expert i; ``AUX_LOSS_COEF`` times the mean over
the step's sequences joins the loss. It is a sum over sequences, so every split of the batch
(micro-batches, data-parallel replicas) gives the same gradient. Its gradient is injected where
the block runs (the output passes through :class:`_AddAuxGrad`, as Megatron-Core's
``MoEAuxLossAutoScaler`` does), so pipeline stages need no extra loss term; the reported loss is
the cross-entropy alone.

Expert parallelism (``ep`` > 1, :mod:`meshwise.runtime.expert_parallel`): rank j of an EP group of
n holds experts [j E/n, (j+1) E/n) (a DTensor sharded on dim 0 over the ``ep`` mesh). Token
copies, sorted by expert, go to their expert's rank with one ``all_to_all_single`` (dispatch),
the experts run, and one more brings the outputs back (combine); both are differentiable
(torch's functional ``all_to_all_single_autograd``), so backward runs them in reverse. The
per-expert counts travel first, in a small all-to-all of E int64 per rank.

Part timing (``meshwise measure``, :class:`PartClock`): while a clock is installed (:func:`timed_parts`),
the block switches it between its parts (``PARTS``) as it runs them forward, and identity autograd
functions on the parts' boundaries (:class:`_Stamp`) switch it as the gradient passes them backward;
the all-to-alls' outputs are waited for at once (``dispatch_combine_s``), and any other blocking wait
inside a part (FSDP2 gathering the experts' weights) is left out of it. Without a clock the block
runs exactly the operators above and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from meshwise.runtime._torch_private import all_to_all_autograd, settle, timed_waits
from meshwise.spec import ModelSpec

AUX_LOSS_COEF = 0.01
PARTS = ("router_s", "permute_s", "experts_s", "shared_s", "dispatch_combine_s")


class PartClock:
    """Seconds per MoE part (``PARTS``) over the steps run while installed: the time from one switch
    to the next is the part switched to; ``None`` is outside every MoE block."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.waits = dict.fromkeys(PARTS, 0.0)  # the blocking waits on collectives seen inside each part
        self.part: str | None = None
        self.since = time.perf_counter()

    def switch(self, part: str | None) -> None:
        now = time.perf_counter()
        if self.part is not None:
            self.seconds[self.part] += now - self.since
        self.part, self.since = part, now

    def waited(self, kind: str, seconds: float) -> None:
        """A blocking wait on a collective inside a part other than the all-to-alls (FSDP2's gathers
        of the experts' weights): not the part's own work, left out. Every wait inside a part is also
        summed in ``waits``."""
        if self.part is not None:
            self.waits[self.part] += seconds
        if self.part not in (None, "dispatch_combine_s"):
            self.seconds[self.part] -= seconds


_CLOCK: PartClock | None = None


@contextmanager
def timed_parts() -> Iterator[PartClock]:
    """Install a :class:`PartClock` on every MoE block of this process while open."""
    global _CLOCK
    clock = _CLOCK = PartClock()
    try:
        with timed_waits(clock.waited):
            yield clock
    finally:
        clock.switch(None)
        _CLOCK = None


class _Stamp(torch.autograd.Function):
    """Identity; in backward switches ``clock`` to ``part`` (the part whose backward runs next)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: PartClock, part: str | None) -> torch.Tensor:
        ctx.clock, ctx.part = clock, part
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.clock.switch(ctx.part)
        return grad, None, None


def _tick(part: str | None) -> None:
    if _CLOCK is not None:
        _CLOCK.switch(part)


def _settled(x: torch.Tensor) -> torch.Tensor:
    """``x``, a functional collective's output, waited for now while a clock is installed."""
    if _CLOCK is not None:
        settle(x)
    return x


def _mark(x: torch.Tensor, part: str | None) -> torch.Tensor:
    """``x``, through a :class:`_Stamp` switching to ``part`` in backward while a clock is installed."""
    return x if _CLOCK is None or not x.requires_grad else _Stamp.apply(x, _CLOCK, part)


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


class _ScaleGrad(torch.autograd.Function):
    """Identity in forward; the gradient times ``scale`` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class GroupedExperts(nn.Module):
    """``experts`` SwiGLU MLPs of width ``width`` (this rank's share of them under EP)."""

    def __init__(self, experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, width, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, width, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, width))
        self.group: dist.ProcessGroup | None = None  # the EP group; None: every expert is here

    def compute(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows of ``x`` grouped by local expert, ``counts[e]`` rows for expert e.

        Under EP the weights' gradients are scaled by 1/ep: they collect the tokens of all ep
        replicas of the group, and data parallelism then averages them over the dp/ep ranks left,
        so the result is the mean over all dp replicas, as for the dense weights."""
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        if self.group is not None:
            scale = 1.0 / dist.get_world_size(self.group)
            w1, w2, w3 = (_ScaleGrad.apply(w, scale) for w in (w1, w2, w3))
        outs = [
            (F.silu(rows @ w1[e].t()) * (rows @ w3[e].t())) @ w2[e].t() for e, rows in enumerate(torch.split(x, counts))
        ]
        return torch.cat(outs)

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``routed`` token copies sorted by global expert id, ``counts`` (E,) per expert: their outputs,
        in the same order."""
        if self.group is None:
            return _mark(self.compute(routed, counts.tolist()), "experts_s")
        n = dist.get_world_size(self.group)
        local = counts.numel() // n
        _tick("dispatch_combine_s")
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)
        rc = received_counts.view(n, local)  # (source rank, local expert)
        send = counts.view(n, local).sum(1).tolist()
        recv = rc.sum(1).tolist()
        received = _mark(_settled(all_to_all_autograd(routed, recv, send, self.group)), "dispatch_combine_s")
        _tick("experts_s")
        chunks = torch.split(received, rc.flatten().tolist())
        grouped = torch.cat([chunks[j * local + e] for e in range(local) for j in range(n)])
        out = self.compute(grouped, rc.sum(0).tolist())
        back = torch.split(out, rc.t().flatten().tolist())  # (local expert, source rank) order
        back = _mark(torch.cat([back[e * n + j] for j in range(n) for e in range(local)]), "experts_s")
        _tick("dispatch_combine_s")
        return _mark(_settled(all_to_all_autograd(back, send, recv, self.group)), "dispatch_combine_s")


class _AddAuxGrad(torch.autograd.Function):
    """Identity on ``out``; in backward the auxiliary loss ``aux`` gets gradient 1."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape = aux.shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.ones(ctx.aux_shape, dtype=torch.float32, device=grad.device)


class MoE(nn.Module):
    """Router, grouped experts, optional shared expert (given, built by the caller) and its gate."""

    def __init__(self, spec: ModelSpec, shared: nn.Module | None) -> None:
        super().__init__()
        self.top_k = spec.experts_per_token
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = GroupedExperts(spec.experts, spec.hidden, spec.expert_ffn_hidden)
        self.shared = shared
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.aux_sequences: int | None = None  # the step's sequences the loss averages over (None: this batch's)
        self.cp_group: dist.ProcessGroup | None = None  # context parallelism: the ranks holding one sequence's parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        _tick("router_s")
        tokens = x.reshape(-1, h)
        probs = self.router(_mark(tokens, None)).float().softmax(-1)  # (T, E)
        experts = probs.shape[1]
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        _tick("permute_s")
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=experts)
        gathered = _mark(_mark(tokens, "router_s")[order // self.top_k], "permute_s")
        _tick("experts_s")
        out_sorted = self.experts(gathered, counts)
        _tick("permute_s")
        routed = torch.empty_like(out_sorted)
        routed[order] = out_sorted
        out = _mark((routed.view(-1, self.top_k, h) * weights.unsqueeze(-1).to(x.dtype)).sum(1), "permute_s")
        if self.training and torch.is_grad_enabled():
            _tick("router_s")
            out = _AddAuxGrad.apply(out, self._aux_loss(probs.view(b, s, -1), chosen.view(b, s, -1)))
            out = _mark(out, "router_s")
        out = out.view(b, s, h)
        if self.shared is not None:
            _tick("shared_s")
            shared = self.shared(_mark(x, None))
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + _mark(shared, "shared_s")
        _tick(None)
        return out

    def _aux_loss(self, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """AUX_LOSS_COEF * sum over this batch's sequences of sum_i f_i P_i, over the step's sequences.

        Under context parallelism (``cp_group``) a rank holds s/cp tokens of each sequence: the
        routing counts behind f_i are summed over the cp ranks (an all-reduce of (b, E) float32 per
        block, no gradient flows through f) and P_i is the rank's own mean. Rank c's term
        sum_i f_i P_i^c averages over the cp ranks to sum_i f_i P_i (every rank holds as many
        tokens), and the data-parallel gradient average over dp * cp ranks takes exactly that mean."""
        b, s, experts = probs.shape
        hits = torch.zeros(b, experts, device=probs.device).scatter_add_(
            1, chosen.reshape(b, -1), torch.ones(b, s * self.top_k, device=probs.device)
        )
        if self.cp_group is not None:
            dist.all_reduce(hits, group=self.cp_group)
            s *= dist.get_world_size(self.cp_group)
        f = hits * experts / (self.top_k * s)
        per_sequence = (f * probs.mean(1)).sum(1)
        return AUX_LOSS_COEF * per_sequence.sum() / (self.aux_sequences or b)


def set_aux_sequences(model: nn.Module, sequences: int, cp_group: dist.ProcessGroup | None = None) -> None:
    """Tell every MoE block of ``model`` over how many sequences the step's loss averages, and
    (context parallelism) which ranks hold the other parts of its sequences."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.aux_sequences = sequences
            m.cp_group = cp_group
