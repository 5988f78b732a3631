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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from meshwise.cost import memory
from meshwise.cost.context import local_train
from meshwise.cost.memory import RankShape
from meshwise.cost.cache import PlanCache, plan_cache
from meshwise.cost.peak_cache import RankEntry
from meshwise.cost.estimate import (DEFAULT_HEADROOM, Estimate, estimate, lower_bound_experts_s, lower_bound_step_s,
                                    optimizer_seconds)
from meshwise.errors import MeshwiseError
from meshwise.layout import AC_MODES, Layout, check_microbatches, layout_from_fields, runs_here
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


def cp_degrees(model: ModelSpec, world: int, seq_len: int, bounded: bool = True) -> list[int]:
    """1, and the powers of two cp dividing ``world`` with ``seq_len`` divisible by 2 * cp (the runtime's
    zig-zag split) and, when ``bounded``, at least CP_MIN_TOKENS per rank. The bound is a preference,
    not a validity rule: unbounded, this is every cp a layout may have."""
    if model.states_only or not seq_len:
        return [1]
    out, cp = [1], 2
    while world % cp == 0 and seq_len % (2 * cp) == 0 and (not bounded or seq_len // cp >= CP_MIN_TOKENS):
        out.append(cp)
        cp *= 2
    return out


def _cp_choices(model: ModelSpec, world: int, seq_len: int, bounded: bool) -> list[int]:
    """The cp degrees of one pass of the enumeration: within CP_MIN_TOKENS (``bounded``), or only
    those past it (the second pass, tried when the first has no valid layout)."""
    within = cp_degrees(model, world, seq_len)
    return within if bounded else [c for c in cp_degrees(model, world, seq_len, bounded=False) if c not in within]


def _structures(model: ModelSpec, world: int, global_batch: int, seq_len: int = 0, cp_bound: bool = True
                ) -> Iterator[tuple[Layout, list[int]]]:
    """Every layout with mbs=1 and ac=none, with the micro-batch sizes valid for it."""
    for dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options in _structure_fields(
            model, world, global_batch, seq_len, cp_bound):
        yield _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep), mbs_options


