"""The optimizer's settings: one frozen dataclass for the runtime (``meshwise.parallelize``) and for
``meshwise train``'s ``[optimizer]`` section alike (pure Python, no torch).

AdamW (Loshchilov & Hutter 2019): decoupled weight decay ``weight_decay``, moments ``beta1`` and
``beta2``, ``eps`` in the denominator; gradients clipped to a global norm of ``grad_clip``. ``lr``
is the peak learning rate; ``min_lr`` the floor of ``meshwise train``'s cosine decay (the runtime
steps at whatever ``lr`` its param groups hold).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerConfig:
    # peak learning rate (after warm-up): at 3e-3 `small` spiked at the warm-up's end in 20 of 21 runs
    # (docs/train.md, "float8"), at 1e-3 it trains to the same loss
    lr: float = 1e-3
    min_lr: float = 1e-4  # learning rate at the end of the cosine decay (meshwise train)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # decoupled (AdamW)
    grad_clip: float = 1.0  # max global gradient norm
