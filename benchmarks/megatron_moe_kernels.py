"""Count the kernels one Megatron-Core MoE layer launches besides its expert GEMMs, forward and backward,
read off the installed megatron-core (the oracle of --runtime megatron) by running its MoELayer on CPU.

Every aten op the layer dispatches is counted (TorchDispatchMode), less the views and metadata ops that
launch no kernel (``VIEWS``). The router (gate GEMM, score function, top-k, the load-balancing loss) is
run alone; the experts (megatron's local SequentialMLP: Transformer Engine is not installed here) alone
on the same permuted tokens; what the layer runs besides both is the token dispatcher's permute,
unpermute and their metadata (``MoEAlltoAllTokenDispatcher`` at world size 1: no all-to-all, so no
regroup of received chunks). GEMMs (``mm``) are priced as GEMMs and left out of the counts printed.
Default settings, as a run without the fusion flags has them (--moe-permute-fusion and
--moe-router-fusion off), aux-loss balancing, dropless.

The CPU build has no CUDA streams: the dispatcher's device-to-host copy stream and its event (what it
synchronises on before the all-to-all) are stood in for by no-ops. cost/moe_block.py's
``ROUTER_KERNELS`` and ``PERMUTE_KERNELS`` for megatron are these counts
(tests/unit/test_moe_block.py runs this script and compares).

    python benchmarks/megatron_moe_kernels.py [experts top_k [softmax|sigmoid-grouped ...]]   # a JSON object each
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import warnings

VIEWS = {
    "view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "split", "split_with_sizes", "detach",
    "slice", "select", "permute", "reshape", "unsqueeze", "squeeze", "alias", "lift_fresh", "unbind", "chunk",
    "narrow", "view_as", "expand_as", "flatten", "unflatten", "sym_size", "sym_stride", "sym_numel", "size",
    "stride", "dim", "is_same_size", "_local_scalar_dense",
}  # fmt: skip
GEMMS = {"mm", "bmm", "addmm"}


def _stand_in_cuda_streams(torch) -> None:
    """No-op CUDA streams and events for the dispatcher's device-to-host copies on a CPU build."""

    class Stream:
        def wait_stream(self, *args):
            pass

        def record_event(self, *args):
            return self

        def synchronize(self):
            pass

        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    torch.cuda.Stream = lambda *a, **k: Stream()
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.record_stream = lambda self, stream: None


