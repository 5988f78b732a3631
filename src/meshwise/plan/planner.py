"""Plan: search (:mod:`meshwise.plan.search`), then explain the choice along the decision order of
docs/design.md with the numbers, and warn of the known anti-patterns. Pure Python: never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshwise.cost import pipeline
from meshwise.cost.estimate import DEFAULT_HEADROOM, Estimate, estimate, rank_memories
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, validate
from meshwise.plan.experts import step_experts
from meshwise.plan.search import (  # noqa: F401  (the search's names, re-exported for plan's callers)
    CP_MIN_TOKENS, MAX_MBS, MAX_VPP, RUNNER_UP_POOL, TIE, SearchResult, _divisors, _rank_key, _simplicity,
    break_ties, cp_degrees, enumerate_layouts, pipeline_options, search, simpler_in, tp_degrees)
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec


# ------------------------------------------------------------------------------- explanation
GB = 1e9


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB"


@dataclass(frozen=True)
class Plan:
    """What ``meshwise plan`` prints: candidates best first, the explanation, the warnings."""

    candidates: tuple[Estimate, ...]
    explanation: tuple[str, ...]
    warnings: tuple[str, ...]
    enumerated: int
    fitting: int
    why_nothing_fits: tuple[str, ...] = ()  # when the search found none: why, then what would fit

    @property
    def nothing_fits(self) -> bool:
        """No candidate fits: ``meshwise plan`` exits with errors.NOTHING_FITS (not 0, not 2)."""
        return not any(e.fits for e in self.candidates)

    def as_json(self) -> dict:
        status = "fits" if not self.nothing_fits else "nothing fits" if not self.candidates else "does not fit"
        out = {"status": status, "candidates": [e.as_json() for e in self.candidates],
               "explanation": list(self.explanation), "warnings": list(self.warnings), "enumerated": self.enumerated,
               "fitting": self.fitting}
        if self.why_nothing_fits:
            out["why_nothing_fits"] = {"reason": self.why_nothing_fits[0], "what_would": list(self.why_nothing_fits[1:])}
        return out


def _one_device(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, ac: str):
    layout = Layout(ac=ac)
    return max(rank_memories(model, cluster, replace(train, global_batch=1), layout), key=lambda m: m.total)


def _precision_note(train: TrainSpec) -> str:
    return (f"{train.state_bytes_per_param} B/param ({train.precision}: {train.weight_bytes} weights + "
            f"{train.grad_bytes} grads + {train.optimizer_bytes} {train.optimizer} states)")


def explain(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, best: list[Estimate],
            headroom: float = DEFAULT_HEADROOM) -> list[str]:
    """Walk the decision order of docs/design.md with the numbers, then compare the winner to the runner-up."""
    usable = cluster.accelerator.memory_bytes * (1 - headroom)
    one = _one_device(model, cluster, train, "none")
    lines = [_step_one_device(model, cluster, train, one, usable, headroom)]
    if one.total > usable:
        lines += _steps_capacity(model, cluster, train, one, usable)
    if best and one.total > usable:
        lines += _step_context(model, cluster, train, best[0], usable)
    if best:
        lines += _steps_shape(model, cluster, train, best[0])
        if model.moe and not model.states_only:
            lines.append(step_experts(model, cluster, train, best[0], usable))
        lines.append(_why_winner(best))
    return lines


def _step_one_device(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, one, usable: float,
                     headroom: float) -> str:
    """Step 1: do the model states (+ activations at micro-batch 1) fit on one device?"""
    accel = cluster.accelerator
    states = model.params * train.state_bytes_per_param
    cap = f"one {accel.name} holds {_gb(accel.memory_bytes)} ({_gb(usable)} usable with {headroom:.0%} headroom)"
    act = "" if model.states_only else f" + activations at micro-batch 1 {_gb(one.activations + one.other)}"
    return (f"1. One device? Model states {model.params / 1e9:,.3g}B params x {_precision_note(train)} = "
            f"{_gb(states)}{act}; {cap} -> " +
            ("fits: data parallelism (DDP) is the simplest answer; global batch = mbs x accum x dp."
             if one.total <= usable else "does not fit: plain DDP cannot run this model."))


def _steps_capacity(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, one, usable: float) -> list[str]:
    """Steps 2 and 3, when one device is not enough: shard the states; is one layer too large?"""
    n = cluster.world_size
    sharded = model.params * train.state_bytes_per_param / n
    verdict = "fits" if sharded <= usable else "does not fit"
    line = (f"2. Replicated states? Sharding them over all {n} device(s) (ZeRO-3/FSDP) leaves "
            f"{_gb(sharded)} of states per device -> {verdict}" +
            (": ZeRO/FSDP addresses the capacity wall." if sharded <= usable else "."))
    if sharded <= usable and not model.states_only and sharded + one.activations + one.other > usable:
        full = _one_device(model, cluster, train, "full")
        line += (f" But the activations ({_gb(one.activations + one.other)} at micro-batch 1) do not fit beside "
                 f"them: checkpointing (full: {_gb(full.activations + full.other)}) or TP+SP, which splits them, is needed too.")
    if model.states_only:
        return [line, "3. One layer too large? Unknown for a bare parameter count: give --model for the "
                      "shape-aware answer (TP, PP and activations)."]
    layer_states = model.layer_params * train.state_bytes_per_param
    layer_act = one.activations / max(model.layers, 1)
    large = layer_states + layer_act > usable
    return [line, f"3. One layer too large? A block holds {model.layer_params / 1e6:,.0f}M params "
                  f"({_gb(layer_states)} of states) and {_gb(layer_act)} of activations at micro-batch 1 -> " +
                  ("too large for one device: tensor parallelism must split its matrices inside a node."
                   if large else "a layer fits; TP is needed only if sharded states plus activations still overflow.")]


def _step_context(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate,
                  usable: float) -> list[str]:
    """Step 3b: is one sequence too long for one rank's activations? The least a rank can keep
    without context parallelism: full recompute, TP + SP across a node (cost/context.py for cp)."""
    if model.states_only:
        return []
    t = max((d for d in tp_degrees(model, cluster.gpus_per_node)), default=1)
    least = Layout(tp=t, sp=t > 1, ac="full")
    mem = max(rank_memories(model, cluster, replace(train, global_batch=1), least), key=lambda m: m.total)
    acts = mem.activations + mem.other
    win = winner.layout
    head = (f"3b. Sequence too long? {train.seq_len:,} tokens keep {_gb(acts)} of activations per rank even with "
            f"TP={t}{'+SP' if t > 1 else ''} and full recompute")
    if acts + mem.states / (cluster.world_size // t) > usable:
        tail = (f" -> too long for one rank's activations: context parallelism cp={win.cp} splits the sequence "
                f"({train.seq_len // win.cp:,} tokens per rank, {_gb(winner.memory.activations)} of activations)."
                if win.cp > 1 else " -> too long for one rank's activations, and no cp degree fits it either.")
    elif win.cp > 1:
        tail = f" -> a sequence fits one rank; cp={win.cp} is chosen for speed (less recompute or TP), not for memory."
    else:
        return []  # short enough: nothing to say
    return [head + tail]


def _steps_shape(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, winner: Estimate) -> list[str]:
    """Steps 4 and 5 for the chosen layout: the pipeline's depth and bubble; placement across nodes."""
    win, lines = winner.layout, []
    if win.pp > 1:
        m = win.accum(train.global_batch)
        lines.append(f"4. Depth: {model.layers} layers in {win.pp} stages x {win.vpp} chunk(s), {m} micro-batches "
                     f"per step -> bubble {winner.time.bubble_s / winner.time.step_s:.1%} of the step ({win.schedule}).")
    elif not model.states_only:
        lines.append(f"4. Depth: no pipeline needed; {model.layers} layers stay on every rank.")
    if cluster.nodes > 1:
        tp_span = "inside a node (NVLink)" if win.tp <= cluster.gpus_per_node else "ACROSS nodes"
        lines.append(f"5. {cluster.nodes} nodes x {cluster.gpus_per_node}: TP={win.tp} {tp_span}, PP={win.pp} next, "
                     f"DP={win.dp} outermost over the scale-out link.")
    return lines


