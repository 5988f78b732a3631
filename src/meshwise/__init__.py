"""meshwise: plan, run and measure the parallel layout of a transformer's training.

The planning half (``meshwise.spec``, ``meshwise.layout``, ``meshwise.cost``, ``meshwise.planner``)
is pure Python and never imports torch; the runtime half lives in ``meshwise.runtime``.
"""

__version__ = "0.1.0"
