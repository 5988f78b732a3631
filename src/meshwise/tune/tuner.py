"""Which layout a tune tries next, and when it is done.

1. The field (tune/field.py) is tried fastest predicted first.
2. After every trial the profile is refitted to all measured trials (tune/refit.py) and every
   untried candidate of the planned pool is predicted again. From three measured trials on (those
   stopped early included), the band is the refitted profile's mean absolute error on a trial it
   was not fitted to (leave one out, refit.held_out_errors; at least the noise floor); before
   that, the planned band (field.relative_band).
3. An untried field member now predicted slower than the measured best beyond the band is
   dropped: the refitted model says it cannot win.
4. With the field done, an untried pool candidate now predicted faster than the measured best
   beyond the band is tried (a new round), and 2-4 repeat until none is: model and measurement agree.
5. The budget, known before the first trial: ``max_trials`` trials (layouts measured: ``--trials``,
   else :func:`default_trials` of the field) and the steps of that many whole trials
   (trials.step_budget), run-off included. A trial starts only where its steps fit, less the
   smallest run-off's where one is due (:attr:`Tune.steps_for_trials`); the clock
   (``--budget-minutes``) ends the tune early too; a finished trial is never repeated.
6. With the loop done, the best trial and the fastest other whose steps overlap it are run again
   together, their steps interleaved, in the steps the budget has left (:meth:`Tune.runoff`,
   trials.runoff_contenders, trials.runoff_passes); the run-off's fastest is the pick.

``exhaustive`` (benchmarks/tune_regret.py's ground truth) tries the pool's first N predicted, all
of them, in that order, with no early stop, no drop and no re-ranking.

Pure Python: the measuring is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshwise.layout import parse
from meshwise.tune.field import Candidate, field_of
from meshwise.tune.refit import Predictor, held_out_errors, refit, step_errors
from meshwise.tune.trials import (
    MEASURED,
    NOISE_FLOOR,
    RUNOFF,
    STOPPED,
    TIMED_STEPS,
    WARMUP_STEPS,
    Trial,
    best_trial,
    runoff_contenders,
    runoff_passes,
    runoff_steps_min,
    step_budget,
    steps_used,
    trials_used,
)

# Trials before the held-out error sets the band: with two, each is predicted from a fit to one
# trial, and two like layouts (tune_regret.py's `four`: both ZeRO over groups of 2) read 4% where
# the refitted profile was 8-14% off on the rest of the field.
HELD_OUT_MIN = 3


def default_trials(field_size: int) -> int:
    """Trials a tune without ``--trials`` may use: a third of its field, rounded down, and at least
    ``HELD_OUT_MIN`` (the trials the held-out band needs)."""
    return max(HELD_OUT_MIN, field_size // 3)


@dataclass
class Tune:
    """The state of one tune; ``trials`` may hold a resumed tune's finished ones."""

    pool: list[Candidate]
    table: dict[str, Any]  # the profile: the base one, then refitted after each trial
    predictor: Predictor
    band: float
    max_trials: int | None = None
    trials: list[Trial] = field(default_factory=list)
    factors: dict[str, float] = field(default_factory=dict)
    base_table: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    exhaustive: int = 0  # benchmarks: try the first N of the pool, all of them, nothing else
    warmup: int = WARMUP_STEPS  # a trial's warm-up and timed steps (before any extension of short ones)
    timed: int = TIMED_STEPS

    def __post_init__(self) -> None:
        self.base_table = dict(self.table)
        self.field = [c.text for c in field_of(self.pool, self.band)]
        if self.exhaustive:
            self.field = [c.text for c in sorted(self.pool, key=lambda c: c.predicted_step_s)[: self.exhaustive]]
        self.planned_band = self.band
        if self.max_trials is None and not self.exhaustive:
            self.max_trials = default_trials(len(self.field))
        self.budget_steps = None if self.exhaustive else step_budget(self.max_trials or 0, self.warmup, self.timed)
        if any(t.fits for t in self.trials):
            self._learn()

    @property
    def tried(self) -> set[str]:
        return {t.layout for t in self.trials}

    @property
    def trials_used(self) -> int:
        return trials_used(self.trials)

    @property
    def steps_used(self) -> int:
        return steps_used(self.trials, self.warmup)

    @property
    def steps_left(self) -> int | None:
        return None if self.budget_steps is None else self.budget_steps - self.steps_used

    @property
    def steps_for_trials(self) -> int | None:
        """The steps left for trials: those left, less the smallest run-off's where one is due (two
        trials' steps overlap): a run-off between two near-ties goes before another trial."""
        left = self.steps_left
        if left is None:
            return None
        return left - (runoff_steps_min() if runoff_contenders(self.trials) else 0)

    def max_timed_steps(self) -> int:
        """Timed steps the next trial may run (0: no bound): its share of the steps left for trials,
        ``steps_for_trials / trials left - warmup``, at least ``timed`` (a short-stepped trial runs
        more only with steps the trials before it left unspent)."""
        left = self.steps_for_trials
        if left is None or self.max_trials is None:
            return 0
        return max(self.timed, left // max(1, self.max_trials - self.trials_used) - self.warmup)

    @property
    def round(self) -> int:
        return max((t.round for t in self.trials), default=0)

    def predicted(self, text: str) -> float:
        return self.predictor.step(self.table, parse(text)).step_s

    def next(self, out_of_time: bool = False) -> tuple[Candidate, int] | None:
        """(the next candidate, its round), or None when the tune is done."""
        if out_of_time or (self.max_trials is not None and self.trials_used >= self.max_trials):
            return None
        if self.steps_for_trials is not None and self.steps_for_trials < self.warmup + self.timed:
            return None
        if any(t.status == RUNOFF for t in self.trials):
            return None
        best = best_trial(self.trials)
        best_s = best.measured_step_s if best else None
        field_left = [t for t in self.field if t not in self.tried and t not in self.dropped]
        if field_left:
            text = field_left[0] if self.exhaustive else min(field_left, key=self.predicted)
            return Candidate(parse(text), self.predicted(text)), 0
        if best_s is None or self.exhaustive:
            return None
        faster = [
            c.text
            for c in self.pool
            if c.text not in self.tried
            and c.text not in self.dropped
            and self.predicted(c.text) < best_s * (1 - self.band)
        ]
        if not faster:
            return None
        text = min(faster, key=self.predicted)
        return Candidate(parse(text), self.predicted(text)), self.round + 1

    def runoff(self, out_of_time: bool = False) -> list[Trial]:
        """The trials to run again together once :meth:`next` is done (none: the pick stands);
        never in an exhaustive tune, past the clock, or without the steps left for
        trials.RUNOFF_MIN_PASSES passes."""
        if out_of_time or self.exhaustive:
            return []
        contenders = runoff_contenders(self.trials)
        return contenders if contenders and self.runoff_passes(len(contenders)) else []

    def runoff_passes(self, contenders: int = 2) -> int:
        """Interleaved passes the steps left allow a run-off (trials.runoff_passes)."""
        return runoff_passes(self.steps_left or 0, contenders)

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)
        self._learn()

    def _learn(self) -> None:
        """Refit to every measured trial, narrow the band, drop what can no longer win."""
        # every measurement is a row of the fit: a layout the run-off measured again has two
        measured = [(parse(t.layout), t.parts) for t in self.trials if t.fits and t.parts]
        if not measured:
            return
        self.table, self.factors = refit(self.base_table, measured, self.predictor)
        done = [t for t in self.trials if t.status in (MEASURED, STOPPED) and t.parts and t.measured_step_s]
        errors = held_out_errors(
            self.base_table,
            [(parse(t.layout), t.parts) for t in done],
            [t.measured_step_s or 0.0 for t in done],
            self.predictor,
        )
        if len(errors) >= HELD_OUT_MIN:
            self.band = max(NOISE_FLOOR, sum(map(abs, errors)) / len(errors))
        best = best_trial(self.trials)
        if best is None or best.measured_step_s is None or self.exhaustive:
            return
        for text in self.field:
            if (
                text not in self.tried
                and text not in self.dropped
                and self.predicted(text) > best.measured_step_s * (1 + self.band)
            ):
                self.dropped.append(text)

    def errors(self, table: dict[str, Any]) -> list[float]:
        """Relative step errors of ``table``'s predictions over the trials that ran all their steps."""
        done = [(parse(t.layout), t.measured_step_s) for t in self.trials if t.status == "measured" and t.steps_s]
        return step_errors(table, [(lay, s) for lay, s in done if s], self.predictor)
