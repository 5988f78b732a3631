"""Plan: search (:mod:`meshwise.plan.search`), then explain the choice along the decision order of
docs/design.md with the numbers, and warn of the known anti-patterns. Pure Python: never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from meshwise.cost import memory
from meshwise.cost.estimate import DEFAULT_HEADROOM, Estimate, estimate
from meshwise.cost.memory import Memory
from meshwise.cost.plan_cache import PlanCache
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable, runs_here, validate
from meshwise.plan.band import Band, band_for, figure_bands, with_band
from meshwise.plan.batch_hint import MAX_SHIFT
from meshwise.plan.compare import binding, costlier_part
from meshwise.plan.experts import expert_degrees, moe_block_params, step_experts_with_figures
from meshwise.plan.megatron_search import MEGATRON_SCHEDULES
from meshwise.plan.search import (  # noqa: F401  (the search's names, re-exported for plan's callers)
    CP_MIN_TOKENS,
    MAX_MBS,
    MAX_VPP,
    RUNNER_UP_POOL,
    TIE,
    SearchResult,
    _collector_paused,
    _divisors,
    _rank_key,
    _simplicity,
    anything_fits,
    break_ties,
    cp_degrees,
    enumerate_layouts,
    pipeline_options,
    search,
    simpler_in,
    tp_degrees,
)
from meshwise.plan.search import _divisors as _divisors_of
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec
from meshwise.units import gb_text

# ------------------------------------------------------------------------------- explanation
# DeepSeek-V3 (arXiv 2412.19437, Sec. 4.2): batch ramped to 15,360 sequences of 4,096 tokens (docs/sources.md)
LARGEST_PUBLISHED_BATCH_TOKENS = 15360 * 4096


ORDER = (
    f"fastest step first; layouts within {TIE:.0%} of the fastest are a tie within the time model's accuracy "
    "and come first, simplest first (no recompute, fewer micro-batches, fewer parallel dimensions), or least "
    "memory first when the fastest leaves little free"
)


@dataclass(frozen=True)
class Plan:
    """What ``meshwise plan`` prints: candidates best first, the explanation, the warnings."""

    candidates: tuple[Estimate, ...]
    explanation: tuple[str, ...]
    warnings: tuple[str, ...]
    enumerated: int
    fitting: int
    why_nothing_fits: tuple[str, ...] = ()  # when the search found none: why, then what would fit
    figures: dict = field(default_factory=dict)  # Explained.figures: what each step's line quotes
    band: Band | None = None  # how far every figure can be off (plan/band.py); the same for every row
    checked: int | None = None  # layouts whose memory was worked out, when the search stopped before all

    def fit_words(self) -> str:
        """The header's count: how many fit, exact when every layout's memory was checked, else of those
        checked (the search weighs layouts fastest lower bound first and stops where no later one can
        make the top ``RUNNER_UP_POOL``)."""
        searched = f"{self.enumerated:,} layouts searched"
        if self.checked is None or self.checked >= self.enumerated:
            return f"{searched}, {self.fitting:,} fit"
        return (
            f"{searched}, {self.fitting:,} fit of the {self.checked:,} checked for memory (the rest are slower "
            f"than the best {RUNNER_UP_POOL} by their lower bound)"
        )

    @property
    def nothing_fits(self) -> bool:
        """No candidate fits: ``meshwise plan`` exits with errors.NOTHING_FITS (not 0, not 2)."""
        return not any(e.fits for e in self.candidates)

    def as_json(self) -> dict:
        status = "fits" if not self.nothing_fits else "nothing fits" if not self.candidates else "does not fit"
        out = {
            "status": status,
            "candidates": [e.as_json() | figure_bands(self.band, e) for e in self.candidates],
            "explanation": list(self.explanation),
            "warnings": list(self.warnings),
            "enumerated": self.enumerated,
            "fitting": self.fitting,
            "checked": self.enumerated if self.checked is None else self.checked,
        }
        out["order"] = ORDER
        out["explanation_figures"] = self.figures
        if self.why_nothing_fits:
            reason, *would = self.why_nothing_fits
            out["why_nothing_fits"] = {"reason": reason, "what_would": would}
        return out


MOMENT_WORDS = {
    "forward": "at the end of its forward",
    "backward": "at the start of its backward",
    "end": "at the end of the step",
    "loss": "in the loss's backward",
    "block": "late in a block's backward",
    "ring": "in the ring attention's backward",
    "embed": "in the embedding's backward",
}


@dataclass(frozen=True)
class Reference:
    """A layout the explanation speaks of, estimated as the table's rows are (``estimate``) on
    ``devices`` devices with ``global_batch`` sequences: ``meshwise plan --gpus devices --global-batch
    global_batch --layout layout`` prints the same memory. ``moment``: where its activations peak."""

    layout: Layout
    devices: int
    global_batch: int
    memory: Memory  # at the step's peak, the largest rank (the table's columns)
    peak_moment: str
    activations_peak: float  # the largest activations of any moment (they may peak elsewhere)
    activations_moment: str

    def as_json(self) -> dict:
        return {
            "layout": self.layout.short(),
            "devices": self.devices,
            "global_batch": self.global_batch,
            "memory": self.memory.as_json(),
            "peak_moment": self.peak_moment,
            "activations_peak_bytes": int(round(self.activations_peak)),
            "activations_moment": self.activations_moment,
        }


def reference(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout) -> Reference:
    """``layout`` on its own world size (dp x cp x tp x pp devices) at ``train``'s batch, when it
    divides, else one sequence per replica; its peak, and its activations' own peak (the moment
    named). Pure bookkeeping over memory.moment_memories: the same numbers as the table's row."""
    gb = train.global_batch if train.global_batch % (layout.dp * layout.mbs) == 0 else layout.dp * layout.mbs
    local = replace(train, global_batch=gb)
    m = layout.accum(gb)
    peak, peak_at, act, act_at = None, "", -1.0, ""
    for shape in memory.rank_shapes(model, layout):
        moments = memory.moment_memories(model, local, layout, shape, m, cluster.accelerator.memory_bytes)
        name, mem = max(moments.items(), key=lambda kv: kv[1].total)
        if peak is None or mem.total > peak.total:
            peak, peak_at = mem, name
        name, mem = max(moments.items(), key=lambda kv: kv[1].activations)
        if mem.activations > act:
            act, act_at = mem.activations, name
    return Reference(layout, layout.dp * layout.cp * layout.tp * layout.pp, gb, peak, peak_at, act, act_at)


