"""Enumerate every valid layout, estimate each, drop what does not fit, rank, explain, warn.

Pure Python: never imports torch. The search covers every factorisation world = dp * cp * tp * pp
with tp dividing the heads, KV heads, MLP width and vocabulary, and cp a power of two that leaves
each rank at least ``CP_MIN_TOKENS`` of a sequence divisible by 2 * cp (context parallelism is for
long sequences); ZeRO stages 0-3 with every sharding
group size that divides dp (HSDP when smaller); sp on/off; the four schedules with vpp from 2 to
``MAX_VPP`` for the interleaved ones; micro-batch sizes that are powers of two up to ``MAX_MBS``
and divide the per-replica batch; and the three activation-checkpointing modes.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from meshwise.cost import memory, pipeline
from meshwise.cost.estimate import DEFAULT_HEADROOM, Estimate, estimate, lower_bound_step_s, rank_memories
from meshwise.errors import MeshwiseError
from meshwise.layout import AC_MODES, Layout, check_microbatches, runs_here, validate
from meshwise.planner_experts import expert_degrees, step_experts
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

MAX_VPP = 8
MAX_MBS = 32
CP_MIN_TOKENS = 8192  # tokens per rank below which the planner tries no context parallelism
RUNNER_UP_POOL = 30  # layouts kept to find the best one of a different kind than the winner


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending: each pair (d, n // d) with d <= sqrt(n), O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def tp_degrees(model: ModelSpec, world: int) -> list[int]:
    if model.states_only:
        return [1]
    return [t for t in _divisors(world)
            if model.heads % t == 0 and model.kv_heads % t == 0 and model.ffn_hidden % t == 0 and model.vocab % t == 0]


def pipeline_options(pp: int, layers: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs for ``pp`` ranks of a model with ``layers`` blocks."""
    if pp == 1:
        return [("1f1b", 1)]
    options = [("gpipe", 1), ("1f1b", 1), ("zero-bubble", 1)]
    if 2 * pp <= layers:
        options.append(("zero-bubble", 2))
    options += [("interleaved-1f1b", v) for v in range(2, MAX_VPP + 1) if pp * v <= layers]
    return options


def cp_degrees(model: ModelSpec, world: int, seq_len: int) -> list[int]:
    """1, and the powers of two cp dividing ``world`` with ``seq_len`` divisible by 2 * cp and at
    least CP_MIN_TOKENS per rank."""
    if model.states_only or not seq_len:
        return [1]
    out, cp = [1], 2
    while world % cp == 0 and seq_len % (2 * cp) == 0 and seq_len // cp >= CP_MIN_TOKENS:
        out.append(cp)
        cp *= 2
    return out


