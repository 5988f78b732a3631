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


def step_experts(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate, usable: float) -> str:
    """Expert parallelism: are the experts too many for one rank's memory, or is moving the tokens to
    them (all-to-all) cheaper than gathering them (ZeRO) to every rank?"""
    return step_experts_with_figures(model, cluster, train, winner, usable)[0]


def step_experts_with_figures(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate,
                              usable: float) -> tuple[str, dict]:
    """:func:`step_experts`, with the figures it quotes (bytes by name)."""
    win = winner.layout
    experts_gb = model.expert_params * train.state_bytes_per_param
    a2a = [c for c in winner.comm if c.kind == "all_to_all"]
    a2a_bytes = sum(c.bytes_per_step for c in a2a)
    m = win.accum(train.global_batch)
    gathers = (2 * m if win.zero == 3 else 1)  # ZeRO-3 gathers every micro-batch, forward and backward
    gather_bytes = model.expert_params / win.pp * train.weight_bytes * gathers
    head = (f"E. Experts: {model.experts} x {model.moe_layers} blocks hold {model.expert_params / 1e9:,.3g}B of the "
            f"{model.params / 1e9:,.3g}B params ({gb_text(experts_gb)} of states), {model.experts_per_token} active per token "
            f"({model.active_params / 1e9:,.3g}B active params). ")
    figures = {"experts_states_bytes": experts_gb, "all_to_all_bytes": a2a_bytes, "gather_bytes": gather_bytes,
               "usable_bytes": usable}
    if win.ep == 1:
        return head + (f"ep=1: sharded by ZeRO the experts fit, and gathering them ({gb_text(gather_bytes)} per rank per "
                       "step) was not slower than any layout with ep > 1 that fits."), figures
    why = []
    if experts_gb / win.tp > usable:
        why.append(f"too many for one rank's memory ({gb_text(experts_gb)} > {gb_text(usable)})")
    why.append(f"all-to-all moves {gb_text(a2a_bytes)} per rank per step where gathering the experts would move "
               f"{gb_text(gather_bytes)}" + (" (cheaper)" if a2a_bytes < gather_bytes else ""))
    return (head + f"ep={win.ep}: each rank keeps {model.experts // win.ep} of each block's experts; " + "; ".join(why)
            + "."), figures
