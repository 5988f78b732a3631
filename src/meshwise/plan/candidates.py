"""The layouts a search weighs and how it ranks them: every valid layout of a world size
(the factorisations, schedules, micro-batch sizes and checkpointing modes; plan/search.py's module
docstring says which), the tie rule, and the ranked insertion both searches share. Pure Python.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from meshwise.cost.estimate import Estimate
from meshwise.errors import MeshwiseError
from meshwise.layout import AC_MODES, Degrees, Layout, check_microbatches, layout_from_fields
from meshwise.plan.experts import expert_degrees
from meshwise.spec import ModelSpec

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
    return [
        t
        for t in _divisors(world)
        if model.heads % t == 0 and model.kv_heads % t == 0 and model.ffn_hidden % t == 0 and model.vocab % t == 0
    ]


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


def _structures(
    model: ModelSpec, world: int, global_batch: int, seq_len: int = 0, cp_bound: bool = True
) -> Iterator[tuple[Layout, list[int]]]:
    """Every layout with mbs=1 and ac=none, with the micro-batch sizes valid for it."""
    for degrees, mbs_options in _structure_fields(model, world, global_batch, seq_len, cp_bound):
        yield degrees.layout(), mbs_options


def _structure_fields(
    model: ModelSpec, world: int, global_batch: int, seq_len: int = 0, cp_bound: bool = True
) -> Iterator[tuple[Degrees, list[int]]]:
    """:func:`_structures` as (Degrees, mbs options): the search builds a layout only for the
    structures that its cached answers do not already refuse.
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
            zero_shards = (
                [(0, dp)] if dp == 1 else [(0, dp)] + [(z, s) for z in (1, 2, 3) for s in _divisors(dp) if s > 1]
            )
            schedules = pipeline_options(pp, layers)
            sps = (False,) if tp == 1 else (True, False)
            eps = {shard: expert_degrees(model, shard * cp) for shard in {s for _, s in zero_shards}}
            for zero, shard in zero_shards:
                for ep in eps[shard]:  # carved from dp_shard x cp (layout.expert_mesh_shape)
                    for sp in sps:
                        for schedule, vpp in schedules:
                            yield Degrees(dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep), mbs_options


def _ac_modes(model: ModelSpec) -> tuple[str, ...]:
    return ("none",) if model.states_only else AC_MODES


def _schedule_ok(layout: Layout, m: int) -> bool:
    try:
        check_microbatches(layout, m)
    except MeshwiseError:
        return False
    return True


def enumerate_layouts(
    model: ModelSpec, world: int, global_batch: int, where: Callable[[Layout], bool] | None = None, seq_len: int = 0
) -> Iterator[Layout]:
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
    return (
        layout.ac != "none",
        -layout.mbs * layout.dp,
        layout.pp > 1,
        layout.cp > 1,
        layout.tp > 1,
        layout.zero,
        layout.replicate > 1,
        layout.vpp,
        not layout.sp,
        layout.ep,
    )


def _simplicity_words(w: Layout, r: Layout, global_batch: int | None = None) -> tuple[str, ...]:
    """How ``w`` reads at each place of :func:`_simplicity` where it is simpler than ``r``."""
    fewer = (
        f"fewer micro-batches per step ({w.accum(global_batch)} per replica, not {r.accum(global_batch)})"
        if global_batch
        else f"fewer micro-batches per step (larger mbs x dp: {w.mbs * w.dp} sequences at once, not {r.mbs * r.dp})"
    )
    return (
        "no recompute" if w.ac == "none" else f"lighter recompute (ac={w.ac}, not {r.ac})",
        fewer,
        "no pipeline",
        "no context parallelism",
        "no tensor parallelism",
        f"a lower ZeRO stage ({w.zero}, not {r.zero})",
        "no HSDP replication",
        f"fewer chunks per pipeline rank (vpp={w.vpp}, not {r.vpp})",
        "sequence parallelism on",
        f"less expert parallelism (ep={w.ep}, not {r.ep})",
    )


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
    rest = ranked[len(band) :]
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
    checked: int = 0  # those whose memory was worked out (all of them unless the search stopped early)
    fitting: int = 0  # those of the checked that fit


def _with(base: Layout, mbs: int, ac: str) -> Layout:
    """``base`` with another mbs and ac (layout.layout_from_fields)."""
    fields = base.__dict__.copy()
    fields["mbs"], fields["ac"] = mbs, ac
    return layout_from_fields(fields)


def keep_ranked(best: list[Estimate], keys: list[tuple], e: Estimate, index: int, keep: int) -> None:
    """Insert ``e`` (enumerated ``index``-th) into ``best``, the ``keep`` best so far in order, with
    ``keys`` their (_rank_key, index): exact ties go to the earlier enumerated layout."""
    key_e = (_rank_key(e), index)
    at = bisect.bisect_right(keys, key_e)
    if at < keep:
        keys.insert(at, key_e)
        best.insert(at, e)
        del keys[keep:], best[keep:]


def of_kind(bounded: list[tuple], split: bool) -> list[tuple]:
    """The entries of a search's ordered (bound, index, group, ...) list whose layouts are of the
    other kind than a winner with ``split`` (ep > 1): ep = 1 where ``split``, else ep > 1. The group
    key (plan/bounds.compute_key) ends with ep for a mixture of experts."""
    return [b for b in bounded if (b[2][-1] == 1) == split]
