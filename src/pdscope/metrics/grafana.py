"""A Grafana dashboard of the article's five names, for people who already run Prometheus.

``pdscope watch --grafana-dashboard > dashboard.json`` writes it; import it in Grafana
(Dashboards → New → Import) and pick the Prometheus data source that scrapes the server: every
panel queries the data-source variable ``${DS_PROMETHEUS}``. The metric names come from the
family's :class:`~pdscope.servers.MetricMap` (the current name of each role), so the
dashboard and ``pdscope watch`` never disagree on a name.

The queries are the standard PromQL for these types: a histogram's percentile over the last
minute is ``histogram_quantile(q, sum by (le) (rate(<name>_bucket[1m])))`` (the same
interpolation :func:`~pdscope.metrics.window.quantile` does on two scrapes), gauges are summed
over engines, except KV-cache usage, a ratio, whose fullest engine is shown (``max``).
"""

from __future__ import annotations

from typing import Any

from pdscope.metrics.dashboard import MEANINGS
from pdscope.metrics.signals import FULL_POOL_KV_USAGE
from pdscope.servers import MetricMap

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
RATE_WINDOW = "1m"  # long enough to hold several scrapes at Prometheus' usual 15 s


def _first(family: MetricMap, role: str) -> str | None:
    names = family.names(role)
    return names[0] if names else None


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": True}


def _timeseries(
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    grid: tuple[int, int, int, int],
    *,
    unit: str = "short",
    warn_at: float | None = None,
    max_value: float | None = None,
) -> dict[str, Any]:
    x, y, w, h = grid
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if warn_at is not None:
        steps.append({"color": "orange", "value": warn_at})
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "thresholds": {"mode": "absolute", "steps": steps},
        "custom": {"thresholdsStyle": {"mode": "line" if warn_at is not None else "off"}},
    }
    if max_value is not None:
        defaults["max"] = max_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [_target(expr, legend, chr(ord("A") + i))
                    for i, (expr, legend) in enumerate(targets)],
    }


def _not_exported(title: str, reason: str, grid: tuple[int, int, int, int]) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "type": "text",
        "title": title,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "options": {"mode": "markdown", "content": f"**Not available.** {reason}."},
    }


def _quantiles(name: str, unit: str = "s") -> list[tuple[str, str]]:
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({name}_bucket[{RATE_WINDOW}])))", label)
        for q, label in (("0.5", "p50"), ("0.99", "p99"))
    ]


def grafana_dashboard(family: MetricMap) -> dict[str, Any]:
    """The dashboard JSON for a server of ``family``: the five names first (TTFT and ITL
    percentiles, running, waiting, KV-cache usage), then prefix-cache hit rate, preemptions
    and token throughput where the family exports them. A role the family does not export
    gets a text panel saying why, rather than an empty graph."""
    panels: list[dict[str, Any]] = []

    def histogram_panel(role: str, title: str, grid: tuple[int, int, int, int]) -> None:
        name = _first(family, role)
        if name is None:
            panels.append(_not_exported(title, family.missing_reason(role), grid))
            return
        description = f"{MEANINGS[role]}. p50 and p99 over {RATE_WINDOW} of {name}."
        panels.append(_timeseries(title, description, _quantiles(name), grid, unit="s"))

    def gauge_panel(
        role: str, title: str, grid: tuple[int, int, int, int], **kw: Any
    ) -> None:
        name = _first(family, role)
        if name is None:
            panels.append(_not_exported(title, family.missing_reason(role), grid))
            return
        how = "max" if role == "kv_usage" else "sum"
        description = f"{MEANINGS[role]}. {how}({name})."
        panels.append(_timeseries(title, description, [(f"{how}({name})", title)], grid, **kw))

    histogram_panel("ttft", "Time to first token (TTFT)", (0, 0, 12, 8))
    histogram_panel("itl", "Inter-token latency (ITL)", (12, 0, 12, 8))
    gauge_panel("running", "Requests running", (0, 8, 8, 8))
    gauge_panel("waiting", "Requests waiting", (8, 8, 8, 8), warn_at=1)
    gauge_panel(
        "kv_usage", "KV-cache usage", (16, 8, 8, 8),
        unit="percentunit", warn_at=FULL_POOL_KV_USAGE, max_value=1,
    )

    hits, queries = _first(family, "prefix_hits"), _first(family, "prefix_queries")
    hit_rate = _first(family, "prefix_hit_rate")
    grid = (0, 16, 8, 8)
    title = "Prefix-cache hit rate"
    description = "share of prompt tokens found in the prefix cache: prefill they skipped"
    if hits and queries:
        expr = (
            f"sum(rate({hits}[{RATE_WINDOW}])) / sum(rate({queries}[{RATE_WINDOW}]))"
        )
        panels.append(_timeseries(title, description, [(expr, "hit rate")], grid,
                                  unit="percentunit", max_value=1))
    elif hit_rate:
        panels.append(_timeseries(title, description, [(f"avg({hit_rate})", "hit rate")], grid,
                                  unit="percentunit", max_value=1))
    else:
        panels.append(_not_exported(title, family.missing_reason("prefix_queries"), grid))

    preemptions = _first(family, "preemptions")
    grid = (8, 16, 8, 8)
    if preemptions:
        panels.append(_timeseries(
            "Preemptions a minute",
            "requests preempted: the KV pool ran out mid-decode and their streams paused",
            [(f"sum(increase({preemptions}[{RATE_WINDOW}]))", "preemptions")],
            grid, warn_at=1,
        ))
    else:
        panels.append(
            _not_exported("Preemptions a minute", family.missing_reason("preemptions"), grid)
        )

    targets = [
        (f"sum(rate({name}[{RATE_WINDOW}]))", legend)
        for role, legend in (("prompt_tokens", "prompt (prefill)"),
                             ("generation_tokens", "generated (decode)"))
        if (name := _first(family, role))
    ]
    grid = (16, 16, 8, 8)
    if targets:
        panels.append(_timeseries(
            "Tokens a second",
            "prompt tokens prefilled and tokens generated, a second, all requests together",
            targets, grid,
        ))
    else:
        panels.append(
            _not_exported("Tokens a second", family.missing_reason("prompt_tokens"), grid)
        )

    for i, panel in enumerate(panels, start=1):
        panel["id"] = i
    return {
        "title": f"pdscope: {family.display}, the five names",
        "uid": f"pdscope-{family.name.replace('.', '')}",
        "description": (
            "Prefill shows in TTFT, decode in ITL; waiting > 0 is queueing, and waiting with "
            "KV-cache usage near 1 is a full KV pool. Written by pdscope "
            "(pdscope.metrics.grafana)."
        ),
        "tags": ["pdscope", family.name],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "DS_PROMETHEUS",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                }
            ]
        },
        "panels": panels,
    }
