"""The one place meshwise reaches into torch's private memory trackers (torch.distributed._tools).

``MemTracker`` attributes every live tensor storage to a category (parameter, buffer, gradient,
activation, temporary, optimizer state) through a dispatch mode and module hooks, and keeps the
snapshot at the peak of the tracked region. ``FSDPMemTracker`` adds FSDP2's own categories
(sharded and unsharded parameters and gradients, all-gather and reduce-scatter buffers).

``MemTracker`` files a storage by when it was created (in forward: an activation; in backward: a
temporary), so FSDP2's gathered weights and its float32 gradient accumulators land among
activations and temporaries. :class:`RoleMemTracker` also splits its peak by what each storage
is, read from the objects that hold it at that moment (``runtime._torch_private.fsdp_held``).

Failing loudly: ``PRIVATE_NAMES`` lists the private names read or overridden here,
``TRACKER_NAMES`` the private attributes of a tracker instance read here, and every override
counts its calls in ``runtime._torch_private.OVERRIDE_CALLS``: tests/unit/test_torch_canary.py
asserts that each exists and that each override runs during a traced step (a renamed hook in torch
would otherwise never be called, and the peak would be read without it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.distributed._tools.mod_tracker import ModTracker
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.utils._pytree import tree_flatten

from meshwise.runtime._torch_private import OVERRIDE_CALLS

PRIVATE_NAMES = (
    ("torch.distributed._tools.common_utils", "get_untyped_storages"),
    ("torch.distributed._tools.mem_tracker", "_TOTAL_KEY"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._update_peak_stats"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._pre_fw_hook"),
    ("torch.distributed._tools.mem_tracker", "MemTracker.track_external"),
    ("torch.distributed._tools.mod_tracker", "ModTracker._fw_pre_hook"),
    ("torch.distributed._tools.mod_tracker", "ModTracker.get_known_fqn"),
    ("torch.distributed._tools.mod_tracker", "ModTracker.is_bw"),
    ("torch.distributed.tensor._sharding_prop", "ShardingPropagator._propagate_tensor_meta_non_cached"),
)
# private attributes of a MemTracker (and its ModTracker) read here, set when it is made or entered
TRACKER_NAMES = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_WINFO", "_mod_tracker", "memory_tracking", "_depth")
MOD_TRACKER_NAMES = ("parents",)


class _LeafSafeModTracker(ModTracker):
    """ModTracker that does not hook the backward of leaf inputs: a pipeline stage's received
    activations are leaves, and zero-bubble schedules differentiate them with ``autograd.grad``,
    which refuses grad hooks on leaves. Only the per-module backward nesting is lost."""

    def _fw_pre_hook(self, mod, input):  # type: ignore[override]
        OVERRIDE_CALLS["ModTracker._fw_pre_hook"] += 1
        args, _ = tree_flatten(input)
        kept = tuple(a for a in args if not (isinstance(a, torch.Tensor) and a.requires_grad and a.grad_fn is None))
        return super()._fw_pre_hook(mod, kept)


_PROPAGATING = [0]  # depth of DTensor sharding propagations running now (see StepMemTracker)


def _untracked_propagation(propagate: Callable) -> Callable:
    def wrapped(self, op_schema):  # type: ignore[no-untyped-def]
        OVERRIDE_CALLS["ShardingPropagator._propagate_tensor_meta_non_cached"] += 1
        _PROPAGATING[0] += 1
        try:
            return propagate(self, op_schema)
        finally:
            _PROPAGATING[0] -= 1

    wrapped._meshwise_original = propagate  # type: ignore[attr-defined]
    return wrapped


class StepMemTracker(MemTracker):
    """MemTracker that accepts a root module's forward several times per step (micro-batches).

    MemTracker keeps per-module statistics and refuses a root's second forward as "a new
    iteration"; meshwise needs only the global peak snapshot, so a root's stale per-module entry is
    dropped and tracking goes on. (FSDPMemTracker refuses the same, so FSDP2's buffers are read as
    the tensors they are.)

    DTensor's sharding propagation runs each op once more on fake tensors of the *global* shape
    (ShardingPropagator._propagate_tensor_meta_non_cached) to learn its output's metadata.
    MemTracker skips those ops by comparing the active fake mode with the one at its entry, which
    fails where the traced step itself runs in a FakeTensorMode (meshwise verify: propagation reuses
    that mode): a tensor-parallel matmul's global output then counted at the peak (5.3 GB on Llama 3
    405B's rank 8192 under tp=8, ac=full). Ops run during a propagation are not tracked here."""

    def __enter__(self) -> StepMemTracker:
        if not hasattr(ShardingPropagator._propagate_tensor_meta_non_cached, "_meshwise_original"):
            ShardingPropagator._propagate_tensor_meta_non_cached = _untracked_propagation(
                ShardingPropagator._propagate_tensor_meta_non_cached
            )
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        original = getattr(ShardingPropagator._propagate_tensor_meta_non_cached, "_meshwise_original", None)
        if original is not None and self._depth == 0:
            ShardingPropagator._propagate_tensor_meta_non_cached = original

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if _PROPAGATING[0]:
            if any(t == DTensor for t in types):
                return NotImplemented
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _LeafSafeModTracker()
        self.peak_in_module = False  # whether the peak fell inside a module (else between them)
        self.peak_in_backward = False
        self.peak_in_attention = False  # whether it fell inside an attention module (a ring's, under cp)

    def _update_peak_stats(self, peak_state) -> None:  # type: ignore[override]
        """MemTracker's global peak per device, noting where a new peak fell (peak_moments).
        MemTracker's own also walks every tracked module on every operator for the per-module
        peaks, which meshwise does not read: that walk was 19 of every 20 seconds of a traced step
        of the tiny model (cProfile)."""
        OVERRIDE_CALLS["MemTracker._update_peak_stats"] += 1
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)
                self._note_peak()

    def get_tracker_snapshot(self, type: str = "current") -> dict:  # type: ignore[override]
        """MemTracker's, copied one level deep (the values are ints) where MemTracker deep-copies:
        its module hooks take one on every module's entry and exit."""
        if type not in ("current", "peak"):
            raise ValueError(f"Invalid type {type}")
        snap = self._curr_mem_snap if type == "current" else self._peak_mem_snap
        return {dev: dict(per_kind) for dev, per_kind in snap.items()}

    def _note_peak(self) -> None:
        parents = set(self._mod_tracker.parents) - {"Global"}
        self.peak_in_backward = bool(self._mod_tracker.is_bw)
        self.peak_in_module = bool(parents)
        self.peak_in_attention = any(name.rpartition(".")[2] == "attention" for name in parents)

    def _pre_fw_hook(self, module, inputs) -> None:  # type: ignore[override]
        OVERRIDE_CALLS["MemTracker._pre_fw_hook"] += 1
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} <= {"Global"}:
                del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)


