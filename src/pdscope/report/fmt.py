"""Number formatting shared by every terminal table."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Bytes in the article's units (1 GB = 10**9 bytes), plus KiB for small per-token figures."""
    if n < 1e3:
        return f"{n:,.0f} B"
    if n < 1e6:
        return f"{n / 1024:,.1f} KiB"
    if n < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.2f} GB"


def human_count(n: float) -> str:
    """Parameter counts as the model cards write them (8.03B, 135M)."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n:,.0f}"


def seconds(s: float | None) -> str:
    """Seconds with a unit fit for the size: 850 µs, 12.3 ms, 1.42 s."""
    if s is None:
        return "—"
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def rate(x: float | None, unit: str = "tok/s") -> str:
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:,.0f} {unit}".rstrip()
    return f"{x:.1f} {unit}".rstrip()
