"""A tune's trials: their record, the early-stop rule, and the results file a tune resumes from.

The results file is JSON lines: a header ``{"tune": 1, "inputs": {...}}`` naming what was tuned
(model, batch, sequence, world, base profile), then one finished trial per line. Each write
replaces the whole file atomically, so an interrupted tune leaves every finished trial and no
half-written one.

Early stop: a trial stops once its fastest measured step is slower than the best trial's step by
more than the noise, ``min(steps) > best (1 + noise)``, the noise being the best trial's own
relative spread ``(max - min) / median`` of its steps, at least ``NOISE_FLOOR``; only after
``STOP_AFTER_STEPS`` timed steps. On this 2-core host a step can run slow for seconds: over the 384
exhaustively measured trials kept from five runs of benchmarks/tune_regret.py, the fastest of a
trial's first two steps was over 15% slower than that layout's median over the rounds in 19, the
fastest of its first three in 10 (over 8%: 34 and 24), and two slow steps once stopped the best
layout of a field (a 13% regret).

Short steps are noisier (a 30 ms step on the shared 2-core host spread 11-71% over five steps), so a
trial whose first timed step is shorter than ``MIN_TIMED_S / steps`` runs more timed steps, enough
for ``MIN_TIMED_S`` of timed work, at most ``MAX_STEPS_FACTOR`` times ``--trial-steps``
(:func:`timed_steps`).

Counting: a trial is a layout measured (:func:`trials_used`); ``--trials K`` counts them, and the
tune's budget is the steps of ``K`` whole trials, ``K (warm-up + timed steps)`` (:func:`step_budget`),
against which every warm-up and timed step counts, the run-off's included (:func:`steps_used`).

The run-off: trials measured minutes apart on a shared host are not comparable to a few percent, so
once the loop is done the best trial and the fastest other whose steps overlap the best's
(:func:`runoff_contenders`) are measured again together, their steps interleaved (A B, B A, ...),
and the fastest median of that run-off is the pick (:func:`best_trial`). It re-measures layouts
already tried, so it is no trial: it runs only where the budget has the steps left for
``RUNOFF_MIN_PASSES`` passes (:func:`runoff_passes`; once one is due, the loop keeps those steps
for it: :func:`runoff_steps_min`), and ends once the refitted profile's faster
contender leads it after ``RUNOFF_AGREE_AFTER`` passes, or once the two contenders' steps stop
overlapping after ``RUNOFF_DECIDED_AFTER`` (:func:`runoff_over`).

Pure Python: no torch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshwise.errors import MeshwiseError
from meshwise.files import write_atomically

NOISE_FLOOR = 0.02  # the least relative noise assumed of a measured step
STOP_AFTER_STEPS = 3  # timed steps a trial runs before it may stop early
MIN_TIMED_S = 1.0  # timed work a trial of short steps extends to (seconds)
MAX_STEPS_FACTOR = 4  # ... with at most this many times --trial-steps
WARMUP_STEPS, TIMED_STEPS = 2, 5  # a trial's warm-up and timed steps (--trial-warmup, --trial-steps)
RUNOFF_WARMUP = 1  # warm-up steps of each run-off contender
RUNOFF_MIN_PASSES = 2  # interleaved passes a run-off needs the budget's steps for, or it is not run
RUNOFF_AGREE_AFTER = 2  # passes after which a run-off led by the refitted profile's faster contender ends
RUNOFF_DECIDED_AFTER = 3  # interleaved passes after which a run-off whose steps do not overlap ends
MEASURED, STOPPED, OVER_LIMIT, OUT_OF_MEMORY = "measured", "stopped early", "over --memory-limit", "out of memory"
RUNOFF = "run-off"
BINDS = {
    "compute_s": "compute",
    "comm_s": "communication",
    "idle_s": "pipeline idle",
    "optimizer_s": "optimizer",
    "fixed_s": "fixed costs",
}


@dataclass(frozen=True)
class Trial:
    """One trial: the layout (its text), its predicted step when chosen, what was measured.
    ``parts``: the median step's split (measure/timing.py names); ``peak_bytes``: the largest rank's
    tracked peak; ``round``: 0 for the field, n for the n-th re-ranking after a refit."""

    layout: str
    status: str
    predicted_step_s: float
    steps_s: list[float] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    peak_bytes: int = 0
    round: int = 0

    @property
    def fits(self) -> bool:
        return self.status in (MEASURED, STOPPED, RUNOFF)

    @property
    def measured_step_s(self) -> float | None:
        return statistics.median(self.steps_s) if self.fits and self.steps_s else None

    @property
    def binds(self) -> str:
        """The largest measured part of the step ("memory" for a layout that did not fit)."""
        if not self.fits:
            return "memory"
        timed = {k: v for k, v in self.parts.items() if k in BINDS}
        return BINDS[max(timed, key=timed.__getitem__)] if timed else "-"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "measured_step_s": self.measured_step_s, "fits": self.fits, "binds": self.binds}


def trial_from_json(d: dict[str, Any]) -> Trial:
    return Trial(
        str(d["layout"]),
        str(d["status"]),
        float(d["predicted_step_s"]),
        [float(x) for x in d["steps_s"]],
        {str(k): float(v) for k, v in d["parts"].items()},
        int(d["peak_bytes"]),
        int(d.get("round", 0)),
    )


def noise_of(steps_s: list[float]) -> float:
    """The relative spread of a trial's measured steps, at least ``NOISE_FLOOR``."""
    if len(steps_s) < 2:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, (max(steps_s) - min(steps_s)) / statistics.median(steps_s))


