"""Where a mixture of experts' token copies go: how many ranks (or nodes) a token's ``k`` experts span,
and what DeepEP sends and permutes (docs/cost-model.md, "Mixture of experts").

The ``E`` experts sit on the ``ep`` ranks of the EP group in order, ``E / ep`` each. A dispatcher that
sends every token copy (meshwise's runtime, Megatron-Core's alltoall dispatcher) moves ``T k h`` per
rank each way. DeepEP sends a token once to each rank holding any of its experts, and across the
scale-out network once to each node, which forwards it over NVLink (DeepEP V1's ``get_dispatch_layout``:
``is_token_in_rank``, ``num_tokens_per_rdma_rank``; deep_ep/buffer.py before b306af0): it moves
``T d h``, ``d`` the distinct units (ranks, or nodes where the group crosses the network) a token's
experts span:

- learned routing, and ``random`` routing (Megatron-Core's ``--moe-router-force-load-balancing``: normal
  random logits, moe_utils.py ``RandomSTE``, so a uniform draw): the ``k`` experts drawn without
  replacement from the ``E`` (from the
  ``router_group_topk`` of ``router_groups`` groups it keeps under group-limited routing, DeepSeek-V3's),
  ``d = U (1 - C(E' - E'/U, k) / C(E', k))`` over the ``U`` units those ``E'`` experts fill;
- ``forced`` routing (``TrainSpec.moe_balancing``: NeMo AutoModel's FakeBalancedGate, token ``i`` to
  experts ``k i`` to ``k i + k - 1`` mod ``E``): the mean over the gate's starting experts of the units
  its ``k`` consecutive experts span.

On the receiving rank DeepEP's copies are permuted to their experts in one fused kernel (Megatron-Core's
MoEFlexTokenDispatcher with ``moe_permute_fusion``, as AutoModel and the Megatron-MoE-ModelZoo runs set
it): the received tokens read and the ``T_e k`` copies written, and after the experts the copies read
and the received tokens written with their weighted sum, each way once; backward twice.
"""

from __future__ import annotations

import math
from functools import lru_cache

from meshwise.spec import ModelSpec, TrainSpec

# Kernels of DeepEP's dispatch path per MoE block, forward and backward, read off megatron-core 0.16.1
# (token_dispatcher.py _DeepepManager, fused_a2a.py; not run here: DeepEP needs a GPU): forward the top-k of
# setup_metadata, get_dispatch_layout, the dispatch's notify and copy, fused_indices_to_multihot, the fused
# permute, the unpermute and the combine; backward the unpermute's and permute's mirrors, the combine that is
# the dispatch's backward, and the notify and copy of the dispatch that is the combine's.
DEEPEP_KERNELS = (8, 6)


@lru_cache(maxsize=1024)
def _span(experts: int, top_k: int, units: int, forced: bool) -> float:
    """Expected distinct units among a token's ``top_k`` of ``experts`` experts, split in order over
    ``units`` units (module docstring)."""
    if units <= 1:
        return 1.0
    per = experts / units
    if forced:
        starts = range(0, experts * top_k // math.gcd(experts, top_k), top_k)  # k i mod E over every i
        spans = [len({int(((s + j) % experts) // per) for j in range(top_k)}) for s in starts]
        return sum(spans) / len(spans)
    missed = math.comb(experts - round(per), top_k) / math.comb(experts, top_k)
    return units * (1.0 - missed)


def destinations(model: ModelSpec, train: TrainSpec, units: int) -> float:
    """Distinct units (ranks, or nodes) of ``units`` that one token's experts span: ``d`` of the module
    docstring, at most ``k``."""
    experts, top_k = model.experts, model.experts_per_token
    forced = train.moe_balancing == "forced"
    groups, kept = model.router_groups, model.router_group_topk
    if not forced and 0 < kept < groups and units % groups == 0:  # group-limited: the kept groups' experts
        experts, units = experts * kept // groups, units * kept // groups
    return min(float(top_k), _span(experts, top_k, units, forced))


def sent_copies(model: ModelSpec, train: TrainSpec, ep: int, nodes: int) -> float:
    """Copies of each token a rank's dispatch sends (and its combine receives): ``k`` for an all-to-all,
    under DeepEP the distinct ranks its experts span, or across ``nodes`` > 1 nodes the distinct nodes."""
    if train.moe_dispatcher != "deepep" or ep <= 1:
        return float(model.experts_per_token)
    return destinations(model, train, nodes if nodes > 1 else ep)


def fused_permute_elements(model: ModelSpec, train: TrainSpec, tokens: float, ep: int) -> float:
    """Elements DeepEP's fused permute and unpermute read and write per forward on a rank dispatching
    ``tokens`` tokens: the received tokens (``tokens * d`` over the ``ep`` ranks, balanced) and the
    ``tokens * k`` copies, each way once (module docstring)."""
    received = tokens * destinations(model, train, ep) if ep > 1 else tokens
    return 2.0 * (received + tokens * model.experts_per_token) * model.hidden