# what a held storage is -> the category it is reported in ("master": a float32 master copy of
# weights computed in another dtype, optimizer state by the ZeRO paper's convention)
ROLE_CATEGORY = {
    "params": "Parameter",
    "master": "Optstate",
    "grads": "Gradient",
    "optimizer": "Optstate",
    "buffers": "Comm buffer",
}


class RoleMemTracker(StepMemTracker):
    """StepMemTracker that also splits the step's peak by what each live storage is.

    ``held()`` yields (role, tensor) for what the model, FSDP2 and the optimizer hold at that moment
    (roles: ROLE_CATEGORY's keys); at each new peak the storages it reaches move from MemTracker's
    category to their role's, the first role naming a storage winning. What no holder reaches was
    made by the forward or the backward and is held by autograd or the step (saved activations,
    their gradients, the loss's float32 tensors): MemTracker's Activation and Temp, both reported as
    Activation. Only the global peak is kept (no per-module peaks): the largest sum over the devices
    of ``device_type`` (all devices when None; on a GPU rank the host's tensors, such as the
    optimizer's step counts, are not the device's memory), where MemTracker keeps a peak per device,
    each at its own moment."""

    def __init__(self, held: Callable[[], Iterable[tuple[str, torch.Tensor]]], device_type: str | None = None) -> None:
        super().__init__()
        self._held = held
        self._device_type = device_type
        self._peak_total = 0
        self.peak_by_role: dict[str, int] = {}

    def __enter__(self) -> RoleMemTracker:
        super().__enter__()
        if self._depth == 1:
            self.peak_by_role = self._split_by_role(self._counted())
        return self

    def _counted(self) -> dict:
        return {
            dev: snap
            for dev, snap in self._curr_mem_snap.items()
            if self._device_type is None or dev.type == self._device_type
        }

    def _update_peak_stats(self, peak_state) -> None:  # type: ignore[override]
        OVERRIDE_CALLS["MemTracker._update_peak_stats"] += 1
        counted = self._counted()
        total = sum(snap[_TOTAL_KEY] for snap in counted.values())
        if total > self._peak_total:
            self._peak_total = total
            self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in counted.items()}
            self._peak_mem_snap = {dev: dict(snap) for dev, snap in counted.items()}
            self.peak_by_role = self._split_by_role(counted)
            self._note_peak()

    def _split_by_role(self, counted: dict) -> dict[str, int]:
        out: dict[str, int] = {}
        for snap in counted.values():
            for key, value in snap.items():
                name = getattr(key, "value", str(key))
                if name != _TOTAL_KEY:
                    out[name] = out.get(name, 0) + int(value)
        seen: set[int] = set()
        for role, tensor in self._held():
            for st in get_untyped_storages(tensor):
                entry = self._WINFO.get(st)
                if entry is None or id(st) in seen or entry[0].device not in counted:
                    continue
                seen.add(id(st))
                winfo = entry[0]
                category = ROLE_CATEGORY[role]
                out[winfo.reftype.value] -= winfo.mem_consumed
                out[category] = out.get(category, 0) + winfo.mem_consumed
        out["Activation"] = out.get("Activation", 0) + out.pop("Temp", 0)
        return {k: v for k, v in out.items() if v}


