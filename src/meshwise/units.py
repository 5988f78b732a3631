"""Units as the tables and explanations print them: decimal gigabytes (1 GB = 1e9 bytes)."""

from __future__ import annotations

GB = 1e9


def gb_text(bytes_: float, unit: bool = True) -> str:
    """Bytes as GB to one decimal (``unit``: with " GB"; below 0.1 GB as MB, so a small model's
    figures are not all 0.0 GB). Without ``unit``, the bare number for a column headed GB."""
    if not unit:
        return f"{bytes_ / GB:,.1f}"
    return f"{bytes_ / GB:,.1f} GB" if abs(bytes_) >= 0.1 * GB or bytes_ == 0 else f"{bytes_ / 1e6:,.1f} MB"