def _structures(model: ModelSpec, world: int, global_batch: int, seq_len: int = 0
                ) -> Iterator[tuple[Layout, list[int]]]:
    """Every layout with mbs=1 and ac=none, with the micro-batch sizes valid for it."""
    layers = model.layers if not model.states_only else 1
    for tp, cp in ((t, c) for t in tp_degrees(model, world) for c in cp_degrees(model, world // t, seq_len)):
        for pp in _divisors(world // (tp * cp)):
            if pp > layers:
                continue
            dp = world // (tp * cp * pp)
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            mbs_options = [b for b in (1, 2, 4, 8, 16, 32) if b <= MAX_MBS and per_replica % b == 0]
            zero_shards = [(0, dp)] if dp == 1 else [(0, dp)] + [(z, s) for z in (1, 2, 3) for s in _divisors(dp) if s > 1]
            for zero, shard in zero_shards:
                for ep in (expert_degrees(model, shard) if cp == 1 else (1,)):  # ep with cp: not yet (layout)
                    for sp in ((False,) if tp == 1 else (True, False)):
                        for schedule, vpp in pipeline_options(pp, layers):
                            yield Layout(dp=dp, zero=zero, shard=shard, cp=cp, tp=tp, sp=sp, pp=pp, vpp=vpp,
                                         schedule=schedule, ep=ep), mbs_options


def _ac_modes(model: ModelSpec) -> tuple[str, ...]:
    return ("none",) if model.states_only else AC_MODES


def _schedule_ok(layout: Layout, m: int) -> bool:
    try:
        check_microbatches(layout, m)
    except MeshwiseError:
        return False
    return True


def enumerate_layouts(model: ModelSpec, world: int, global_batch: int,
                      where: Callable[[Layout], bool] | None = None, seq_len: int = 0) -> Iterator[Layout]:
    """Every valid layout of ``world`` ranks for this model and batch (that ``where`` admits)."""
    for base, mbs_options in _structures(model, world, global_batch, seq_len):
        for ac in _ac_modes(model):
            if where is not None and not where(replace(base, ac=ac)):
                continue
            for mbs in mbs_options:
                if _schedule_ok(base, global_batch // (base.dp * mbs)):
                    yield replace(base, mbs=mbs, ac=ac)


TIE = 0.03  # predicted steps this close to the fastest are a tie within the time model's accuracy


def _simplicity(layout: Layout) -> tuple:
    """Tie-break between equally fast layouts: no recompute and no accumulation first (they buy
    memory, which a fitting layout does not need; fewer micro-batches per step = larger mbs x dp),
    then fewer parallel dimensions and less machinery."""
    return (layout.ac != "none", -layout.mbs * layout.dp, layout.pp > 1, layout.cp > 1, layout.tp > 1, layout.zero,
            layout.replicate > 1, layout.vpp, not layout.sp, layout.ep)


def _rank_key(e: Estimate) -> tuple:
    """Fastest first; among equally fast layouts the simpler one, then the one with less memory."""
    return (round(-e.tokens_per_s, 3), _simplicity(e.layout), round(e.memory.total))


def break_ties(ranked: list[Estimate], usable_bytes: float) -> list[Estimate]:
    """Reorder the layouts whose predicted step is within ``TIE`` of the fastest one.

    While the fastest leaves at least half the usable memory free, memory is not short: the tie
    goes to less machinery (:func:`_simplicity`). Otherwise the tie goes to the least memory.
    """
    if not ranked:
        return ranked
    fastest = ranked[0].time.step_s
    band = [e for e in ranked if e.time.step_s <= fastest * (1 + TIE)]
    rest = ranked[len(band):]
    if ranked[0].memory.total <= 0.5 * usable_bytes:
        band.sort(key=lambda e: (_simplicity(e.layout), e.time.step_s))
    else:
        band.sort(key=lambda e: (round(e.memory.total), e.time.step_s))
    return band + rest


@dataclass
class SearchResult:
    """The best ``top`` fitting layouts, and how many were enumerated and fitted."""

    best: list[Estimate] = field(default_factory=list)
    pool: list[Estimate] = field(default_factory=list)  # the best RUNNER_UP_POOL, for the explanation
    enumerated: int = 0
    fitting: int = 0


def search(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
           headroom: float = DEFAULT_HEADROOM, where: Callable[[Layout], bool] | None = None) -> SearchResult:
    """Exhaustive search with two exact prunings: a layout whose memory exceeds the device is never
    timed, and one whose compute + bubble alone is slower than the current ``top``-th best is not
    estimated further. ``where`` restricts the search (it sees each layout with mbs=1); by default,
    for meshwise's own runtime, to what that runtime runs (:func:`meshwise.layout.runs_here`).
    """
    if where is None and train.runtime == "meshwise" and not model.states_only:
        where = runs_here(model, train.seq_len)

    keep = max(top, RUNNER_UP_POOL)
    result = SearchResult()
    usable = cluster.accelerator.memory_bytes * (1 - headroom)
    bounds: dict[tuple, float] = {}
    keys: list[tuple] = []  # _rank_key of result.best, in order
    peaks = memory.PeakCache(model, train)
    for base, all_mbs in _structures(model, cluster.world_size, train.global_batch, train.seq_len):
        mbs_options = [b for b in all_mbs if _schedule_ok(base, train.global_batch // (base.dp * b))]
        acs = [ac for ac in _ac_modes(model) if where is None or where(replace(base, ac=ac))]
        if not acs:
            continue
        result.enumerated += len(acs) * len(mbs_options)
        shapes = memory.rank_shapes(model, base)
        # weights + optimizer states never shrink below the convention's: a lower bound for the structure
        floor = [(lambda w, g, o: w + o)(*memory.states(sh.params, train, base, sh.expert_params)) for sh in shapes]
        if max(floor) > usable:
            continue
        for ac in acs:
            overflowed = False
            for mbs in mbs_options:
                m = train.global_batch // (base.dp * mbs)
                # Memory grows with mbs while earlier micro-batches leave gradients (m > 1); with a
                # single micro-batch there are none at the forward's end, so that one is tried anyway.
                if overflowed and m > 1:
                    continue
                layout = Layout(base.dp, base.zero, base.shard, base.cp, base.tp, base.sp, base.pp, base.vpp,
                                base.schedule, mbs, ac, base.ep)
                total = max(peaks.total(layout, sh, m) for sh in shapes)
                if total > usable:
                    overflowed = True
                    continue
                result.fitting += 1
                key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, mbs, ac, layout.ep)
                bound = bounds.get(key)
                if bound is None:
                    bound = bounds[key] = lower_bound_step_s(model, cluster, train, layout)
                if len(result.best) >= keep and bound > result.best[-1].time.step_s:
                    continue
                e = estimate(model, cluster, train, layout, headroom)
                key_e = _rank_key(e)
                at = bisect.bisect_right(keys, key_e)
                if at < keep:
                    keys.insert(at, key_e)
                    result.best.insert(at, e)
                    del keys[keep:], result.best[keep:]
    result.best = break_ties(result.best, usable)
    result.pool = result.best[:]
    del result.best[top:]
    return result


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

    def as_json(self) -> dict:
        return {"candidates": [e.as_json() for e in self.candidates], "explanation": list(self.explanation),
                "warnings": list(self.warnings), "enumerated": self.enumerated, "fitting": self.fitting}


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
        needs = [what for what, less in (("less machinery (no recompute, fewer micro-batches first)",
                                          _simplicity(w.layout) < _simplicity(r.layout)),
                                         ("less memory", w.memory.total < r.memory.total)) if less]
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
        lines.append(f"Nothing fits: none of the {result.enumerated:,} layouts of {cluster.world_size} device(s) does.")
        lines += ["What would: " + s for s in what_would_fit(model, cluster, train, headroom)]
    best = result.best[0] if result.best else None
    return Plan(tuple(result.best), tuple(lines), tuple(warnings_for(model, cluster, train, best)),
                result.enumerated, result.fitting)