def _precision_note(train: TrainSpec) -> str:
    return (
        f"{train.state_bytes_per_param} B/param ({train.precision}: {train.weight_bytes} weights + "
        f"{train.grad_bytes} grads + {train.optimizer_bytes} {train.optimizer} states)"
    )


@dataclass
class Explained:
    """The explanation's lines and, by step label ("1", "2", "3", "3b", "4", "5", "E", "chosen"), the
    figures each quotes: bytes, seconds and fractions by name, and the reference layouts it speaks of."""

    lines: list[str]
    figures: dict[str, dict]

    def add(self, step: str, line: str, **figures) -> None:
        self.lines.append(line)
        self.figures[step] = {k: (v.as_json() if isinstance(v, Reference) else v) for k, v in figures.items()}


def explain(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    best: list[Estimate],
    headroom: float = DEFAULT_HEADROOM,
    shown: int | None = None,
    cache: PlanCache | None = None,
) -> Explained:
    """Walk the decision order of docs/design.md with the numbers, then compare the winner to row #2
    and to the best layout of another kind (``shown``: the rows the table shows); each line with its
    figures (Plan.as_json's ``explanation_figures``; ``cache``: the plan's, cost/plan_cache.py)."""
    usable = cluster.accelerator.memory_bytes * (1 - headroom)
    out = Explained([], {})
    one = reference(model, cluster, replace(train, global_batch=1), Layout())
    _step_one_device(out, model, cluster, train, one, usable, headroom)
    if one.memory.total > usable:
        _steps_capacity(out, model, cluster, train, usable, best[0] if best else None)
    if best and (one.memory.total > usable or best[0].layout.cp > 1):
        _step_context(out, model, cluster, train, best[0], usable, cache)
    if best:
        _steps_shape(out, model, cluster, train, best[0])
        if model.moe and not model.states_only:
            other = _other_ep(model, cluster, train, best[0], usable, cache)
            line, figures = step_experts_with_figures(model, cluster, train, best[0], usable, other)
            out.add("E", line, **figures)
        _why_winner(out, best, len(best) if shown is None else shown)
    return out


def _other_ep(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate, usable: float, cache: PlanCache | None
):
    """The search restricted to the layouts of the other kind than the chosen one: ep = 1 where it
    has ep > 1, ep > 1 where it has ep = 1 (what decided ep, plan/experts.py)."""
    split = winner.layout.ep > 1
    runs = runs_here(model, train.seq_len) if train.runtime == "meshwise" else (lambda layout: True)

    def other(layout: Layout) -> bool:  # no ``reads``: the search would share its answers across eps
        return (layout.ep == 1) == split and runs(layout)

    other.ep_split = split  # type: ignore[attr-defined]  # the plan's search answers it from its own order
    return search(model, cluster, train, 1, 1 - usable / cluster.accelerator.memory_bytes, where=other, cache=cache)


