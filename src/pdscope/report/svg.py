"""Charts as inline SVG: a report that opens anywhere, with no network and no script.

One function, :func:`chart`, draws lines and points on linear axes with ticks, a legend, and
optional shaded bands (the window of an injected prefill, say). Numbers in, a string out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    kind: str = "line"  # "line", "points" or "both"
    dashed: bool = False
    color: str | None = None


@dataclass(frozen=True)
class Band:
    x0: float
    x1: float
    label: str = ""
    color: str = "#fde68a"


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    bands: Sequence[Band] = field(default_factory=tuple)
    y_min: float | None = 0.0
    note: str = ""


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 0.5:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:g}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


def chart(c: Chart, width: int = 640, height: int = 340) -> str:
    """The chart as an ``<svg>`` element. Empty data gives a chart that says so."""
    pts = [p for s in c.series for p in s.points if all(map(math.isfinite, p))]
    left, right, top, bottom = 64, 16, 36, 48
    pw, ph = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}"'
           f' width="{width}" height="{height}" role="img" aria-label="{escape(c.title)}">',
           f'<text x="{left}" y="20" class="chart-title">{escape(c.title)}</text>']  # fmt: skip
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle"'
                   ' class="chart-empty">no data</text></svg>')  # fmt: skip
        return "".join(out)
    xs = [p[0] for p in pts] + [b.x0 for b in c.bands] + [b.x1 for b in c.bands]
    ys = [p[1] for p in pts]
    x_lo, x_hi = min(xs), max(xs)
    y_lo = c.y_min if c.y_min is not None else min(ys)
    y_hi = max(ys)
    xt, yt = nice_ticks(x_lo, x_hi), nice_ticks(min(y_lo, min(ys)), y_hi)
    x_lo, x_hi = min(xt[0], x_lo), max(xt[-1], x_hi)
    y_lo, y_hi = yt[0], yt[-1]

    def sx(x: float) -> float:
        return left + (x - x_lo) / ((x_hi - x_lo) or 1) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y_lo) / ((y_hi - y_lo) or 1) * ph

    for b in c.bands:
        out.append(f'<rect x="{sx(b.x0):.1f}" y="{top}" width="{max(1.0, sx(b.x1) - sx(b.x0)):.1f}"'
                   f' height="{ph}" fill="{b.color}" opacity="0.6"/>')  # fmt: skip
        if b.label:
            out.append(f'<text x="{sx(b.x0) + 3:.1f}" y="{top + 12}" class="band-label">'
                       f"{escape(b.label)}</text>")  # fmt: skip
    for t in yt:
        y = sy(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                   f"{_fmt(t)}</text>")  # fmt: skip
    for t in xt:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}"'
                   f' class="axis"/><text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle"'
                   f' class="tick">{_fmt(t)}</text>')  # fmt: skip
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" class="axis"/>'
               f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" class="axis"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle"'
               f' class="axis-label">{escape(c.x_label)}</text>')  # fmt: skip
    out.append(f'<text transform="translate(14,{top + ph / 2}) rotate(-90)"'
               f' text-anchor="middle" class="axis-label">{escape(c.y_label)}</text>')  # fmt: skip
    for i, s in enumerate(c.series):
        color = s.color or PALETTE[i % len(PALETTE)]
        good = [(x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
        if not good:
            continue
        if s.kind in ("line", "both") and len(good) > 1:
            path = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                            for j, (x, y) in enumerate(good))  # fmt: skip
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}'
                       f' class="series" data-label="{escape(s.label)}"/>')  # fmt: skip
        if s.kind in ("points", "both"):
            r = 2.2 if len(good) > 200 else 3.5
            out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r}" fill="{color}"'
                       ' class="point"/>' for x, y in good)  # fmt: skip
    # Legend, top right.
    lx, ly = left + pw - 6, top + 8
    for i, s in enumerate(c.series):
        color = s.color or PALETTE[i % len(PALETTE)]
        y = ly + i * 16
        out.append(f'<rect x="{lx - 12}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx - 16}" y="{y + 1}" text-anchor="end" class="legend">'
                   f"{escape(s.label)}</text>")  # fmt: skip
    out.append("</svg>")
    if c.note:
        out.append(f'<p class="chart-note">{escape(c.note)}</p>')
    return "".join(out)