def tracker_for(
    modules: list,
    optimizer: Any,
    held: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
    device_type: str | None = None,
) -> MemTracker:
    """A tracker over the modules (their parameters and buffers) and the optimizer's states; with
    ``held``, a RoleMemTracker that also splits its peak by what the storages are (on the devices
    of ``device_type``)."""
    tracker = RoleMemTracker(held, device_type) if held else StepMemTracker()
    tracker.track_external(*modules, optimizer)
    return tracker


def peak_moments(tracker, ring: bool = False) -> list[str]:
    """The cost model's moments (cost/memory.MOMENTS) the tracked peak can be: in a forward, the
    end of one; in a module's backward, the start of one or (under cp) inside a ring attention's;
    with ``ring`` (the run's attention is a cp ring), inside an attention module's backward the
    ring's, in another module's the start of one; elsewhere in a backward any (the loss's backward,
    the end of the step, or a pipeline stage's backward, whose module nesting the tracker does not
    follow: _LeafSafeModTracker)."""
    if not tracker.peak_in_backward:
        return ["forward"]
    if not tracker.peak_in_module:
        return []
    if ring:
        return ["ring"] if tracker.peak_in_attention else ["backward"]
    return ["backward", "ring"]


def peak_by_category(tracker) -> dict[str, int]:
    """{category name: bytes} of the peak snapshot, summed over devices (the ``Total`` key dropped)."""
    out: dict[str, int] = {}
    for snap in tracker.get_tracker_snapshot("peak").values():
        for key, value in snap.items():
            name = getattr(key, "value", str(key))
            if name != "Total":
                out[name] = out.get(name, 0) + int(value)
    return out
