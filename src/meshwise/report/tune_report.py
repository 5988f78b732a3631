"""``meshwise tune ... --report tune.html``: the trials on one page, predicted against measured.

The chart puts each measured trial at (measured step, predicted step) twice: under the profile the
tune started from and under the refitted one; on the diagonal the model and the measurement agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from meshwise.files import write_atomically
from meshwise.report.html import image, page, paragraphs, table


def predicted_against_measured(
    measured_s: Sequence[float], before_s: Sequence[float], after_s: Sequence[float], title: str
) -> bytes:
    from meshwise.report.figures import COLORS, _png, plt  # matplotlib: only when the page is drawn

    fig, ax = plt.subplots(figsize=(5.5, 5))
    top = max([*measured_s, *before_s, *after_s, 1e-9]) * 1.1
    ax.plot([0, top], [0, top], color="#999", linewidth=1, label="predicted = measured")
    ax.scatter(measured_s, before_s, color=COLORS["params"], marker="o", label="starting profile")
    ax.scatter(measured_s, after_s, color=COLORS["B"], marker="x", label="refitted profile")
    for i, (m, b) in enumerate(zip(measured_s, before_s), 1):
        ax.annotate(str(i), (m, b), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (s)")
    ax.set_ylabel("predicted step (s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def write_tune_report(
    path: str | Path,
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    points: Sequence[tuple[float, float, float]],
    lines: Sequence[str],
) -> None:
    """``points``: (measured, predicted before, predicted after) of each measured trial, in table order."""
    measured, before, after = ([p[i] for p in points] for i in range(3))
    chart = image(predicted_against_measured(measured, before, after, title), "predicted against measured step")
    write_atomically(
        path,
        page(
            title,
            [("Summary", paragraphs(lines)), ("Predicted against measured", chart), ("Trials", table(header, rows))],
        ),
    )
