"""The doctor's report as one self-contained HTML file: no network, no script, charts in SVG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from pdscope.report.svg import Chart, chart

_CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111827;
background:#f9fafb}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:32px 0 12px}
.sub{color:#4b5563;margin:0 0 16px}
.phases{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px}
.card h3{margin:0 0 8px;font-size:16px}
.big{font-size:28px;font-weight:650}
.meter{height:10px;background:#e5e7eb;border-radius:5px;overflow:hidden;margin:8px 0 4px}
.meter span{display:block;height:100%;background:#2563eb}
.finding{background:#fff;border:1px solid #e5e7eb;border-left:6px solid #9ca3af;border-radius:8px;
padding:12px 16px;margin:10px 0}
.finding.high{border-left-color:#dc2626}.finding.medium{border-left-color:#ea580c}
.finding.low{border-left-color:#ca8a04}.finding.info{border-left-color:#2563eb}
.finding h3{margin:0;font-size:16px}.tag{font-size:12px;color:#6b7280;margin-left:8px}
.finding ul{margin:8px 0 0 18px;padding:0}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.chart-box{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:8px}
svg.chart{width:100%;height:auto}
.chart-title{font-weight:600;font-size:14px}.tick,.legend,.band-label{font-size:11px;fill:#374151}
.axis-label{font-size:12px;fill:#374151}.grid{stroke:#e5e7eb}.axis{stroke:#6b7280}
.chart-empty{fill:#9ca3af}.chart-note{font-size:12px;color:#6b7280;margin:4px 8px}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #e5e7eb;padding:4px 8px;
text-align:right;font-size:13px}th{background:#f3f4f6}td:first-child,th:first-child{text-align:left}
details{margin:8px 0}pre{background:#111827;color:#e5e7eb;padding:12px;border-radius:8px;
overflow:auto;font-size:12px;max-height:480px}
@media (max-width:800px){.phases,.charts{grid-template-columns:1fr}}
"""


@dataclass(frozen=True)
class PhaseCard:
    """One phase beside its ceiling, for the top of the report."""

    name: str  # "Prefill" or "Decode"
    headline: str  # "0.34 s TTFT" / "60.4 tok/s"
    rate: float | None
    ceiling: float | None
    unit: str
    lines: Sequence[str]
    at_least: bool = False  # the ceiling is a measurement that beat the specs' (roofline.Held)

    @property
    def fraction(self) -> float | None:
        """The rate's share of the ceiling, never above 1: a ceiling below the measurement
        is a wrong ceiling, and the caller holds it at the measurement (``at_least``)."""
        if self.rate is None or not self.ceiling:
            return None
        return min(1.0, self.rate / self.ceiling)

    @property
    def ceiling_text(self) -> str:
        """The ceiling as printed: "at least" it when a measurement beat the specs'."""
        if self.ceiling is None:
            return "—"
        return f"{'at least ' if self.at_least else ''}{self.ceiling:,.0f}"


def _card(p: PhaseCard) -> str:
    meter = ""
    frac = p.fraction
    if frac is not None:
        width = max(1.0, min(100.0, frac * 100))
        meter = (f'<div class="meter" title="{frac:.0%} of the ceiling"><span style="width:'
                 f'{width:.1f}%"></span></div><div>{p.rate:,.1f} of {p.ceiling_text} {p.unit}'
                 f" the hardware allows: <b>{frac:.0%}</b></div>")  # fmt: skip
    lines = "".join(f"<div>{escape(line)}</div>" for line in p.lines)
    return (f'<div class="card"><h3>{escape(p.name)}</h3><div class="big">'
            f"{escape(p.headline)}</div>{meter}{lines}</div>")  # fmt: skip


def _finding(f: dict[str, Any]) -> str:
    advice = "".join(f"<li>{escape(a)}</li>" for a in f.get("advice") or [])
    ul = f"<ul>{advice}</ul>" if advice else ""
    return (f'<div class="finding {escape(f["severity"])}" id="{escape(f["id"])}"><h3>'
            f'{escape(f["title"])}<span class="tag">{escape(f["id"])} · {escape(f["severity"])}'
            f'</span></h3><div>{escape(f["reason"])}</div>{ul}</div>')  # fmt: skip


def render(
    *,
    title: str,
    subtitle: str,
    phases: Sequence[PhaseCard],
    findings: Sequence[dict[str, Any]],
    charts: Sequence[Chart],
    tables: Sequence[Table] = (),
    raw: dict[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> str:
    """The whole report. ``findings`` are the rules' JSON (``Finding.to_json()``);
    ``warnings`` are shown under the phases (a ceiling a measurement beat, and why)."""
    fired = [f for f in findings if f["status"] == "fired"]
    clear = [f for f in findings if f["status"] == "clear"]
    missing = [f for f in findings if f["status"] == "insufficient"]
    parts = [
        _head(title, subtitle),
        '<h2>The two phases, each beside its ceiling</h2><div class="phases">',
        *(_card(p) for p in phases),
        "</div>",
        *(f'<p class="chart-note">warning: {escape(w)}</p>' for w in warnings),
        f"<h2>What to change ({len(fired)} findings)</h2>",
        *(_finding(f) for f in fired),
    ]
    if not fired:
        parts.append("<p>Nothing to change was found in what could be measured.</p>")
    parts.extend(_charts(charts))
    parts.extend(_tables(tables))
    if clear:
        parts.append(f"<details><summary>Checked and clear ({len(clear)})</summary>")
        parts.extend(_finding(f) for f in clear)
        parts.append("</details>")
    if missing:
        parts.append(f"<details><summary>Not enough evidence ({len(missing)})</summary>")
        parts.extend(_finding(f) for f in missing)
        parts.append("</details>")
    if raw is not None:
        text = json.dumps(raw, indent=2, default=str)
        parts.append(f"<details><summary>Raw numbers</summary><pre>{escape(text)}</pre></details>")
    parts.append(_FOOT)
    return "".join(parts)


Table = tuple[str, Sequence[str], Sequence[Sequence[str]]]
_FOOT = ("<p class=\"sub\">Made by pdscope. Definitions: the README's \"Definitions\".</p>"
         "</main></body></html>")


def _head(title: str, subtitle: str) -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><meta name=\"viewport\" content=\"width=device-width\">"
            f"<style>{_CSS}</style></head><body><main>"
            f"<h1>{escape(title)}</h1><p class=\"sub\">{escape(subtitle)}</p>")


def _charts(charts: Sequence[Chart]) -> list[str]:
    return ['<h2>Charts</h2><div class="charts">',
            *(f'<div class="chart-box">{chart(c)}</div>' for c in charts), "</div>"]


def _tables(tables: Sequence[Table]) -> list[str]:
    parts = []
    for caption, head, rows in tables:
        parts.append(f"<h2>{escape(caption)}</h2><table><tr>")
        parts.extend(f"<th>{escape(h)}</th>" for h in head)
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    return parts


def page(*, title: str, subtitle: str, tables: Sequence[Table], charts: Sequence[Chart],
         notes: Sequence[str] = ()) -> str:
    """A plain page: tables first, then charts, then notes (``pdscope compare --html``)."""
    parts = [_head(title, subtitle), *_tables(tables), *_charts(charts)]
    parts.extend(f'<p class="sub">{escape(n)}</p>' for n in notes)
    parts.append(_FOOT)
    return "".join(parts)
