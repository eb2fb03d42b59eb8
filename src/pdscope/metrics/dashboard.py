"""The dashboard of one window: the article's five names, then what they mean together.

Pure functions from a :class:`~pdscope.metrics.window.Window` to rows of text and to one JSON
object, so that ``pdscope watch``, a report or a notebook show a window the same way. Nothing
here does I/O or knows about terminals: a :class:`Row` carries a level (``ok``, ``warn``,
``unknown``) and the caller picks the colour.

The five names come first, in the article's order of reading them: is the batch full
(running), does anyone wait (waiting), is the KV pool full (KV-cache usage), and the two
latencies the user sees (TTFT, ITL), each percentile stated with the bucket it was read from,
since a histogram knows a value only to within its bucket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast, get_args

from pdscope.metrics.signals import (
    FULL_POOL_KV_USAGE,
    Level,
    Queueing,
    Signal,
    achieved_bandwidth_gb_s,
    classify_queueing,
    signals,
)
from pdscope.metrics.window import Window, from_json, to_json
from pdscope.servers import MetricMap

# The one-line meaning of each of the five names (the article's reading of each).
MEANINGS = {
    "running": "requests in the batch, being prefilled or decoded",
    "waiting": "requests not started yet: time spent here is queueing, not the model",
    "kv_usage": "share of the KV pool in use; near 100% new requests wait for blocks",
    "ttft": "time to first token: queueing plus prefill of the whole prompt",
    "itl": "gap between two tokens of a stream: one decode step",
    "ttft_p99": "the slowest 1% of first tokens: what an unlucky user waits",
    "itl_p99": "the longest 1% of gaps: stalls, as when a prefill joins the batch",
}

SIGNAL_LABELS = {
    "queueing": "queueing",
    "prefix_cache_hit_rate": "prefix-cache hits",
    "preemptions": "preemptions",
    "mean_iteration_tokens": "tokens a step",
    "achieved_bandwidth_gb_s": "bandwidth",
}


@dataclass(frozen=True)
class Row:
    """One line of the dashboard. ``value`` is already formatted ("—" when unknown);
    ``meaning`` says what the value means, or why it is unknown; ``metric`` is the server's
    name for it, where it is one metric."""

    id: str
    label: str
    value: str
    level: Level
    meaning: str
    metric: str = ""


def format_seconds(seconds: float) -> str:
    """``0.21 s``, ``1.3 s``, ``28 ms``, ``4.2 ms``: three significant figures at most."""
    if seconds >= 1:
        return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:,.0f} s"
    ms = seconds * 1000
    if ms >= 10 or ms == 0:
        return f"{ms:.0f} ms"
    return f"{ms:.2g} ms" if ms >= 1 else f"{ms:.2f} ms"


def _bound(value: float, unit: str) -> str:
    number = value * 1000 if unit == "ms" else value
    return f"{number:g}"


def format_quantile(value: float, bounds: tuple[float, float] | None) -> str:
    """A percentile with the bucket it was read from: ``0.21 s (bucket 0.1–0.25 s)``.

    A percentile in the ``+Inf`` bucket is only a floor: ``≥ 80 s (above the last bucket)``.
    """
    if bounds is None:
        return format_seconds(value)
    lower, upper = bounds
    if math.isinf(upper):
        return f"≥ {format_seconds(value)} (above the last bucket)"
    unit = "ms" if upper < 1 else "s"
    low = max(lower, 0.0)
    return f"{format_seconds(value)} (bucket {_bound(low, unit)}–{_bound(upper, unit)} {unit})"


def five_names(window: Window, family: MetricMap) -> list[Row]:
    """Running, waiting, KV-cache usage, TTFT p50/p99 and ITL p50/p99, each row with the
    family's own metric name in ``metric``."""

    def name(role: str) -> str:
        names = family.names(role)
        return names[0] if names else ""

    rows: list[Row] = []
    for key, role, label in (
        ("num_requests_running", "running", "running"),
        ("num_requests_waiting", "waiting", "waiting"),
    ):
        value = getattr(window, key)
        if value is None:
            rows.append(Row(key, label, "—", "unknown", window.missing.get(key, ""), name(role)))
            continue
        level: Level = "warn" if role == "waiting" and value > 0 else "ok"
        rows.append(Row(key, label, f"{value:g}", level, MEANINGS[role], name(role)))

    kv = window.kv_cache_usage
    if kv is None:
        reason = window.missing.get("kv_cache_usage", "")
        rows.append(
            Row("kv_cache_usage", "KV-cache usage", "—", "unknown", reason, name("kv_usage"))
        )
    else:
        level = "warn" if kv >= FULL_POOL_KV_USAGE else "ok"
        rows.append(
            Row("kv_cache_usage", "KV-cache usage", f"{kv:.1%}", level, MEANINGS["kv_usage"],
                name("kv_usage"))
        )

    for role, label in (("ttft", "TTFT"), ("itl", "ITL")):
        for q in ("p50", "p99"):
            key = f"{role}_{q}_s"
            value = getattr(window, key)
            if value is None:
                reason = window.missing.get(key, "not reported")
                rows.append(Row(key, f"{label} {q}", "—", "unknown", reason, name(role)))
                continue
            text = format_quantile(value, window.resolution.get(key))
            meaning = MEANINGS[role] if q == "p50" else MEANINGS[f"{role}_p99"]
            rows.append(Row(key, f"{label} {q}", text, "ok", meaning, name(role)))
    return rows