def _kind(layout: Layout) -> tuple:
    """What makes two layouts different in kind, not just in shard size or micro-batch size."""
    return (layout.tp, layout.cp, layout.pp, layout.zero, layout.ac, layout.schedule, layout.ep)


def _why_winner(best: list[Estimate]) -> str:
    w = best[0]
    head = (f"Chosen: {w.layout.short()} - {w.time.step_s:.3g} s/step, {w.tokens_per_s:,.0f} tokens/s, "
            f"MFU {w.mfu:.1%}, {_gb(w.memory.total)} on the largest rank.")
    if len(best) < 2:
        return head + " It is the only layout that fits."
    r = next((e for e in best[1:] if _kind(e.layout) != _kind(w.layout)), best[1])
    parts = {"compute": r.time.compute_s - w.time.compute_s,
             "exposed communication": r.time.comm_exposed_s - w.time.comm_exposed_s,
             "pipeline bubble": r.time.bubble_s - w.time.bubble_s,
             "optimizer step": r.time.optimizer_s - w.time.optimizer_s}
    reason, delta = max(parts.items(), key=lambda kv: kv[1])
    slower = r.time.step_s / w.time.step_s - 1
    if slower < TIE:
        simpler = simpler_in(w.layout, r.layout)  # only what actually differs between the two
        needs = ([f"less machinery: {simpler}"] if simpler else []) + \
            ([f"less memory ({_gb(w.memory.total)}, not {_gb(r.memory.total)})"] if w.memory.total < r.memory.total else [])
        return head + (f" Runner-up {r.layout.short()} is within {TIE:.0%} ({slower:+.1%}): a tie within the time "
                       f"model's accuracy; the chosen one needs {' and '.join(needs) or 'no more'}.")
    return head + (f" Runner-up of another kind, {r.layout.short()}, is {slower:.1%} slower: its {reason} costs "
                   f"{delta:.3g} s more per step (the binding constraint).")


