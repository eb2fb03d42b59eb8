"""Server metrics: scrape ``/metrics``, name its facts per server family, read windows.

``scrape`` and ``parse_metrics`` turn a ``/metrics`` text into a :class:`Snapshot`;
``detect_family`` picks the :class:`MetricMap` of the server that wrote it; ``make_window``
reads what happened between two snapshots; ``signals`` says what that means.
"""

from pdscope.metrics.families import (
    FAMILIES,
    LLAMACPP,
    OLLAMA_NO_METRICS,
    ROLES,
    SGLANG,
    TGI,
    VLLM,
    MetricMap,
    detect_family,
    family_by_name,
)
from pdscope.metrics.scrape import Snapshot, metrics_url, parse_metrics, scrape
from pdscope.metrics.signals import (
    FULL_POOL_KV_USAGE,
    Signal,
    achieved_bandwidth_gb_s,
    classify_queueing,
    signals,
)
from pdscope.metrics.window import (
    Histogram,
    Window,
    bucket_resolution,
    counter_delta,
    counter_rate,
    histogram_delta,
    make_window,
    quantile,
    to_json,
)

__all__ = [
    "FAMILIES",
    "FULL_POOL_KV_USAGE",
    "LLAMACPP",
    "OLLAMA_NO_METRICS",
    "ROLES",
    "SGLANG",
    "TGI",
    "VLLM",
    "Histogram",
    "MetricMap",
    "Signal",
    "Snapshot",
    "Window",
    "achieved_bandwidth_gb_s",
    "bucket_resolution",
    "classify_queueing",
    "counter_delta",
    "counter_rate",
    "detect_family",
    "family_by_name",
    "histogram_delta",
    "make_window",
    "metrics_url",
    "parse_metrics",
    "quantile",
    "scrape",
    "signals",
    "to_json",
]