def _signal_value(signal: Signal) -> str:
    value = signal.value
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if signal.id == "prefix_cache_hit_rate":
        return f"{value:.1%}"
    if signal.id == "mean_iteration_tokens":
        return f"{value:.1f}"
    if signal.id == "achieved_bandwidth_gb_s":
        return f"{value:,.1f} GB/s"
    return f"{value:g}"


def signal_rows(window: Window, *, ceiling_gb_s: float | None = None) -> list[Row]:
    """The derived signals as rows; ``ceiling_gb_s`` sets the bandwidth beside a device's."""
    return [
        Row(s.id, SIGNAL_LABELS.get(s.id, s.id), _signal_value(s), s.level, s.meaning)
        for s in signals(window, ceiling_gb_s=ceiling_gb_s)
    ]


def dashboard_rows(
    window: Window, family: MetricMap, *, ceiling_gb_s: float | None = None
) -> tuple[list[Row], list[Row]]:
    """The five names and the signals, in display order."""
    return five_names(window, family), signal_rows(window, ceiling_gb_s=ceiling_gb_s)


def _queueing(x: Any) -> Queueing | None:
    return cast(Queueing, x) if x in get_args(Queueing) else None


@dataclass(frozen=True)
class Peak:
    """The scrape of a run at which most requests waited
    (:func:`~pdscope.metrics.recorder.peak_waiting_window`): its gauges and why they waited."""

    num_requests_waiting: float | None
    num_requests_running: float | None
    kv_cache_usage: float | None
    queueing: Queueing | None

    @classmethod
    def of(cls, window: Window) -> Peak:
        return cls(window.num_requests_waiting, window.num_requests_running,
                   window.kv_cache_usage, classify_queueing(window))

    def to_json(self) -> dict[str, Any]:
        return {"num_requests_waiting": self.num_requests_waiting,
                "num_requests_running": self.num_requests_running,
                "kv_cache_usage": self.kv_cache_usage, "queueing": self.queueing}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Peak:
        return cls(d.get("num_requests_waiting"), d.get("num_requests_running"),
                   d.get("kv_cache_usage"), _queueing(d.get("queueing")))


_WINDOW_FIELDS = frozenset(f.name for f in fields(Window))


@dataclass(frozen=True)
class WindowRecord:
    """A window as pdscope saves it (``pdscope watch --json``, a bench stage's
    ``server_metrics``): the :class:`Window`, its queueing class and achieved bandwidth (with
    the device's ceiling where one was given) and, for a load stage, its :class:`Peak`.
    ``missing``: why ``queueing`` or ``achieved_bandwidth_gb_s`` is ``None`` (the window's
    own reasons are in ``window.missing``)."""

    window: Window
    queueing: Queueing | None
    achieved_bandwidth_gb_s: float | None
    bandwidth_ceiling_gb_s: float | None = None
    missing: Mapping[str, str] = field(default_factory=dict)
    peak: Peak | None = None

    @classmethod
    def of(cls, window: Window, *, ceiling_gb_s: float | None = None,
           peak: Peak | None = None) -> WindowRecord:
        by_id = {s.id: s for s in signals(window, ceiling_gb_s=ceiling_gb_s)}
        queueing, bandwidth = classify_queueing(window), achieved_bandwidth_gb_s(window)
        missing = {}
        if queueing is None:
            missing["queueing"] = by_id["queueing"].meaning
        if bandwidth is None:
            missing["achieved_bandwidth_gb_s"] = by_id["achieved_bandwidth_gb_s"].meaning
        return cls(window, queueing, bandwidth, ceiling_gb_s, missing, peak)

    def to_json(self) -> dict[str, Any]:
        """Every :class:`Window` field, ``queueing`` and ``achieved_bandwidth_gb_s``, then
        ``resolution`` and ``missing`` (a reason for every ``null``), then ``peak``."""
        out = to_json(self.window)
        missing = {**out.pop("missing"), **self.missing}
        resolution = out.pop("resolution")
        out["queueing"] = self.queueing
        out["achieved_bandwidth_gb_s"] = self.achieved_bandwidth_gb_s
        if self.bandwidth_ceiling_gb_s is not None:
            out["bandwidth_ceiling_gb_s"] = self.bandwidth_ceiling_gb_s
        out["resolution"] = resolution
        out["missing"] = missing
        if self.peak is not None:
            out["peak"] = self.peak.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WindowRecord:
        """A record as :meth:`to_json` wrote it. ``KeyError``, ``TypeError``, ``ValueError``
        or ``AttributeError`` when it is not one."""
        missing = dict(d.get("missing") or {})
        own = {k: v for k, v in missing.items() if k in _WINDOW_FIELDS}
        window = from_json({**d, "missing": own})
        peak = d.get("peak")
        return cls(window, _queueing(d.get("queueing")), d.get("achieved_bandwidth_gb_s"),
                   d.get("bandwidth_ceiling_gb_s"),
                   {k: str(v) for k, v in missing.items() if k not in _WINDOW_FIELDS},
                   None if peak is None else Peak.from_json(peak))


def window_record(window: Window, *, ceiling_gb_s: float | None = None) -> dict[str, Any]:
    """One JSON object for a window (:meth:`WindowRecord.to_json`): every :class:`Window`
    field, the queueing class and the achieved bandwidth, with a reason in ``missing`` for
    every ``null``.

    ``queueing`` is ``none``, ``capacity``, ``scheduler`` or ``null`` (see
    :func:`~pdscope.metrics.signals.classify_queueing`).
    """
    return WindowRecord.of(window, ceiling_gb_s=ceiling_gb_s).to_json()