def _counter(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: collections.Counter = collections.Counter()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            result = func(*args, **(kwargs or {}))
            if name not in VIEWS:
                self.ops[name] += 1
                if name not in GEMMS:  # what the kernel reads and writes: its tensor inputs and outputs
                    tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
                    outs = result if isinstance(result, (tuple, list)) else (result,)
                    tensors += [o for o in outs if isinstance(o, torch.Tensor)]
                    self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return result

        def kernels(self) -> int:
            return sum(n for op, n in self.ops.items() if op not in GEMMS)

    return Count


# the two routers meshwise's models configure (plan/megatron_family.router_args): a softmax router with the
# auxiliary balancing loss, and DeepSeek-V3's sigmoid router with group-limited top-k (8 groups, 4 kept),
# the per-expert bias, the scaled weights and the sequence-wise balancing loss
ROUTERS = {
    "softmax": {"moe_router_load_balancing_type": "aux_loss"},
    "sigmoid-grouped": {
        "moe_router_score_function": "sigmoid",
        "moe_router_num_groups": 8,
        "moe_router_group_topk": 4,
        "moe_router_enable_expert_bias": True,
        "moe_router_topk_scaling_factor": 2.5,
        "moe_router_load_balancing_type": "seq_aux_loss",
    },
}


def _layer(torch, experts: int, top_k: int, router: str = "softmax"):
    import torch.distributed as dist

    # one process: an in-memory store, no port (two of these ran at once under pytest-xdist and met on one)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    moe_utils.te_general_gemm = None  # its router GEMM falls back to torch without Transformer Engine
    config = TransformerConfig(
        num_layers=1,
        hidden_size=256,
        num_attention_heads=4,
        num_moe_experts=experts,
        moe_router_topk=top_k,
        moe_ffn_hidden_size=128,
        ffn_hidden_size=128,
        moe_token_dispatcher_type="alltoall",
        moe_aux_loss_coeff=1e-3,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        bias_activation_fusion=False,
        use_cpu_initialization=True,
        **ROUTERS[router],
    )
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    return MoELayer(config, spec.submodules.mlp.submodules)


def _counts(torch, Count, layer, experts: int, top_k: int, tokens: int) -> dict:
    """Kernels (besides GEMMs) of the whole layer, its router alone and its experts alone, forward and
    backward, every parameter's gradient unset before each backward."""
    out = {}
    x = torch.randn(tokens, 1, 256, requires_grad=True)
    layer(x)  # the first call builds what later calls reuse
    fwd, bwd = Count(), Count()
    with fwd:
        y, _ = layer(x)
    layer.zero_grad(set_to_none=True)
    with bwd:
        y.sum().backward()
    out["layer"] = (fwd.kernels(), bwd.kernels())
    fwd, bwd = Count(), Count()
    with fwd:
        probs, _ = layer.router(x.view(-1, 256))
    layer.zero_grad(set_to_none=True)
    with bwd:
        probs.sum().backward()
    out["router"] = (fwd.kernels(), bwd.kernels())
    out["router_bytes"] = (fwd.bytes, bwd.bytes)
    per_expert = torch.full((experts,), tokens * top_k // experts, dtype=torch.long)
    # not leaves, as the dispatcher's outputs are not: their gradients flow on rather than accumulate
    h = torch.randn(tokens * top_k, 256, requires_grad=True) * 1.0
    p = torch.rand(tokens * top_k, requires_grad=True) * 1.0
    fwd, bwd = Count(), Count()
    with fwd:
        e, _ = layer.experts(h, per_expert, p)
    layer.zero_grad(set_to_none=True)
    with bwd:
        e.sum().backward()
    out["experts"] = (fwd.kernels(), bwd.kernels())
    return out


def count(experts: int = 8, top_k: int = 2, router: str = "softmax", tokens: int = 256) -> dict:
    """Kernels (besides GEMMs) of the router and of the dispatcher (the layer less its router and its
    experts), forward and backward, the bytes the router's kernels move per score, and the experts' kernels
    per local expert (the change from ``experts`` to
    twice as many local experts, per expert): megatron's local experts, not Transformer Engine's."""
    warnings.simplefilter("ignore")
    import torch

    _stand_in_cuda_streams(torch)
    Count = _counter(torch)
    one = _counts(torch, Count, _layer(torch, experts, top_k, router), experts, top_k, tokens)
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    two = _counts(torch, Count, _layer(torch, 2 * experts, top_k, router), 2 * experts, top_k, tokens)
    parallel_state.destroy_model_parallel()  # as it started: another count can follow in this process
    torch.distributed.destroy_process_group()
    per_expert = [(b - a) / experts for a, b in zip(one["experts"], two["experts"])]
    layer_per_expert = [(b - a) / experts for a, b in zip(one["layer"], two["layer"])]
    fixed = [t - experts * s for t, s in zip(one["layer"], layer_per_expert)]
    experts_fixed = [t - experts * s for t, s in zip(one["experts"], per_expert)]
    dispatcher = [round(f - r - x) for f, r, x in zip(fixed, one["router"], experts_fixed)]
    # the router's bytes grow with its tokens x experts scores: their change with twice the experts, per score
    per_score = [(b - a) / (tokens * experts) for a, b in zip(one["router_bytes"], two["router_bytes"])]
    return {
        "num_experts": experts,
        "top_k": top_k,
        "router_kind": router,
        "router": list(one["router"]),
        "dispatcher": dispatcher,
        "router_bytes_per_score": per_score,
        "per_local_expert": per_expert,
        "per_local_expert_in_layer": layer_per_expert,
    }


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:3]] or [8, 2]
    for router in sys.argv[3:] or ["softmax"]:
        print(json.dumps(count(*sizes, router)))
