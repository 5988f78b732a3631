"""The reference model: a Llama-style decoder built from a ``ModelSpec``.

Token embedding -> ``layers`` x [RMSNorm -> GQA attention (rotary, causal SDPA) -> residual,
RMSNorm -> SwiGLU (or GeLU) MLP -> residual] -> RMSNorm -> LM head (tied or untied).
No biases, no dropout. Built on the meta device; :func:`init_weights` then fills every parameter
from ``(seed, fully-qualified name)`` alone, so every layout starts from bit-identical weights.

Activations the forward keeps for backward, per block, with ``ac=none`` (b = micro-batch sequences,
s = sequence, h = hidden, a = heads, k = kv_heads, d = head_dim, f = ffn_hidden; under TP the
a, k, f widths are divided by tp, and under SP the b*s*h tensors are divided by tp):

- attention RMSNorm: its input x (b*s*h) and the inverse RMS (b*s*1);
- the normed input, shared by the Q, K and V matmuls (b*s*h; under SP the all-gathered copy);
- rotated Q (b*s*a*d) and rotated K (b*s*k*d), and V (b*s*k*d): SDPA's inputs;
- SDPA output (b*s*a*d) and its log-sum-exp (b*a*s, fp32);
- the attention output that enters the output projection (b*s*a*d);
- MLP RMSNorm: its input, the residual after attention (b*s*h), and the inverse RMS (b*s*1);
- the normed input, shared by the gate and up matmuls (b*s*h; under SP the all-gathered copy);
- SwiGLU: gate output (b*s*f, SiLU's input), SiLU output and up output (b*s*f each, the
  multiply's inputs), their product (b*s*f, the down matmul's input);
  GeLU: up output (b*s*f, GeLU's input) and GeLU output (b*s*f, the down matmul's input).

Outside the blocks: the token ids (embedding backward), the final norm's input and inverse RMS,
the normed input of the head (b*s*h), and the cross-entropy's log-softmax (b*s*vocab, fp32).
Rotary cos/sin are buffers (s*d each, shared), not per-step activations.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from meshwise.spec import ModelSpec

RMS_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention: x*cos + rotate_half(x)*sin on (b, heads, s, d)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query attention; head counts are read from the projection widths (TP-local)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.hidden, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wo = nn.Linear(spec.hidden, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[:s], sin[:s]), rotate(k, cos[:s], sin[:s])
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); GeLU: w2(gelu(w1 x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, RMS_EPS)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden)
        self.attention = Attention(spec)
        self.mlp_norm = RMSNorm(spec.hidden)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.mlp(self.mlp_norm(h))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline chunk of it (:meth:`keep_only` drops the rest).

    ``layers`` is a ModuleDict keyed by the global block index, so a parameter's name is the same
    in every chunk and layout (``layers.3.mlp.w1.weight``).
    Input: token ids (b, s) on the first chunk, hidden states (b, s, h) elsewhere.
    Output: logits (b, s, vocab) on the last chunk, hidden states elsewhere.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm: RMSNorm | None = RMSNorm(spec.hidden)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope_cos", torch.empty(spec.max_seq, spec.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(spec.max_seq, spec.head_dim), persistent=False)

    def keep_only(self, first_layer: int, num_layers: int, first: bool, last: bool) -> "Transformer":
        """Drop everything outside one pipeline chunk: blocks [first_layer, first_layer+num_layers)."""
        keep = {str(i) for i in range(first_layer, first_layer + num_layers)}
        for name in list(self.layers):
            if name not in keep:
                del self.layers[name]
        if not first:
            self.tok_embeddings = None
        if not last:
            self.norm = None
            self.output = None
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for block in self.layers.values():
            h = block(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def rope_tables(seq: int, head_dim: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq, head_dim): angle(p, i) = p * theta^(-2i/d), each half repeated."""
    inv_freq = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


# ---------------------------------------------------------------------------------------- init
def canonical_name(name: str) -> str:
    """A parameter's name in the plain model: wrapper prefixes (activation checkpointing) removed."""
    return name.replace("_recomputed.", "")


def init_std(name: str, spec: ModelSpec) -> float | None:
    """Normal std per parameter (None: ones, for norm weights); residual outputs scaled by 1/sqrt(2L)."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("attention.wo.weight", "mlp.w2.weight")):
        return INIT_STD / math.sqrt(2 * spec.layers)
    return INIT_STD


def full_init(name: str, shape: torch.Size, spec: ModelSpec, seed: int) -> torch.Tensor:
    """The full fp32 tensor for ``name``: a CPU generator seeded by crc32("seed:name")."""
    std = init_std(name, spec)
    if std is None:
        return torch.ones(shape)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.empty(shape).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter (full tensor from seed and name, then this rank's shard) and the rope tables.

    Works on plain tensors and on DTensors (TP and/or FSDP2 sharded): the local shard is cut from
    the full tensor with ``distribute_tensor(..., src_data_rank=None)``, which communicates nothing.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        full = full_init(canonical_name(name), param.shape, spec, seed)
        if isinstance(param, DTensor):
            local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements,
                                      src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    for module in model.modules():
        if isinstance(module, Transformer):
            cos, sin = rope_tables(module.spec.max_seq, module.spec.head_dim, module.rope_cos.device)
            module.rope_cos.copy_(cos)
            module.rope_sin.copy_(sin)


def build_model(spec: ModelSpec, seed: int, device: torch.device | str = "cpu") -> Transformer:
    """The plain, single-device model: meta construction, then materialise and initialise."""
    with torch.device("meta"):
        model = Transformer(spec)
    model.to_empty(device=device)
    init_weights(model, spec, seed)
    return model


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed token cross-entropy in fp32 (divide by the token count you want to average over)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
