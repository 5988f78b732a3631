"""Failures and checkpoints: how often a synchronous job is interrupted, what a checkpoint of a layout
costs, the checkpoint interval that maximises useful work, and the goodput it leaves.

Rate (catalog/failures.toml): ``r_f`` job-interrupting failures per node-day (Kokolis et al. 2025,
arXiv 2410.21680), split by the root causes of Llama 3's 419 unexpected interruptions (arXiv
2407.21783, Table 5) into what scales with GPUs (ranks), nodes and NICs:

    lambda [1/h] = g * gpus + n * nodes + c * nics,    g = s_gpu r / G0,  n = s_node r,  c = s_nic r / C0

with ``r`` the per-node-hour rate, ``G0``/``C0`` the observed nodes' GPUs and NICs (8 and 8) and
``s`` the shares. The job's mean time between failures is ``M = 1 / lambda``.

Checkpoint of a layout, from the states each rank holds (cost/memory.states: the fp32 master and
AdamW moments under bf16-mixed, the weights too otherwise; gradients are not saved):

- ``delta`` (blocking) = the largest rank's bytes / the host link (asynchronous DCP stages to host
  memory, then writes from a thread while training goes on);
- ``w`` (write) = the node's bytes after DCP's deduplication of replicas / storage bandwidth per node;
- ``R`` (restart) = the restart minutes + reading the node's bytes back at the storage bandwidth.

Interval and goodput (``tau`` compute between checkpoints):

- Young (1974): ``tau = sqrt(2 delta M)``;
- Daly (2006), first order: ``tau = sqrt(2 delta (M + R))``; higher order, for ``delta < 2M``:
  ``tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta``, else ``M``;
- Daly (2006) expected wall time of ``T`` of work: ``T_w = M e^(R/M) (e^((tau+delta)/M) - 1) T / tau``,
  so goodput ``G = T / T_w``. An asynchronous write adds ``w`` to the work a failure loses (the
  checkpoint being written is not yet committed), so the plan uses ``R + w`` in place of ``R``
  and keeps ``tau >= w`` (one save in flight at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from meshwise.catalog import read_catalog
from meshwise.cost.memory import rank_shapes, states
from meshwise.errors import MeshwiseError

HOURS_PER_DAY = 24.0
SECONDS_PER_HOUR = 3600.0
BITS_PER_BYTE = 8


@dataclass(frozen=True)
class FailureRates:
    """Failures per hour of one GPU (rank), one node and one NIC."""

    per_gpu_hour: float
    per_node_hour: float
    per_nic_hour: float
    source: str = ""

    def job_per_hour(self, gpus: int, nodes: int, nics: int) -> float:
        return self.per_gpu_hour * gpus + self.per_node_hour * nodes + self.per_nic_hour * nics

    def breakdown(self, gpus: int, nodes: int, nics: int) -> dict[str, float]:
        """Failures per hour of the job by what they scale with."""
        return {"gpus": self.per_gpu_hour * gpus, "nodes": self.per_node_hour * nodes, "nics": self.per_nic_hour * nics}


@dataclass(frozen=True)
class HostSpec:
    """A node's host: device-to-host link per GPU (one direction) and memory."""

    link_bytes_per_s: float
    memory_bytes: float
    source: str = ""


@dataclass(frozen=True)
class CheckpointDefaults:
    storage_gbps: float
    restart_minutes: float
    storage_source: str
    restart_source: str


@cache
def _table() -> dict:
    return read_catalog("failures.toml")


def catalog_rates() -> FailureRates:
    """The catalog's rate split into per GPU, per node and per NIC (module docstring)."""
    rate, shares = _table()["rate"], _table()["shares"]
    per_node_hour = rate["failures_per_node_day"] / HOURS_PER_DAY
    total = shares["gpu"] + shares["node"] + shares["nic"]
    return FailureRates(
        per_gpu_hour=per_node_hour * shares["gpu"] / total / rate["gpus_per_node"],
        per_node_hour=per_node_hour * shares["node"] / total,
        per_nic_hour=per_node_hour * shares["nic"] / total / rate["nics_per_node"],
        source=rate["source"] + "; " + shares["source"],
    )