def warnings_for(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, e: Estimate | None) -> list[str]:
    """The anti-patterns of docs/design.md, for the chosen (or evaluated) layout."""
    out: list[str] = []
    tokens = train.tokens_per_step
    if tokens > 16 * 2**20:
        out.append(f"Global batch of {tokens / 2**20:,.1f}M tokens per step is past what optimisation usually "
                   "tolerates (Llama 3 405B ramped to 16M); a larger batch buys throughput, not convergence.")
    if e is None:
        return out
    lay = e.layout
    if lay.tp > cluster.gpus_per_node:
        out.append(f"TP={lay.tp} spans nodes of {cluster.gpus_per_node}: every block's collectives cross the "
                   "scale-out link; keep TP inside a node.")
    if e.time.comm_exposed_s > 0.3 * e.time.step_s:
        out.append(f"Exposed communication is {e.time.comm_exposed_s / e.time.step_s:.0%} of the step: adding devices "
                   "will not scale linearly.")
    if lay.pp > 1:
        m = lay.accum(train.global_batch)
        if m < 4 * lay.pp or e.time.bubble_s > 0.2 * e.time.step_s:
            out.append(f"PP={lay.pp} with only {m} micro-batches per step: the bubble is "
                       f"{e.time.bubble_s / e.time.step_s:.0%} of the step; aim for at least {4 * lay.pp}. "
                       f"What would remove it: {pipeline.bubble_remedy(lay.schedule, lay.pp, lay.vpp, m, model.layers)}.")
    if cluster.nodes > 1:
        out.append(f"{cluster.nodes}-node run: set a checkpoint interval (meshwise train --checkpoint-every) so a "
                   "failure costs minutes, not the run.")
    return out


