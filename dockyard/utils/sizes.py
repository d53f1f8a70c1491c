"""Byte counts as people read them (``1.5 GiB``), for tables and refusals."""

from __future__ import annotations


def human_bytes(count: int) -> str:
    """``count`` in the largest binary unit up to GiB that keeps it ≥ 1 (``512 B``,
    ``1.5 GiB``; larger counts stay in GiB)."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"