def flat_rates(per_gpu_hour: float) -> FailureRates:
    """``--failure-rate``: every failure counted per GPU (rank)."""
    return FailureRates(per_gpu_hour, 0.0, 0.0, source="--failure-rate")


def host_for(accelerator: str) -> HostSpec:
    hosts = _table()["host"]
    h = hosts.get(accelerator, hosts["default"])
    return HostSpec(float(h["link_bytes_per_s"]), float(h["memory_bytes"]), h["source"])


def checkpoint_defaults() -> CheckpointDefaults:
    c = _table()["checkpoint"]
    return CheckpointDefaults(
        float(c["storage_gbps"]), float(c["restart_minutes"]), c["storage_source"], c["restart_source"]
    )


def check_failure_options(
    failure_rate: float | None, mtbf_hours: float | None, storage_gbps: float | None, restart_minutes: float | None
) -> None:
    """Refuse values that cannot be rates, times or bandwidths, before any work starts."""
    if failure_rate is not None and mtbf_hours is not None:
        raise MeshwiseError("--mtbf-hours: give it or --failure-rate, not both (the MTBF is 1 / (rate x GPUs))")
    checks = (
        ("--failure-rate", failure_rate, "failures per GPU-hour, more than 0 (e.g. 2e-5)"),
        ("--mtbf-hours", mtbf_hours, "hours between the whole job's failures, more than 0 (e.g. 3)"),
        ("--storage-gbps", storage_gbps, "gigabits per second per node, more than 0 (e.g. 7.8)"),
    )
    for name, value, valid in checks:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise MeshwiseError(f"{name}: {value!r} must be {valid}")
    if restart_minutes is not None and not (math.isfinite(restart_minutes) and restart_minutes >= 0):
        raise MeshwiseError(f"--restart-minutes: {restart_minutes!r} must be a number of minutes, 0 or more (e.g. 11)")


# ------------------------------------------------------------------------------ the formulas
def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 delta M)``."""
    return math.sqrt(2 * delta_s * mtbf_s)


def daly_first_order_interval_s(delta_s: float, mtbf_s: float, restart_s: float) -> float:
    """Daly (2006) first-order optimum: ``sqrt(2 delta (M + R))``."""
    return math.sqrt(2 * delta_s * (mtbf_s + restart_s))


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum (perturbation solution), ``M`` when ``delta >= 2M``."""
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    x = delta_s / (2 * mtbf_s)
    return math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def goodput(interval_s: float, delta_s: float, mtbf_s: float, restart_s: float) -> float:
    """Daly (2006): useful work over expected wall time, ``tau / (M e^(R/M) (e^((tau+delta)/M) - 1))``."""
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + delta_s) / m))