def _step_one_device(
    out: Explained,
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    one: Reference,
    usable: float,
    headroom: float,
) -> None:
    """Step 1: do the model states (+ the activations of one sequence) fit on one device?"""
    accel = cluster.accelerator
    states = model.params * train.state_bytes_per_param
    cap = (
        f"one {accel.name} holds {gb_text(accel.memory_bytes)} ({gb_text(usable)} usable with {headroom:.0%} headroom)"
    )
    act = (
        ""
        if model.states_only
        else (
            f"; one sequence's activations reach {gb_text(one.activations_peak)} "
            f"{MOMENT_WORDS[one.activations_moment]}, and the device's peak is {gb_text(one.memory.total)} "
            f"{MOMENT_WORDS[one.peak_moment]} (dp=1, mbs=1, no recompute)"
        )
    )
    out.add(
        "1",
        f"1. One device? Model states {model.params / 1e9:,.3g}B params x {_precision_note(train)} = "
        f"{gb_text(states)}{act}; {cap} -> "
        + (
            "fits: data parallelism (DDP) is the simplest answer; global batch = mbs x accum x dp."
            if one.memory.total <= usable
            else "does not fit: plain DDP cannot run this model."
        ),
        states_bytes=states,
        capacity_bytes=accel.memory_bytes,
        usable_bytes=usable,
        one_device=one,
    )


def _steps_capacity(
    out: Explained, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, usable: float, winner: Estimate | None
) -> None:
    """Steps 2 and 3, when one device is not enough: shard the states; is one layer too large?"""
    n = cluster.world_size
    sharded = model.params * train.state_bytes_per_param / n
    verdict = "fits" if sharded <= usable else "does not fit"
    line = (
        f"2. Replicated states? Sharding them over all {n} device(s) (ZeRO-3/FSDP) leaves "
        f"{gb_text(sharded)} of states per device -> {verdict}"
        + (": ZeRO/FSDP addresses the capacity wall." if sharded <= usable else ".")
    )
    refs: dict[str, Reference] = {}
    if sharded <= usable and not model.states_only:
        plain = reference(model, cluster, train, Layout(dp=n, zero=3, shard=n))
        if plain.memory.total > usable:
            full = reference(model, cluster, train, Layout(dp=n, zero=3, shard=n, ac="full"))
            refs = {"zero3": plain, "zero3_full": full}
            batch = f" (at a global batch of {plain.global_batch})" if plain.global_batch != train.global_batch else ""
            line += (
                f" But the activations do not fit beside them: {plain.layout.short()}{batch} peaks at "
                f"{gb_text(plain.memory.total)} with {gb_text(plain.memory.activations)} of activations; with full "
                f"recompute ({full.layout.short()}) {gb_text(full.memory.activations)} of activations, a peak of "
                f"{gb_text(full.memory.total)} -> "
                + (
                    "checkpointing or TP+SP, which splits them, is needed too."
                    if full.memory.total <= usable
                    else "checkpointing alone is not enough: TP+SP (or PP, CP) must split them too."
                )
            )
    out.add("2", line, sharded_states_bytes=sharded, usable_bytes=usable, **refs)
    if model.states_only:
        out.add(
            "3",
            "3. One layer too large? Unknown for a bare parameter count: give --model for the "
            "shape-aware answer (TP, PP and activations).",
        )
        return
    _step_layer(out, model, cluster, train, usable, winner)


def _step_layer(
    out: Explained, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, usable: float, winner: Estimate | None
) -> None:
    """Step 3: one block must be whole on a rank while it computes (FSDP gathers one at a time): its
    weights and gradients, unsharded, and its activations of one sequence. Routed experts are split
    by expert parallelism (up to the largest ep the search tries), not by TP."""
    max_ep = max(expert_degrees(model, cluster.world_size))
    # a MoE block's own parameters (the largest block), not the mean over the blocks
    per_block_experts = model.expert_params / model.moe_layers if model.moe else 0.0
    block = moe_block_params(model) if model.moe else model.layer_params
    unsplit = block - per_block_experts * (1 - 1 / max_ep)
    whole = unsplit * (train.weight_bytes + train.grad_bytes)
    kept = memory.kept_per_block(model, train, Layout())
    large = whole + kept > usable
    experts = (
        (
            f", {per_block_experts / 1e6:,.0f}M of them in routed experts, which expert parallelism splits "
            f"(up to ep={max_ep}: {unsplit / 1e6:,.0f}M left on a rank)"
        )
        if model.moe
        else ""
    )
    tp = winner.layout.tp if winner else 1
    if large:
        verdict = "too large for one device: tensor parallelism must split its matrices inside a node" + (
            f" (the chosen layout has tp={tp})." if winner else "."
        )
    else:
        verdict = "a layer fits; TP is needed only if sharded states plus activations still overflow" + (
            f" (the chosen layout has tp={tp})." if winner else "."
        )
    out.add(
        "3",
        f"3. One layer too large? A {'MoE ' if model.moe else ''}block holds {block / 1e6:,.0f}M params{experts}; "
        f"whole while it computes, its weights and gradients take {gb_text(whole)} and its activations of one "
        f"sequence {gb_text(kept)} -> {verdict}",
        block_whole_bytes=whole,
        block_activations_bytes=kept,
        usable_bytes=usable,
    )


