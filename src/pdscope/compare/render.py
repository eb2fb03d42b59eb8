"""A comparison as text: cells for a terminal table, Markdown for a pull-request comment, and
a self-contained HTML page with each side's distributions drawn on one chart."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdscope.charts import Chart, Series
from pdscope.compare.comparison import Comparison, Row
from pdscope.compare.runs import Side
from pdscope.report.fmt import rate, seconds
from pdscope.report.html import Table, page

HEAD = ("figure", "A", "B", "change", "95% interval", "p", "verdict")
# Points of a drawn distribution (quantiles of the pooled samples).
CURVE_POINTS = 101


def value(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    if unit == "s":
        return seconds(x)
    if unit == "share":
        return f"{100 * x:.1f}%"
    if unit == "users":
        return f"{x:g}"
    return rate(x, unit)


def cells(r: Row) -> list[str]:
    """One row's cells, in :data:`HEAD` order."""
    change = "—" if r.delta_pct is None else f"{r.delta_pct:+.1f}%"
    ci = ("—" if r.ci_low_pct is None or r.ci_high_pct is None
          else f"{r.ci_low_pct:+.1f}% … {r.ci_high_pct:+.1f}%")
    p = "—" if r.p_value is None else (f"{r.p_value:.3f}" if r.p_value >= 0.001 else "<0.001")
    return [r.label, value(r.a, r.unit), value(r.b, r.unit),
            change, ci, p, r.verdict]


def geomean_cells(c: Comparison) -> list[str]:
    g = "—" if c.geomean_pct is None else f"{c.geomean_pct:+.1f}% (better > 0)"
    return ["geomean", "", "", g, "", "", ""]


def markdown(c: Comparison) -> str:
    """A pull-request comment: the table, the findings that changed, the notes."""
    lines = [f"**pdscope compare**: `{c.b}` against `{c.a}` (changes under"
             f" {100 * c.threshold:g}% or with p ≥ {c.alpha:g} are `~`)", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in c.rows:
        row = cells(r)
        if r.verdict != "~":
            row[-1] = f"**{r.verdict}**"
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| " + " | ".join(geomean_cells(c)) + " |")
    if c.findings:
        lines += ["", "Findings that changed:", ""]
        lines += [f"- {f.change}: {f.title} ({f.a or '—'} → {f.b or '—'})" for f in c.findings]
    if c.differences:
        lines += ["", "Compared although unlike: " + "; ".join(c.differences)]
    if c.notes:
        lines += ["", *(f"<sub>{n}</sub>  " for n in c.notes)]
    return "\n".join(lines) + "\n"


def distribution_charts(a: Side, b: Side) -> list[Chart]:
    """TTFT and ITL (and E2E) of each side as quantile curves on one chart each."""
    out = []
    for key, title in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "End-to-end time")):
        series = []
        for side, name in ((a, f"A: {a.label}"), (b, f"B: {b.label}")):
            runs = side.series(key)
            if not runs:
                continue
            pooled = np.concatenate(runs)
            qs = np.linspace(0, 100, CURVE_POINTS)
            series.append(Series(name, tuple(float(q) for q in qs),
                                 tuple(float(v) * 1000 for v in np.percentile(pooled, qs))))
        if len(series) == 2:
            out.append(Chart(f"compare-{key}", f"{title}: each side's distribution",
                             "percentile", "ms", tuple(series)))
    return out


def html(c: Comparison, a: Side, b: Side) -> str:
    rows: Sequence[Sequence[str]] = [*(cells(r) for r in c.rows), geomean_cells(c)]
    tables: list[Table] = [("Figures (95% intervals; B against A)", HEAD, rows)]
    if c.findings:
        tables.append(("Findings that changed", ("finding", "change", "A", "B"),
                       [[f.title, f.change, f.a or "—", f.b or "—"] for f in c.findings]))
    return page(title=f"pdscope compare: {c.b} against {c.a}",
                subtitle=f"{len(a.runs)} run(s) against {len(b.runs)}; changes under"
                         f" {100 * c.threshold:g}% or with p ≥ {c.alpha:g} are ~",
                tables=tables, charts=distribution_charts(a, b),
                notes=[*c.notes, *(f"unlike: {d}" for d in c.differences)])
