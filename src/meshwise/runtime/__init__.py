"""The runtime half of meshwise: run a Layout on PyTorch's distributed stack (imports torch).

``build_mesh`` validates the layout and builds the 5-D DeviceMesh; ``parallelize`` returns this
rank's stage modules, pipeline schedule and optimizer with a ``step(inputs, targets)`` helper;
``end_process_group`` ends the run (gloo's threads included).

- ``mesh``: the device mesh; ``parallelize``: one layout composed, chunk by chunk;
- ``model``: the reference model; ``moe``: the mixture-of-experts block; ``optim``: AdamW and
  clipping by the global gradient norm;
- ``tensor_parallel`` (TP/SP), ``data_parallel`` (ZeRO on FSDP2), ``pipeline``, ``context_parallel``
  (ring attention), ``expert_parallel``, ``activation_checkpointing``, ``compile``, ``float8``: one
  parallelism or technique each;
- ``_torch_private``: every private torch API meshwise touches, in one place.
"""

from meshwise.runtime.mesh import build_mesh, end_process_group
from meshwise.runtime.model import Transformer, build_model, init_weights, loss_sum
from meshwise.runtime.optim import OptimizerConfig
from meshwise.runtime.parallelize import ParallelModel, parallelize

__all__ = [
    "build_mesh",
    "end_process_group",
    "parallelize",
    "ParallelModel",
    "OptimizerConfig",
    "Transformer",
    "build_model",
    "init_weights",
    "loss_sum",
]
