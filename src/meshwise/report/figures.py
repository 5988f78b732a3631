"""The figures, each rendered to PNG bytes with matplotlib's non-interactive Agg backend."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from meshwise.cost.pipeline import Op  # noqa: E402

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2", "other": "#CCB974",
          "F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
GB = 1e9


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def memory_bars(labels: Sequence[str], memories: Sequence[dict[str, float]], capacity_bytes: float,
                usable_bytes: float, title: str = "memory per rank (largest rank)") -> bytes:
    """Stacked bars of the memory categories per layout, against the device capacity."""
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels) + 2), 4.2))
    xs = range(len(labels))
    bottom = [0.0] * len(labels)
    for cat in CATEGORIES:
        vals = [m[cat] / GB for m in memories]
        ax.bar(xs, vals, bottom=bottom, color=COLORS[cat], label=cat, width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(capacity_bytes / GB, color="black", linewidth=1.2, label="capacity")
    ax.axhline(usable_bytes / GB, color="black", linewidth=0.8, linestyle="--", label="usable (headroom)")
    ax.set_xticks(list(xs), [f"#{i + 1}" for i in xs])
    ax.set_ylabel("GB")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for i, label in enumerate(labels):
        ax.annotate(label, (i, 0), xytext=(0, -28), textcoords="offset points", ha="center", fontsize=6, rotation=0,
                    wrap=True)
    return _png(fig)


def pipeline_timeline(ops: Sequence[Op], ranks: int, title: str, unit: str = "s") -> bytes:
    """Ranks x time: forward, backward (and weight-gradient) boxes per micro-batch; gaps are the bubble."""
    fig, ax = plt.subplots(figsize=(10, 0.45 * ranks + 1.6))
    for op in ops:
        ax.barh(op.rank, op.end - op.start, left=op.start, height=0.8, color=COLORS[op.kind], edgecolor="white",
                linewidth=0.4)
        if len(ops) <= 24 * ranks * 3 and op.end > op.start:
            ax.text((op.start + op.end) / 2, op.rank, str(op.microbatch), ha="center", va="center", fontsize=6,
                    color="white")
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


def scaling_curve(gpus: Sequence[int], tokens_per_s: Sequence[float], mfu: Sequence[float], title: str) -> bytes:
    """Predicted throughput and MFU as the GPU count grows (the layouts go in a table beside it)."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.plot(gpus, tokens_per_s, marker="o", color=COLORS["params"], label="tokens/s")
    if gpus:
        ideal = [tokens_per_s[0] * g / gpus[0] for g in gpus]
        ax.plot(gpus, ideal, linestyle=":", color="grey", label="linear from the first point")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
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


def predicted_vs_measured(figures: Sequence[str], predicted: Sequence[float], measured: Sequence[float],
                          title: str) -> bytes:
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
