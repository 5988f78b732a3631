"""Expert parallelism's collectives: the all-to-alls of each MoE block (docs/cost-model.md)."""

from __future__ import annotations

from meshwise.cost import comm
from meshwise.cost.comm import Collective
from meshwise.cost.memory import RankShape
from meshwise.layout import Layout
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


def ep_collectives(model: ModelSpec, train: TrainSpec, layout: Layout, shape: RankShape, m: int,
                    cluster: ClusterSpec) -> list[Collective]:
    """Per micro-batch and MoE block, as runtime/moe.py issues them on the EP group (``ep`` ranks,
    ``tp`` apart: layout.expert_mesh_shape): in forward an all-to-all of the expert counts (E int64)
    and two of the token copies, dispatch and combine (``T k h e`` each: every copy of the
    micro-batch's T tokens, the whole sequence under TP), in backward the two in reverse; ``ac=full``
    runs the forward's three again."""
    if layout.ep == 1 or model.states_only or not model.moe:
        return []
    link = cluster.link_for(layout.ep, layout.tp)
    moe_blocks = shape.expert_params / (model.experts * model._mlp(model.expert_ffn_hidden))
    forwards = 2 if layout.ac == "full" else 1
    payload = train.seq_len * layout.mbs * model.experts_per_token * model.hidden * train.activation_bytes
    calls = round(moe_blocks) * m
    return [comm.collective("all_to_all", "ep", layout.ep, payload, calls * (2 * forwards + 2), link),
            comm.collective("all_to_all", "ep", layout.ep, model.experts * 8, calls * forwards, link)]
