"""The activation-checkpointing recipes, written down once: the runtime applies them, the cost model counts them.

- ``full``: every transformer block is checkpointed; only its input is kept, the whole block runs
  again in backward.
- ``selective``: every transformer block is checkpointed with an op-level policy that keeps the
  outputs of the ops in ``SELECTIVE_SAVE_OPS`` (the matrix multiplies and the fused attention) and
  recomputes everything else (norms, rotary, SiLU and the gating multiply): cheap elementwise work
  is redone, no matmul FLOPs are.
"""

# aten op names (without the ``aten.`` prefix and overload) whose outputs ``selective`` keeps.
SELECTIVE_SAVE_OPS = (
    "mm",
    "addmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
