"""The published runs the GPU time model misses by more than a bound, each with the plan's split of its
step, grouped by what they share: where to look for the mispriced part before changing anything.

For every run of the chosen sets (benchmarks/fidelity.py's runs, predicted as it predicts them) with
|error| beyond ``--beyond`` (error = predicted / published - 1), one line: its set, id, origin, runtime
(and model code), GPU and count, layout, precision, published and predicted seconds, and the predicted
step's parts as shares of it (cost/estimate.py ``StepTime``: compute, exposed communication, bubble,
optimizer, fixed; they sum to the step). Then the misses grouped by origin, GPU, runtime and the
parallelism that shapes the step (``parallelism``: pipeline, tensor, context, else data parallel only):
runs, precisions, error range and mean shares. Then every set's mean / worst |error| of the chosen kind, the
figures a change's commit quotes before and after. Nothing is fitted or written.

The default sets are the seen ones (band.py's SEEN): a test set not yet evaluated is priced only if named.

    python benchmarks/step_misses.py                      # dense runs beyond 15%, every seen set
    python benchmarks/step_misses.py --kind moe --beyond 0.3 --sets test4,test5
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from band import SEEN  # noqa: E402
from fidelity import SETS, Run, load_runs  # noqa: E402
from fidelity import summary as fidelity_summary  # noqa: E402
from meshwise.cost.estimate import estimate  # noqa: E402

PARTS = ("compute", "comm", "bubble", "optimizer", "fixed")  # StepTime's parts, in its order
KINDS = ("dense", "moe", "all")


@dataclass(frozen=True)
class Miss:
    """One run's prediction: its error and the predicted step's parts in seconds (``PARTS`` order)."""

    run: Run
    predicted_s: float
    parts_s: tuple[float, ...]

    @property
    def error(self) -> float:
        return self.predicted_s / self.run.published_step_s - 1

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(p / self.predicted_s for p in self.parts_s)

    @property
    def runtime(self) -> str:
        """The runtime, with the model code meshwise's runtime priced (cost/kernels.py ``ops_key``)."""
        train = self.run.train
        return train.runtime if train.runtime == "megatron" else f"meshwise/{train.model_code}"

    @property
    def group(self) -> tuple[str, str, str, str]:
        """What the run shares with others: origin, GPU, runtime and parallelism."""
        r = self.run
        return r.origin, r.gpu, self.runtime, parallelism(r)


def parallelism(run: Run) -> str:
    """The parallelism that shapes the step most: pipeline, else tensor, else context, else data parallel
    only (ZeRO-3 / FSDP named as such)."""
    lay = run.layout
    if lay.pp > 1:
        return f"PP {lay.schedule}"
    if lay.tp > 1:
        return "TP"
    if lay.cp > 1:
        return "CP"
    return "FSDP only" if lay.zero == 3 else "DP only"


def predicted(run: Run) -> Miss:
    """``run`` priced by cost/estimate.py with the catalog's constants, as benchmarks/fidelity.py prices it."""
    t = estimate(run.model, run.cluster, run.train, run.layout).time
    return Miss(run, t.step_s, (t.compute_s, t.comm_exposed_s, t.bubble_s, t.optimizer_s, t.fixed_s))


def of_kind(runs: list[Run], kind: str) -> list[Run]:
    return [r for r in runs if kind == "all" or (r.moe == (kind == "moe"))]


def misses(priced: list[Miss], beyond: float) -> list[Miss]:
    """The runs of ``priced`` whose |error| exceeds ``beyond``, worst first."""
    return sorted((m for m in priced if abs(m.error) > beyond), key=lambda m: -abs(m.error))


def groups(found: list[Miss]) -> dict[tuple[str, str, str, str], list[Miss]]:
    """``found`` by :attr:`Miss.group`, the largest group first."""
    out: dict[tuple[str, str, str, str], list[Miss]] = defaultdict(list)
    for m in found:
        out[m.group].append(m)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def summary(priced: list[Miss]) -> tuple[int, float, float]:
    """(runs, mean |error|, worst |error|): fidelity.summary's figures."""
    return len(priced), *fidelity_summary([m.error for m in priced])


def _shares_text(shares: tuple[float, ...]) -> str:
    return " ".join(f"{name} {s:.0%}" for name, s in zip(PARTS, shares) if name != "fixed" or s)


def run_lines(found: list[Miss]) -> list[str]:
    """One line per miss: where it ran, how it was laid out and what the plan's step is made of."""
    lines = []
    for m in found:
        r = m.run
        lines.append(
            f"{r.set:5s} {m.error:+6.1%}  {r.id}  [{r.origin}; {m.runtime}; {r.gpu} x {r.cluster.world_size}; "
            f"`{r.layout}`; {r.train.precision}]  published {r.published_step_s:.3f} s, predicted {m.predicted_s:.3f} s: "
            + _shares_text(m.shares)
        )
    return lines


def group_lines(found: list[Miss]) -> list[str]:
    """One line per group: its runs, their precisions and error range, the mean shares of their steps."""
    lines = []
    for (origin, gpu, runtime, layout), members in groups(found).items():
        errors = [m.error for m in members]
        mean = tuple(sum(m.shares[i] for m in members) / len(members) for i in range(len(PARTS)))
        precisions = "/".join(sorted({m.run.train.precision for m in members}))
        lines.append(
            f"{len(members):2d} runs {min(errors):+6.1%} to {max(errors):+6.1%}  {origin}; {gpu}; {runtime}; "
            f"{layout}; {precisions}: " + _shares_text(mean)
        )
    return lines


def report(set_names: tuple[str, ...], kind: str, beyond: float) -> list[str]:
    """The listing, the groups and every set's summary, as lines."""
    priced = {s: [predicted(r) for r in of_kind(load_runs(set_name=s), kind)] for s in set_names}
    found = misses([m for s in set_names for m in priced[s]], beyond)
    lines = [f"{kind} runs beyond {beyond:.0%} |error| on step time ({', '.join(set_names)}): {len(found)}", ""]
    lines += run_lines(found) + ["", "Grouped by origin, GPU, runtime and parallelism (mean shares of the step):"]
    lines += group_lines(found) + ["", f"{kind} mean / worst |error| by set:"]
    for s in set_names:
        if priced[s]:
            n, mean, worst = summary(priced[s])
            lines.append(f"  {s:6s} {n:3d} runs: {mean:.1%} / {worst:.1%}")
    return lines


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SEEN), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--kind", choices=KINDS, default="dense")
    parser.add_argument("--beyond", type=float, default=0.15, help="the |error| bound (0.15 = 15%%)")
    args = parser.parse_args(argv)
    names = tuple(s for s in args.sets.split(",") if s)
    if not names or any(s not in SETS for s in names):
        print(f"--sets: comma-separated names of {', '.join(SETS)} (got {args.sets!r})", file=sys.stderr)
        raise SystemExit(2)
    if not 0 <= args.beyond < 10:
        print(f"--beyond: a fraction of the published step in [0, 10), e.g. 0.15 (got {args.beyond})", file=sys.stderr)
        raise SystemExit(2)
    print("\n".join(report(names, args.kind, args.beyond)))


if __name__ == "__main__":
    main(sys.argv[1:])
