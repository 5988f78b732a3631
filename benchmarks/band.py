"""The band table the planner prints around its figures (src/meshwise/catalog/bands.toml), from the time
model's errors on the published runs already seen: the development set and the test sets evaluated
once before (dev, test to test6: SEEN; benchmarks/fidelity.py --set NAME). A test set not yet evaluated
is never read.

Each seen run gives e = published step / predicted step - 1 and a category (plan/band.py: dense or MoE,
GPU family, precision class). A row holds the central ``coverage`` share of its runs' e (empirical
quantiles, linear between runs): rows for every category level with at least MIN_RUNS runs from at
least MIN_SOURCES sources, and one row of every run of a kind. The calibrated rows use each run's e
less the median e of its cluster (its source's runs on one GPU, clusters of two runs or more): a
calibrated profile measures the cluster's own speed, the offset those runs share.

Each row's quantiles are widened about its median by one factor: with few sources, the runs of a
source share an offset that a band drawn from other sources does not see. The coverage and the
widening are the pair of COVERAGES x WIDENINGS of least median half-width whose bands reach
TARGET_COVERAGE leave-one-source-out on the seen runs: each source's runs are banded by the table built
without that source.

Source-weighted rows (the default; ``--equal-runs`` for every run weighing one): each run weighs 1 / (its source's runs), so every
source counts once in a row's quantiles and median. A source of 18 runs sharing one offset (one cluster, one
software stack) otherwise sets a row's spread by itself, and a new source brings an offset of its own, not
another of that source's runs: the spread that matters out of sample is the one between sources.

    python benchmarks/band.py            # the leave-one-source-out figures; writes bands.toml and
                                         # benchmarks/results/band-seen.txt
    python benchmarks/band.py --dry-run --equal-runs
                                         # every run weighing one: printed, nothing written
    python benchmarks/band.py --dry-run --holdout test4
                                         # built from the sets before test4 only, then test4 banded by it
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import load_runs, predict  # noqa: E402
from meshwise.plan.band import Category, category_of, lookup  # noqa: E402

MIN_RUNS = 5
MIN_SOURCES = 3  # a row's spread must hold the offsets between sources, not one source's scatter
COVERAGES = (0.8, 0.9, 1.0)
WIDENINGS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
KINDS = ("dense", "moe")  # each kind's coverage and widening are chosen on its own runs
TARGET_COVERAGE = 0.85  # leave-one-source-out, on the seen runs: above the 80% a test set must reach
SEEN = (
    "dev",
    "test",
    "test2",
    "test3",
    "test4",
    "test5",
    "test6",
)  # the sets bands.toml is built from (the default of --seen)
ALL_SETS = ("dev", "test", "test2", "test3", "test4", "test5", "test6")  # in the order they were collected (--holdout)
ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "src/meshwise/catalog/bands.toml"
RESULT = ROOT / "benchmarks/results/band-seen.txt"


@dataclass(frozen=True)
class Point:
    """One seen run: its source, its category (catalog profile) and e = published / predicted - 1."""

    id: str
    origin: str
    gpu: str
    category: Category
    error: float


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of ``values``, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def weighted_quantile(points: list[Point], q: float) -> float:
    """The q-quantile of the points' errors, each weighing 1 / (its source's points), linear between points:
    point i sits at ``(C_i - w_i / 2 - w_0 / 2) / (W - w_0 / 2 - w_n / 2)`` (``C_i`` the weight up to and with
    it, ``W`` the whole), which with equal weights is ``i / (n - 1)``, :func:`quantile`'s rule."""
    per_source = defaultdict(int)
    for p in points:
        per_source[p.origin] += 1
    xs = sorted((p.error, 1.0 / per_source[p.origin]) for p in points)
    if len(xs) == 1:
        return xs[0][0]
    first, last = xs[0][1] / 2, xs[-1][1] / 2
    span, acc, at = sum(w for _, w in xs) - first - last, 0.0, []
    for _, w in xs:
        acc += w
        at.append((acc - w / 2 - first) / span)
    for i in range(1, len(xs)):
        if at[i] >= q:
            t = max(0.0, (q - at[i - 1]) / (at[i] - at[i - 1]))
            return xs[i - 1][0] + t * (xs[i][0] - xs[i - 1][0])
    return xs[-1][0]


def seen_points(sets: tuple[str, ...] = SEEN) -> list[Point]:
    out = []
    for r in (r for name in sets for r in load_runs(set_name=name)):
        cat = category_of(r.moe, r.gpu, r.train.precision, calibrated=False)
        out.append(Point(r.id, r.origin, r.gpu, cat, r.published_step_s / predict(r) - 1))
    return out