# ------------------------------------------------------------------------- a layout's checkpoint
@dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint of a layout: bytes and seconds (module docstring)."""

    staged_bytes_per_rank: float  # the largest rank's saved states
    staged_bytes_per_node: float
    write_bytes_per_node: float  # after deduplicating replicas
    stage_s: float  # blocking: device to host
    write_s: float  # in the background
    read_s: float  # on restart
    restart_s: float  # restart minutes + read
    host_memory_bytes: float  # one node's

    @property
    def staging_fits(self) -> bool:
        return self.staged_bytes_per_node <= self.host_memory_bytes

    def as_json(self) -> dict:
        return {
            "staged_bytes_per_rank": self.staged_bytes_per_rank,
            "staged_bytes_per_node": self.staged_bytes_per_node,
            "write_bytes_per_node": self.write_bytes_per_node,
            "stage_s": self.stage_s,
            "write_s": self.write_s,
            "read_s": self.read_s,
            "restart_s": self.restart_s,
            "host_memory_bytes": self.host_memory_bytes,
            "staging_fits": self.staging_fits,
        }


def saved_bytes(params: float, expert_params: float, train, layout) -> tuple[float, float]:
    """(weights, optimizer) bytes a rank holding ``params`` saves: the optimizer states (the fp32
    master among them under mixed precision) and, without a master, the weights."""
    w, _, o = states(params, train, layout, expert_params)
    return (0.0 if train.mixed else w), o


def replicas(layout) -> tuple[int, int]:
    """How many ranks hold each saved byte of (weights, optimizer): DCP writes each once."""
    outside = layout.dp // layout.shard if layout.zero else layout.dp
    return (outside if layout.zero >= 3 else layout.dp), outside


def checkpoint_cost(
    model, train, layout, gpus_per_node: int, host: HostSpec, storage_gbps: float, restart_minutes: float
) -> CheckpointCost:
    """The checkpoint of ``layout``: the largest pipeline rank's states staged, each node's share written."""
    w_rep, o_rep = replicas(layout)
    staged = written = 0.0
    for shape in rank_shapes(model, layout):
        w, o = saved_bytes(shape.params, shape.expert_params, train, layout)
        staged, written = max(staged, w + o), max(written, w / w_rep + o / o_rep)
    per_node = min(gpus_per_node, layout.world_size)
    storage_bytes_per_s = storage_gbps * 1e9 / BITS_PER_BYTE
    read_s = staged * per_node / storage_bytes_per_s
    return CheckpointCost(
        staged,
        staged * per_node,
        written * per_node,
        stage_s=staged / host.link_bytes_per_s,
        write_s=written * per_node / storage_bytes_per_s,
        read_s=read_s,
        restart_s=restart_minutes * 60 + read_s,
        host_memory_bytes=host.memory_bytes,
    )


# ------------------------------------------------------------------------------ reliability
@dataclass(frozen=True)
class Reliability:
    """A layout under failures: the planned interval and the goodput it leaves."""

    mtbf_s: float
    delta_s: float  # blocking part of a save
    lost_s: float  # restart + the background write a failure loses with it
    interval_s: float  # compute between checkpoints (Daly's higher order, at least the write)
    interval_steps: int
    goodput: float
    young_interval_s: float
    cost: CheckpointCost | None = None

    def as_json(self) -> dict:
        out = {
            "mtbf_hours": self.mtbf_s / SECONDS_PER_HOUR,
            "delta_s": self.delta_s,
            "restart_and_write_s": self.lost_s,
            "interval_s": self.interval_s,
            "interval_steps": self.interval_steps,
            "goodput": self.goodput,
            "young_interval_s": self.young_interval_s,
        }
        if self.cost is not None:
            out["checkpoint"] = self.cost.as_json()
        return out


def plan_interval(
    delta_s: float, mtbf_s: float, lost_s: float, step_s: float, write_s: float = 0.0
) -> tuple[float, int]:
    """Daly's higher-order interval, at least the background write and one step, rounded to whole
    steps: (seconds, steps)."""
    tau = max(daly_interval_s(delta_s, mtbf_s), write_s, step_s)
    steps = max(1, round(tau / step_s))
    return steps * step_s, steps


def reliability(cost: CheckpointCost, mtbf_s: float, step_s: float) -> Reliability:
    """The planned interval and goodput of a layout whose saves cost ``cost``."""
    lost_s = cost.restart_s + cost.write_s
    tau, steps = plan_interval(cost.stage_s, mtbf_s, lost_s, step_s, cost.write_s)
    return Reliability(
        mtbf_s,
        cost.stage_s,
        lost_s,
        tau,
        steps,
        goodput(tau, cost.stage_s, mtbf_s, lost_s),
        young_interval_s(cost.stage_s, mtbf_s),
        cost,
    )


def job_mtbf_s(rates: FailureRates | None, mtbf_hours: float | None, gpus: int, nodes: int, nics: int) -> float:
    """The job's mean time between failures: ``--mtbf-hours``, else ``1 / lambda``."""
    if mtbf_hours is not None:
        return mtbf_hours * SECONDS_PER_HOUR
    assert rates is not None
    return SECONDS_PER_HOUR / rates.job_per_hour(gpus, nodes, nics)
