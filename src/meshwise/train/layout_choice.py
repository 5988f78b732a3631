"""The layout of a run: the one given, or (``auto``) the planner's choice for the live cluster.

The live cluster is what torchrun says (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``: world / ranks per
node = nodes) on the local device: CUDA -> the catalog profile of the GPU's name, with the memory
the device reports; CPU -> this machine's calibrated profile (``measure/auto_profile.py``: measured
once, cached per host and torch version), or the catalog's ``cpu`` where none is cached. The search is restricted (``planner.search``'s
``where=``) to layouts this runtime runs for the given model and sequence
(:func:`meshwise.layout.runtime_refusal` says which, and why).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from meshwise.cost.estimate import DEFAULT_HEADROOM, estimate
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable, check_seq_len, parse, runs_here
from meshwise.measure import auto_profile
from meshwise.plan import planner
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, load_cluster

THREADS_ENV = "MESHWISE_THREADS"  # threads per CPU rank, set by the launcher for its workers

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
        cluster = profile_cluster(profile, world, local_world)
        if device_type != "cuda":
            return LiveCluster(with_threads(cluster, threads_per_rank(local_world)), "fp32")
        return LiveCluster(cluster, "bf16-mixed")
    if device_type != "cuda":
        found = auto_profile.resolved(local_world)
        cluster = profile_cluster(found, world, local_world) if found else load_cluster("cpu", world, local_world)
        return LiveCluster(with_threads(cluster, threads_per_rank(local_world)), "fp32")
    # torch: tune's refit and driver import this module, and they plan in pure Python (no torch)
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


def threads_per_rank(local_world: int) -> int:
    """Threads of one CPU rank: the launcher's choice (``MESHWISE_THREADS``), else the cores shared
    evenly among the node's ranks, at least one."""
    given = os.environ.get(THREADS_ENV, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // max(local_world, 1))


def with_threads(cluster: ClusterSpec, threads: int) -> ClusterSpec:
    """The cluster whose ranks each compute with ``threads`` threads: a profile's FLOP/s are one
    thread's (``meshwise calibrate`` measures one thread per core), and ``t`` threads reach
    ``1 + (t - 1) * thread_efficiency`` times that; so do the attention kernels' per-score-element
    costs (SDPA and the ring's tensor operations split their rows over the threads as the GEMMs do).
    Host time per operator and per call does not scale."""
    if threads <= 1:
        return cluster
    a = cluster.accelerator
    k = 1 + (threads - 1) * a.thread_efficiency
    faster = replace(
        a,
        peak_bf16_flops_per_s=a.peak_bf16_flops_per_s * k,
        peak_fp32_flops_per_s=a.peak_fp32_flops_per_s * k,
        sdpa_score_s=a.sdpa_score_s / k,
        sdpa_score_dim_s=a.sdpa_score_dim_s / k,
        cp_score_s=a.cp_score_s / k,
        cp_score_dim_s=a.cp_score_dim_s / k,
        cp_ring_table=tuple((e, d, min(a.cp_step_s, s) + max(s - a.cp_step_s, 0.0) / k) for e, d, s in a.cp_ring_table),
        sdpa_head_table=tuple((s, d, t / k) for s, d, t in a.sdpa_head_table),
    )
    return replace(cluster, accelerator=faster)


def largest_fitting_mbs(layout: Layout, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec) -> Layout:
    """``layout`` with the largest micro-batch that divides the replica's batch, runs and fits with
    the planner's headroom (no accumulation when the whole replica batch fits); mbs=1 if none fits."""
    per_replica = train.global_batch // layout.dp
    for mbs in sorted((b for b in range(1, per_replica + 1) if per_replica % b == 0), reverse=True):
        candidate = replace(layout, mbs=mbs)
        if not runs_here(model, train.seq_len)(candidate):
            continue
        try:
            check_runnable(candidate, model, cluster.world_size, train.global_batch, train.seq_len)
        except MeshwiseError:
            continue
        if estimate(model, cluster, train, candidate, DEFAULT_HEADROOM).fits:
            return candidate
    return replace(layout, mbs=1)


def _mbs_given(layout_text: str) -> bool:
    return any(part.strip().startswith("mbs=") for part in layout_text.split(","))


def profile_cluster(profile: str, world: int, local_world: int) -> ClusterSpec:
    """The cluster of ``world`` ranks, ``local_world`` per node, of a profile file; refused by name."""
    if not profile.endswith(".toml"):
        raise MeshwiseError(f"--layout.profile: {profile!r} is not a profile .toml (write one with meshwise calibrate)")
    try:
        return load_cluster(profile, world, local_world)
    except MeshwiseError as e:
        raise MeshwiseError(f"--layout.profile: {str(e).removeprefix('--gpu ').removeprefix('--gpu: ')}") from None


def check_given(layout_text: str, model: ModelSpec, world: int | None, global_batch: int, seq_len: int) -> None:
    """A given layout's refusals that need no calibration, before any is measured or re-checked:
    :func:`choose`'s checks at ``world`` ranks (None: processes not chosen yet, so at the layout's
    own world, dp=1 unless given: every refusal there holds at any dp), with mbs=1 where not given."""
    if layout_text == "auto":
        return
    layout = parse(layout_text, world, explicit=True)
    if not _mbs_given(layout_text):
        layout = replace(layout, mbs=1)
    check_runnable(layout, model, world or layout.world_size, global_batch, seq_len, seq_field="--data.seq_len")


def choose(
    layout_text: str,
    model: ModelSpec,
    world: int,
    local_world: int,
    global_batch: int,
    seq_len: int,
    device_type: str,
    profile: str = "",
) -> tuple[Layout, list[str]]:
    """(layout, explanation lines). ``layout_text`` is ``auto`` or a layout text."""
    check_seq_len(model, seq_len, "--data.seq_len")
    if layout_text != "auto":
        layout = parse(layout_text, world, explicit=True)
        if _mbs_given(layout_text):
            check_runnable(layout, model, world, global_batch, seq_len, seq_field="--data.seq_len")
            return layout, [f"Layout (given): {layout.short()}"]
        check_runnable(replace(layout, mbs=1), model, world, global_batch, seq_len, seq_field="--data.seq_len")
        live, train = _live_train(world, local_world, device_type, profile, global_batch, seq_len)
        layout = largest_fitting_mbs(layout, model, live.cluster, train)
        m = layout.accum(global_batch)
        why = (
            "the whole replica batch fits: no accumulation"
            if m == 1
            else f"the largest micro-batch that fits {live.cluster.accelerator.name}'s memory; {m} accumulated"
        )
        return layout, [f"Layout (given): {layout.short()} (mbs={layout.mbs} not given: {why})"]
    live, train = _live_train(world, local_world, device_type, profile, global_batch, seq_len)
    result = planner.search(model, live.cluster, train, top=5, where=runs_here(model, seq_len))
    if not result.best:
        raise MeshwiseError(
            f"layout auto: no layout of {world} rank(s) fits {model.name} with global batch "
            f"{global_batch} x {seq_len} tokens; give --layout, a smaller model or more devices"
        )
    lines = [
        f"Layout (auto, planner on {live.cluster.nodes} node(s) x {live.cluster.gpus_per_node} "
        f"{live.cluster.accelerator.name}): {result.best[0].layout.short()}"
    ]
    if live.note:
        lines.append(live.note)
    lines += planner.explain(model, live.cluster, train, result.pool).lines
    return result.best[0].layout, lines


def _live_train(
    world: int, local_world: int, device_type: str, profile: str, global_batch: int, seq_len: int
) -> tuple[LiveCluster, TrainSpec]:
    """The live cluster and the run's training shape, at the precision the runtime computes in there."""
    live = live_cluster(world, local_world, device_type, profile)
    return live, TrainSpec(global_batch=global_batch, seq_len=seq_len, precision=live.precision)


def choose_cpu_processes(
    layout_text: str, model: ModelSpec, global_batch: int, seq_len: int, profile: str = "", cores: int | None = None
) -> tuple[int, int, str]:
    """(processes, threads each, a line saying why) for a CPU run on this machine's ``cores``:
    every split of the cores into ``n`` processes of ``cores / n`` threads is planned (the given
    layout, or auto) and the fastest predicted one is taken; ties go to fewer processes."""
    cores = cores or os.cpu_count() or 1
    best: tuple[float, int] | None = None
    for n in (d for d in range(1, cores + 1) if cores % d == 0):
        saved = os.environ.get(THREADS_ENV)
        os.environ[THREADS_ENV] = str(cores // n)
        try:
            layout, _ = choose(layout_text, model, n, n, global_batch, seq_len, "cpu", profile)
            live, train = _live_train(n, n, "cpu", profile, global_batch, seq_len)
            step_s = estimate(model, live.cluster, train, layout).time.step_s  # the cost model's step time
        except MeshwiseError:
            continue
        finally:
            if saved is None:
                os.environ.pop(THREADS_ENV, None)
            else:
                os.environ[THREADS_ENV] = saved
        if best is None or step_s < best[0] * (1 - planner.TIE):
            best = (step_s, n)
    if best is None:
        raise MeshwiseError(
            f"--layout: {layout_text!r} runs on no split of this machine's {cores} core(s) into "
            "processes; give --nproc-per-node"
        )
    step_s, n = best
    return (
        n,
        cores // n,
        (
            f"Processes: {n} x {cores // n} thread(s) on {cores} core(s) (the fastest predicted split, "
            f"{step_s:.3g} s/step; --nproc-per-node N to choose)"
        ),
    )


def peak_flops_per_s(world: int, local_world: int, device_type: str, profile: str = "") -> float:
    """The accelerator profile's peak per device (a CPU rank: with its threads), for the precision
    the runtime computes in."""
    live = live_cluster(world, local_world, device_type, profile)
    return live.cluster.accelerator.peak_flops_per_s(live.precision)
