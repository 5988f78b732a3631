"""``plan``'s failure figures: each shown layout's checkpoint cost, planned interval and goodput
(cost/failures.py), the explanation's lines about them, and whether ranking on goodput changes the pick.

Shown for runs of more than one node, or whenever a failure option is given
(``--failure-rate``, ``--mtbf-hours``, ``--storage-gbps``, ``--restart-minutes``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshwise.cost import failures as fm
from meshwise.plan.candidates import TIE
from meshwise.units import gb_text

RATE_SOURCE = "Kokolis et al. 2025's rate, split by Llama 3's causes: catalog/failures.toml"


@dataclass(frozen=True)
class FailureOptions:
    failure_rate: float | None = None  # failures per GPU-hour
    mtbf_hours: float | None = None  # the whole job's
    storage_gbps: float | None = None  # per node
    restart_minutes: float | None = None

    def given(self) -> bool:
        return any(v is not None for v in (self.failure_rate, self.mtbf_hours, self.storage_gbps, self.restart_minutes))

    def check(self) -> None:
        fm.check_failure_options(self.failure_rate, self.mtbf_hours, self.storage_gbps, self.restart_minutes)

    def resolved(self) -> tuple[float, float]:
        """(storage Gb/s per node, restart minutes): the options, else the catalog's."""
        d = fm.checkpoint_defaults()
        return (
            d.storage_gbps if self.storage_gbps is None else self.storage_gbps,
            d.restart_minutes if self.restart_minutes is None else self.restart_minutes,
        )


def shown(cluster, options: FailureOptions) -> bool:
    return cluster.nodes > 1 or options.given()


def job_mtbf_s(cluster, options: FailureOptions) -> float:
    rates = fm.flat_rates(options.failure_rate) if options.failure_rate is not None else fm.catalog_rates()
    return fm.job_mtbf_s(rates, options.mtbf_hours, cluster.world_size, cluster.nodes, cluster.world_size)


def layout_reliability(
    model, cluster, train, estimate, options: FailureOptions, mtbf_s: float, layout=None
) -> fm.Reliability:
    """One layout's checkpoint cost, interval and goodput (``layout``: another than the estimate's)."""
    storage_gbps, restart_minutes = options.resolved()
    cost = fm.checkpoint_cost(
        model,
        train,
        layout or estimate.layout,
        cluster.gpus_per_node,
        fm.host_for(cluster.accelerator.name),
        storage_gbps,
        restart_minutes,
    )
    return fm.reliability(cost, mtbf_s, estimate.time.step_s)


def reliabilities(model, cluster, train, candidates, options: FailureOptions) -> list[fm.Reliability]:
    mtbf_s = job_mtbf_s(cluster, options)
    return [layout_reliability(model, cluster, train, e, options, mtbf_s) for e in candidates]


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:,.0f} h" if s >= 360_000 else f"{s / 3600:.3g} h"
    return f"{s / 60:.3g} min" if s >= 120 else f"{s:.3g} s"


def interval_cell(r: fm.Reliability) -> str:
    return f"{r.interval_steps:,} ({_seconds(r.interval_s)})"


def _rate_line(cluster, options: FailureOptions, mtbf_s: float) -> str:
    if options.mtbf_hours is not None:
        why = "--mtbf-hours"
    elif options.failure_rate is not None:
        why = f"--failure-rate {options.failure_rate:g} per GPU-hour"
    else:
        parts = fm.catalog_rates().breakdown(cluster.world_size, cluster.nodes, cluster.world_size)
        total = sum(parts.values())
        why = (
            f"GPUs {parts['gpus'] / total:.0%}, nodes {parts['nodes'] / total:.0%}, NICs "
            f"{parts['nics'] / total:.0%}; {RATE_SOURCE}"
        )
    return (
        f"one interruption every {_seconds(mtbf_s)} on {cluster.world_size:,} x {cluster.accelerator.name} "
        f"({cluster.nodes:,} node(s); {why})"
    )


def explanation_lines(cluster, candidates, rels: list[fm.Reliability], options: FailureOptions) -> list[str]:
    """The failure line for row #1, and the pick on goodput when it differs."""
    if not candidates:
        return []
    r, e = rels[0], candidates[0]
    c = r.cost
    storage_gbps, restart_minutes = options.resolved()
    text = (
        f"Failures: {_rate_line(cluster, options, r.mtbf_s)}. Row #1's checkpoint: "
        f"{gb_text(c.staged_bytes_per_rank)} per rank staged to host memory in {c.stage_s:.3g} s (blocking; "
        f"asynchronous DCP), {gb_text(c.write_bytes_per_node)} per node written in {_seconds(c.write_s)} at "
        f"{storage_gbps:g} Gb/s while training goes on; a restart costs {restart_minutes:g} min + "
        f"{_seconds(c.read_s)} to read it back. Daly's interval: every {r.interval_steps:,} steps "
        f"({_seconds(r.interval_s)}) of training "
        f"(Young's first order: {_seconds(r.young_interval_s)}) -> goodput {r.goodput:.1%}, "
        f"{e.tokens_per_s * r.goodput:,.0f} effective tokens/s."
    )
    return [text] + _pick_line(candidates, rels)


def _pick_line(candidates, rels: list[fm.Reliability]) -> list[str]:
    effective = [e.tokens_per_s * r.goodput for e, r in zip(candidates, rels)]
    best = max(range(len(candidates)), key=lambda i: (effective[i], -i))
    if len(candidates) < 2:
        return []
    if best == 0 or effective[best] <= effective[0] * (1 + TIE):
        spread = max(r.goodput for r in rels) - min(r.goodput for r in rels)
        return (
            [f"On goodput (tokens/s x goodput) row #1 stays the pick; the shown rows' goodput differs by {spread:.1%}."]
            if spread > 0.005
            else []
        )
    gain = effective[best] / effective[0] - 1
    return [
        f"On goodput the pick changes: row #{best + 1}, {candidates[best].layout.short()}, gives "
        f"{effective[best]:,.0f} effective tokens/s (goodput {rels[best].goodput:.1%}) against row #1's "
        f"{effective[0]:,.0f} ({rels[0].goodput:.1%}), {gain:+.1%}, past the {TIE:.0%} tie: its checkpoints "
        f"stage {gb_text(rels[best].cost.staged_bytes_per_rank)} per rank, not "
        f"{gb_text(rels[0].cost.staged_bytes_per_rank)}."
    ]


def staging_warnings(
    model, cluster, train, candidates, rels: list[fm.Reliability], options: FailureOptions
) -> list[str]:
    """Row #1's staging against the node's memory: one line with what fits when it does not."""
    if not candidates or rels[0].cost.staging_fits:
        return []
    e, c = candidates[0], rels[0].cost
    lay = e.layout
    what = f"save without staging (the write then blocks: {_seconds(c.write_s)} per save)"
    if lay.zero == 0 and lay.dp > 1:
        alt = layout_reliability(model, cluster, train, e, options, rels[0].mtbf_s, layout=replace(lay, zero=1))
        if alt.cost.staging_fits:
            what = (
                f"--layout {replace(lay, zero=1).short()} (sharded optimizer states) stages "
                f"{gb_text(alt.cost.staged_bytes_per_node)} per node; or {what}"
            )
    return [
        f"Checkpoint staging of row #1 needs {gb_text(c.staged_bytes_per_node)} of host memory per node, "
        f"more than the node's {gb_text(c.host_memory_bytes)}: {what}."
    ]
