"""The layout of a run: the one given, or (``auto``) the planner's choice for the live cluster.

The live cluster is what torchrun says (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``: world / ranks per
node = nodes) on the local device: CUDA -> the catalog profile of the GPU's name, with the memory
the device reports; CPU -> the ``cpu`` profile. The search is restricted (``planner.search``'s
``where=``) to layouts this runtime runs for the given model and sequence: the runtime refuses
pp > 1 with tied embeddings, sequence parallelism needs the sequence divisible by tp, and
selective activation checkpointing fails under the zero-bubble schedules (their split backward
runs each checkpointed region twice, which ``torch.utils.checkpoint``'s selective mode forbids).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from meshwise import planner
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, parse, validate
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster

# Substrings of torch.cuda.get_device_name() -> catalog accelerator (checked in order).
_GPU_NAMES = (("H200", "h200"), ("H100", "h100"), ("B200", "b200"), ("MI300X", "mi300x"), ("A100", "a100"))


@dataclass(frozen=True)
class LiveCluster:
    """What the run runs on: the cluster spec the planner sees and the precision the runtime uses."""

    cluster: ClusterSpec
    precision: str  # the runtime computes in fp32 on CPU, bf16 (fp32 master + reductions) on CUDA
    note: str = ""


def live_cluster(world: int, local_world: int, device_type: str, profile: str = "") -> LiveCluster:
    """``profile``: an accelerator profile .toml (``meshwise calibrate``) used instead of the catalog's."""
    if world % local_world:
        raise MeshwiseError(f"launch: world size {world} is not a whole number of nodes of {local_world} ranks")
    if profile:
        return LiveCluster(profile_cluster(profile, world, local_world), "fp32" if device_type != "cuda" else "bf16-mixed")
    if device_type != "cuda":
        return LiveCluster(load_cluster("cpu", world, local_world), "fp32")
    import torch

    name = torch.cuda.get_device_name()
    memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    profile = next((p for key, p in _GPU_NAMES if key in name), None)
    note = ""
    if profile == "a100":
        profile = "a100-80gb" if memory > 50e9 else "a100-40gb"
    if profile is None:
        profile, note = "h100", f"unknown GPU {name!r}: planning with the h100 profile and its measured memory"
    cluster = load_cluster(profile, world, local_world)
    cluster = replace(cluster, accelerator=replace(cluster.accelerator, memory_bytes=int(memory)))
    return LiveCluster(cluster, "bf16-mixed", note)


def profile_cluster(profile: str, world: int, local_world: int) -> ClusterSpec:
    """The cluster of ``world`` ranks, ``local_world`` per node, of a profile file; refused by name."""
    if not profile.endswith(".toml"):
        raise MeshwiseError(f"--layout.profile: {profile!r} is not a profile .toml (write one with meshwise calibrate)")
    try:
        return load_cluster(profile, world, local_world)
    except MeshwiseError as e:
        raise MeshwiseError(f"--layout.profile: {str(e).removeprefix('--gpu ').removeprefix('--gpu: ')}") from None


def runnable(model: ModelSpec, seq_len: int) -> Callable[[Layout], bool]:
    """What the runtime can run beyond :func:`meshwise.layout.validate` (see ``runtime.parallelize``)."""
    def ok(layout: Layout) -> bool:
        if model.tied_embeddings and layout.pp > 1:
            return False
        if layout.sp and (seq_len % layout.tp or model.position == "learned"):
            return False
        if layout.schedule == "zero-bubble" and layout.pp > 1 and layout.ac == "selective":
            return False
        return True
    return ok


def check_runnable(layout: Layout, model: ModelSpec, world: int, global_batch: int, seq_len: int) -> None:
    """Refuse, in one line, a given layout that cannot run here."""
    validate(layout, model, world, global_batch)
    if seq_len > model.max_seq:
        raise MeshwiseError(f"--data.seq_len: {seq_len} is longer than the model's max_seq {model.max_seq}")
    if not runnable(model, seq_len)(layout):
        if model.tied_embeddings and layout.pp > 1:
            raise MeshwiseError(f"layout: pp={layout.pp} with the tied embeddings of {model.name!r} is not supported "
                                "by the runtime; use pp=1")
        if layout.ac == "selective" and layout.schedule == "zero-bubble":
            raise MeshwiseError("layout: ac=selective with schedule=zero-bubble is not supported by the runtime (the "
                                "split backward runs a selectively checkpointed region twice); use ac=full or another "
                                "schedule")
        raise MeshwiseError(f"layout: sp=on needs the sequence ({seq_len}) divisible by tp={layout.tp}")


def choose(spec: str, model: ModelSpec, world: int, local_world: int, global_batch: int, seq_len: int,
           device_type: str, profile: str = "") -> tuple[Layout, list[str]]:
    """(layout, explanation lines). ``spec`` is ``auto`` or a layout text."""
    if seq_len > model.max_seq:
        raise MeshwiseError(f"--data.seq_len: {seq_len} is longer than the model's max_seq {model.max_seq}")
    if spec != "auto":
        layout = parse(spec, world)
        check_runnable(layout, model, world, global_batch, seq_len)
        return layout, [f"Layout (given): {layout.short()}"]
    live = live_cluster(world, local_world, device_type, profile)
    train = TrainSpec(global_batch=global_batch, seq_len=seq_len, precision=live.precision)
    result = planner.search(model, live.cluster, train, top=5, where=runnable(model, seq_len))
    if not result.best:
        raise MeshwiseError(f"layout auto: no layout of {world} rank(s) fits {model.name} with global batch "
                            f"{global_batch} x {seq_len} tokens; give --layout, a smaller model or more devices")
    lines = [f"Layout (auto, planner on {live.cluster.nodes} node(s) x {live.cluster.gpus_per_node} "
             f"{live.cluster.accelerator.name}): {result.best[0].layout.short()}"]
    if live.note:
        lines.append(live.note)
    lines += planner.explain(model, live.cluster, train, result.pool)
    return result.best[0].layout, lines


def peak_flops_per_s(world: int, local_world: int, device_type: str, profile: str = "") -> float:
    """The accelerator profile's peak per device, for the precision the runtime computes in."""
    live = live_cluster(world, local_world, device_type, profile)
    return live.cluster.accelerator.peak_flops_per_s(live.precision)
