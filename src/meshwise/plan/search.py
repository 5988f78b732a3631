"""The search: enumerate every valid layout, estimate each, drop what does not fit, rank.

Pure Python: never imports torch. The search covers every factorisation world = dp * cp * tp * pp
with tp dividing the heads, KV heads, MLP width and vocabulary, and cp a power of two that leaves
each rank at least ``CP_MIN_TOKENS`` of a sequence divisible by 2 * cp (context parallelism is for
long sequences); ZeRO stages 0-3 with every sharding group size that divides dp (HSDP when
smaller), and ep over the sharding group times cp for mixture-of-experts models; sp on/off; the four
schedules with vpp from 2 to ``MAX_VPP`` for the interleaved ones; micro-batch sizes that are
powers of two up to ``MAX_MBS`` and divide the per-replica batch; and the three
activation-checkpointing modes. Ties go to less machinery (:func:`break_ties`).
"""

from __future__ import annotations

import bisect
import gc
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

from meshwise.cost import memory
from meshwise.cost.memory import RankShape, _candidates
from meshwise.cost.context import local_train
from meshwise.cost.peak_cache import PeakCache
from meshwise.cost.estimate import (DEFAULT_HEADROOM, Estimate, estimate, lower_bound_experts_s, lower_bound_step_s,
                                    optimizer_seconds)
from meshwise.errors import MeshwiseError
from meshwise.layout import AC_MODES, Layout, check_microbatches, runs_here
from meshwise.plan.experts import expert_degrees
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec

_RUNS_HERE_FIELDS = ("pp", "schedule", "ac", "cp", "sp", "tp")  # what layout.runs_here's answer reads
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
    for dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options in _structure_fields(model, world, global_batch,
                                                                                           seq_len):
        yield _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep), mbs_options


def _structure_fields(model: ModelSpec, world: int, global_batch: int, seq_len: int = 0) -> Iterator[tuple]:
    """:func:`_structures` as (dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs options): the
    search builds a layout only for the structures that its cached answers do not already refuse."""
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
            schedules = pipeline_options(pp, layers)
            sps = (False,) if tp == 1 else (True, False)
            eps = {shard: expert_degrees(model, shard * cp) for shard in {s for _, s in zero_shards}}
            for zero, shard in zero_shards:
                for ep in eps[shard]:  # carved from dp_shard x cp (layout.expert_mesh_shape)
                    for sp in sps:
                        for schedule, vpp in schedules:
                            yield dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options


def _layout(dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int, schedule: str, mbs: int,
            ac: str, ep: int) -> Layout:
    """``Layout(dp=dp, ...)`` built as :func:`_from_fields` does (the fields in their declared order)."""
    return _from_fields({"dp": dp, "zero": zero, "shard": shard, "cp": cp, "tp": tp, "sp": sp, "pp": pp, "vpp": vpp,
                         "schedule": schedule, "mbs": mbs, "ac": ac, "ep": ep})