def calibrated(points: list[Point]) -> list[Point]:
    """Each run's error about the median of its cluster's (its source's runs on its GPU; clusters of two
    runs or more), as calibrated points: what is left once the cluster's own speed is measured."""
    by_cluster = defaultdict(list)
    for p in points:
        by_cluster[p.origin, p.gpu].append(p)
    out = []
    for group in by_cluster.values():
        if len(group) < 2:
            continue
        mid = statistics.median(p.error for p in group)
        out += [replace(p, category=replace(p.category, profile="calibrated"), error=p.error - mid) for p in group]
    return out


def build(points: list[Point], coverage: float, widen: float = 1.0, weighted: bool = False) -> dict[str, dict]:
    """{key: row} for every category level with enough runs and sources, and each kind's every-run row:
    the central ``coverage`` of its errors, widened ``widen`` times about their median (``weighted``: each
    source's runs weigh one source in all, :func:`weighted_quantile`)."""
    groups: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        for key in p.category.keys():
            groups[key].append(p)
    tail = (1 - coverage) / 2
    table = {}
    for key, group in groups.items():
        sources = len({p.origin for p in group})
        if key.count("/") == 1 or (len(group) >= MIN_RUNS and sources >= MIN_SOURCES):
            errors = [p.error for p in group]

            def q(x: float, group: list[Point] = group, errors: list[float] = errors) -> float:
                return weighted_quantile(group, x) if weighted else quantile(errors, x)

            mid = q(0.5) if weighted else statistics.median(errors)
            low = max(mid + widen * (q(tail) - mid), -0.95)
            table[key] = {
                "category": key,
                "low": round(low, 4),
                "high": round(mid + widen * (q(1 - tail) - mid), 4),
                "coverage": coverage,
                "widen": widen,
                "runs": len(group),
                "sources": sources,
            }
    return table


def leave_one_source_out(
    points: list[Point], coverage: float, widen: float, weighted: bool = False
) -> list[tuple[Point, float, float, str]]:
    """Each point with the band of the table built without its source: (point, low, high, row used)."""
    out = []
    for origin in sorted({p.origin for p in points}):
        table = build([p for p in points if p.origin != origin], coverage, widen, weighted)
        for p in points:
            if p.origin == origin:
                b = lookup(p.category, table)
                out.append((p, b.low, b.high, b.category) if b else (p, float("-inf"), float("inf"), "none"))
    return out


def scores(banded: list[tuple[Point, float, float, str]]) -> tuple[float, float]:
    """(share of points inside their band, median half-width (high - low) / 2)."""
    inside = sum(lo <= p.error <= hi for p, lo, hi, _ in banded) / len(banded)
    return inside, statistics.median((hi - lo) / 2 for _, lo, hi, _ in banded)


def choose(points: list[Point], weighted: bool = False) -> tuple[float, float]:
    """(coverage, widening): of the pairs whose bands hold TARGET_COVERAGE of the points leave-one-source-out,
    the one of least median half-width (the widest pair when none does)."""
    tried = [(c, w, *scores(leave_one_source_out(points, c, w, weighted))) for c in COVERAGES for w in WIDENINGS]
    good = [t for t in tried if t[2] >= TARGET_COVERAGE]
    c, w, _, _ = min(good, key=lambda t: t[3]) if good else max(tried, key=lambda t: (t[2], -t[3]))
    return c, w


def floored(rows: dict[str, dict], table: dict[str, dict]) -> dict[str, dict]:
    """A thin kind's rows, each at least as wide as the first kind's row of the same profile (an
    out-of-source spread it cannot measure itself is not taken to be smaller than a measured one)."""
    out = {}
    for key, row in rows.items():
        floor = table.get(f"{key.split('/')[0]}/{KINDS[0]}")
        out[key] = (
            row
            if floor is None
            else row | {"low": min(row["low"], floor["low"]), "high": max(row["high"], floor["high"])}
        )
    return out


@dataclass(frozen=True)
class Method:
    """How a table is built and scored: the sets it reads, source-weighted rows or not."""

    sets: tuple[str, ...] = SEEN
    weighted: bool = True


