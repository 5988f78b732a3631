"""The reference model: a decoder built from a ``ModelSpec``, as its Hugging Face family builds it.

Token embedding -> ``layers`` x [RMSNorm -> GQA attention (rotary, causal SDPA) -> residual,
RMSNorm -> SwiGLU (or GeLU) MLP -> residual] -> RMSNorm -> LM head (tied or untied), with the
family's variations: rope theta and Llama 3.1 scaling, norm eps, explicit head_dim, q/k/v/o and
MLP biases, q/k RMSNorm (Qwen3, Gemma 3 per head; OLMo 2 over the whole projection), Gemma's (1 + w)
norms, sqrt(h) embedding scale and GeGLU, GPT-2's LayerNorm and learned positions; Gemma 3's norms
on both sides of each sublayer, query scaling, interleaved sliding-window blocks with their own rope
base, and final logit soft-capping; OLMo 2's norms on the sublayer outputs only. No dropout. tests/unit/test_hf_runtime.py checks the logits against
transformers, family by family. Built on the meta device; :func:`init_weights` then fills every parameter
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
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from meshwise.runtime._torch_private import flash_attention
from meshwise.runtime.context_parallel import RingGroup, ring_attention
from meshwise.runtime.moe import MoE
from meshwise.spec import ModelSpec

GEMMA = ("gemma", "gemma2", "gemma3_text")

INIT_STD = 0.02


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention: x*cos + rotate_half(x)*sin on (b, heads, s, d)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Norm(nn.Module):
    """RMSNorm (weight; Gemma: x * (1 + weight), computed in fp32) or LayerNorm (weight and bias)."""

    def __init__(self, width: int, spec: ModelSpec) -> None:
        super().__init__()
        self.eps = spec.norm_eps
        self.layernorm = spec.norm == "layernorm"
        self.offset = spec.family in GEMMA
        self.weight = nn.Parameter(torch.empty(width))
        self.bias = nn.Parameter(torch.empty(width)) if self.layernorm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layernorm:
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        if self.offset:
            return (F.rms_norm(x.float(), (x.shape[-1],), None, self.eps) * (1.0 + self.weight.float())).type_as(x)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention; head counts are read from the projection widths (TP-local).

    Optional per family: q/k/v (and output) biases, RMSNorm of each query and key head before the
    rotation (Qwen3), no rotation at all for learned positions (GPT-2).
    """

    def __init__(self, spec: ModelSpec, window: int = 0, rotary: bool = True) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        q = spec.heads * spec.head_dim
        self.rotary = spec.position == "rope" and rotary  # False: a NoPE block (SmolLM3)
        self.window = window  # sliding window in tokens (0: full causal attention)
        self.scale = spec.query_scale**-0.5 if spec.query_scale else None  # None: SDPA's 1/sqrt(head_dim)
        self.wq = nn.Linear(spec.hidden, q, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.qkv_bias)
        self.wo = nn.Linear(q, spec.hidden, bias=spec.o_bias)
        whole = spec.qk_norm_scope == "projection"  # OLMo 2: one norm over all heads of Q (and of K)
        self.qk_norm_whole = whole
        self.q_norm = Norm(q if whole else spec.head_dim, spec) if spec.qk_norm else None
        self.k_norm = Norm(spec.kv_dim if whole else spec.head_dim, spec) if spec.qk_norm else None
        self.ring: RingGroup | None = None  # context parallelism: set by runtime.parallelize

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k = self.wq(x), self.wk(x)
        if self.q_norm is not None and self.qk_norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, -1, self.head_dim)
        k = k.view(b, s, -1, self.head_dim)
        if self.q_norm is not None and not self.qk_norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        return self.wo(self.attend(q, k, v, cos, sin))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Rotation and causal attention on this rank's heads, (b, heads, s, d) -> (b, s, heads*d):
        local tensors only, the region :mod:`meshwise.runtime.compile` compiles under TP."""
        if self.rotary:
            s = q.shape[2]
            q, k = rotate(q, cos[:s], sin[:s]), rotate(k, cos[:s], sin[:s])
        if self.ring is not None:
            o = ring_attention(q, k, v, self.ring)
        elif self.window and self.window < q.shape[2]:
            o = windowed_attention(q, k, v, self.window, self.scale)
        else:
            o = causal_attention(q, k, v, self.scale)
        return o.transpose(1, 2).flatten(2)


def windowed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float | None
) -> torch.Tensor:
    """Causal GQA SDPA where query i sees keys j with i - window < j <= i (``window`` 0: all j <= i;
    transformers' ``sliding_window_overlay``), scores scaled by ``scale`` (None: 1/sqrt(d))."""
    s = q.shape[2]
    i = torch.arange(s, device=q.device)
    mask = i[None, :] <= i[:, None]
    if window:
        mask &= i[None, :] > i[:, None] - window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal GQA SDPA on (b, heads, s, d). On ``cuda`` tensors in bf16/fp16 without a real CUDA
    device (``meshwise verify``'s fake cuda tensors on the CPU build) the flash kernel is called
    directly: SDPA's dispatcher there can only pick the math kernel, which keeps the s x s scores,
    where a GPU picks flash for half-precision GQA (it keeps the output, the float32 log-sum-exp
    and Q, K, V). Everywhere else SDPA picks as it does (on CPU its flash kernel keeps the same).
    ``scale``: the scores' factor (None: 1/sqrt(d); Gemma's query_pre_attn_scalar^-1/2)."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and not torch.cuda.is_available():
        return flash_attention(q, k, v, scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); GeGLU (Gemma): w2(gelu_tanh(w1 x) * w3 x); GeLU: w2(gelu_tanh(w1 x))."""

    def __init__(self, spec: ModelSpec, width: int | None = None) -> None:
        super().__init__()
        width = width or spec.ffn_hidden
        self.act = F.silu if spec.mlp == "swiglu" else partial(F.gelu, approximate="tanh")
        self.w1 = nn.Linear(spec.hidden, width, bias=spec.mlp_bias)
        self.w2 = nn.Linear(width, spec.hidden, bias=spec.mlp_bias)
        self.w3 = nn.Linear(spec.hidden, width, bias=spec.mlp_bias) if spec.mlp != "gelu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.activate(self.w1(x), self.w3(x) if self.w3 is not None else None))

    def activate(self, gate: torch.Tensor, up: torch.Tensor | None) -> torch.Tensor:
        """act(gate) * up, or act(gate) without an up projection: the MLP's local elementwise
        region, compiled on its own under TP (:mod:`meshwise.runtime.compile`)."""
        return self.act(gate) * up if up is not None else self.act(gate)


class Block(nn.Module):
    """Attention and an MLP, or for a MoE model's sparse blocks (not in ``dense_layers``) a
    mixture of experts (:mod:`meshwise.runtime.moe`).

    Norms: on each sublayer's input (``attention_norm``, ``mlp_norm``), and with four per block
    (Gemma 2/3) also on its output (``attention_out_norm``, ``mlp_out_norm``); OLMo 2
    (``post_norm``) has the output ones only: h = x + out_norm(sublayer(x)). A block outside
    ``full_attention_layers`` of a model with a ``sliding_window`` attends within it (with the
    local rope tables where the model has them: :func:`local_rope_layers`)."""

    def __init__(self, spec: ModelSpec, index: int = 0) -> None:
        super().__init__()
        windowed = bool(spec.sliding_window) and index not in spec.full_attention_layers
        self.attention_norm = None if spec.post_norm else Norm(spec.hidden, spec)
        self.attention = Attention(spec, spec.sliding_window if windowed else 0, index not in spec.nope_layers)
        self.mlp_norm = None if spec.post_norm else Norm(spec.hidden, spec)
        outputs = spec.post_norm or spec.norms_per_layer == 4
        self.attention_out_norm = Norm(spec.hidden, spec) if outputs else None
        self.mlp_out_norm = Norm(spec.hidden, spec) if outputs else None
        self.residual = spec.residual_multiplier  # Granite's scale of each sublayer's output
        if spec.moe and index not in spec.dense_layers:
            shared = MLP(spec, spec.shared_ffn_hidden) if spec.shared_ffn_hidden else None
            self.mlp: nn.Module = MoE(spec, shared)
        else:
            self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a = self.attention(x if self.attention_norm is None else self.attention_norm(x), cos, sin)
        a = a if self.attention_out_norm is None else self.attention_out_norm(a)
        h = x + (a if self.residual == 1.0 else a * self.residual)
        m = self.mlp(h if self.mlp_norm is None else self.mlp_norm(h))
        m = m if self.mlp_out_norm is None else self.mlp_out_norm(m)
        return h + (m if self.residual == 1.0 else m * self.residual)


class Transformer(nn.Module):
    """The whole decoder, or one pipeline chunk of it (:meth:`keep_only` drops the rest).

    ``layers`` is a ModuleDict keyed by the global block index, so a parameter's name is the same
    in every chunk and layout (``layers.3.mlp.w1.weight``).
    Input: token ids (b, s) on the first chunk, hidden states (b, s, h) elsewhere.
    Output: logits (b, s, vocab) on the last chunk, hidden states elsewhere.
    Gemma scales the embedding by sqrt(h), Granite by its ``embedding_multiplier`` (and divides the
    logits by ``logits_scaling``); GPT-2 adds learned positions (``pos_embeddings``).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_seq, spec.hidden) if spec.position == "learned" else None
        )
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm: Norm | None = Norm(spec.hidden, spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.tie_weights()
        self.register_buffer("rope_cos", torch.empty(spec.max_seq, spec.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(spec.max_seq, spec.head_dim), persistent=False)
        local = (spec.max_seq, spec.head_dim) if spec.rope_local_theta else (0, spec.head_dim)
        self.register_buffer("rope_local_cos", torch.empty(local), persistent=False)  # Gemma 3's windowed blocks
        self.register_buffer("rope_local_sin", torch.empty(local), persistent=False)
        self.positions: torch.Tensor | None = None  # context parallelism: the local tokens' positions

    def tie_weights(self) -> None:
        """Make the head's weight the embedding's (tied models): on construction, and again after
        ``to_empty()``, which gives each module its own new plain tensor (DTensors are swapped in
        place and stay tied)."""
        if self.spec.tied_embeddings and self.tok_embeddings is not None and self.output is not None:
            if self.output.weight is not self.tok_embeddings.weight:
                self.output.weight = self.tok_embeddings.weight

    def keep_only(self, first_layer: int, num_layers: int, first: bool, last: bool) -> Transformer:
        """Drop everything outside one pipeline chunk: blocks [first_layer, first_layer+num_layers)."""
        keep = {str(i) for i in range(first_layer, first_layer + num_layers)}
        for name in list(self.layers):
            if name not in keep:
                del self.layers[name]
        if not first:
            self.tok_embeddings = None
            self.pos_embeddings = None
        if not last:
            self.norm = None
            self.output = None
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.spec.family in GEMMA:
                h = h * torch.tensor(self.spec.hidden**0.5, dtype=h.dtype)
            if self.spec.embedding_multiplier != 1.0:  # Granite
                h = h * self.spec.embedding_multiplier
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(x.shape[1], device=x.device))
        tables = {False: (self.rope_cos, self.rope_sin), True: (self.rope_local_cos, self.rope_local_sin)}
        if self.positions is not None:
            tables = {
                key: (cos[self.positions], sin[self.positions]) if cos.numel() else (cos, sin)
                for key, (cos, sin) in tables.items()
            }
        local = local_rope_layers(self.spec)
        for key, block in self.layers.items():
            h = block(h, *tables[int(key) in local])
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
            if self.spec.final_softcap:  # Gemma 2/3: cap * tanh(logits / cap)
                h = torch.tanh(h / self.spec.final_softcap) * self.spec.final_softcap
            if self.spec.logits_scaling != 1.0:  # Granite
                h = h / self.spec.logits_scaling
        return h


def local_rope_layers(spec: ModelSpec) -> frozenset[int]:
    """The blocks that rotate with the local rope tables: Gemma 3's sliding-window blocks."""
    if not (spec.rope_local_theta and spec.sliding_window):
        return frozenset()
    return frozenset(range(spec.layers)) - frozenset(spec.full_attention_layers)


def inv_frequencies(spec: ModelSpec, local: bool = False) -> torch.Tensor:
    """theta^(-2i/d) for i < d/2, with Llama 3.1's rescaling when ``rope_scaling == "llama3"``, all
    divided by ``rope_factor`` when it is "linear" (position interpolation). ``local``: Gemma 3's
    windowed blocks, theta ``rope_local_theta`` and no scaling.

    llama3 (Llama Team 2024; transformers' ``_compute_llama3_parameters``): wavelengths longer than
    L/low_freq_factor are divided by ``factor``, shorter than L/high_freq_factor kept, and those
    between interpolated with s = (L/wavelength - low) / (high - low), L the original context.
    """
    d = spec.head_dim
    theta = spec.rope_local_theta if local else spec.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if local:
        return inv
    if spec.rope_scaling == "linear":
        return inv / spec.rope_factor
    if spec.rope_scaling != "llama3":
        return inv
    old, low, high, factor = (
        spec.rope_original_max_seq,
        spec.rope_low_freq_factor,
        spec.rope_high_freq_factor,
        spec.rope_factor,
    )
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    spec: ModelSpec, device: torch.device | str = "cpu", local: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_seq, head_dim): angle(p, i) = p * inv_freq_i, each half repeated (fp32,
    as transformers computes them)."""
    angles = torch.outer(torch.arange(spec.max_seq, dtype=torch.float32), inv_frequencies(spec, local))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(device), angles.sin().to(device)


# Families the plan counts exactly and the runtime does not build: what it lacks of each.
PLAN_ONLY = {
    "llama4_text": "Llama 4's chunked attention, NoPE blocks, attention temperature tuning, weightless L2 "
    "q/k norms and sigmoid-gated top-1 experts",
    "glm4_moe": "GLM-4.5's sigmoid-scored, bias-corrected expert routing and partial rotary embedding",
    "hunyuan_v1_dense": "Hunyuan's q/k norms after the rotary embedding",
    "glm4": "GLM-4's partial rotary embedding and norms after each sublayer",
    "minimax_m2": "MiniMax-M2's sigmoid-scored, bias-corrected expert routing",
}


def runtime_refusal(spec: ModelSpec, seq_len: int | None = None) -> str | None:
    """Why the runtime cannot build ``spec`` yet (one line), or None: the plan counts these exactly."""
    if spec.states_only:
        return "a bare parameter count has no shape to build"
    if spec.family in PLAN_ONLY:
        return f"model {spec.name!r}: {PLAN_ONLY[spec.family]} are not built by the runtime (plan only)"
    if spec.mla:
        return f"model {spec.name!r}: multi-head latent attention ({spec.family}) is not built by the runtime yet (plan only)"
    if spec.attn_sinks or spec.swiglu_limit or spec.router_bias:
        return (
            f"model {spec.name!r}: GPT-OSS's attention sinks, clamped SwiGLU experts with biases and router bias "
            f"are not built by the runtime (plan only)"
        )
    if spec.moe and spec.mlp != "swiglu":
        return f"model {spec.name!r}: experts with a {spec.mlp} MLP are not built by the runtime (swiglu)"
    if spec.norms_per_layer not in (2, 4) or spec.norms_per_layer == 4 and spec.post_norm:
        return f"model {spec.name!r}: {spec.norms_per_layer} norms per block are not built by the runtime (2 or 4)"
    if spec.attn_softcap:
        return (
            f"model {spec.name!r}: attention logit soft-capping ({spec.family}) is not built by the runtime (plan only)"
        )
    if spec.rope_scaling not in ("", "llama3", "linear"):
        return (
            f"model {spec.name!r}: rope scaling {spec.rope_scaling!r} is not built by the runtime "
            f"(default, llama3 or linear)"
        )
    if spec.attention_chunk:
        return f"model {spec.name!r}: chunked attention is not built by the runtime (plan only)"
    return None


# ---------------------------------------------------------------------------------------- init
def canonical_name(name: str) -> str:
    """A parameter's name in the plain model: wrapper prefixes (activation checkpointing) removed."""
    return name.replace("_recomputed.", "")


