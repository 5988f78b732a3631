"""Expert parallelism's collectives: the all-to-alls of each MoE block, and under context
parallelism the routing counts its load-balancing loss sums over the cp ranks (docs/cost-model.md)."""

from __future__ import annotations

from meshwise.cost import comm, moe_dispatch
from meshwise.cost.comm import Collective
from meshwise.cost.memory import RankShape
from meshwise.layout import Layout
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def ep_collectives(
    model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int, cluster: ClusterSpec
) -> list[Collective]:
    """Per micro-batch and MoE block, as runtime/moe.py issues them (``train`` is the rank's own
    setting, a sequence of s/cp tokens under context parallelism):

    - on the EP group (``ep`` ranks, ``tp`` apart, carved from dp_shard x cp: layout.expert_mesh_shape;
      folded over tp, Layout.ep_folds_tp: ``ep`` consecutive ranks, each with ``T / tp`` of the tokens),
      in forward an all-to-all of the expert counts (E int64) and two of the token copies, dispatch
      and combine (``T k h e`` each: every copy of the micro-batch's T = mbs * s/cp local tokens,
      the whole local sequence under TP), in backward the two in reverse; times the capacity factor
      where the experts' inputs are padded to it (``train.moe_capacity_factor``);
    - under Megatron-Core with tp > 1 (not folded; its expert TP is the TP size), each TP rank
      dispatches its own ``T / tp`` sequence-parallel tokens, and the expert-TP group all-gathers
      the received copies after the dispatch and reduce-scatters them before the combine
      (token_dispatcher.py, MoEAlltoAllTokenDispatcher): the all-to-alls carry ``T k h e / tp``, and an
      all-gather and a reduce-scatter of ``T k h e`` run on the TP group, in backward in reverse;
    - under cp > 1 (any ep), in forward an all-reduce on the cp group of the routing counts of the
      micro-batch's sequences (mbs x E float32) for the sequence-wise load-balancing loss.

    ``ac=full`` runs the forward's collectives again."""
    if model.states_only or not model.moe:
        return []
    moe_blocks = round(shape.expert_params / (model.experts * model._mlp(model.expert_ffn_hidden)))
    moe_blocks += train.mtp_layers if shape.has_head else 0  # multi-token prediction's MoE blocks (cost/mtp.py)
    forwards = 2 if layout.ac == "full" else 1
    calls = moe_blocks * m
    out: list[Collective] = []
    if layout.ep > 1:
        # folded over tp (layout.ep_folds_tp): ep consecutive ranks, each routing its 1/tp of the sequence
        folded = layout.ep_folds_tp
        gathered = train.runtime == "megatron" and layout.tp > 1 and not folded  # expert-TP all-gather
        stride = 1 if folded else layout.tp
        per_node = min(layout.ep, max(1, cluster.domain_gpus // stride))  # the group's ranks in one NVLink domain
        tokens = train.seq_len * layout.mbs / (layout.tp if folded or gathered else 1)
        padded = train.moe_capacity_factor if train.moe_capacity_factor > 0 else 1.0
        copies = moe_dispatch.sent_copies(model, train, layout.ep, layout.ep // per_node)
        payload = padded * tokens * copies * model.hidden * train.activation_bytes
        out += [
            _all_to_all(layout.ep, per_node, payload, calls * (2 * forwards + 2), cluster),
            _all_to_all(layout.ep, per_node, model.experts * 8, calls * forwards, cluster),
        ]
        if gathered:
            tp_link = cluster.link_for(layout.tp, 1)
            out += [
                comm.collective(kind, "tp", layout.tp, layout.tp * payload, calls * (forwards + 1), tp_link)
                for kind in ("all_gather", "reduce_scatter")
            ]
    if layout.cp > 1 and calls:
        out.append(
            comm.collective(
                "all_reduce",
                "cp",
                layout.cp,
                layout.mbs * model.experts * 4,
                calls * forwards,
                cluster.link_for(layout.cp, layout.tp),
            )
        )
    return out


def _all_to_all(n: int, per_node: int, payload: float, calls: int, cluster: ClusterSpec) -> Collective:
    """``calls`` all-to-alls of ``payload`` bytes per rank over an EP group of ``n`` ranks, ``per_node`` of
    them in each NVLink domain. Inside one domain: the pairwise exchange on NVLink (cost/comm.py). Across
    domains each rank sends the share bound for other domains, ``(n - per_node) / n`` of its payload,
    through its own NIC at the per-GPU scale-out rate (every rank of a node sends at once, so the node's
    NICs are not pooled for one rank as a ring's channels are: DeepEP's internode dispatch and combine
    run at 43-58 GB/s per GPU of a 50 GB/s NIC, deepseek-ai/DeepEP docs/legacy.md), its own domain's share
    on NVLink at the same time."""
    if per_node >= n:
        return comm.collective("all_to_all", "ep", n, payload, calls, cluster.link_for(n, 1))
    inter, intra = cluster.inter, cluster.intra
    remote_s = (n - per_node) / n * payload / inter.bytes_per_s
    local_s = (per_node - 1) / n * payload / intra.bytes_per_s
    seconds = (n - 1) * inter.latency_s + max(remote_s, local_s)
    return Collective("all_to_all", "ep", payload * calls, calls, calls * seconds)


def exposed_s(ops: list[Collective], compute_s: float, train: TrainSpec) -> float:
    """Seconds of a rank's expert-parallel collectives on its critical path: all of them (the experts
    wait for their tokens), or under ``train.overlap_ep_comm`` (Megatron's
    ``--overlap-moe-expert-parallel-comm``, DeepSeek-V3's DualPipe: one micro-batch's all-to-alls run
    while another's forward or backward computes) what exceeds the rank's compute."""
    total_s = sum(op.seconds_per_step for op in ops)
    return max(0.0, total_s - compute_s) if train.overlap_ep_comm else total_s
