"""ModelSpec: a decoder-only transformer, as its Hugging Face family builds it, and its parameter counts.

Pure Python (no torch). Every count is exact against ``transformers``' own ``num_parameters`` for the
supported families (tests/unit/test_hf_models.py builds each with transformers on the meta device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from meshwise.errors import MeshwiseError

MLP_KINDS = ("gelu", "swiglu", "geglu")  # geglu: gated tanh-GeLU (Gemma)


def cached_hash(self) -> int:
    """``__hash__`` for frozen dataclasses used as cache keys in the planner's hot loop: the fields'
    hash is computed once, not on every lookup. Assign it in the class body (``__hash__ =
    cached_hash``): dataclass keeps an explicitly defined ``__hash__``."""
    cached = self.__dict__.get("_cached_hash")
    if cached is None:
        cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
        object.__setattr__(self, "_cached_hash", cached)
    return cached


# --------------------------------------------------------------------------------------- model
FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "phi3",
    "gpt2",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "llama4_text",
    "gpt_oss",
    "olmo3",
    "smollm3",
    "ministral",
    "glm4_moe",
    "seed_oss",
    "ernie4_5",
    "helium",
    "granite",
    "hunyuan_v1_dense",
    "glm4",
    "minimax_m2",
    "exaone4",
)
QK_NORM_SCOPES = ("head", "projection")  # head: one norm of head_dim per head (Qwen3, Gemma 3); projection: OLMo 2
NORMS = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned")
ROUTER_SCORES = ("softmax", "sigmoid")


_COUNTS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "max_seq")  # whole numbers > 0
_COUNTS_OR_ZERO = (
    "head_dim",
    "experts",
    "experts_per_token",
    "expert_ffn_hidden",
    "shared_ffn_hidden",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "v_head_dim",
    "sliding_window",
    "rope_original_max_seq",
    "attention_chunk",
    "excluded_params",
    "router_groups",
    "router_group_topk",
)  # whole numbers >= 0
_FLAGS = (
    "tied_embeddings",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "qk_norm",
    "shared_expert_gate",
    "post_norm",
    "attn_sinks",
    "router_bias",
    "router_norm_topk",
    "expert_bias",
    "qk_l2_norm",
)
_POSITIVE_REALS = ("embedding_multiplier", "residual_multiplier", "logits_scaling", "router_scale")
_REALS = (
    "norm_eps",
    "rope_theta",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "attn_softcap",
    "final_softcap",
    "query_scale",
    "rope_local_theta",
    "swiglu_limit",
    "aux_loss_coeff",
)  # finite, >= 0


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as its Hugging Face family builds it.

    ``param_count`` is set only for a bare parameter count (``--params 70e9``): then the shape is
    unknown and only model states can be estimated (``states_only``). ``head_dim`` 0 means
    hidden / heads. Mixture-of-experts: ``experts`` routed experts of width ``expert_ffn_hidden``,
    ``experts_per_token`` of them active, ``shared_ffn_hidden`` the width of the always-active
    shared expert(s), ``dense_layers`` the blocks with a plain MLP of ``ffn_hidden``. Multi-head
    latent attention (DeepSeek-V2/V3): ``kv_lora_rank`` > 0, with ``q_lora_rank``,
    ``qk_rope_head_dim`` and ``v_head_dim`` (``head_dim`` = nope + rope width of a query head).
    The derived counts are ``cached_property``s: the fields never change, so each is worked out once
    (the planner's search reads them hundreds of thousands of times).

    The families of 2026: ``qk_norm_scope`` "projection" normalises the whole Q (and K) projection
    (OLMo 2; "head": each head, Qwen3 and Gemma 3); ``post_norm`` puts a block's two norms on its
    sublayers' outputs (OLMo 2); ``full_attention_layers`` are the blocks exempt from
    ``sliding_window`` or ``attention_chunk`` (Gemma 2/3, GPT-OSS, Llama 4; empty: every block is
    windowed); ``query_scale`` scales scores by query_scale^-1/2 (Gemma's query_pre_attn_scalar; 0:
    head_dim); ``rope_local_theta`` is the windowed blocks' unscaled rope base (Gemma 3);
    ``attn_sinks`` adds one learned sink logit per head (GPT-OSS), ``router_bias`` a bias to the
    router, ``swiglu_limit`` GPT-OSS's clamped SwiGLU; ``nope_layers`` are the blocks that attend
    without rotary positions (SmolLM3's every fourth); Granite scales the embedding by
    ``embedding_multiplier`` and each sublayer's output by ``residual_multiplier`` before the residual
    add, and divides the logits by ``logits_scaling``. ``excluded`` names what the count leaves out
    (DeepSeek-V3's multi-token-prediction layers, a multimodal model's vision encoder) and
    ``excluded_params`` its size, where known.

    The router (they add no weights; what ``plan --emit`` configures): ``router_score`` softmax or
    sigmoid of the logits, ``router_norm_topk`` the k weights renormalised to sum 1 (norm_topk_prob),
    ``router_scale`` their factor (routed_scaling_factor), grouped top-k over ``router_groups`` groups
    keeping ``router_group_topk`` (n_group, topk_group), ``expert_bias`` DeepSeek-V3's aux-loss-free
    balancing bias, ``aux_loss_coeff`` the balance loss's weight (0: not given); ``qk_l2_norm``
    Llama 4's parameter-free L2 norm of q and k in its RoPE blocks.
    """

    name: str
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    ffn_hidden: int = 0
    mlp: str = "swiglu"
    vocab: int = 0
    tied_embeddings: bool = False
    max_seq: int = 0
    source: str = ""
    param_count: int | None = None
    family: str = "llama"
    head_dim: int = 0
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    norms_per_layer: int = 2
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    position: str = "rope"
    rope_theta: float = 10000.0
    rope_scaling: str = ""
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq: int = 0
    sliding_window: int = 0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden: int = 0
    shared_ffn_hidden: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm_scope: str = "head"
    post_norm: bool = False
    full_attention_layers: tuple[int, ...] = ()
    attention_chunk: int = 0
    query_scale: float = 0.0
    rope_local_theta: float = 0.0
    attn_sinks: bool = False
    router_bias: bool = False
    swiglu_limit: float = 0.0
    nope_layers: tuple[int, ...] = ()
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    excluded: str = ""
    excluded_params: int = 0
    router_score: str = "softmax"
    router_norm_topk: bool = True
    router_scale: float = 1.0
    router_groups: int = 0
    router_group_topk: int = 0
    expert_bias: bool = False
    aux_loss_coeff: float = 0.0
    qk_l2_norm: bool = False

    __hash__ = cached_hash

    def __post_init__(self) -> None:
        if self.param_count is not None:
            if self.param_count <= 0:
                raise MeshwiseError(f"--params: {self.param_count} must be a positive parameter count")
            return
        self._check_values()
        self._check_shape()

    def _check_values(self) -> None:
        """Each field's type and range: counts, flags, finite reals and names from their lists."""
        for name in _COUNTS:
            _positive_int(self, name, getattr(self, name))
        for name in _COUNTS_OR_ZERO:
            _positive_int(self, name, getattr(self, name), zero_ok=True)
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise MeshwiseError(f"model {self.name!r}: {name} must be true or false, got {getattr(self, name)!r}")
        for name in (*_REALS, *_POSITIVE_REALS):
            value = getattr(self, name)
            positive = name in _POSITIVE_REALS  # 0 is no model
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
                or (value == 0 and positive)
            ):
                what = "a finite number above 0" if positive else "a finite non-negative number"
                raise MeshwiseError(f"model {self.name!r}: {name} must be {what}, got {value!r}")
        for name, valid in (
            ("mlp", MLP_KINDS),
            ("family", FAMILIES),
            ("norm", NORMS),
            ("position", POSITIONS),
            ("qk_norm_scope", QK_NORM_SCOPES),
            ("router_score", ROUTER_SCORES),
        ):
            if getattr(self, name) not in valid:
                raise MeshwiseError(
                    f"model {self.name!r}: {name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}"
                )

    def _check_shape(self) -> None:
        """The widths divide, the block lists hold blocks, the experts per token are experts."""
        if not self.head_dim:
            if self.hidden % self.heads:
                raise MeshwiseError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise MeshwiseError(f"model {self.name!r}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        object.__setattr__(self, "eos_ids", tuple(self.eos_ids))
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        object.__setattr__(self, "full_attention_layers", tuple(self.full_attention_layers))
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        for name in ("dense_layers", "full_attention_layers", "nope_layers"):
            bad = [i for i in getattr(self, name) if not isinstance(i, int) or not 0 <= i < self.layers]
            if bad:
                raise MeshwiseError(
                    f"model {self.name!r}: {name} must hold block indices in 0..{self.layers - 1}, got {bad[0]!r}"
                )
        if self.experts and not 0 < self.experts_per_token <= self.experts:
            raise MeshwiseError(
                f"model {self.name!r}: experts_per_token must be in 1..{self.experts}, got {self.experts_per_token}"
            )

    @cached_property
    def states_only(self) -> bool:
        return self.param_count is not None

    @cached_property
    def moe(self) -> bool:
        return self.experts > 0

    @cached_property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @cached_property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @cached_property
    def attention_params(self) -> int:
        """Q, K, V and output projections with their biases (Q and O: h x heads*d; K and V: h x kv_dim).

        MLA: q (h x heads*d, or the LoRA pair h x r_q + r_q x heads*d with its norm), the joint KV
        down-projection h x (r_kv + rope), its norm, the up-projection r_kv x heads*(nope + v), O.
        Attention sinks (GPT-OSS): one learned logit per head.
        """
        h, q = self.hidden, self.heads * self.head_dim
        if self.mla:
            nope = self.head_dim - self.qk_rope_head_dim
            q_proj = self.q_lora_rank * (h + 1 + q) if self.q_lora_rank else h * q
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * self.heads * (nope + self.v_head_dim)
            )
            return q_proj + kv + self.heads * self.v_head_dim * h
        bias = (q + 2 * self.kv_dim if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return 2 * h * q + 2 * h * self.kv_dim + bias + (self.heads if self.attn_sinks else 0)

    def _mlp(self, width: int) -> int:
        """A dense MLP of ``width``: gated (SwiGLU/GeGLU) three h x f matrices, plain two; biases if any."""
        matrices = 2 if self.mlp == "gelu" else 3
        bias = (matrices - 1) * width + self.hidden if self.mlp_bias else 0
        return matrices * self.hidden * width + bias

    @cached_property
    def moe_layers(self) -> int:
        return self.layers - len(self.dense_layers) if self.moe else 0

    def _moe_block(self, experts: int) -> int:
        """``experts`` routed experts + the router (h x E, its bias E) + the shared expert and its gate (h x 1)."""
        shared = self._mlp(self.shared_ffn_hidden) if self.shared_ffn_hidden else 0
        gate = self.hidden if self.shared_expert_gate else 0
        router = (self.hidden + (1 if self.router_bias else 0)) * self.experts
        return experts * self._mlp(self.expert_ffn_hidden) + router + shared + gate

    @cached_property
    def total_mlp_params(self) -> int:
        """Every block's MLP (dense or MoE), summed over the layers."""
        dense = self.layers - self.moe_layers
        return dense * self._mlp(self.ffn_hidden) + self.moe_layers * (self._moe_block(self.experts) if self.moe else 0)

    @cached_property
    def expert_params(self) -> int:
        """The routed experts of every MoE block (what expert parallelism shards)."""
        return self.moe_layers * self.experts * self._mlp(self.expert_ffn_hidden) if self.moe else 0

    @cached_property
    def dense_mlp_params(self) -> float:
        """One block's dense MLP, the mean over the blocks (0 for a MoE block): what TP splits."""
        return (self.layers - self.moe_layers) * self._mlp(self.ffn_hidden) / self.layers

    @cached_property
    def mlp_params(self) -> float:
        """One block's MLP; for MoE models the mean over the blocks (dense and sparse ones)."""
        return self.total_mlp_params / self.layers if self.moe else self._mlp(self.ffn_hidden)

    @cached_property
    def active_mlp_params(self) -> float:
        """One block's MLP as a token sees it: ``experts_per_token`` experts of a MoE block (mean)."""
        if not self.moe:
            return self.mlp_params
        dense = self.layers - self.moe_layers
        return (
            dense * self._mlp(self.ffn_hidden) + self.moe_layers * self._moe_block(self.experts_per_token)
        ) / self.layers

    @cached_property
    def layer_norm_params(self) -> int:
        """A block's norms: ``norms_per_layer`` of width h (LayerNorm: weight and bias), q/k norms of d
        each (per head) or of the whole Q and K widths (``qk_norm_scope`` "projection", OLMo 2)."""
        per = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        if not self.qk_norm:
            qk = 0
        elif self.qk_norm_scope == "projection":
            qk = self.heads * self.head_dim + self.kv_dim
        else:
            qk = 2 * self.head_dim
        return self.norms_per_layer * per + qk

    @cached_property
    def layer_params(self) -> float:
        """One transformer block: attention + MLP + its norms (MoE: the mean over blocks)."""
        return self.attention_params + self.mlp_params + self.layer_norm_params

    @cached_property
    def embedding_params(self) -> int:
        """Token embedding, plus learned positions (GPT-2: max_seq x h)."""
        return self.vocab * self.hidden + (self.max_seq * self.hidden if self.position == "learned" else 0)

    @cached_property
    def final_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    @cached_property
    def head_params(self) -> int:
        """The LM head's own weights (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def _total(self, mlp_sum: float) -> int:
        blocks = self.layers * (self.attention_params + self.layer_norm_params) + mlp_sum
        return int(round(blocks)) + self.embedding_params + self.final_norm_params + self.head_params

    @cached_property
    def params(self) -> int:
        """Total parameters, tied weights once (as transformers' ``num_parameters`` counts them)."""
        if self.param_count is not None:
            return self.param_count
        return self._total(self.total_mlp_params)

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through: MoE blocks with ``experts_per_token`` experts."""
        if self.param_count is not None or not self.moe:
            return self.params
        return self._total(self.active_mlp_params * self.layers)

    def as_json(self) -> dict[str, Any]:
        """``plan --json``'s ``model``: family, params (tied weights once), active_params, then every
        field the counts and the runtime read."""
        if self.states_only:
            return {"family": None, "params": self.params, "active_params": self.params, "name": self.name}
        used = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("param_count", "family")}
        used["eos_ids"] = list(self.eos_ids)
        used["dense_layers"] = list(self.dense_layers)
        used["full_attention_layers"] = list(self.full_attention_layers)
        used["nope_layers"] = list(self.nope_layers)
        return {"family": self.family, "params": self.params, "active_params": self.active_params, **used}

    @classmethod
    def from_param_count(cls, count: float) -> ModelSpec:
        n = int(count)
        return cls(name=f"{_human_count(n)} parameters", param_count=n, source="bare parameter count")

    @cached_property
    def exclusion_note(self) -> str:
        """One line saying what the parameter count leaves out, or ""."""
        if not self.excluded:
            return ""
        size = f" ({_human_count(self.excluded_params)} parameters)" if self.excluded_params else ""
        return (
            f"not counted or planned: {self.excluded}{size}; the plan covers the {_human_count(self.params)} "
            f"parameters transformers builds for {self.family}"
        )

    def describe(self) -> str:
        if self.states_only:
            return f"{self.name} (shape unknown: model states only)"
        moe = (
            (
                f", {self.experts} experts ({self.experts_per_token} active, {_human_count(self.active_params)} "
                f"active parameters)"
            )
            if self.moe
            else ""
        )
        return (
            f"{self.name}: {self.family}, {_human_count(self.params)} parameters, {self.layers} layers, hidden "
            f"{self.hidden}, {self.heads} heads ({self.kv_heads} KV, head_dim {self.head_dim}), {self.mlp} MLP "
            f"{self.ffn_hidden}, vocab {self.vocab}{moe}"
        )


def _positive_int(spec: ModelSpec, name: str, value: Any, zero_ok: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero_ok else 1):
        kind = "a non-negative" if zero_ok else "a positive"
        raise MeshwiseError(f"model {spec.name!r}: {name} must be {kind} integer, got {value!r}")


def _human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))