def _step_context(
    out: Explained,
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    winner: Estimate,
    usable: float,
    cache: PlanCache | None = None,
) -> None:
    """Step 3b: is one sequence too long for one rank? Said only where the chosen layout splits the
    sequence (cp > 1); whether it had to is the search's own answer without context parallelism."""
    win = winner.layout
    if model.states_only or win.cp == 1:
        return  # the chosen layout holds whole sequences: they fit
    runs = runs_here(model, train.seq_len) if train.runtime == "meshwise" else (lambda layout: True)

    def without_cp(layout: Layout) -> bool:
        return layout.cp == 1 and runs(layout)

    without_cp.reads = runs_here(model, train.seq_len).reads  # type: ignore[attr-defined]  # the search's cache key
    alone = search(
        model, cluster, train, 1, 1 - usable / cluster.accelerator.memory_bytes, where=without_cp, cache=cache
    )
    head = f"3b. Sequence too long? {train.seq_len:,} tokens"
    split = (
        f"context parallelism cp={win.cp} splits the sequence ({train.seq_len // win.cp:,} tokens per rank, "
        f"{gb_text(winner.memory.activations)} of activations)"
    )
    if not alone.enumerated:
        out.add(
            "3b",
            f"3b. Why split the sequence? {train.seq_len:,} tokens: no layout without context parallelism "
            f"is valid here (dp must divide the global batch of {train.global_batch:,}, and tp and pp "
            f"cannot take the other ranks) -> {split}.",
            chosen_activations_bytes=winner.memory.activations,
        )
        return
    if not alone.best:
        out.add(
            "3b",
            f"{head}: none of the {alone.enumerated:,} layouts without context parallelism fits (even TP+SP "
            f"and full recompute leave one sequence's activations too large) -> too long for one rank's "
            f"activations: {split}.",
            chosen_activations_bytes=winner.memory.activations,
        )
        return
    b = alone.best[0]
    slower = b.time.step_s / winner.time.step_s - 1
    out.add(
        "3b",
        f"{head} fit one rank: the best layout without context parallelism, {b.layout.short()}, takes "
        f"{b.time.step_s:.3g} s/step ({slower:+.1%}) -> {split}, for speed, not for memory.",
        chosen_activations_bytes=winner.memory.activations,
        best_without_cp_step_s=b.time.step_s,
    )


def _steps_shape(out: Explained, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate) -> None:
    """Steps 4 and 5 for the chosen layout: the pipeline's depth and bubble; placement across nodes."""
    win = winner.layout
    if win.pp > 1:
        m = win.accum(train.global_batch)
        share = winner.time.bubble_s / winner.time.step_s
        out.add(
            "4",
            f"4. Depth: {model.layers} layers in {win.pp} stages x {win.vpp} chunk(s), {m} micro-batches "
            f"per step -> bubble {share:.1%} of the step ({win.schedule}).",
            bubble_share=share,
        )
    elif not model.states_only:
        out.add("4", f"4. Depth: no pipeline needed; {model.layers} layers stay on every rank.")
    if cluster.nodes > 1:
        tp_span = "inside a node (NVLink)" if win.tp <= cluster.gpus_per_node else "ACROSS nodes"
        domain = cluster.domain_gpus  # GB200/GB300 NVL72: NVLink joins several nodes
        outer = (
            f"DP={win.dp} outermost, over NVLink inside each {domain}-GPU NVLink domain "
            f"({domain // cluster.gpus_per_node} nodes) and the scale-out link between the "
            f"{cluster.world_size // domain} domains"
            if domain > cluster.gpus_per_node
            else f"DP={win.dp} outermost over the scale-out link"
        )
        out.add(
            "5",
            f"5. {cluster.nodes} nodes x {cluster.gpus_per_node}: TP={win.tp} {tp_span}, PP={win.pp} next, {outer}.",
        )


def _kind(layout: Layout) -> tuple:
    """What makes two layouts different in kind, not just in shard size or micro-batch size."""
    return (layout.tp, layout.cp, layout.pp, layout.zero, layout.ac, layout.schedule, layout.ep)