def best_trial(trials: list[Trial]) -> Trial | None:
    """The run-off's fastest median where there was a run-off, else the fitting trial that ran all
    its steps with the fastest median step (None if none)."""
    done = [t for t in trials if t.status == RUNOFF and t.steps_s]
    done = done or [t for t in trials if t.status == MEASURED and t.steps_s]
    return min(done, key=lambda t: t.measured_step_s or 0.0) if done else None


def should_stop(steps_s: list[float], best_s: float | None, noise: float) -> bool:
    """Stop a trial whose fastest step so far (of at least ``STOP_AFTER_STEPS``) is slower than the
    best step by more than the noise (the best trial's: its own fastest step already allows for its
    spread)."""
    return best_s is not None and len(steps_s) >= STOP_AFTER_STEPS and min(steps_s) > best_s * (1 + noise)


def timed_steps(steps: int, first_s: float, min_timed_s: float = MIN_TIMED_S) -> int:
    """Timed steps of a trial whose first timed step took ``first_s``: enough for ``min_timed_s``
    of timed work, at least ``steps``, at most ``MAX_STEPS_FACTOR * steps``."""
    if first_s <= 0:
        return steps * MAX_STEPS_FACTOR
    return min(steps * MAX_STEPS_FACTOR, max(steps, math.ceil(min_timed_s / first_s)))


def trials_used(trials: list[Trial]) -> int:
    """Trials: layouts measured, fitting or not (the run-off measures tried layouts again: no trial)."""
    return sum(1 for t in trials if t.status != RUNOFF)


def steps_used(trials: list[Trial], warmup: int) -> int:
    """Every warm-up and timed step of ``trials``: ``warmup`` + timed steps per trial (a layout over
    the memory limit: its warm-up alone), ``RUNOFF_WARMUP`` + timed steps per run-off contender."""
    return sum(len(t.steps_s) + (RUNOFF_WARMUP if t.status == RUNOFF else warmup) for t in trials)


def step_budget(trials_allowed: int, warmup: int, timed: int) -> int:
    """The steps of ``trials_allowed`` whole trials: the most a tune spends, run-off included."""
    return trials_allowed * (warmup + timed)


def steps_overlap(a: list[float], b: list[float]) -> bool:
    """Whether two trials' measured steps overlap: ``min(a) <= max(b)`` and ``min(b) <= max(a)``."""
    return bool(a and b) and min(a) <= max(b) and min(b) <= max(a)


def runoff_contenders(trials: list[Trial]) -> list[Trial]:
    """[the best trial, the fastest other measured trial whose steps overlap the best's]; none when
    no other overlaps or a run-off was already run."""
    if any(t.status == RUNOFF for t in trials):
        return []
    best = best_trial(trials)
    if best is None:
        return []
    close = [
        t
        for t in trials
        if t.status == MEASURED and t is not best and t.steps_s and steps_overlap(t.steps_s, best.steps_s)
    ]
    return [best, min(close, key=lambda t: t.measured_step_s or 0.0)] if close else []


def runoff_passes(steps_left: int, contenders: int = 2) -> int:
    """Interleaved passes a run-off of ``contenders`` can run in ``steps_left`` steps, each contender
    warmed up by ``RUNOFF_WARMUP``; 0 (no run-off) below ``RUNOFF_MIN_PASSES``."""
    passes = (steps_left - contenders * RUNOFF_WARMUP) // contenders
    return passes if passes >= RUNOFF_MIN_PASSES else 0


def runoff_steps_min(contenders: int = 2) -> int:
    """The steps of the smallest run-off: ``RUNOFF_MIN_PASSES`` passes and the warm-ups."""
    return contenders * (RUNOFF_WARMUP + RUNOFF_MIN_PASSES)


def runoff_decided(steps_s: list[list[float]]) -> bool:
    """Whether a run-off of two contenders may end now: each has ``RUNOFF_DECIDED_AFTER`` timed steps
    and every step of one is faster than every step of the other (with no difference between them,
    three interleaved steps each fall so, either way round, 1 time in 10: 2 / C(6, 3))."""
    if len(steps_s) != 2 or min(map(len, steps_s)) < RUNOFF_DECIDED_AFTER:
        return False
    a, b = steps_s
    return max(a) < min(b) or max(b) < min(a)


def runoff_over(steps_s: list[list[float]], predicted_s: list[float]) -> bool:
    """Whether a run-off of two contenders ends now: decided (:func:`runoff_decided`), or model and
    measurement agree: after ``RUNOFF_AGREE_AFTER`` passes, the contender with the faster median so
    far is the one the refitted profile predicts faster (``predicted_s``)."""
    if len(steps_s) != 2:
        return False
    if runoff_decided(steps_s):
        return True
    if min(map(len, steps_s)) < RUNOFF_AGREE_AFTER:
        return False
    leader = min((0, 1), key=lambda i: statistics.median(steps_s[i]))
    return leader == min((0, 1), key=lambda i: predicted_s[i])


def write_results(path: Path, inputs: dict[str, Any], trials: list[Trial]) -> None:
    lines = [json.dumps({"tune": 1, "inputs": inputs})] + [json.dumps(asdict(t)) for t in trials]
    write_atomically(path, "\n".join(lines) + "\n")


def read_results(path: Path, inputs: dict[str, Any]) -> list[Trial]:
    """The finished trials of a results file written for the same ``inputs``; refused in one line otherwise."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows or rows[0].get("tune") != 1:
            raise ValueError("no tune header")
        trials = [trial_from_json(r) for r in rows[1:]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise MeshwiseError(f"--resume: {path} is not a tune results file ({e})") from None
    saved = rows[0].get("inputs", {})
    for key, value in inputs.items():
        if saved.get(key) != value:
            raise MeshwiseError(
                f"--resume: {path} was tuned with {key} = {saved.get(key)!r}, not {value!r}; "
                "give the same inputs, or another --out for a new tune"
            )
    return trials
