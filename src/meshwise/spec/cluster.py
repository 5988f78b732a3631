"""What it runs on: LinkSpec, AcceleratorSpec, ClusterSpec and ``load_cluster`` (the accelerator catalog or a profile).

Pure Python (no torch). Units are in the names: ``_bytes``, ``_flops_per_s``, ``_bytes_per_s``, ``_s``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from meshwise.catalog import read_catalog
from meshwise.errors import MeshwiseError
from meshwise.files import read_toml
from meshwise.spec.gpu_keys import GPU_KEYS, gpu_fields
from meshwise.spec.host_keys import HOST_KEYS, host_fields
from meshwise.spec.model import cached_hash


@dataclass(frozen=True)
class LinkSpec:
    """One link tier: per-GPU bandwidth (one direction) and per-message latency. ``reduce_scatter_ratio``
    (0: none stated): a reduce-scatter costs this times an all-reduce of the same tensor instead of the
    ring formula (gloo, measured by ``meshwise calibrate``; cost/comm.py). ``all_to_all_ratio`` (0: none
    stated): an all-to-all costs this times the pairwise-exchange formula (gloo, likewise). A link across
    nodes (ClusterSpec.link_for) states the group's ``ranks_per_node`` and the node's own per-step
    ``intra_latency_s``: a ring's steps between two ranks of one node cost that, not ``latency_s``
    (cost/comm.py)."""

    bytes_per_s: float
    latency_s: float
    reduce_scatter_ratio: float = 0.0
    all_to_all_ratio: float = 0.0
    ranks_per_node: int = 1
    intra_latency_s: float = 0.0


@dataclass(frozen=True)
class AcceleratorSpec:
    """A device: capacity, peak FLOP/s, HBM bandwidth and the achieved-efficiency curve.

    Achieved fraction of peak for a model of hidden size h: efficiency_max * h / (h + efficiency_half_width).
    ``comm_overlap``: communication can run beside compute (GPUs: copy engines and NCCL's own SMs);
    false for CPU ranks, whose cores gloo's transfers share, so nothing hides behind compute.
    """

    name: str
    memory_bytes: int
    peak_bf16_flops_per_s: float
    peak_fp32_flops_per_s: float
    hbm_bytes_per_s: float
    efficiency_max: float = 0.0
    efficiency_half_width: float = 0.0
    comm_overlap: bool = True
    source: str = ""
    # float8 (cost/fp8.py): dense peaks of the e4m3 tensor cores with per-tensor/row/block scales, and
    # of the MX formats (32-element blocks, e8m0 scales; Blackwell, CDNA4); 0 = the device has none
    peak_fp8_flops_per_s: float = 0.0
    peak_mxfp8_flops_per_s: float = 0.0
    nvlink_domain_gpus: int = 0  # GPUs one NVLink (scale-up) domain joins; 0 = a node (NVL72: 72)
    calibrated_on: str = ""  # what its predictions were checked against ("" = nothing): published runs
    # (a test set, nothing fitted to them) or a meshwise calibrate of the machine
    # The GPU op model (cost/kernels.py); a profile without sm_count keeps the flat curve above.
    sm_count: int = 0  # streaming multiprocessors (CUs): GEMM tiles run in waves of this many
    gemm_tile_m: int = 128  # output tile of the GEMM kernels, rows x columns
    gemm_tile_n: int = 256
    gemm_efficiency: float = 0.0  # a profile's flat GEMM fraction of peak (used when ``gemm`` has no row)
    attention_efficiency: float = 0.0  # a profile's flat fused-attention fraction (used when ``attention`` is empty)
    hbm_efficiency: float = 0.0  # fraction of HBM bandwidth memory-bound kernels reach (STREAM copy)
    # Component fits (benchmarks/fit_components.py, each on its own published data; docs/cost-model.md):
    gemm: tuple = ()  # (dtype, efficiency, k_half) rows: GEMM throughput by shape
    attention: tuple = ()  # (kernel, fields...) rows: fused attention by sequence and head width
    kernel_floor_s: float = 0.0  # a kernel's fixed time (launch, fill and drain), however small its work
    host_launch_s: float = 0.0  # host time to issue one kernel from PyTorch (0: an x86 host's, cost/moe_block.py)
    sustained_clock: float = 1.0  # clock held under sustained dense math at the power limit / the peak's clock
    runtime: str = ""  # the runtime this profile was measured under ("" = not stated)
    # Host time per launched operator (cost/host.py); 0 in GPU profiles, measured by `meshwise calibrate`.
    op_overhead_s: float = 0.0  # dispatch + autograd of one aten operator
    checkpoint_call_s: float = 0.0  # torch.utils.checkpoint's wrapper, per checkpointed block call
    selective_op_s: float = 0.0  # the selective policy's dispatch mode, per operator it sees
    tp_op_s: float = 0.0  # DTensor's sharding propagation, per operator under tp > 1
    tp_sp_block_s: float = 0.0  # sequence parallelism's redistributions, per block per micro-batch (fwd + bwd)
    zb_split_block_s: float = 0.0  # a zero-bubble schedule's backward split in two passes, per block per micro-batch
    pp_call_s: float = 0.0  # the pipeline schedule's own work per stage call (one chunk's forward or backward)
    fsdp_call_s: float = 0.0  # FSDP2's host work per all-gather / reduce-scatter call of a unit
    fsdp_param_s: float = 0.0  # ... and per parameter tensor of the unit in each such call
    fsdp_byte_s: float = 0.0  # ... and per byte it gathers or reduces (0: its copies at the copy bandwidth)
    optimizer_dtensor_s: float = 0.0  # AdamW's extra per DTensor parameter tensor (FSDP2 or TP), per step
    # ring attention's kernels per ring step (cost/context_parallel.py ``ring_kernel_seconds``): step + E * (score + d * dim)
    cp_step_s: float = 0.0
    cp_score_s: float = 0.0
    cp_score_dim_s: float = 0.0
    cp_step_includes_sends: bool = False  # the three timed as whole ring calls over a real ring: K/V and dK/dV sends in
    cp_ring_table: tuple = ()  # ((score elements, head width, seconds), ...) per ring step, as timed: read first
    # the fused causal attention (SDPA) per call (cost/host.py ``sdpa_call_seconds``): call + E * (score + d * dim)
    sdpa_call_s: float = 0.0
    sdpa_score_s: float = 0.0
    sdpa_score_dim_s: float = 0.0
    sdpa_head_table: tuple = ()  # ((sequence, head width, seconds per query head), ...) as timed: read first
    loss_token_table: tuple = ()  # ((tokens, vocab, seconds per token), ...): the loss's fwd + bwd as timed
    moe_part_table: tuple = ()  # a MoE block's parts per call as timed at a run's shapes (spec/host_keys.py MOE_PART_COLUMNS)
    # A CPU profile's GEMMs by shape (cost/host.py ``gemm_shape_factor``): t = 2MNK / rate + call + bytes / bandwidth
    cpu_gemm_flops_per_s: float = 0.0  # 0: no GEMM grid measured, one efficiency for every shape
    cpu_gemm_call_s: float = 0.0
    cpu_gemm_bytes_per_s: float = 0.0  # 0: no bandwidth term
    gemm_reference_efficiency: float = 1.0  # the grid's efficiency at the calibration's own GEMMs
    dram_bytes_per_s: float = 0.0  # a CPU's copy bandwidth beyond its last-level cache (0: not measured)
    thread_efficiency: float = 1.0  # rate of t threads in one process = rate of 1 x (1 + (t - 1) x this)
    cores_per_node: int = 0  # CPU cores the node's ranks share (0: not stated; calibrate writes it)
    # more ranks than cores: a collective waits for peers the scheduler has not run yet (cost/host.py ``sync_skew_seconds``)
    sync_skew_ratio: float = 0.0  # seconds waited per second of a rank's own-core compute before the collective
    sync_skew_slice_s: float = 0.0  # ... up to this much compute per collective (the longest slice measured)

    __hash__ = cached_hash

    @cached_property
    def has_op_model(self) -> bool:
        """True when the profile declares the GPU fields: compute is costed per operation."""
        return self.sm_count > 0 and (self.gemm_efficiency > 0 or bool(self.gemm))

    def has_gemm_row(self, name: str) -> bool:
        """Whether the catalog gives this device a GEMM row ``gemm.<name>`` of its own."""
        return any(row[0] == name for row in self.gemm)

    def peak_flops_per_s(self, precision: str) -> float:
        """The peak MFU and the non-GEMM work are reckoned against: fp32's, else bf16's (the float8
        formats' too, as torchtitan and NeMo report MFU against the bf16 peak); cost/fp8.py prices
        the float8 GEMMs at their own peak."""
        return self.peak_fp32_flops_per_s if precision == "fp32" else self.peak_bf16_flops_per_s

    def efficiency(self, hidden: float) -> float:
        return self.efficiency_max * hidden / (hidden + self.efficiency_half_width)


# Fitted on Narayanan et al. 2021 Table 1 (benchmarks/calibrate_table1.py): the default for every GPU.
DEFAULT_EFFICIENCY_MAX = 0.62
DEFAULT_EFFICIENCY_HALF_WIDTH = 800.0


@dataclass(frozen=True)
class ClusterSpec:
    """``nodes`` nodes of ``gpus_per_node`` accelerators; ``intra`` links a node, ``inter`` links nodes."""

    accelerator: AcceleratorSpec
    gpus_per_node: int
    nodes: int
    intra: LinkSpec
    inter: LinkSpec

    @cached_property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @cached_property
    def domain_gpus(self) -> int:
        """GPUs one scale-up (NVLink) domain joins: the node, or under a profile's ``nvlink_domain_gpus``
        (GB200/GB300 NVL72: 72 GPUs over 18 trays of 4) the largest whole number of nodes, at most
        that many, that divides the world (64 of a 72-GPU rack's GPUs where the world is 128)."""
        domain = self.accelerator.nvlink_domain_gpus
        if domain <= self.gpus_per_node:
            return self.gpus_per_node
        nodes = max(n for n in range(1, domain // self.gpus_per_node + 1) if self.nodes % n == 0)
        return nodes * self.gpus_per_node

    def link_for(self, group_size: int, stride: int) -> LinkSpec:
        """The link a group of ``group_size`` ranks, ``stride`` apart in rank order, communicates over.

        Inside a node (an NVLink domain: ``domain_gpus``): the intra-node link. Across nodes: every rank
        has its own NIC and a collective splits its data over channels, one per rank of the group in a
        node (NCCL's rings), so the group's bandwidth is the per-GPU scale-out bandwidth times its
        ranks per node, at most a faster intra-node link's (NVLink), which its rings cross too (the
        slowest tier; a profile whose two links are one, gloo's, keeps the product);
        its ring steps inside a node keep the intra-node latency (cost/comm.py).
        """
        domain = self.domain_gpus
        if group_size == 1 or group_size * stride <= domain:
            return self.intra
        per_node = max(1, min(group_size, domain // stride))
        link = self._scale_out_links.get(per_node)
        if link is None:
            bytes_per_s = self.inter.bytes_per_s * per_node
            if self.intra.bytes_per_s > self.inter.bytes_per_s:  # a node fabric of its own (NVLink): a tier to cross
                bytes_per_s = min(bytes_per_s, self.intra.bytes_per_s)
            link = self._scale_out_links[per_node] = LinkSpec(
                bytes_per_s,
                self.inter.latency_s,
                self.inter.reduce_scatter_ratio,
                self.inter.all_to_all_ratio,
                per_node,
                self.intra.latency_s,
            )
        return link

    @cached_property
    def _scale_out_links(self) -> dict[int, LinkSpec]:
        """link_for's answers across nodes by ranks per node (the search asks thousands of times)."""
        return {}


# a GPU's float8 tensor cores and NVLink domain (absent from CPU profiles, as the op model's keys)
MAX_GPUS = 2**20  # 1,048,576 devices: ten times the largest published training clusters (~10^5 GPUs)

ACCEL_GPU_KEYS = {"peak_fp8_flops_per_s", "peak_mxfp8_flops_per_s", "nvlink_domain_gpus"}
# a device's memory and peak rates, then its node's links: in the order a calibrated profile writes them
DEVICE_LINK_KEYS = (
    "memory_bytes",
    "peak_bf16_flops_per_s",
    "peak_fp32_flops_per_s",
    "hbm_bytes_per_s",
    "gpus_per_node",
    "intra_bytes_per_s",
    "intra_latency_s",
    "inter_bytes_per_s",
    "inter_latency_s",
)
_ACCEL_KEYS = (
    set(DEVICE_LINK_KEYS)
    | {
        "efficiency_max",
        "efficiency_half_width",
        "comm_overlap",
        "source",
        "name",
        "calibrated_on",
        "reduce_scatter_ratio",
        "all_to_all_ratio",
    }
    | ACCEL_GPU_KEYS
    | GPU_KEYS
    | HOST_KEYS
)


def _spelling(name: str) -> str:
    """How a GPU name is compared: case, spaces and underscores aside (``H100 SXM`` = ``h100-sxm``)."""
    return "-".join(name.lower().replace("_", " ").replace("-", " ").split())


def catalog_accelerator(ref: str) -> str | None:
    """The catalog entry ``ref`` names: its own name or one of its ``aliases`` (accelerators.toml),
    compared case-insensitively; None when it names none."""
    wanted = _spelling(ref)
    for name, table in read_catalog("accelerators.toml").items():
        if wanted in {_spelling(n) for n in (name, *table.get("aliases", ()))}:
            return name
    return None


def _unknown_accelerator(ref: str) -> MeshwiseError:
    """One line: the closest catalog names and aliases ("did you mean"), then every entry."""
    catalog = read_catalog("accelerators.toml")
    spellings = {_spelling(n): name for name, table in catalog.items() for n in (name, *table.get("aliases", ()))}
    # a prefix such as "a100" names every entry it begins, then the nearest spellings
    close = [name for name in catalog if name.startswith(_spelling(ref)) and len(_spelling(ref)) >= 2]
    close += [spellings[s] for s in difflib.get_close_matches(_spelling(ref), list(spellings), n=6, cutoff=0.5)]
    guess = list(dict.fromkeys(close))[:3]
    hint = f" (did you mean {' or '.join(guess)}?)" if guess else ""
    return MeshwiseError(
        f"--gpu: unknown accelerator {ref!r}{hint}; choose one of {', '.join(catalog)} (any case, "
        "or an alias listed in catalog/accelerators.toml), or give a profile .toml"
    )


def _accelerator_table(ref: str) -> tuple[str, dict[str, Any]]:
    path = Path(ref)
    if path.is_dir():
        raise MeshwiseError(f"--gpu: {ref} is a folder; give a catalog name (e.g. h100) or a profile .toml file")
    if path.suffix == ".toml":
        table = read_toml(path, "--gpu")
        table = table.get("accelerator", table)
        if "base" in table:
            table = _on_base(table, ref)
        return str(table.get("name", path.stem)), table
    name = catalog_accelerator(ref)
    if name is None:
        raise _unknown_accelerator(ref)
    return name, read_catalog("accelerators.toml")[name]


def _on_base(profile: dict[str, Any], ref: str) -> dict[str, Any]:
    """A cluster profile over a catalog GPU: ``base`` names the entry, the profile's keys replace its
    (a cluster's own clock under its power cap and cooling, its links); the clock it gives
    (``sustained_mhz`` or ``sustained_clock``) replaces the catalog's."""
    base = profile["base"]
    name = catalog_accelerator(base) if isinstance(base, str) else None
    if name is None:
        raise MeshwiseError(
            f"--gpu {ref}: base {base!r} is not a catalog accelerator; give one of "
            f"{', '.join(read_catalog('accelerators.toml'))}"
        )
    table = {k: v for k, v in read_catalog("accelerators.toml")[name].items() if k != "aliases"}
    if "sustained_mhz" in profile:
        table.pop("sustained_clock", None)
    return table | {k: v for k, v in profile.items() if k != "base"}


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise MeshwiseError(f"{where} must be true or false, got {value!r}")
    return value


def _profile_number(gpu: str, table: dict[str, Any], key: str, default: Any, zero_ok: bool) -> float:
    """A profile figure: a finite number above zero (or zero where ``zero_ok``); KeyError if absent."""
    value = table[key] if default is None else table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MeshwiseError(f"--gpu {gpu}: {key} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or value == 0 and not zero_ok:
        raise MeshwiseError(
            f"--gpu {gpu}: {key} must be a finite number above 0{' (or 0)' if zero_ok else ''}, got {value!r}"
        )
    return float(value)


def _domain(table: dict[str, Any], gpu: str) -> int:
    value = table.get("nvlink_domain_gpus", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MeshwiseError(
            f"--gpu {gpu}: nvlink_domain_gpus must be a whole number of GPUs (0: a node), got {value!r}"
        )
    return value


def load_cluster(gpu: str, gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """``gpus`` accelerators of kind ``gpu``, ``gpus_per_node`` to a node (the catalog's default when None)."""
    name, table = _accelerator_table(gpu)
    unknown = sorted(set(table) - _ACCEL_KEYS - {"aliases"})  # aliases: other names of a catalog entry
    if unknown:
        raise MeshwiseError(f"--gpu {gpu}: unknown key {unknown[0]!r}")
    try:
        num = lambda key, default=None, zero_ok=False: _profile_number(gpu, table, key, default, zero_ok)  # noqa: E731
        accel = AcceleratorSpec(
            name=name,
            memory_bytes=int(num("memory_bytes")),
            peak_bf16_flops_per_s=num("peak_bf16_flops_per_s"),
            peak_fp32_flops_per_s=num("peak_fp32_flops_per_s", table.get("peak_bf16_flops_per_s")),
            hbm_bytes_per_s=num("hbm_bytes_per_s"),
            efficiency_max=num("efficiency_max", DEFAULT_EFFICIENCY_MAX),
            efficiency_half_width=num("efficiency_half_width", DEFAULT_EFFICIENCY_HALF_WIDTH, zero_ok=True),
            comm_overlap=_flag(table.get("comm_overlap", True), f"--gpu {gpu}: comm_overlap"),
            source=str(table.get("source", "")),
            **gpu_fields(table, gpu),
            **host_fields(table, gpu),
            peak_fp8_flops_per_s=num("peak_fp8_flops_per_s", 0.0, zero_ok=True),
            peak_mxfp8_flops_per_s=num("peak_mxfp8_flops_per_s", 0.0, zero_ok=True),
            nvlink_domain_gpus=_domain(table, gpu),
            calibrated_on=str(table.get("calibrated_on", "")),
        )
        rs_ratio = num("reduce_scatter_ratio", 0.0, zero_ok=True)
        a2a_ratio = num("all_to_all_ratio", 0.0, zero_ok=True)
        intra = LinkSpec(num("intra_bytes_per_s"), num("intra_latency_s", zero_ok=True), rs_ratio, a2a_ratio)
        inter = LinkSpec(num("inter_bytes_per_s"), num("inter_latency_s", zero_ok=True), rs_ratio, a2a_ratio)
        if accel.efficiency_max > 1:
            raise MeshwiseError(f"--gpu {gpu}: efficiency_max {accel.efficiency_max} must be in (0, 1]")
    except KeyError as missing:
        raise MeshwiseError(f"--gpu {gpu}: profile lacks {missing.args[0]!r}") from None
    if gpus < 1:
        raise MeshwiseError(f"--gpus: {gpus} must be at least 1")
    if gpus > MAX_GPUS:
        raise MeshwiseError(
            f"--gpus: {gpus} is past meshwise's bound of {MAX_GPUS:,} devices (the largest published "
            "training clusters hold about 10^5)"
        )
    per_node = gpus_per_node if gpus_per_node is not None else int(table.get("gpus_per_node", 8))
    if per_node < 1:
        raise MeshwiseError(f"--gpus-per-node: {per_node} must be at least 1")
    per_node = min(per_node, gpus)
    if gpus % per_node:
        raise MeshwiseError(f"--gpus: {gpus} is not a whole number of nodes of {per_node} (--gpus-per-node)")
    return ClusterSpec(accelerator=accel, gpus_per_node=per_node, nodes=gpus // per_node, intra=intra, inter=inter)