def _versus(w: Estimate, r: Estimate, global_batch: int) -> str:
    """Why ``w`` comes before ``r``: a tie won by less machinery or memory, or the part of the step
    that makes ``r`` slower."""
    slower = r.time.step_s / w.time.step_s - 1
    if slower < TIE:
        simpler = simpler_in(w.layout, r.layout, global_batch)  # only what actually differs between the two
        needs = [f"less machinery: {simpler}"] if simpler else []
        if w.memory.total < r.memory.total:
            needs.append(f"less memory ({gb_text(w.memory.total)}, not {gb_text(r.memory.total)})")
        why = f"the chosen one needs {' and '.join(needs)}" if needs else "the chosen one is as simple and faster"
        return f"within {TIE:.0%} ({slower:+.1%}): a tie within the time model's accuracy; {why}"
    reason, delta = costlier_part(w, r)
    return (
        f"{slower:.1%} slower: its {reason} costs {delta:.3g} s more per step "
        f"(what binds it, as in the table's binds column: {binding(r)})"
    )


def _why_winner(out: Explained, best: list[Estimate], shown: int) -> None:
    """The chosen layout (row #1), row #2 and, when row #2 is of the same kind, the best of another kind
    (with its row, or where to find it). With ``shown`` 0 (``--layout``: the table is that layout's
    row alone) the search's ranks are named as such."""

    def rank(k: int) -> str:
        return f"row #{k}" if k <= shown else (f"#{k} of those that fit" + (f": --top {k} shows it" if shown else ""))

    w = best[0]
    first = rank(1) if shown else "the search's #1"
    head = (
        f"Chosen: {w.layout.short()} ({first}) - "
        f"{w.time.step_s:.3g} s/step, {w.tokens_per_s:,.0f} tokens/s, MFU {w.mfu:.1%}, {gb_text(w.memory.total)} on "
        "the largest rank."
    )
    if len(best) < 2:
        out.add(
            "chosen",
            head + " It is the only layout that fits.",
            rows={"1": w.layout.short()},
            row_1_total_bytes=w.memory.total,
        )
        return
    gb = w.global_batch
    rows = {"1": w.layout.short(), "2": best[1].layout.short()}
    second = f"Row #2, {best[1].layout.short()}," if shown >= 2 else f"The search's #2, {best[1].layout.short()},"
    text = head + f" {second} is {_versus(w, best[1], gb)}."
    k, r = 0, None
    if _kind(best[1].layout) == _kind(w.layout):
        k, r = next(((i, e) for i, e in enumerate(best[2:], 3) if _kind(e.layout) != _kind(w.layout)), (0, None))
        if r is not None:
            rows[str(k)] = r.layout.short()
            text += f" The best of another kind, {r.layout.short()} ({rank(k)}), is {_versus(w, r, gb)}."
    totals = {f"row_{k}_total_bytes": e.memory.total for k, e in ((1, w), (2, best[1]), (k, r)) if e is not None}
    out.add("chosen", text, rows=rows, **totals)


def warnings_for(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    e: Estimate | None,
    headroom: float = DEFAULT_HEADROOM,
    cache: PlanCache | None = None,
) -> list[str]:
    """The anti-patterns of docs/design.md, for the chosen (or evaluated) layout (``cache``: the plan's)."""
    out: list[str] = []
    tokens = train.tokens_per_step
    if tokens > LARGEST_PUBLISHED_BATCH_TOKENS:
        out.append(
            f"Global batch of {tokens / 1e6:,.1f}M tokens per step is past the largest published pretraining "
            f"batch we know of (DeepSeek-V3: 15,360 x 4,096 = {LARGEST_PUBLISHED_BATCH_TOKENS / 1e6:,.1f}M "
            "tokens; Llama 3 405B: 16M); a larger batch buys throughput, not necessarily convergence. "
            f"--global-batch counts sequences of {train.seq_len:,} tokens, not tokens."
        )
    if e is None:
        return out
    lay = e.layout
    if lay.tp > cluster.gpus_per_node:
        out.append(
            f"TP={lay.tp} spans nodes of {cluster.gpus_per_node}: every block's collectives cross the "
            "scale-out link; keep TP inside a node."
        )
    if e.time.comm_exposed_s > 0.3 * e.time.step_s:
        out.append(
            f"Exposed communication is {e.time.comm_exposed_s / e.time.step_s:.0%} of the step: adding devices "
            "will not scale linearly."
        )
    if lay.pp > 1:
        m = lay.accum(train.global_batch)
        if m < 4 * lay.pp or e.time.bubble_s > 0.2 * e.time.step_s:
            out.append(
                f"PP={lay.pp} with only {m} micro-batches per step: the bubble is "
                f"{e.time.bubble_s / e.time.step_s:.1%} of the step; aim for at least {4 * lay.pp}. "
                "What shrinks it and predicts faster: "
                f"{bubble_remedy(model, cluster, train, e, headroom, cache)}."
            )
    if cluster.nodes > 1:
        out.append(
            f"{cluster.nodes}-node run: set a checkpoint interval (meshwise train --checkpoint-every auto "
            "sets it from its measured saves and the failure rate) so a "
            "failure costs minutes, not the run."
        )
    return out


