"""meshwise: plan, run and measure the parallel layout of a transformer's training.

The planning half (``meshwise.spec``, ``meshwise.layout``, ``meshwise.cost``, ``meshwise.plan.planner``)
is pure Python and never imports torch; the runtime half lives in ``meshwise.runtime``.
"""

__version__ = "0.1.0"

_RUNTIME_NAMES = ("parallelize", "build_mesh", "end_process_group", "ParallelModel", "OptimizerConfig")


def __getattr__(name: str):
    """``meshwise.parallelize`` and friends import torch only when first used."""
    if name in _RUNTIME_NAMES or name == "runtime":
        import importlib

        runtime = importlib.import_module("meshwise.runtime")
        return runtime if name == "runtime" else getattr(runtime, name)
    raise AttributeError(f"module 'meshwise' has no attribute {name!r}")
