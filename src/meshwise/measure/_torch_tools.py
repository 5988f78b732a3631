"""The one place meshwise reaches into torch's private memory trackers (torch.distributed._tools).

``MemTracker`` attributes every live tensor storage to a category (parameter, buffer, gradient,
activation, temporary, optimizer state) through a dispatch mode and module hooks, and keeps the
snapshot at the peak of the tracked region. ``FSDPMemTracker`` adds FSDP2's own categories
(sharded and unsharded parameters and gradients, all-gather and reduce-scatter buffers).
"""

from __future__ import annotations

from typing import Any

import torch

from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._pytree import tree_flatten


class _LeafSafeModTracker(ModTracker):
    """ModTracker that does not hook the backward of leaf inputs: a pipeline stage's received
    activations are leaves, and zero-bubble schedules differentiate them with ``autograd.grad``,
    which refuses grad hooks on leaves. Only the per-module backward nesting is lost."""

    def _fw_pre_hook(self, mod, input):  # type: ignore[override]
        args, _ = tree_flatten(input)
        kept = tuple(a for a in args if not (isinstance(a, torch.Tensor) and a.requires_grad and a.grad_fn is None))
        return super()._fw_pre_hook(mod, kept)


class StepMemTracker(MemTracker):
    """MemTracker that accepts a root module's forward several times per step (micro-batches).

    MemTracker keeps per-module statistics and refuses a root's second forward as "a new
    iteration"; meshwise needs only the global peak snapshot, so a root's stale per-module entry is
    dropped and tracking goes on. (FSDPMemTracker refuses the same, so FSDP2's buffers are read as
    the tensors they are.)"""

    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _LeafSafeModTracker()

    def _pre_fw_hook(self, module, inputs) -> None:  # type: ignore[override]
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} <= {"Global"}:
                del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)


def tracker_for(modules: list, optimizer: Any) -> MemTracker:
    """A tracker over the modules (their parameters and buffers) and the optimizer's states."""
    tracker = StepMemTracker()
    tracker.track_external(*modules, optimizer)
    return tracker


def peak_by_category(tracker) -> dict[str, int]:
    """{category name: bytes} of the peak snapshot, summed over devices (the ``Total`` key dropped)."""
    out: dict[str, int] = {}
    for snap in tracker.get_tracker_snapshot("peak").values():
        for key, value in snap.items():
            name = getattr(key, "value", str(key))
            if name != "Total":
                out[name] = out.get(name, 0) + int(value)
    return out