def _other_schedules(model: ModelSpec, layout: Layout) -> list[Layout]:
    """The chosen layout under each other pipeline schedule the search tries (pipeline_options)."""
    return [
        replace(layout, schedule=sch, vpp=v)
        for sch, v in pipeline_options(layout.pp, model.layers)
        if (sch, v) != (layout.schedule, layout.vpp)
    ]


def _check_here(layout: Layout, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, global_batch: int) -> None:
    """layout.check_runnable for the plan's runtime (Megatron-Core runs only its own schedules)."""
    if train.runtime == "megatron" and layout.pp > 1:
        if layout.schedule not in MEGATRON_SCHEDULES:
            raise MeshwiseError(f"schedule={layout.schedule} is not Megatron-Core's")
    check_runnable(layout, model, cluster.world_size, global_batch, train.seq_len, runtime=train.runtime)


def _faster_schedules(
    model: ModelSpec,
    cluster: ClusterSpec,
    train: TrainSpec,
    e: Estimate,
    headroom: float,
    cache: PlanCache | None = None,
) -> list[Estimate]:
    """Per other schedule kind, the vpp whose layout runs here, fits (when ``e`` does), cuts the bubble's
    share and predicts the fastest step, kept only when that step is faster than ``e``'s; fastest first."""
    share = e.time.bubble_s / e.time.step_s
    best: dict[str, Estimate] = {}
    for layout in _other_schedules(model, e.layout):
        try:
            _check_here(layout, model, cluster, train, train.global_batch)
        except MeshwiseError:
            continue
        alt = estimate(model, cluster, train, layout, headroom, cache.stages if cache else None)
        now = best.get(layout.schedule)
        if (
            (alt.fits or not e.fits)
            and alt.time.step_s < e.time.step_s
            and alt.time.bubble_s / alt.time.step_s < share
            and (now is None or alt.time.step_s < now.time.step_s)
        ):
            best[layout.schedule] = alt
    return sorted(best.values(), key=lambda a: a.time.step_s)