def _from_fields(fields: dict) -> Layout:
    """A Layout holding ``fields``, equal to ``Layout(**fields)``, without the frozen ``__init__``'s
    setattr per field (Layout has no ``__post_init__``): ``dataclasses.replace``, and even the frozen
    ``__init__``, is several times slower, and the search builds tens of thousands."""
    new = object.__new__(Layout)
    object.__setattr__(new, "__dict__", fields)
    return new


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
            if where is not None and not where(_with(base, base.mbs, ac)):
                continue
            for mbs in mbs_options:
                if _schedule_ok(base, global_batch // (base.dp * mbs)):
                    yield _with(base, mbs, ac)


TIE = 0.03  # predicted steps this close to the fastest are a tie within the time model's accuracy
SHORT = 0.05  # memory is short when the fastest layout leaves less than this fraction of usable memory free


def _simplicity(layout: Layout) -> tuple:
    """Tie-break between equally fast layouts: no recompute and no accumulation first (they buy
    memory, which a fitting layout does not need; fewer micro-batches per step = larger mbs x dp),
    then fewer parallel dimensions and less machinery."""
    return (layout.ac != "none", -layout.mbs * layout.dp, layout.pp > 1, layout.cp > 1, layout.tp > 1, layout.zero,
            layout.replicate > 1, layout.vpp, not layout.sp, layout.ep)


def _simplicity_words(w: Layout, r: Layout, global_batch: int | None = None) -> tuple[str, ...]:
    """How ``w`` reads at each place of :func:`_simplicity` where it is simpler than ``r``."""
    fewer = (f"fewer micro-batches per step ({w.accum(global_batch)} per replica, not {r.accum(global_batch)})"
             if global_batch else f"fewer micro-batches per step (larger mbs x dp: {w.mbs * w.dp} sequences at once, "
                                  f"not {r.mbs * r.dp})")
    return ("no recompute" if w.ac == "none" else f"lighter recompute (ac={w.ac}, not {r.ac})", fewer,
            "no pipeline", "no context parallelism", "no tensor parallelism",
            f"a lower ZeRO stage ({w.zero}, not {r.zero})", "no HSDP replication",
            f"fewer chunks per pipeline rank (vpp={w.vpp}, not {r.vpp})", "sequence parallelism on",
            f"less expert parallelism (ep={w.ep}, not {r.ep})")


def simpler_in(w: Layout, r: Layout, global_batch: int | None = None) -> str | None:
    """What decides :func:`_simplicity` between ``w`` and ``r`` (its first place where they differ),
    in words, when ``w`` is the simpler; None when it is not (or they are alike). With the global
    batch, micro-batches are counted per replica."""
    for a, b, words in zip(_simplicity(w), _simplicity(r), _simplicity_words(w, r, global_batch)):
        if a != b:
            return words if a < b else None
    return None


def _rank_key(e: Estimate) -> tuple:
    """Fastest first; among equally fast layouts the simpler one, then the one with less memory."""
    return (round(-e.tokens_per_s, 3), _simplicity(e.layout), round(e.memory.total))


def break_ties(ranked: list[Estimate], usable_bytes: float) -> list[Estimate]:
    """Reorder the layouts whose predicted step is within ``TIE`` of the fastest one.

    Every layout ranked here fits with the headroom, so memory is not short and the tie goes to
    less machinery (:func:`_simplicity`: no recompute, no accumulation...), unless the fastest is
    within ``SHORT`` of the usable memory: then the tie goes to the least memory.
    """
    if not ranked:
        return ranked
    fastest = ranked[0].time.step_s
    band = [e for e in ranked if e.time.step_s <= fastest * (1 + TIE)]
    rest = ranked[len(band):]
    if ranked[0].memory.total <= (1 - SHORT) * usable_bytes:
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


def _with(base: Layout, mbs: int, ac: str) -> Layout:
    """``base`` with another mbs and ac (:func:`_from_fields`)."""
    fields = base.__dict__.copy()
    fields["mbs"], fields["ac"] = mbs, ac
    return _from_fields(fields)


def _static_entry(shape: RankShape, static: tuple | None, layout: Layout, train: TrainSpec) -> tuple:
    """(shape, its static parts, and of memory.candidates_floor's two sums the static halves: the
    forward's end's and the backward's start's weights + 0.0 + optimizer, the fixed buffers, and
    under the interleaved runtime the static part of memory.interleaved_ceiling, else None)."""
    if static is None:  # a bare parameter count: no floor of that form
        return shape, static, 0.0, 0.0, 0.0, None
    w_fwd, w_bwd, o, _, _, fixed_other, *_ = static
    ceiling = memory.interleaved_ceiling(train, layout, shape, static) if memory.interleaved(layout) else None
    return shape, static, w_fwd + 0.0 + o, w_bwd + 0.0 + o, fixed_other, ceiling


def search(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
           headroom: float = DEFAULT_HEADROOM, where: Callable[[Layout], bool] | None = None) -> SearchResult:
    """Exhaustive search with two exact prunings: a layout whose memory exceeds the device is never
    timed, and, the fitting ones taken fastest lower bound first, one whose compute + bubble alone
    is slower than the worst of the best ``max(top, RUNNER_UP_POOL)`` ends the search. ``where`` restricts the search (it sees each layout with mbs=1); by default,
    for meshwise's own runtime, to what that runtime runs (:func:`meshwise.layout.runs_here`).

    The cyclic garbage collector is paused while it runs: the search allocates hundreds of thousands
    of small tuples, dicts and layouts that reference counting frees (the only cycles are its own
    nested functions, collected once it is resumed), and the collector's passes over them took
    about 7% of a Mixtral 8x22B plan.
    """
    resume = gc.isenabled()
    gc.disable()
    try:
        return _search(model, cluster, train, top, headroom, where)
    finally:
        if resume:
            gc.enable()


def _search(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int,
            headroom: float, where: Callable[[Layout], bool] | None) -> SearchResult:
    if where is None and train.runtime == "meshwise" and not model.states_only:
        where = runs_here(model, train.seq_len)

    keep = max(top, RUNNER_UP_POOL)
    result = SearchResult()
    capacity = cluster.accelerator.memory_bytes
    usable = capacity * (1 - headroom)
    bounds: dict[tuple, float] = {}
    optimizers: dict[tuple, float] = {}
    keys: list[tuple] = []  # (_rank_key, enumeration index) of result.best, in order
    fitting: list[tuple[float, int, Layout, tuple]] = []  # (lower bound of the step, enumeration index, layout, its rank shapes)
    peaks = PeakCache(model, train)
    states_only = model.states_only
    # The micro-batch sizes and checkpointing modes of a structure depend only on these fields (the
    # default filter, runs_here, reads no others), so each is worked out once; a custom ``where``
    # may read any field and is asked for every structure.
    options: dict[tuple, tuple[list[int], list[str]]] = {}
    shared_where = where is None or getattr(where, "reads", None) == _RUNS_HERE_FIELDS
    # Whether any mbs or ac of a structure fits: the floor reads only these fields (the rank shapes
    # come from tp, pp, vpp and the V schedule; cost/peak_cache.py), not sp nor the schedule otherwise.
    floor_fits: dict[tuple, bool | tuple] = {}  # False, or (rank shapes, [_static_entry of each])
    widest_fits: dict[tuple, bool] = {}
    local_trains: dict[int, TrainSpec] = {}  # context.local_train by cp
    rank_shapes: dict[tuple, tuple[RankShape, ...]] = {}
    widest_found: dict[tuple, list] = {}  # structure_fits of a whole-dp sharding group, by the rest
    sp_on_empty: dict[tuple, tuple] = {}  # the options of SP-on structures where nothing fits
    # (ep, the (ac, mbs) that fit) of a structure's last ep > 1, by the structure less ep
    fewer_experts_fit: dict[tuple, tuple[int, frozenset]] = {}
    # estimate._stage_of's cache, shared by the bounds and the estimates (with compute_seconds' answers)
    stages: dict[tuple, tuple | float] = {}
    narrower_fit: dict[tuple, frozenset] = {}  # (ac, mbs) that fit a narrower sharding group, by the rest  # memory.rank_shapes by what it reads, without hashing the model

    def shapes_of(layout: Layout) -> tuple[RankShape, ...]:
        key = (layout.tp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2)
        shapes = rank_shapes.get(key)
        if shapes is None:
            shapes = rank_shapes[key] = memory.rank_shapes(model, layout)
        return shapes

    def structure_fits(dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int,
                       schedule: str, ep: int, mbs_options: list[int], acs: list[str], known: frozenset = frozenset(),
                       possible: frozenset | None = None) -> list[tuple[Layout, int, tuple[RankShape, ...]]]:
        """The layouts of one structure that fit, as (layout, mbs, its rank shapes), in the order of
        the mbs and ac loop; the (ac, mbs) in ``known`` fit without being worked out (they fit a
        narrower sharding group of the same structure), and so do those that fit the same structure
        with a smaller ep > 1; those not in ``possible`` (when given: what fits the whole dp group) do not."""
        ekey = (dp, zero, shard, cp, tp, sp, pp, vpp, schedule) if ep > 1 else None
        if ekey is not None:
            # what fits with fewer experts per rank (a smaller ep > 1) fits here: a rank's states only
            # shrink as ep grows, and its per-micro-batch parts read ep only as ep > 1
            narrower_ep = fewer_experts_fit.get(ekey)
            if narrower_ep is not None and narrower_ep[0] < ep:
                known = known | narrower_ep[1]
        found = structure_fits_at(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs, known, possible)
        if ekey is not None:  # the eps of a structure come in ascending order (_structure_fields)
            fewer_experts_fit[ekey] = (ep, frozenset((lay.ac, mbs) for lay, mbs, _ in found))
        return found

    def structure_fits_at(dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int,
                          schedule: str, ep: int, mbs_options: list[int], acs: list[str], known: frozenset,
                          possible: frozenset | None) -> list[tuple[Layout, int, tuple[RankShape, ...]]]:
        found: list[tuple[Layout, int, tuple[RankShape, ...]]] = []
        fkey = (dp, cp, zero, shard, tp, pp, vpp, schedule == "zero-bubble" and vpp == 2, ep)
        fit = floor_fits.get(fkey)
        if fit is False:  # known to fit at no mbs or ac (most structures): no layout built
            return found
        base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
        if fit is None:
            if zero and 1 < shard < dp:
                # the floor only shrinks as the sharding group grows (every term is divided by it or
                # does not read it, for shard > 1): if the whole dp group's fails, this one does too
                widest = fkey[:3] + (dp,) + fkey[4:]
                if widest not in widest_fits:
                    whole = _layout(dp, zero, dp, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
                    widest_fits[widest] = all(peaks.floor(whole, sh) <= usable for sh in shapes_of(whole))
                if not widest_fits[widest]:
                    fit = floor_fits[fkey] = False
            if fit is None:
                shapes = shapes_of(base)
                fit = all(peaks.floor(base, sh) <= usable for sh in shapes)  # max(...) <= usable
                # what the mbs and ac loop reads of the rank shapes, shared by the structures of this key
                floor_fits[fkey] = fit = fit and (shapes, [_static_entry(sh, peaks.static_of(base, sh), base, train)
                                                           for sh in shapes])
        if not fit:  # no mbs or ac fits this structure
            return found
        shapes, statics = fit
        lt = local_trains.get(base.cp)
        if lt is None:
            lt = local_trains[base.cp] = local_train(train, base)
        table = peaks.table_of(base)
        # where the interleaved runtime reduces each chunk's gradients after its last backward, fewer
        # micro-batches (a larger mbs) can hold fewer chunks' gradients at once: no shortcut there
        monotone = not memory.frees_gradients(base)
        for ac in acs:
            overflowed = False
            for mbs in mbs_options:
                m = train.global_batch // (base.dp * mbs)
                # Memory grows with mbs while earlier micro-batches leave gradients (m > 1); with a
                # single micro-batch there are none at the forward's end, so that one is tried anyway.
                if overflowed and m > 1 and monotone:
                    continue
                if (ac, mbs) in known:
                    layout, fits = None, True
                elif possible is not None and (ac, mbs) not in possible:
                    layout, fits = None, False
                elif states_only:
                    layout = _with(base, mbs, ac)
                    fits = all(peaks.fits(layout, sh, m, st, lt, usable, table) for sh, st, *_ in statics)
                else:  # PeakCache.fits, inlined: most tries are refused before a layout is built
                    layout, fits, per_mbs = None, True, []
                    # every rank's floor first (memory.candidates_floor, inlined: the static half of
                    # each sum is added up in advance, in the same order), then the full peaks
                    for sh, st, fwd_static, bwd_static, fixed_other, ceiling in statics:
                        per_mb = table.get((ac, mbs, sh.pp_rank))
                        if per_mb is None:
                            layout = layout or _with(base, mbs, ac)
                            per_mb = table[ac, mbs, sh.pp_rank] = peaks.per_micro_batch(layout, sh, m, lt)
                        if fwd_static + per_mb[0] + fixed_other > usable or bwd_static + per_mb[1] + fixed_other > usable:
                            fits = False
                            break
                        # under the interleaved runtime, a rank below its ceiling fits without its moments
                        if ceiling is not None and ceiling + max(per_mb[0], per_mb[1], per_mb[2], per_mb[4]) <= usable:
                            continue
                        per_mbs.append((sh, st, per_mb))
                    if fits:
                        layout = layout or _with(base, mbs, ac)
                        for sh, st, per_mb in per_mbs:
                            if max(map(sum, _candidates(lt, layout, sh, m, st, per_mb))) > usable:  # total_from
                                fits = False
                                break
                if not fits:
                    overflowed = True
                    continue
                found.append((layout or _with(base, mbs, ac), mbs, shapes))
        return found

    for dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, all_mbs in _structure_fields(
            model, cluster.world_size, train.global_batch, train.seq_len):
        base = None  # the structure's layout (mbs=1, ac=none), built once something needs it
        okey = (dp, cp, tp, sp, pp, schedule)
        opts = options.get(okey) if shared_where else None
        if opts is None:
            base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
            mbs_options = [b for b in all_mbs if _schedule_ok(base, train.global_batch // (dp * b))]
            acs = [ac for ac in _ac_modes(model) if where is None or where(_with(base, base.mbs, ac))]
            opts = options[okey] = (mbs_options, acs)
        mbs_options, acs = opts
        if not acs:
            continue
        result.enumerated += len(acs) * len(mbs_options)
        # with SP off a rank holds more activations than with it on and nothing less (checked over
        # every layout of 4 cases with no exception): where SP on fits at no mbs or ac, SP off does not
        # (SP on comes first in the enumeration, with the same options where the filter allows it)
        skey = (dp, zero, shard, cp, tp, pp, vpp, schedule, ep) if tp > 1 else None
        if skey is not None and not sp and sp_on_empty.get(skey) == opts:
            continue
        if zero and 1 < shard < dp:
            # whether a layout fits only improves as the sharding group grows (every state is divided
            # by it or does not read it; FSDP2's padded shard, ceil(rows / shard), shrinks too): if no
            # mbs or ac of the whole dp group's structure fits, none of this one's does
            wkey = (dp, cp, zero, tp, sp, pp, vpp, schedule, ep)
            if wkey not in widest_found:
                widest_found[wkey] = structure_fits(dp, zero, dp, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs)
            widest = widest_found[wkey]
            found = widest and structure_fits(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs,
                                              narrower_fit.get(wkey, frozenset()),
                                              frozenset((lay.ac, mbs) for lay, mbs, _ in widest))
            if found:  # ... and what fits this group fits every wider one
                narrower_fit[wkey] = narrower_fit.get(wkey, frozenset()) | {(lay.ac, mbs) for lay, mbs, _ in found}
        elif zero and shard == dp > 1:
            wkey = (dp, cp, zero, tp, sp, pp, vpp, schedule, ep)
            found = widest_found.pop(wkey, None)
            if found is None:
                found = structure_fits(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs)
        else:
            found = structure_fits(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs)
        if not found and sp and skey is not None:
            sp_on_empty[skey] = opts
        for layout, mbs, shapes in found:
            ac = layout.ac
            result.fitting += 1
            # the compute-only bound reads neither ep nor any DP/ZeRO field (dp is fixed by tp, cp, pp)
            key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, mbs, ac, layout.sp)
            bound = bounds.get(key)
            if bound is None:
                bound = bounds[key] = lower_bound_step_s(model, cluster, train, layout, compute_only=True,
                                                         stage_cache=stages)
            fitting.append((bound, len(fitting), layout, shapes))
    # Estimate the fitting layouts in order of their lower bound: once the ``keep`` best are known,
    # the first whose bound is slower than the worst of them ends the search, and one whose tighter
    # bound (every part of the step but the data-parallel collectives) is slower is skipped. Exact ties
    # between rank keys go to the earlier enumerated layout, as if estimated in enumeration order.
    fitting.sort()  # by (bound, enumeration index): the index is unique, so no layout is ever compared
    tight: dict[tuple, float] = {}
    with_experts: dict[tuple, float] = {}  # estimate.lower_bound_experts_s by what it reads
    moe = model.moe and not model.states_only
    for bound, index, layout, shapes in fitting:
        if len(result.best) >= keep:
            worst = result.best[-1].time.step_s
            if bound > worst:
                break
            # the tighter bound's two parts, each cached by the fields it reads (cost/estimate.py)
            okey = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2,
                    layout.ep, layout.zero >= 1, layout.shard, layout.dp > 1)
            opt_s = optimizers.get(okey)
            if opt_s is None:
                opt_s = optimizers[okey] = optimizer_seconds(model, cluster, train, layout, shapes)
            if moe:
                # first a cheaper one, compute + the expert all-to-alls (most tighter bounds of a
                # mixture of experts that refuse a layout refuse it for those)
                key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
                       layout.sp)
                busy = with_experts.get(key)
                if busy is None:
                    busy = with_experts[key] = lower_bound_experts_s(model, cluster, train, layout, stages)
                if busy + opt_s > worst:
                    continue
            key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
                   layout.sp, layout.zero >= 2)
            busy = tight.get(key)
            if busy is None:
                busy = tight[key] = lower_bound_step_s(model, cluster, train, layout, stage_cache=stages)
            if busy + opt_s > worst:
                continue
        e = estimate(model, cluster, train, layout, headroom, stages, peaks.memories(layout, shapes, capacity))
        key_e = (_rank_key(e), index)
        at = bisect.bisect_right(keys, key_e)
        if at < keep:
            keys.insert(at, key_e)
            result.best.insert(at, e)
            del keys[keep:], result.best[keep:]
    result.best = break_ties(result.best, usable)
    result.pool = result.best[:]
    del result.best[top:]
    return result
