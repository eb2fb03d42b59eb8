"""Server metrics: scrape ``/metrics``, name its facts per server family, read windows.

``scrape`` and ``parse_metrics`` turn a ``/metrics`` text into a :class:`Snapshot`;
``detect_metric_map`` picks the :class:`MetricMap` of the server that wrote it (each family's
map is in its module of :mod:`pdscope.servers`); ``make_window``
reads what happened between two snapshots; ``signals`` says what that means, and
``window_record`` / ``dashboard_rows`` show it. :class:`MetricsRecorder` records scrapes beside
a load run into a JSONL file that ``load_recording`` reads back; ``grafana_dashboard`` writes
the same names as a Grafana dashboard.
"""

from pdscope.metrics.dashboard import Peak, Row, WindowRecord, dashboard_rows, window_record
from pdscope.metrics.grafana import grafana_dashboard
from pdscope.metrics.recorder import (
    MetricsRecorder,
    Recording,
    ThreadedMetricsRecorder,
    bracket,
    load_recording,
    peak_waiting_window,
    read_recording,
    recording_window,
)
from pdscope.metrics.scrape import Snapshot, base_url, metrics_url, parse_metrics, scrape
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
from pdscope.servers import LLAMACPP_METRICS as LLAMACPP
from pdscope.servers import (
    METRIC_MAPS,
    OLLAMA_NO_METRICS,
    ROLES,
    MetricMap,
    detect_metric_map,
    metric_map_named,
)
from pdscope.servers import SGLANG_METRICS as SGLANG
from pdscope.servers import TGI_METRICS as TGI
from pdscope.servers import VLLM_METRICS as VLLM

__all__ = [
    "FULL_POOL_KV_USAGE",
    "LLAMACPP",
    "METRIC_MAPS",
    "OLLAMA_NO_METRICS",
    "ROLES",
    "SGLANG",
    "TGI",
    "VLLM",
    "Histogram",
    "MetricMap",
    "MetricsRecorder",
    "Peak",
    "Recording",
    "Row",
    "Signal",
    "Snapshot",
    "ThreadedMetricsRecorder",
    "Window",
    "WindowRecord",
    "achieved_bandwidth_gb_s",
    "base_url",
    "bracket",
    "bucket_resolution",
    "classify_queueing",
    "counter_delta",
    "counter_rate",
    "dashboard_rows",
    "detect_metric_map",
    "grafana_dashboard",
    "histogram_delta",
    "load_recording",
    "make_window",
    "metric_map_named",
    "metrics_url",
    "parse_metrics",
    "peak_waiting_window",
    "quantile",
    "read_recording",
    "recording_window",
    "scrape",
    "signals",
    "to_json",
    "window_record",
]