def report(kind: str, points: list[Point], cal: list[Point], pair: tuple[float, float], method: Method) -> list[str]:
    coverage, widen = pair
    lines = [
        f"{kind}: the central {coverage:.0%} of each row's errors, widened {widen:g} times about their median "
        f"(the narrowest pair reaching {TARGET_COVERAGE:.0%} leave-one-source-out on the seen runs, else the most covering)"
        f"{', each source weighing one in all' if method.weighted else ''}; "
        f"{len(points)} seen runs ({', '.join(method.sets)}), {len({p.origin for p in points})} sources",
        "",
        "Leave-one-source-out on the seen runs (each source banded by the table built without it):",
    ]
    for name, pts in (("catalog", points), ("calibrated", cal)):
        if len({p.origin for p in pts}) < MIN_SOURCES:
            lines.append(f"  {name:16s} {len(pts):3d} runs: not measurable, fewer than {MIN_SOURCES} sources")
        elif pts:
            inside, half = scores(leave_one_source_out(pts, coverage, widen, method.weighted))
            lines.append(
                f"  {name:16s} {len(pts):3d} runs: {inside:.0%} inside their band, median half-width {half:.1%}"
            )
    lines += [
        "",
        "| run | source | category | e = published/predicted - 1 | band (LOSO) | row |",
        "|---|---|---|---:|---|---|",
    ]
    for p, lo, hi, row in leave_one_source_out(points, coverage, widen, method.weighted):
        mark = "" if lo <= p.error <= hi else " (outside)"
        lines.append(
            f"| {p.id} | {p.origin} | {p.category.keys()[0]} | {p.error:+.1%} | {lo:+.1%} .. {hi:+.1%}{mark} | {row} |"
        )
    return lines


def toml_text(table: dict[str, dict]) -> str:
    head = [
        "# The band the planner prints around step time, tokens/s, days and cost (src/meshwise/plan/band.py).",
        "# Written by benchmarks/band.py from the time model's errors on the published runs already seen",
        "# (benchmarks/fidelity.py --set dev|test|test2): e = published step / predicted step - 1; each row holds the",
        "# central `coverage` of its runs' e, widened `widen` times about their median.",
        "# Do not edit: rerun `python benchmarks/band.py`.",
        "",
    ]
    rows = []
    for key in sorted(table):
        r = table[key]
        rows += [
            "[[band]]",
            f'category = "{key}"',
            f"low = {r['low']}",
            f"high = {r['high']}",
            f"coverage = {r['coverage']}",
            f"widen = {r['widen']}",
            f"runs = {r['runs']}",
            f"sources = {r['sources']}",
            "",
        ]
    return "\n".join(head + rows)


def table_of(points: list[Point], method: Method) -> tuple[dict[str, dict], list[str]]:
    """The band table of ``points`` (catalog and calibrated rows, each kind's own pair; a thin kind borrows
    the first kind's pair and floor) and the report's lines."""
    cal = calibrated(points)
    table, lines, pairs = {}, [], {}
    for kind in KINDS:  # dense first: a thin kind borrows its pair and its floor
        pts, cal_pts = [p for p in points if p.category.kind == kind], [p for p in cal if p.category.kind == kind]
        thin = len({p.origin for p in pts}) < MIN_SOURCES
        pairs[kind] = pairs[KINDS[0]] if thin else choose(pts, method.weighted)
        rows = build(pts, *pairs[kind], method.weighted) | build(cal_pts, *pairs[kind], method.weighted)
        table |= floored(rows, table) if thin else rows
        lines += report(kind, pts, cal_pts, pairs[kind], method)
        if thin:
            lines.append(
                f"  ({kind} has fewer than {MIN_SOURCES} sources: {KINDS[0]}'s coverage and widening, its rows no "
                f"narrower than {KINDS[0]}'s)"
            )
        lines.append("")
    return table, lines


def held_out(table: dict[str, dict], points: list[Point], name: str) -> list[str]:
    """A later set banded by a table built without it: per kind, the share inside and the median half-width."""
    lines = [f"{name}, banded by the table built from the sets before it:"]
    for kind in KINDS:
        bands = [(p, lookup(p.category, table)) for p in points if p.category.kind == kind]
        if bands:
            inside = sum(b.low <= p.error <= b.high for p, b in bands) / len(bands)
            half = statistics.median((b.high - b.low) / 2 for _, b in bands)
            lines.append(
                f"  {kind:16s} {len(bands):3d} runs: {inside:.0%} inside their band, median half-width {half:.1%}"
            )
    return lines


def _args(argv: list[str]) -> tuple[Method, str | None, bool]:
    """(method, held-out set or None, dry run) from ``--seen A,B``, ``--holdout SET``, ``--equal-runs``,
    ``--dry-run``."""
    opts = dict(zip(argv, [*argv[1:], ""][: len(argv)], strict=True))
    holdout = opts.get("--holdout") or None
    sets = tuple(opts["--seen"].split(",")) if "--seen" in opts else SEEN
    if holdout:
        sets = ALL_SETS[: ALL_SETS.index(holdout)]
    return Method(sets, "--equal-runs" not in argv), holdout, "--dry-run" in argv or holdout is not None


def main(argv: list[str]) -> None:
    method, holdout, dry = _args(argv)
    table, lines = table_of(seen_points(method.sets), method)
    if holdout:
        lines += held_out(table, seen_points((holdout,)), holdout)
    print("\n".join(lines))
    if dry:
        return
    TABLE.write_text(toml_text(table))
    RESULT.write_text("\n".join(lines) + "\n")
    print(f"\nwritten: {TABLE.relative_to(ROOT)}, {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
