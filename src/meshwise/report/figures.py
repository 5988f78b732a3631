"""The figures, each rendered to PNG bytes with matplotlib's non-interactive Agg backend."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.text  # noqa: E402
import matplotlib.ticker  # noqa: E402

from meshwise.cost.pipeline import Op  # noqa: E402

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
COLORS = {
    "params": "#4C72B0",
    "grads": "#55A868",
    "optimizer": "#C44E52",
    "activations": "#8172B2",
    "other": "#CCB974",
    "F": "#4C72B0",
    "B": "#DD8452",
    "W": "#55A868",
}
GB = 1e9


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _wrapped(label: str, width: int = 36) -> str:
    """A layout's text on lines of at most ``width`` characters, broken after its commas."""
    lines, line = [], ""
    for part in label.split(","):
        piece = part if not line else "," + part
        if line and len(line) + len(piece) > width:
            lines.append(line + ",")
            line = part
        else:
            line += piece
    return "\n".join(lines + [line])


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of ``fig`` whose drawn boxes overlap (what makes labels
    unreadable), from matplotlib's own extents at the figure's dpi."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [
        t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip() and t.figure is fig
    ]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    out = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1 :]:
            if box_a.overlaps(box_b) and box_a.width > 0 and box_b.width > 0:
                inter_w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
                inter_h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
                if inter_w > 1 and inter_h > 1:  # more than a pixel: touching edges are not overlap
                    out.append((a, b))
    return out


def memory_bars(
    labels: Sequence[str],
    memories: Sequence[dict[str, float]],
    capacity_bytes: float,
    usable_bytes: float,
    title: str = "memory per rank (largest rank)",
) -> bytes:
    """Stacked horizontal bars of the memory categories per layout, against the device capacity; each
    layout's text on its own row beside its bar (wrapped after commas), so no two labels share a line."""
    wrapped = [f"#{i + 1} {_wrapped(label)}" for i, label in enumerate(labels)]
    rows = [w.count("\n") + 1 for w in wrapped]
    fig, ax = plt.subplots(figsize=(5.5, 1.0 + 0.32 * sum(max(r, 2) for r in rows)))
    ys = list(range(len(labels)))
    left = [0.0] * len(labels)
    for cat in CATEGORIES:
        vals = [m[cat] / GB for m in memories]
        ax.barh(ys, vals, left=left, color=COLORS[cat], label=cat, height=0.6)
        left = [a + v for a, v in zip(left, vals)]
    ax.axvline(capacity_bytes / GB, color="black", linewidth=1.2, label="capacity")
    ax.axvline(usable_bytes / GB, color="black", linewidth=0.8, linestyle="--", label="usable (headroom)")
    ax.set_yticks(ys, wrapped, fontsize=8, family="monospace")
    ax.invert_yaxis()
    ax.set_xlabel("GB per rank")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def pipeline_timeline(ops: Sequence[Op], ranks: int, title: str, unit: str = "s") -> bytes:
    """Ranks x time: forward, backward (and weight-gradient) boxes per micro-batch; gaps are the bubble."""
    fig, ax = plt.subplots(figsize=(8.2, 0.45 * ranks + 1.6))
    for op in ops:
        ax.barh(
            op.rank,
            op.end - op.start,
            left=op.start,
            height=0.8,
            color=COLORS[op.kind],
            edgecolor="white",
            linewidth=0.4,
        )
        if len(ops) <= 24 * ranks * 3 and op.end > op.start:
            ax.text(
                (op.start + op.end) / 2,
                op.rank,
                str(op.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    end = max((op.end for op in ops), default=0.0)
    busy = sum(op.end - op.start for op in ops)
    idle = ranks * end - busy
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{title} - idle {idle / (ranks * end):.1%} of rank-time" if end else title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("F", "B", "W")]
    ax.legend(handles, ["forward", "backward", "weight grad"], fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def scaling_curve(
    gpus: Sequence[int], tokens_per_s: Sequence[float], mfu: Sequence[float], title: str, requested: int | None = None
) -> bytes:
    """Predicted throughput and MFU as the GPU count grows (the layouts go in a table beside it), the
    requested count marked."""
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    if requested:
        ax.axvline(requested, color="grey", linewidth=0.8, linestyle="--", label=f"requested: {requested}")
    ax.plot(gpus, tokens_per_s, marker="o", color=COLORS["params"], label="tokens/s")
    if gpus:
        ideal = [tokens_per_s[0] * g / gpus[0] for g in gpus]
        ax.plot(gpus, ideal, linestyle=":", color="grey", label="linear from the first point")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(gpus), [f"{g:,}" for g in gpus], fontsize=8)
    ax.minorticks_off()
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax2 = ax.twinx()
    ax2.plot(gpus, [100 * m for m in mfu], marker="s", color=COLORS["optimizer"], label="MFU %")
    ax2.set_ylabel("MFU %")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    ax.set_title(title)
    return _png(fig)


def predicted_vs_measured(
    figures: Sequence[str], predicted: Sequence[float], measured: Sequence[float], title: str
) -> bytes:
    """Paired bars per figure, normalised to the prediction, with the relative error printed."""
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(figures) + 2), 4.5))
    xs = list(range(len(figures)))
    ratio = [m / p if p else 0.0 for p, m in zip(predicted, measured)]
    ax.bar([x - 0.2 for x in xs], [1.0] * len(xs), width=0.4, color=COLORS["params"], label="predicted")
    ax.bar([x + 0.2 for x in xs], ratio, width=0.4, color=COLORS["B"], label="measured")
    for x, r in zip(xs, ratio):
        ax.text(x + 0.2, r, f"{r - 1:+.0%}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(xs, figures, rotation=70, ha="right", fontsize=6)
    ax.set_ylabel("measured / predicted")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)