def init_std(name: str, spec: ModelSpec) -> float | None:
    """Normal std per parameter (None: a constant, for norms and biases); residual outputs scaled by 1/sqrt(2L)."""
    if name.endswith(("norm.weight", ".bias")):
        return None
    if name.endswith(("attention.wo.weight", "mlp.w2.weight", "experts.w2", "shared.w2.weight")):
        return INIT_STD / math.sqrt(2 * spec.layers)
    return INIT_STD


def full_init(name: str, shape: torch.Size, spec: ModelSpec, seed: int) -> torch.Tensor:
    """The full fp32 tensor for ``name``: a CPU generator seeded by crc32("seed:name"); norm weights
    1 (Gemma's offset norms 0, the same scale), biases 0."""
    std = init_std(name, spec)
    if std is None:
        unit = name.endswith("norm.weight") and spec.family not in GEMMA
        return torch.ones(shape) if unit else torch.zeros(shape)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.empty(shape).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter (full tensor from seed and name, then this rank's shard) and the rope tables.

    Works on plain tensors and on DTensors (TP and/or FSDP2 sharded): the local shard is cut from
    the full tensor with ``distribute_tensor(..., src_data_rank=None)``, which communicates nothing.
    """
    for name, param in model.named_parameters():
        full = full_init(canonical_name(name), param.shape, spec, seed)
        if isinstance(param, DTensor):
            local = distribute_tensor(
                full.to(param.device), param.device_mesh, param.placements, src_data_rank=None
            ).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    for module in model.modules():
        if isinstance(module, Transformer):
            cos, sin = rope_tables(module.spec, module.rope_cos.device)
            module.rope_cos.copy_(cos)
            module.rope_sin.copy_(sin)
            if module.rope_local_cos.numel():
                cos, sin = rope_tables(module.spec, module.rope_cos.device, local=True)
                module.rope_local_cos.copy_(cos)
                module.rope_local_sin.copy_(sin)


def build_model(spec: ModelSpec, seed: int, device: torch.device | str = "cpu") -> Transformer:
    """The plain, single-device model: meta construction, then materialise and initialise."""
    with torch.device("meta"):
        model = Transformer(spec)
    model.to_empty(device=device)
    model.tie_weights()
    init_weights(model, spec, seed)
    return model


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed token cross-entropy in fp32 (divide by the token count you want to average over)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
