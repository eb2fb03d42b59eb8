"""Charts as inline SVG: a report that opens anywhere, with no network and no script.

One function, :func:`chart`, draws an experiment's chart data
(:class:`pdscope.charts.Chart`: lines, points or bars on linear axes, with shaded
spans such as the window of an injected prefill) with ticks and a legend. Numbers in, a string
out.
"""

from __future__ import annotations

import math
from html import escape

from pdscope.charts import Chart

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
BAND_COLOR = "#fde68a"


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
    ticks: list[float] = []
    t = start
    while not ticks or ticks[-1] < hi:
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
    series = [(s, [(x, y) for x, y in zip(s.x, s.y, strict=True)
                   if y is not None and math.isfinite(x) and math.isfinite(y)])
              for s in c.series]
    pts = [p for _, good in series for p in good]
    left, right, top, bottom = 64, 16, 36, 48
    pw, ph = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}"'
           f' width="{width}" height="{height}" role="img" aria-label="{escape(c.title)}"'
           f' data-chart="{escape(c.id)}">',
           f'<text x="{left}" y="20" class="chart-title">{escape(c.title)}</text>']
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle"'
                   ' class="chart-empty">no data</text></svg>')
        return "".join(out)
    bars = c.categories is not None
    xs = [p[0] for p in pts] + [b.start for b in c.spans] + [b.end for b in c.spans]
    ys = [p[1] for p in pts]
    if bars:
        xt = [float(i) for i in range(len(c.categories or ()))]
        x_lo, x_hi = -0.6, len(xt) - 0.4
    else:
        xt = nice_ticks(min(xs), max(xs))
        x_lo, x_hi = min(xt[0], min(xs)), max(xt[-1], max(xs))
    yt = nice_ticks(min(0.0, min(ys)), max(ys))
    y_lo, y_hi = yt[0], yt[-1]

    def sx(x: float) -> float:
        return left + (x - x_lo) / ((x_hi - x_lo) or 1) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y_lo) / ((y_hi - y_lo) or 1) * ph

    for b in c.spans:
        out.append(f'<rect x="{sx(b.start):.1f}" y="{top}" width="'
                   f'{max(1.0, sx(b.end) - sx(b.start)):.1f}" height="{ph}" fill="{BAND_COLOR}"'
                   ' opacity="0.6" class="span"/>')
        if b.name:
            out.append(f'<text x="{sx(b.start) + 3:.1f}" y="{top + 12}" class="band-label">'
                       f"{escape(b.name)}</text>")
    for t in yt:
        y = sy(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                   f"{_fmt(t)}</text>")
    for i, t in enumerate(xt):
        x = sx(t)
        label = (c.categories or ())[i] if bars else _fmt(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}"'
                   f' class="axis"/><text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle"'
                   f' class="tick">{escape(label)}</text>')
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" class="axis"/>'
               f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" class="axis"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle"'
               f' class="axis-label">{escape(c.x_label)}</text>')
    out.append(f'<text transform="translate(14,{top + ph / 2}) rotate(-90)"'
               f' text-anchor="middle" class="axis-label">{escape(c.y_label)}</text>')
    for i, (s, good) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if not good:
            continue
        if s.kind == "bar":
            w = pw / max(1, len(xt)) * 0.6
            out.extend(f'<rect x="{sx(x) - w / 2:.1f}" y="{sy(y):.1f}" width="{w:.1f}"'
                       f' height="{max(0.0, sy(0) - sy(y)):.1f}" fill="{color}" class="bar"/>'
                       for x, y in good)
        elif s.kind == "line" and len(good) > 1:
            path = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                            for j, (x, y) in enumerate(good))
            dash = ' stroke-dasharray="6 4"' if "ceiling" in s.name.lower() else ""
            out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}'
                       f' class="series" data-label="{escape(s.name)}"/>')
        else:
            r = 2.2 if len(good) > 200 else 3.5
            out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r}" fill="{color}"'
                       ' class="point"/>' for x, y in good)
    lx, ly = left + pw - 6, top + 8
    for i, (s, _) in enumerate(series):
        y = ly + i * 16
        out.append(f'<rect x="{lx - 12}" y="{y - 8}" width="10" height="10"'
                   f' fill="{PALETTE[i % len(PALETTE)]}"/><text x="{lx - 16}" y="{y + 1}"'
                   f' text-anchor="end" class="legend">{escape(s.name)}</text>')
    out.append("</svg>")
    return "".join(out)