def what_would_fit(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, headroom: float) -> list[str]:
    """When nothing fits: fewer bytes per parameter, more devices, a shorter sequence."""
    out: list[str] = []
    if train.state_bytes_per_param > 12 and train.precision != "bf16":
        lighter = replace(train, precision="bf16")
        r = search(model, cluster, lighter, 1, headroom)
        out.append(f"Fewer bytes per parameter: with --precision bf16 (12 B/param) " +
                   (f"{r.best[0].layout.short()} fits." if r.best else "it still does not fit."))
    else:
        weights = model.params * train.weight_bytes / cluster.world_size
        out.append(f"Fewer bytes per parameter: {train.state_bytes_per_param} B/param is already the leanest "
                   f"convention; the weights alone take {_gb(weights)} per device"
                   + (" - more than fits, so only more devices help." if weights > cluster.accelerator.memory_bytes * (1 - headroom) else "."))
    node = max(cluster.gpus_per_node, 8)
    for k in range(1, 15):
        more = cluster.world_size * 2**k
        per_node = min(node, more)
        bigger = ClusterSpec(cluster.accelerator, per_node, more // per_node, cluster.intra, cluster.inter)
        gb = max(train.global_batch, more)
        r = search(model, bigger, replace(train, global_batch=gb), 1, headroom)
        if r.best:
            batch = f", global batch {gb}" if gb != train.global_batch else ""
            out.append(f"More devices: {more} x {cluster.accelerator.name} fit with {r.best[0].layout.short()}"
                       f" ({_gb(r.best[0].memory.total)} on the largest rank{batch}).")
            break
    else:
        out.append("More devices: not even 2^14 times as many would fit it.")
    if not model.states_only:
        seq = train.seq_len // 2
        while seq >= 128:
            r = search(model, cluster, replace(train, seq_len=seq), 1, headroom)
            if r.best:
                out.append(f"A shorter sequence: --seq-len {seq} fits with {r.best[0].layout.short()}.")
                break
            seq //= 2
    return out


def plan(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
         headroom: float = DEFAULT_HEADROOM, layout: Layout | None = None) -> Plan:
    """Search (or evaluate ``layout`` alone), explain and warn."""
    if layout is not None:
        validate(layout, model, cluster.world_size, train.global_batch)
        e = estimate(model, cluster, train, layout, headroom)
        result = search(model, cluster, train, 2, headroom)
        lines = explain(model, cluster, train, result.pool, headroom)
        verdict = "fits" if e.fits else "does NOT fit"
        lines.append(f"Evaluated: {layout.short()} {verdict} ({_gb(e.memory.total)} on the largest rank), "
                     f"{e.time.step_s:.3g} s/step, {e.tokens_per_s:,.0f} tokens/s, MFU {e.mfu:.1%}" +
                     (f"; the best layout is {(result.best[0].tokens_per_s / e.tokens_per_s - 1):.1%} faster."
                      if result.best and e.fits and result.best[0].layout != layout else "."))
        return Plan((e,), tuple(lines), tuple(warnings_for(model, cluster, train, e)), result.enumerated, result.fitting)
    result = search(model, cluster, train, top, headroom)
    lines = explain(model, cluster, train, result.pool, headroom)
    if not result.best:
        if result.enumerated == 0:
            raise MeshwiseError(f"--global-batch: {train.global_batch} leaves no valid layout on {cluster.world_size} "
                                f"devices; use a multiple of the data-parallel degree (e.g. {cluster.world_size})")
        why = [f"Nothing fits: none of the {result.enumerated:,} layouts of {cluster.world_size} device(s) does.",
               *what_would_fit(model, cluster, train, headroom)]
        lines += [why[0]] + ["What would: " + s for s in why[1:]]
    best = result.best[0] if result.best else None
    return Plan(tuple(result.best), tuple(lines), tuple(warnings_for(model, cluster, train, best)),
                result.enumerated, result.fitting, tuple(why) if not result.best else ())