def _structure_fields(model: ModelSpec, world: int, global_batch: int, seq_len: int = 0,
                      cp_bound: bool = True) -> Iterator[tuple]:
    """:func:`_structures` as (dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs options): the
    search builds a layout only for the structures that its cached answers do not already refuse.
    With ``cp_bound`` False, only the structures whose cp is past CP_MIN_TOKENS (:func:`_cp_choices`):
    the searches enumerate them when the bounded pass holds no valid layout (a batch that dp alone
    cannot divide on many devices), so "no valid layout" means none exists. CP_MIN_TOKENS is the
    enumeration's only bound that is not a validity rule (mbs=1, gpipe and 1f1b are always tried)."""
    layers = model.layers if not model.states_only else 1
    tps = tp_degrees(model, world)
    for tp, cp in ((t, c) for t in tps for c in _cp_choices(model, world // t, seq_len, cp_bound)):
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
    """``Layout(dp=dp, ...)`` through layout.layout_from_fields (the fields in their declared order)."""
    return layout_from_fields({"dp": dp, "zero": zero, "shard": shard, "cp": cp, "tp": tp, "sp": sp, "pp": pp,
                               "vpp": vpp, "schedule": schedule, "mbs": mbs, "ac": ac, "ep": ep})


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
    """Every valid layout of ``world`` ranks for this model and batch (that ``where`` admits), cp within
    CP_MIN_TOKENS; only when there is none, those with a larger cp (:func:`_structure_fields`)."""
    found = False
    for cp_bound in (True, False):
        for base, mbs_options in _structures(model, world, global_batch, seq_len, cp_bound):
            for ac in _ac_modes(model):
                if where is not None and not where(_with(base, base.mbs, ac)):
                    continue
                for mbs in mbs_options:
                    if _schedule_ok(base, global_batch // (base.dp * mbs)):
                        found = True
                        yield _with(base, mbs, ac)
        if found:
            return


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
    """``base`` with another mbs and ac (layout.layout_from_fields)."""
    fields = base.__dict__.copy()
    fields["mbs"], fields["ac"] = mbs, ac
    return layout_from_fields(fields)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one search. The search allocates hundreds of thousands
    of small tuples, dicts and layouts that reference counting frees (it makes no cycles), and the
    collector's passes over them took about 7% of a Mixtral 8x22B plan. The pause is process-wide
    (the collector has no other switch), so it lasts only while the search runs."""
    resume = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if resume:
            gc.enable()


def search(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int = 5,
           headroom: float = DEFAULT_HEADROOM, where: Callable[[Layout], bool] | None = None,
           cache: PlanCache | None = None) -> SearchResult:
    """Exhaustive search with two exact prunings: a layout whose memory exceeds the device is never
    timed, and, the fitting ones taken fastest lower bound first, one whose compute + bubble alone
    is slower than the worst of the best ``max(top, RUNNER_UP_POOL)`` ends the search. ``where``
    restricts the search (it sees each layout with mbs=1); by default, for meshwise's own runtime,
    to what that runtime runs (:func:`meshwise.layout.runs_here`). ``cache``: the plan's caches
    (cost/cache.py), where it serves this model, cluster and setting; else the search makes its own."""
    with _collector_paused():
        if train.runtime == "megatron" and not model.states_only:  # Megatron-Core's memory and MoE folding
            from meshwise.plan.megatron_search import search_megatron
            return search_megatron(model, cluster, train, top, headroom, where)
        return _Search(model, cluster, train, top, headroom, where, plan_cache(model, cluster, train, cache)).run()


_Found = list[tuple[Layout, int, tuple[RankShape, ...]]]  # (layout, mbs, its rank shapes) of one structure


def keep_ranked(best: list[Estimate], keys: list[tuple], e: Estimate, index: int, keep: int) -> None:
    """Insert ``e`` (enumerated ``index``-th) into ``best``, the ``keep`` best so far in order, with
    ``keys`` their (_rank_key, index): exact ties go to the earlier enumerated layout."""
    key_e = (_rank_key(e), index)
    at = bisect.bisect_right(keys, key_e)
    if at < keep:
        keys.insert(at, key_e)
        best.insert(at, e)
        del keys[keep:], best[keep:]


class _Search:
    """One search: its memo tables are the fields, its prunings the methods. Every memo is keyed by a
    plain tuple of the fields its answer reads (cheaper to hash than a spec), so one answer serves
    every layout that shares them. Each pruning below says why it drops nothing that could fit or
    make the top: the result equals the brute force's (tests/unit/test_planner.py holds it)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, top: int, headroom: float,
                 where: Callable[[Layout], bool] | None, cache: PlanCache) -> None:
        if where is None and train.runtime == "meshwise" and not model.states_only:
            where = runs_here(model, train.seq_len)
        self.model, self.cluster, self.train, self.top, self.headroom, self.where = (
            model, cluster, train, top, headroom, where)
        self.keep = max(top, RUNNER_UP_POOL)
        self.capacity = cluster.accelerator.memory_bytes
        self.usable = self.capacity * (1 - headroom)
        self.peaks = cache.peaks  # the memory's parts
        self.result = SearchResult()
        # The micro-batch sizes and checkpointing modes of a structure depend only on these fields
        # when the filter is runs_here (it reads no others); a custom ``where`` is asked every time.
        self.shared_where = where is None or getattr(where, "reads", None) == _RUNS_HERE_FIELDS
        self.options: dict[tuple, tuple[list[int], list[str]]] = {}
        self.floor_fits: dict[tuple, bool | tuple] = {}  # False, or (rank shapes, their RankEntry)
        self.widest_fits: dict[tuple, bool] = {}  # the floor of a whole-dp sharding group
        self.local_trains: dict[int, TrainSpec] = {}  # context.local_train by cp
        self.rank_shapes: dict[tuple, tuple[RankShape, ...]] = {}  # memory.rank_shapes by what it reads
        self.widest_found: dict[tuple, _Found] = {}  # what fits a whole-dp sharding group, by the rest
        self.narrower_fit: dict[tuple, frozenset] = {}  # (ac, mbs) that fit a narrower group, by the rest
        self.sp_on_empty: dict[tuple, tuple] = {}  # the options of SP-on structures where nothing fits
        self.fewer_experts_fit: dict[tuple, tuple[int, frozenset]] = {}  # (ep, (ac, mbs) that fit) by the rest
        self.stages = cache.stages  # estimate's per-rank memo, bounds and estimates alike
        self.bounds: dict[tuple, float] = {}  # the compute-only bound
        self.optimizers: dict[tuple, float] = {}  # estimate.optimizer_seconds
        self.with_experts: dict[tuple, float] = {}  # estimate.lower_bound_experts_s
        self.tight: dict[tuple, float] = {}  # the tighter bound: everything but the DP collectives
        self.fitting: list[tuple[float, int, Layout, tuple[RankShape, ...]]] = []  # (bound, index, layout, shapes)

    def run(self) -> SearchResult:
        for cp_bound in (True, False):  # cp past CP_MIN_TOKENS only when no layout within it is valid
            for fields in _structure_fields(self.model, self.cluster.world_size, self.train.global_batch,
                                            self.train.seq_len, cp_bound):
                self._collect(*fields)
            if self.result.enumerated:
                break
        return self._rank()

    # ------------------------------------------------------------------ what fits
    def _options(self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int,
                 schedule: str, ep: int, all_mbs: list[int]) -> tuple[list[int], list[str]]:
        """The structure's micro-batch sizes the schedule admits and the checkpointing modes ``where``
        admits (shared by every structure with the same fields runs_here reads and dp)."""
        okey = (dp, cp, tp, sp, pp, schedule)
        opts = self.options.get(okey) if self.shared_where else None
        if opts is None:
            base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
            mbs_options = [b for b in all_mbs if _schedule_ok(base, self.train.global_batch // (dp * b))]
            acs = [ac for ac in _ac_modes(self.model) if self.where is None or self.where(_with(base, base.mbs, ac))]
            opts = self.options[okey] = (mbs_options, acs)
        return opts

    def _collect(self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int, schedule: str,
                 ep: int, all_mbs: list[int]) -> None:
        """Add the structure's fitting layouts, each with the compute-only lower bound of its step."""
        opts = self._options(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, all_mbs)
        mbs_options, acs = opts
        if not acs:
            return
        self.result.enumerated += len(acs) * len(mbs_options)
        # With SP off a rank holds more activations than with it on and nothing less (checked over every
        # layout of 4 cases): where SP on fits at no mbs or ac, SP off does not (SP on comes first).
        skey = (dp, zero, shard, cp, tp, pp, vpp, schedule, ep) if tp > 1 else None
        if skey is not None and not sp and self.sp_on_empty.get(skey) == opts:
            return
        found = self._found(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs)
        if not found and sp and skey is not None:
            self.sp_on_empty[skey] = opts
        for layout, mbs, shapes in found:
            self.result.fitting += 1
            # the compute-only bound reads neither ep nor any DP/ZeRO field (dp is fixed by tp, cp, pp)
            key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, mbs, layout.ac, layout.sp)
            bound = self.bounds.get(key)
            if bound is None:
                bound = self.bounds[key] = lower_bound_step_s(self.model, self.cluster, self.train, layout,
                                                              compute_only=True, stage_cache=self.stages)
            self.fitting.append((bound, len(self.fitting), layout, shapes))

    def _found(self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int, schedule: str,
               ep: int, mbs_options: list[int], acs: list[str]) -> _Found:
        """What fits the structure. Whether a layout fits only improves as the sharding group grows
        (every state is divided by it or does not read it; FSDP2's padded shard, ceil(rows / shard),
        shrinks too): a narrower group tries only what fits the whole dp group, and what fits it fits
        every wider one."""
        fields = (dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep, mbs_options, acs)
        wkey = (dp, cp, zero, tp, sp, pp, vpp, schedule, ep)
        if zero and 1 < shard < dp:
            if wkey not in self.widest_found:
                self.widest_found[wkey] = self._structure_fits(dp, zero, dp, *fields[3:])
            widest = self.widest_found[wkey]
            found = widest and self._structure_fits(*fields, self.narrower_fit.get(wkey, frozenset()),
                                                    frozenset((lay.ac, mbs) for lay, mbs, _ in widest))
            if found:
                self.narrower_fit[wkey] = self.narrower_fit.get(wkey, frozenset()) | {
                    (lay.ac, mbs) for lay, mbs, _ in found}
            return found
        if zero and shard == dp > 1:
            found = self.widest_found.pop(wkey, None)
            if found is not None:
                return found
        return self._structure_fits(*fields)

    def _structure_fits(self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int,
                        schedule: str, ep: int, mbs_options: list[int], acs: list[str], known: frozenset = frozenset(),
                        possible: frozenset | None = None) -> _Found:
        """The layouts of one structure that fit, in the order of the mbs and ac loop; the (ac, mbs) in
        ``known`` fit without being worked out, and so do those that fit the same structure with a
        smaller ep > 1 (a rank's states only shrink as ep grows, and its per-micro-batch parts read
        ep only as ep > 1); those not in ``possible`` (when given) do not."""
        ekey = (dp, zero, shard, cp, tp, sp, pp, vpp, schedule) if ep > 1 else None
        if ekey is not None:
            narrower_ep = self.fewer_experts_fit.get(ekey)
            if narrower_ep is not None and narrower_ep[0] < ep:
                known = known | narrower_ep[1]
        found: _Found = []
        fit = self._floor_fit(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep)
        if fit:
            base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
            found = self._fitting_mbs(base, fit, mbs_options, acs, known, possible)
        if ekey is not None:  # the eps of a structure come in ascending order (_structure_fields)
            self.fewer_experts_fit[ekey] = (ep, frozenset((lay.ac, mbs) for lay, mbs, _ in found))
        return found

    def _shapes_of(self, layout: Layout) -> tuple[RankShape, ...]:
        key = (layout.tp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2)
        shapes = self.rank_shapes.get(key)
        if shapes is None:
            shapes = self.rank_shapes[key] = memory.rank_shapes(self.model, layout)
        return shapes

    def _floor_fit(self, dp: int, zero: int, shard: int, cp: int, tp: int, sp: bool, pp: int, vpp: int,
                   schedule: str, ep: int) -> bool | tuple:
        """False when the structure fits at no mbs or ac (most do not), else (its rank shapes, their
        RankEntry). The floor (PeakCache.floor) reads only these fields: the rank shapes come from tp,
        pp, vpp and the V schedule, not from sp nor the schedule otherwise."""
        fkey = (dp, cp, zero, shard, tp, pp, vpp, schedule == "zero-bubble" and vpp == 2, ep)
        fit = self.floor_fits.get(fkey)
        if fit is not None:
            return fit
        if zero and 1 < shard < dp:
            # the floor only shrinks as the sharding group grows (every term is divided by it or does
            # not read it, for shard > 1): if the whole dp group's fails, this one's does too
            widest = fkey[:3] + (dp,) + fkey[4:]
            if widest not in self.widest_fits:
                whole = _layout(dp, zero, dp, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
                self.widest_fits[widest] = all(self.peaks.floor(whole, sh) <= self.usable
                                               for sh in self._shapes_of(whole))
            if not self.widest_fits[widest]:
                self.floor_fits[fkey] = False
                return False
        base = _layout(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, 1, "none", ep)
        shapes = self._shapes_of(base)
        fit = all(self.peaks.floor(base, sh) <= self.usable for sh in shapes)
        self.floor_fits[fkey] = fit = fit and (shapes, [self.peaks.rank_entry(base, sh, self.train) for sh in shapes])
        return fit

    def _fitting_mbs(self, base: Layout, fit: tuple, mbs_options: list[int], acs: list[str], known: frozenset,
                     possible: frozenset | None) -> _Found:
        """The (ac, mbs) of a structure whose floor fits that fit in full. Memory grows with mbs while
        earlier micro-batches leave gradients (m > 1), so after one overflows a larger mbs is not
        tried, unless it is a single micro-batch (no gradients at the forward's end) or the
        interleaved runtime reduces each chunk's gradients after its last backward (fewer
        micro-batches can then hold fewer chunks' gradients at once)."""
        shapes, entries = fit
        lt = self.local_trains.get(base.cp)
        if lt is None:
            lt = self.local_trains[base.cp] = local_train(self.train, base)
        table = self.peaks.table_of(base)
        monotone = not memory.frees_gradients(base)
        found: _Found = []
        for ac in acs:
            overflowed = False
            for mbs in mbs_options:
                m = self.train.global_batch // (base.dp * mbs)
                if overflowed and m > 1 and monotone:
                    continue
                if (ac, mbs) in known:
                    layout, fits = None, True
                elif possible is not None and (ac, mbs) not in possible:
                    layout, fits = None, False
                else:
                    layout, fits = self._fits(base, entries, table, lt, m, ac, mbs)
                if not fits:
                    overflowed = True
                    continue
                found.append((layout or _with(base, mbs, ac), mbs, shapes))
        return found

    def _fits(self, base: Layout, entries: list[RankEntry], table: dict, lt: TrainSpec, m: int, ac: str,
              mbs: int) -> tuple[Layout | None, bool]:
        """Whether ``base`` at (ac, mbs) fits on every rank, and its layout when one was built: every
        rank's fit floor first (memory.candidates_floor), then the full peaks (PeakCache.total_from);
        under the interleaved runtime a rank below its ceiling fits without its moments. Most tries
        are refused before a layout is built."""
        layout = None
        if self.model.states_only:
            layout = _with(base, mbs, ac)
            return layout, all(self.peaks.fits(layout, e.shape, m, e.static, lt, self.usable, table) for e in entries)
        usable = self.usable
        full: list[tuple[RankEntry, tuple]] = []
        for e in entries:
            per_mb = table.get((ac, mbs, e.shape.pp_rank))
            if per_mb is None:
                layout = layout or _with(base, mbs, ac)
                per_mb = table[ac, mbs, e.shape.pp_rank] = self.peaks.per_micro_batch(layout, e.shape, m, lt)
            if memory.candidates_floor(e.halves, per_mb) > usable:
                return layout, False
            if e.ceiling is not None and e.ceiling + memory.ceiling_activations(per_mb) <= usable:
                continue
            full.append((e, per_mb))
        if full:
            layout = layout or _with(base, mbs, ac)
            for e, per_mb in full:
                if self.peaks.total_from(layout, e.shape, m, e.static, lt, per_mb) > usable:
                    return layout, False
        return layout, True

    # ------------------------------------------------------------------ ranking
    def _rank(self) -> SearchResult:
        """Estimate the fitting layouts in order of their lower bound: once the ``keep`` best are known,
        the first whose bound is slower than the worst of them ends the search, and one whose tighter
        bound (every part of the step but the data-parallel collectives) is slower is skipped. Exact
        ties between rank keys go to the earlier enumerated layout, as if estimated in that order."""
        result, keep = self.result, self.keep
        keys: list[tuple] = []  # (_rank_key, enumeration index) of result.best, in order
        self.fitting.sort()  # by (bound, enumeration index): the index is unique, no layout is compared
        for bound, index, layout, shapes in self.fitting:
            if len(result.best) >= keep:
                worst = result.best[-1].time.step_s
                if bound > worst:
                    break
                if self._slower_than(layout, shapes, worst):
                    continue
            e = estimate(self.model, self.cluster, self.train, layout, self.headroom, self.stages,
                         self.peaks.memories(layout, shapes, self.capacity))
            keep_ranked(result.best, keys, e, index, keep)
        result.best = break_ties(result.best, self.usable)
        result.pool = result.best[:]
        del result.best[self.top:]
        return result

    def _slower_than(self, layout: Layout, shapes: tuple[RankShape, ...], worst: float) -> bool:
        """Whether a lower bound of the layout's step is above ``worst``: the optimizer plus, for a
        mixture of experts, compute and the expert all-to-alls first (cheaper; most refusals of a
        mixture of experts are for those), then the tighter bound. Each part is cached by the fields
        it reads (cost/estimate.py)."""
        model, cluster, train = self.model, self.cluster, self.train
        okey = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule == "zero-bubble" and layout.vpp == 2,
                layout.ep, layout.zero >= 1, layout.shard, layout.dp > 1)
        opt_s = self.optimizers.get(okey)
        if opt_s is None:
            opt_s = self.optimizers[okey] = optimizer_seconds(model, cluster, train, layout, shapes)
        if model.moe and not model.states_only:
            key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
                   layout.sp)
            busy = self.with_experts.get(key)
            if busy is None:
                busy = self.with_experts[key] = lower_bound_experts_s(model, cluster, train, layout, self.stages)
            if busy + opt_s > worst:
                return True
        key = (layout.tp, layout.cp, layout.pp, layout.vpp, layout.schedule, layout.mbs, layout.ac, layout.ep,
               layout.sp, layout.zero >= 2)
        busy = self.tight.get(key)
        if busy is None:
            busy = self.tight[key] = lower_bound_step_s(model, cluster, train, layout, stage_cache=self.stages)
        return busy + opt_s > worst
