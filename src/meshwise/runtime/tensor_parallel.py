"""Tensor (and sequence) parallelism with DTensor's ``parallelize_module`` (Megatron-style split).

Per block: Q, K, V and the MLP gate/up projections column-wise (heads / ffn split over tp), the
attention output and MLP down projections row-wise. The embedding is split column-wise (hidden
shards; its output gathered, then under SP split on the sequence): DTensor's embedding backward
has no vocabulary-sharded strategy, so a row-wise (vocabulary-sharded) table's weight gradient
would come out whole on every TP rank. A tied embedding is split row-wise with the LM head. The
LM head is split column-wise (vocab shards) with its logits gathered (``output_layouts=
Replicate()``), so the loss runs on full logits, identically on every TP rank.

``sp=off``: activations between the parallel regions are replicated; each row-wise layer ends in
an all-reduce (forward), each column-wise region starts with one in backward.
``sp=on``: the residual stream and the norms are sharded on the sequence dimension
(``SequenceParallel``); an all-gather enters each column-wise region and a reduce-scatter leaves
each row-wise one (forward), and the reverse in backward.
The residual stream between modules is a plain local tensor: (b, s, h), or (b, s/tp, h) with SP.
A mixture-of-experts block (``runtime/moe.py``) is not split: every TP rank runs it whole on the
whole (under SP, all-gathered) sequence and keeps its own sequence shard of the output.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from meshwise.runtime import float8
from meshwise.runtime.model import Transformer
from meshwise.runtime.moe import MoE


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, sp: bool, precision: str | None = None) -> None:
    """Shard ``model`` (a whole model or a pipeline chunk) over ``tp_mesh`` in place; under ``fp8``
    its float8 linears take torchao's float8 styles (:func:`meshwise.runtime.float8.tp_styles`)."""
    stream = Shard(1) if sp else Replicate()  # layout of the residual stream between modules
    device = tp_mesh.device_type
    plan: dict[str, object] = {}
    if model.tok_embeddings is not None:
        if model.spec.tied_embeddings:  # shares the head's vocabulary shards (Shard(0))
            plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        else:
            # split on the hidden dimension: DTensor's embedding backward has no vocabulary-sharded
            # strategy, so a row-wise table's gradient comes out whole (V x h, every TP rank)
            plan["tok_embeddings"] = ColwiseParallel(
                input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=not sp
            )
    if model.norm is not None and sp:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=stream, output_layouts=Replicate(), use_local_output=True)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    if model.tok_embeddings is not None and sp and not model.spec.tied_embeddings:
        # gathered, then split on the sequence (no all-to-all, which gloo lacks; its gradient is gathered)
        parallelize_module(
            model.tok_embeddings,
            tp_mesh,
            PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=stream),
        )
    for block in model.layers.values():
        block_plan: dict[str, object] = {}
        regions: dict[str, type] = {"attention": PrepareModuleInput, "mlp": PrepareModuleInput}
        for region, column, row in (("attention", ("wq", "wk", "wv"), "wo"), ("mlp", ("w1", "w3"), "w2")):
            module = getattr(block, region)
            if isinstance(module, MoE):
                continue
            column_linears = {n: getattr(module, n) for n in column if getattr(module, n, None) is not None}
            for name, linear in column_linears.items():
                block_plan[f"{region}.{name}"] = float8.tp_style(precision, linear, "colwise", sp, device)()
            block_plan[f"{region}.{row}"] = float8.tp_style(precision, getattr(module, row), "rowwise", sp, device)(
                output_layouts=stream
            )
            regions[region] = float8.region_input_style(precision, list(column_linears.values()), sp, device)
        if block.attention.q_norm is not None:
            # Qwen3's per-head norms see only this rank's heads: their weights are Replicate DTensors
            # over the head-sharded input (dim 2), so each weight gradient is summed over all heads.
            block_plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            block_plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if sp:  # every norm of the residual stream: on the input and (Gemma 2/3, OLMo 2) the output side
            for norm in ("attention_norm", "mlp_norm"):
                if getattr(block, norm, None) is not None:
                    block_plan[norm] = SequenceParallel()
            for norm in ("attention_out_norm", "mlp_out_norm"):  # their output joins the local residual stream
                if getattr(block, norm, None) is not None:
                    block_plan[norm] = SequenceParallel(use_local_output=True)
        # One DTensor input per parallel region: Q/K/V (and gate/up) share it, so backward reduces
        # the input gradient once per region (all-reduce, or reduce-scatter under SP), not per matmul.
        block_plan["attention"] = regions["attention"](
            input_layouts=(stream, None, None), desired_input_layouts=(Replicate(), None, None)
        )
        block_plan["mlp"] = regions["mlp"](input_layouts=(stream,), desired_input_layouts=(Replicate(),))
        if isinstance(block.mlp, MoE):
            for key in ("mlp.w1", "mlp.w2", "mlp.w3", "mlp"):
                block_plan.pop(key, None)
            if sp:
                block_plan["mlp"] = PrepareModuleInputOutput(
                    input_layouts=(stream,),
                    desired_input_layouts=(Replicate(),),
                    use_local_input=True,
                    output_layouts=(Replicate(),),
                    desired_output_layouts=(stream,),
                    use_local_output=True,
                )
        parallelize_module(block, tp_mesh, block_plan)
    if model.spec.tied_embeddings and model.tok_embeddings is not None and model.output is not None:
        # Both are Shard(0) on the vocab dimension: re-tie the two DTensor parameters.
        model.output.weight = model.tok_embeddings.weight
