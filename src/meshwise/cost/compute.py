"""FLOPs of a training step.

Per token and block, the forward costs ``2 * (matmul parameters)`` plus ``4 * s * h`` for the
attention scores and their product with V (the full square, as Narayanan et al. 2021 Eq. 3 and
Korthikanti et al. 2022 Eq. 7 count it, even though causal attention needs half); for a mixture of
experts the matmul parameters are the active ones (k experts per token). The LM head adds
``2 * h * V``. Backward costs twice the forward.

- model FLOPs = 3 x forward (Korthikanti Eq. 7 for GPT shapes: 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)));
- hardware FLOPs add recomputation: ``full`` re-runs every block's forward (Narayanan Eq. 3, the
  96 factor); meshwise's ``selective`` recomputes only elementwise ops (no matmul FLOPs), so its
  hardware FLOPs equal the model FLOPs. The paper's own selective (recompute the attention core)
  is Eq. 8.
"""

from __future__ import annotations

from meshwise.spec import ModelSpec


def attention_core_flops_per_token(model: ModelSpec, seq: int) -> float:
    """A block's attention core (scores and their weighted sum) per token, forward: ``4 s h``
    (Narayanan et al. 2021, the convention of the whole model: no causal halving)."""
    return 4.0 * seq * model.hidden


def block_forward_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Mixture of experts: the parameters a token passes through (its k experts, the shared expert
    and the router; ``active_mlp_params``), the mean over the blocks."""
    matmul_params = model.attention_params + model.active_mlp_params
    return 2.0 * matmul_params + attention_core_flops_per_token(model, seq)


def tp_divides_moe(ep_folds_tp: bool, runtime: str) -> bool:
    """Whether TP divides a MoE block's expert work: expert parallelism folded over the TP ranks (each
    routes its 1/tp of the tokens), or Megatron-Core, whose expert TP defaults to the TP size (each TP
    rank holds 1/tp of every expert's width). meshwise's runtime otherwise runs the block whole on
    every TP rank (runtime/moe.py)."""
    return ep_folds_tp or runtime == "megatron"


def tp_rank_flops_per_token(model: ModelSpec, seq: int, tp: int, moe_split: bool = False) -> float:
    """A block's forward FLOPs on one TP rank: TP divides all of them except a MoE block's MLP,
    which every TP rank runs whole unless ``moe_split`` (``tp_divides_moe``)."""
    moe = 0.0 if moe_split else 2.0 * (model.active_mlp_params - model.dense_mlp_params)
    return (block_forward_flops_per_token(model, seq) - moe) / tp + moe


def head_forward_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden * model.vocab


def recompute_factor(ac: str) -> float:
    """Forward passes of a block in one step: 3 (fwd + 2x bwd), 4 with full recompute."""
    return 4.0 if ac == "full" else 3.0


def model_flops(model: ModelSpec, seq: int, tokens: float) -> float:
    """Model FLOPs for ``tokens`` tokens (6*N*tokens plus attention, for a model with a known shape)."""
    if model.states_only:
        return 6.0 * model.params * tokens
    return (
        3.0 * tokens * (model.layers * block_forward_flops_per_token(model, seq) + head_forward_flops_per_token(model))
    )


def hardware_flops(model: ModelSpec, seq: int, tokens: float, ac: str) -> float:
    """Model FLOPs plus the recomputed forward of every block under ``full``."""
    extra = 0.0
    if ac == "full" and not model.states_only:
        extra = tokens * model.layers * block_forward_flops_per_token(model, seq)
    return model_flops(model, seq, tokens) + extra


def narayanan_eq3(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs per iteration with full recompute."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
