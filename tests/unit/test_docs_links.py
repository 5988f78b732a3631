"""Results files and the documents that cite them: every file in ``benchmarks/results/`` is named in
the README or a page of ``docs/``, and every ``benchmarks/results/NAME`` those documents name exists.

Both sides are read from the tree, so a results file renamed together with its citation keeps the
test green; one renamed alone fails it. A citation with a placeholder
(``benchmarks/results/gpu-check-<device>.txt``, written per device) names no single file and is
not checked. README's table cells stay at most README_CELL_MAX characters.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# benchmarks/results/NAME, NAME with its extension and no placeholder character (<, {, *)
CITATION = re.compile(r"benchmarks/results/([A-Za-z0-9_.+-]+\.[A-Za-z0-9]+)(?![A-Za-z0-9_<{*-])")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _cited() -> dict[str, list[str]]:
    """Each results file name the documents cite, with the documents citing it."""
    cited: dict[str, list[str]] = {}
    for doc in _documents():
        for name in CITATION.findall(doc.read_text(encoding="utf-8")):
            cited.setdefault(name, []).append(str(doc.relative_to(ROOT)))
    return cited


def _results() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_file() and not p.name.startswith("."))


def test_the_pattern_reads_citations_as_the_documents_write_them():
    text = (
        "[results](benchmarks/results/fidelity-dev.txt), `benchmarks/results/plan-speed-cpu2core.txt`; "
        "writes benchmarks/results/gpu-check-<device>.txt and ../benchmarks/results/band-dev.txt."
    )
    assert CITATION.findall(text) == ["fidelity-dev.txt", "plan-speed-cpu2core.txt", "band-dev.txt"]


def test_every_results_file_is_cited():
    cited = _cited()
    uncited = [name for name in _results() if name not in cited]
    assert not uncited, f"benchmarks/results/ files that README.md and docs/ never name: {uncited}"


def test_every_cited_results_file_exists():
    missing = {name: docs for name, docs in _cited().items() if not (RESULTS / name).is_file()}
    assert not missing, f"results files cited but absent from benchmarks/results/: {missing}"


README_CELL_MAX = 200  # characters: one figure per cell, the method and the rest in the page it links


def _long_cells(text: str) -> list[str]:
    """The table cells of ``text`` over README_CELL_MAX characters (cells split on unescaped ``|``)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [c.strip() for line in lines for c in re.split(r"(?<!\\)\|", line) if len(c.strip()) > README_CELL_MAX]


def test_readme_table_cells_stay_short():
    long = _long_cells((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not long, f"README cells over {README_CELL_MAX} characters: {[c[:60] for c in long]}"


def test_the_check_sees_a_long_cell():
    assert _long_cells("| a | " + "x \\| y " * 40 + " |")
    assert not _long_cells("| a | short \\| cell |")