def _more_micro_batches(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, e: Estimate, headroom: float
) -> list[str]:
    """More micro-batches per step, each said only where it predicts better: a smaller mbs (same batch)
    where the step is faster; a global batch of 4 x pp micro-batches where tokens/s is higher."""
    lay, out = e.layout, []
    if lay.mbs > 1:
        smaller = replace(lay, mbs=lay.mbs // 2)
        try:
            _check_here(smaller, model, cluster, train, train.global_batch)
            alt = estimate(model, cluster, train, smaller, headroom)
            if alt.fits and alt.time.step_s < e.time.step_s:
                out.append(
                    f"mbs={smaller.mbs}: a {alt.time.step_s:.4g} s step ({alt.time.step_s / e.time.step_s - 1:+.1%})"
                )
        except MeshwiseError:
            pass
    batch = 4 * lay.pp * lay.mbs * lay.dp
    if batch > train.global_batch:
        more = replace(train, global_batch=batch)
        try:
            _check_here(lay, model, cluster, train, batch)
            alt = estimate(model, cluster, more, lay, headroom)
            if alt.fits and alt.tokens_per_s > e.tokens_per_s:
                out.append(
                    f"--global-batch {batch} ({4 * lay.pp} micro-batches): {alt.tokens_per_s:,.0f} tokens/s "
                    f"({alt.tokens_per_s / e.tokens_per_s - 1:+.1%}), if the optimisation tolerates the batch"
                )
        except MeshwiseError:
            pass
    return out


def bubble_remedy(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, e: Estimate, headroom: float, cache: PlanCache | None
) -> str:
    """What shrinks the chosen layout's bubble AND predicts a faster step, each estimated as the table's
    rows are: another schedule (:func:`_faster_schedules`, step_s compared) or more micro-batches
    (:func:`_more_micro_batches`); or that none does. A smaller bubble share alone is no remedy: a
    schedule that adds communication or memory can shrink the share and still slow the step."""
    out = [
        f"schedule={alt.layout.schedule}"
        + (f",vpp={alt.layout.vpp}" if alt.layout.vpp > 1 else "")
        + f" cuts it to {alt.time.bubble_s / alt.time.step_s:.1%} of a {alt.time.step_s:.4g} s step "
        f"({alt.time.step_s / e.time.step_s - 1:+.1%})"
        + ("" if alt.fits else f", but it needs {gb_text(alt.memory.total)}, more than fits")
        for alt in _faster_schedules(model, cluster, train, e, headroom, cache)
    ]
    out += _more_micro_batches(model, cluster, train, e, headroom)
    if not out:
        return (
            f"none of what meshwise tries predicts better than now ({e.time.step_s:.4g} s/step): another "
            f"schedule that fits, a smaller mbs, {4 * e.layout.pp} micro-batches per step"
        )
    return "; ".join(out)


def _first_valid(model: ModelSpec, world: int, train: TrainSpec, global_batch: int) -> Layout | None:
    """A valid layout of ``world`` ranks for ``global_batch`` that the chosen runtime runs, or None."""
    if train.runtime == "megatron" and not model.states_only:
        where = lambda lay: lay.schedule in MEGATRON_SCHEDULES  # noqa: E731
    else:
        where = None if model.states_only else runs_here(model, train.seq_len)
    return next(enumerate_layouts(model, world, global_batch, where, train.seq_len), None)


def no_valid_layout(model: ModelSpec, world: int, train: TrainSpec, tries: int = 12) -> str:
    """The one-line refusal when no layout is valid (every cp included): dp must divide the global batch.
    Names a nearby global batch that has a valid layout (checked, at most ``tries`` of them): within the
    batch hint's shift, the one that admits the most data-parallel degrees first (1,000 on 1,000
    devices rather than 1,025, whose only layouts run dp=25), then the nearest (plan/batch_hint.py)."""
    dps = {
        world // (tp * cp * pp)
        for tp in tp_degrees(model, world)
        for cp in cp_degrees(model, world // tp, train.seq_len, bounded=False)
        for pp in (p for p in _divisors_of(world // (tp * cp)) if p <= max(model.layers, 1))
    }
    gb = train.global_batch
    batches = sorted(
        {b for d in dps for b in (gb // d * d, -(-gb // d) * d) if b > 0 and b != gb},
        key=lambda b: (abs(b - gb) > MAX_SHIFT * gb, -math.gcd(b, world), abs(b - gb), b),
    )
    head = f"--global-batch: {gb} leaves no valid layout on {world} devices (dp must divide it)"
    for b in batches[:tries]:
        lay = _first_valid(model, world, train, b)
        if lay is not None:
            return f"{head}; --global-batch {b} has one ({lay.short()})"
    return f"{head}; try a multiple of {world}, or another --gpus"


def _best_fit(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float) -> list[Estimate]:
    """``search(model, cluster, train, 1, headroom).best``, searched only where a memory-only pass
    (search.anything_fits) finds a layout that fits: the same answer, without the time bounds a
    search that finds nothing works out."""
    cache = PlanCache(model, cluster, train)
    if not anything_fits(model, cluster, train, headroom, cache):
        return []
    return search(model, cluster, train, 1, headroom, cache=cache).best


def what_would_fit(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float) -> list[str]:
    """When nothing fits: fewer bytes per parameter, more devices, a shorter sequence."""
    out: list[str] = []
    if train.state_bytes_per_param > 12 and train.precision != "bf16":
        lighter = replace(train, precision="bf16")
        best = _best_fit(model, cluster, lighter, headroom)
        out.append(
            "Fewer bytes per parameter: with --precision bf16 (12 B/param) "
            + (f"{best[0].layout.short()} fits." if best else "it still does not fit.")
        )
    else:
        weights = model.params * train.weight_bytes / cluster.world_size
        out.append(
            f"Fewer bytes per parameter: {train.state_bytes_per_param} B/param is already the leanest "
            f"convention; the weights alone take {gb_text(weights)} per device"
            + (
                " - more than fits, so only more devices help."
                if weights > cluster.accelerator.memory_bytes * (1 - headroom)
                else "."
            )
        )
    node = max(cluster.gpus_per_node, 8)
    for k in range(1, 15):
        more = cluster.world_size * 2**k
        per_node = min(node, more)
        bigger = ClusterSpec(cluster.accelerator, per_node, more // per_node, cluster.intra, cluster.inter)
        gb = max(train.global_batch, more)
        best = _best_fit(model, bigger, replace(train, global_batch=gb), headroom)
        if best:
            batch = f", global batch {gb}" if gb != train.global_batch else ""
            out.append(
                f"More devices: {more} x {cluster.accelerator.name} fit with {best[0].layout.short()}"
                f" ({gb_text(best[0].memory.total)} on the largest rank{batch})."
            )
            break
    else:
        out.append("More devices: not even 2^14 times as many would fit it.")
    if not model.states_only:
        # powers of two, longest first: they split evenly over the context-parallel ranks a long
        # sequence needs (halving 10,000,000 gave 19,531, where 1,048,576 fits)
        seq = 1 << (train.seq_len - 1).bit_length() - 1
        while seq >= 128:
            best = _best_fit(model, cluster, replace(train, seq_len=seq), headroom)
            if best:
                out.append(
                    f"A shorter sequence: --seq-len {seq} (the longest power of two that fits) with "
                    f"{best[0].layout.short()}."
                )
                break
            seq //= 2
    return out


def evaluate_layout(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, headroom: float = DEFAULT_HEADROOM
) -> Plan:
    """Evaluate ``layout`` alone beside the search's best, explain and warn, with one set of caches
    (cost/plan_cache.py)."""
    cache = PlanCache(model, cluster, train)
    validate(layout, model, cluster.world_size, train.global_batch)
    e = estimate(model, cluster, train, layout, headroom, cache.stages)
    result = search(model, cluster, train, 2, headroom, cache=cache)
    said = explain(model, cluster, train, result.pool, headroom, shown=0, cache=cache)
    lines = said.lines
    verdict = "fits" if e.fits else "does NOT fit"
    lines.append(
        f"Evaluated: {layout.short()} {verdict} ({gb_text(e.memory.total)} on the largest rank), "
        f"{e.time.step_s:.3g} s/step, {e.tokens_per_s:,.0f} tokens/s, MFU {e.mfu:.1%}"
        + (
            f"; the best layout is {(result.best[0].tokens_per_s / e.tokens_per_s - 1):.1%} faster."
            if result.best and e.fits and result.best[0].layout != layout
            else "."
        )
    )
    warnings = warnings_for(model, cluster, train, e, headroom, cache)
    band = band_for(model, cluster.accelerator, train)
    lines = [with_band(line, band, (e,)) for line in lines]
    return Plan(
        (e,),
        tuple(lines),
        tuple(warnings),
        result.enumerated,
        result.fitting,
        figures=said.figures,
        band=band,
        checked=result.checked,
    )


def plan(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5, headroom: float = DEFAULT_HEADROOM
) -> Plan:
    """Search, explain and warn, with one set of caches (cost/plan_cache.py). The cyclic garbage
    collector stays paused until those caches are freed (search._collector_paused): resumed while
    they live, its first pass would walk every tuple and layout they hold (~0.07 s of a DeepSeek-V3
    plan on 16,384 GPUs)."""
    with _collector_paused():
        return _plan(model, cluster, train, top, headroom)


def _plan(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int, headroom: float) -> Plan:
    """:func:`plan`'s work; its caches go when it returns."""
    cache = PlanCache(model, cluster, train)
    result = search(model, cluster, train, top, headroom, cache=cache)
    said = explain(model, cluster, train, result.pool, headroom, shown=top, cache=cache)
    lines = said.lines
    if not result.best:
        if result.enumerated == 0:
            raise MeshwiseError(no_valid_layout(model, cluster.world_size, train))
        why = [
            f"Nothing fits: none of the {result.enumerated:,} layouts of {cluster.world_size} device(s) does.",
            *what_would_fit(model, cluster, train, headroom),
        ]
        lines += [why[0]] + ["What would: " + s for s in why[1:]]
    best = result.best[0] if result.best else None
    band = band_for(model, cluster.accelerator, train)
    lines = [with_band(line, band, result.best[:1]) for line in lines]
    return Plan(
        tuple(result.best),
        tuple(lines),
        tuple(warnings_for(model, cluster, train, best, headroom, cache)),
        result.enumerated,
        result.fitting,
        tuple(why) if not result.best else (),
        said.figures,
        band,
        result.checked,
    )


def plan_notes(cluster: ClusterSpec, train: TrainSpec, shown: tuple[Estimate, ...] = ()) -> list[str]:
    """What every plan on this device and setting must say beside its numbers: a time model never
    checked against published runs of this device (the accelerator's ``calibrated_on`` is empty); and,
    where a ZeRO-3 row of ``shown`` reads (near) 0 GB of params or grads, what its columns are."""
    accel = cluster.accelerator
    notes = []
    if not accel.calibrated_on:
        notes.append(
            f"{accel.name}'s step times are not checked against any published run (datasheet peaks with "
            f"{'the op model of a sibling device' if accel.has_op_model else 'the default efficiency curve'}"
            "): treat its times as a first-order estimate"
        )
    if any(e.layout.zero == 3 and min(e.memory.params, e.memory.grads) < 0.05e9 for e in shown):
        notes.append(
            "the memory columns are each category at the rank's peak moment (they sum to total), not "
            "each one's own maximum: under ZeRO-3 a rank keeps 1/shard of the weights and gradients and "
            "the whole ones exist only while a block computes, so params or grads can read 0.0 GB there"
        )
    return notes
