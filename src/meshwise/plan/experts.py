"""The planner's expert-parallel part: which ep to search, and the explanation's step that says why
ep was (or was not) chosen. Pure Python, no torch."""

from __future__ import annotations

from meshwise.cost.estimate import Estimate
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec
from meshwise.units import gb_text


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_degrees(model: ModelSpec, ranks: int) -> list[int]:
    """ep: divisors of the ``ranks`` EP is carved from (dp_shard x cp) that divide the experts (1
    for a dense model)."""
    if model.states_only or not model.moe:
        return [1]
    return [e for e in _divisors(ranks) if model.experts % e == 0]


def step_experts(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate, usable: float, other
) -> str:
    """Expert parallelism: what a MoE block holds, what each rank keeps under the chosen ep, and the
    figures that decided ep (``other``: the best layouts of the other kind, found by the same search)."""
    return step_experts_with_figures(model, cluster, train, winner, usable, other)[0]


def moe_block_params(model: ModelSpec) -> int:
    """One MoE block's own parameters: attention, norms, its routed experts, router and shared expert
    (not the mean over the model's blocks, dense ones included)."""
    return model.attention_params + model.layer_norm_params + model._moe_block(model.experts)


def _placement(cluster: ClusterSpec, win) -> str:
    """Where the all-to-all runs: the ep ranks' span against the NVLink domain (cost/experts.py's link)."""
    span = win.ep * (1 if win.ep_folds_tp else win.tp)
    domain = cluster.domain_gpus
    where = f"the {domain}-GPU NVLink domain" if domain > cluster.gpus_per_node else f"a {domain}-GPU node (NVLink)"
    if span <= domain:
        return f"its all-to-all spans {span} GPUs, inside {where}"
    return f"its all-to-all spans {span} GPUs, past {where}: over the scale-out link"


def _decider(other, winner: Estimate) -> tuple[str, dict]:
    """The figure that decided ep: ``other`` (a SearchResult) holds the best layout of the other kind,
    ep = 1 where the chosen has ep > 1 and the reverse; its step time against the chosen one's, or
    that none of that kind fits."""
    kind = "ep=1" if winner.layout.ep > 1 else "ep > 1"
    if not other.best:
        return f"no layout with {kind} fits ({other.enumerated:,} tried)", {}
    b = other.best[0]
    slower = b.time.step_s / winner.time.step_s - 1
    return (
        f"the best with {kind}, {b.layout.short()}, takes {b.time.step_s:.3g} s/step ({slower:+.1%}, "
        f"{gb_text(b.memory.total)} per rank)"
    ), {"other_kind_step_s": b.time.step_s, "other_kind_total_bytes": b.memory.total}


def step_experts_with_figures(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate, usable: float, other
) -> tuple[str, dict]:
    """:func:`step_experts`, with the figures it quotes (bytes by name); ``other``: the search's result
    for the layouts of the other kind (planner._other_ep)."""
    win = winner.layout
    block = moe_block_params(model)
    expert = model._mlp(model.expert_ffn_hidden)
    a2a_bytes = sum(c.bytes_per_step for c in winner.comm if c.kind == "all_to_all")
    m = win.accum(train.global_batch)
    gathers = 2 * m if win.zero == 3 else 1  # ZeRO-3 gathers every micro-batch, forward and backward
    gather_bytes = model.expert_params / win.pp * train.weight_bytes * gathers
    shared = (
        f", a shared expert of {model._mlp(model.shared_ffn_hidden) / 1e6:,.0f}M" if model.shared_ffn_hidden else ""
    )
    head = (
        f"E. Experts: a MoE block holds {block / 1e9:,.3g}B params ({model.experts} routed experts of "
        f"{expert / 1e6:,.0f}M{shared}, the router and attention), {model.moe_layers} of the {model.layers} "
        f"blocks; {model.experts_per_token} experts active per token ({model.active_params / 1e9:,.3g}B active "
        f"params of {model.params / 1e9:,.3g}B). "
    )
    rank_experts = model.expert_params / win.pp / win.ep
    figures = {
        "rank_expert_states_bytes": rank_experts * train.state_bytes_per_param,
        "all_to_all_bytes": a2a_bytes,
        "gather_bytes": gather_bytes,
        "usable_bytes": usable,
    }
    decider, more = _decider(other, winner)
    figures.update(more)
    if win.ep == 1:
        return head + (
            f"ep=1: every rank keeps all {model.experts} experts of each of its MoE blocks "
            f"({gb_text(figures['rank_expert_states_bytes'])} of their states before ZeRO sharding), "
            f"gathered by ZeRO ({gb_text(gather_bytes)} per rank per step); {decider}."
        ), figures
    return (
        head + f"ep={win.ep}: each rank keeps {model.experts // win.ep} of each MoE block's {model.experts} "
        f"experts ({gb_text(figures['rank_expert_states_bytes'])} of their states before ZeRO sharding); "
        f"{_placement(cluster, win)}; the all-to-all moves {gb_text(a2a_bytes)} per rank per step "
        f"(gathering the experts instead: {gb_text(gather_bytes)}); chosen because {decider}."
    ), figures
