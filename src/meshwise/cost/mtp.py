"""Multi-token prediction's work on the last pipeline stage (GPU op model).

A run that trains ``D = TrainSpec.mtp_layers`` multi-token-prediction modules (DeepSeek-V3 report, arXiv
2412.19437, Sec. 2.2: ``D = 1``; Megatron-Core's ``--mtp-num-layers``, multi_token_prediction.py) runs, per
micro-batch and module, on the stage that holds the output head (Megatron-Core builds them in the last
stage's post-process; the report's DualPipe keeps them with the deepest layers and the head):

- the embedding of the tokens shifted by one more position (the shared table);
- the projection of the two normed inputs, ``[norm(h_prev); norm(emb)] (T x 2h) @ W (2h x h)``, split by TP;
- one more block of the model's deepest kind (DeepSeek-V3: latent attention and a MoE MLP), priced as a
  block of the main model (cost/kernels.py ``block_seconds``, cost/moe_block.py ``rank_mlp_seconds``);
- the shared output head and its loss again (cost/kernels.py ``head_seconds``).

The two input norms are memory-bound passes over ``2 T h`` elements, left out (under 0.1% of the block).
Its memory (the module's weights and activations on the last stage) is not yet in the plan's memory.
"""

from __future__ import annotations

from meshwise.cost import kernels, moe_block
from meshwise.layout import Layout
from meshwise.spec import AcceleratorSpec, ModelSpec, TrainSpec


def mtp_seconds(model: ModelSpec, accel: AcceleratorSpec, train: TrainSpec, layout: Layout) -> float:
    """Forward + backward (+ recompute under the layout's ``ac``) seconds of the ``train.mtp_layers`` modules
    for one micro-batch on the last stage (module docstring); ``train`` is the rank's own (s/cp tokens)."""
    if not train.mtp_layers or model.states_only:
        return 0.0
    mbs, tp, sp, ac = layout.mbs, layout.tp, layout.sp, layout.ac
    fwd, bwd, rec = kernels.block_seconds(model, accel, train, mbs, tp, sp, ac, layout.cp)
    mlp = 0.0  # a dense model's block_seconds holds its MLP
    if model.moe:
        mlp = moe_block.rank_mlp_seconds(model, accel, train, mbs, tp, layout.ep, layout.ep_folds_tp, ac, 1, 1)
    tokens, h = mbs * train.seq_len, model.hidden
    proj_f, proj_b = kernels.linears_seconds(accel, train, tokens, (h / tp, 2 * h))
    head = kernels.head_seconds(model, accel, train, mbs, tp, sp) + kernels.embedding_seconds(
        model, accel, train, mbs, tp, sp
    )
    again = proj_f if ac == "full" else 0.0
    return train.mtp_layers * (fwd + bwd + rec + mlp + proj_f + proj_b + again + head)
