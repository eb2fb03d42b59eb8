"""The statistics of a load run, with ``vllm bench serve``'s key names beside pdscope's own.

Only completed requests enter the latency statistics; a failed request is counted by its cause
and never pollutes a percentile. Warm-up requests are left out of everything but the counts.

Definitions (README, "Definitions"): TTFT from the actual send; ITL per token (a chunk of k
tokens gives k gaps of gap/k; ``vllm bench serve`` takes per-chunk gaps, identical when every
chunk holds one token); TPOT = (last token - first token) / (output tokens - 1); E2E from the
send to the last token; ``client_queue`` the wait for ``--max-concurrency``; ``schedule_lag``
the open-loop delay between the scheduled and the actual send. Throughputs divide by the
stage's duration: from its start to the last request's end.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from pdscope.load.runner import Finished, StageRun
from pdscope.slo import SLO
from pdscope.units import NS

PERCENTILES = (50, 90, 95, 99)
# The objectives' names in ``goodput_slo_ms``: ``vllm bench serve --goodput``'s.
GOODPUT_NAMES = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el"}


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {k: None for k in ("mean", "median", "p90", "p95", "p99", "max", "std")}
    xs = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(xs, PERCENTILES)
    return {
        "mean": float(xs.mean()),
        "median": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(xs.max()),
        "std": float(xs.std()),
    }


def peak_output_rate(finished: Sequence[Finished], window_s: float = 1.0) -> float | None:
    """The most output tokens that arrived in any ``window_s`` window, per second; ``None``
    when the tokens span less than one window (the mean rate says it better then)."""
    times: list[int] = []
    for f in finished:
        r = f.record
        ks = r.chunk_tokens if len(r.chunk_tokens) == len(r.token_times_ns) else None
        for i, t in enumerate(r.token_times_ns):
            times.extend([t] * (ks[i] if ks else 1))
    if not times:
        return None
    ts = np.sort(np.asarray(times, dtype=np.int64))
    width = int(window_s * NS)
    if ts[-1] - ts[0] < width:
        return None
    # For every token, the tokens within the window that starts at it.
    ends = np.searchsorted(ts, ts + width, side="left")
    return float((ends - np.arange(ts.size)).max() / window_s)


def summarize_stage(run: StageRun, slo: SLO | None = None) -> dict[str, Any]:
    """The summary JSON of one stage."""
    measured = [f for f in run.finished if not f.warmup]
    ok = [f for f in measured if f.record.ok]
    failed = [f for f in measured if not f.record.ok and f.record.error_kind != "cancelled"]
    incomplete = [f for f in measured if f.record.error_kind == "cancelled"]
    duration = run.duration_s

    def ms(values: Sequence[float | None]) -> list[float]:
        return [v * 1000 for v in values if v is not None]

    ttft = ms([f.record.ttft_s for f in ok])
    tpot = ms([f.record.tpot_s for f in ok])
    itl = [g * 1000 for f in ok for g in f.record.itl_s]
    e2e = ms([f.record.e2e_s for f in ok])
    queue = ms([f.client_queue_s for f in measured])
    lag = ms([f.record.schedule_lag_s for f in measured])
    out_tokens = sum(f.record.output_tokens or 0 for f in ok)
    in_tokens = sum(f.record.prompt_tokens or 0 for f in ok)
    s: dict[str, Any] = {
        "stage": run.stage.to_json(),
        "started_at": run.started_wall,
        "duration_s": duration,
        "duration": duration,  # vllm bench serve's name
        "interrupted": run.interrupted,
        "sent": len(measured),
        "warmup_requests": len(run.finished) - len(measured),
        "completed": len(ok),
        "failed": len(failed),
        "incomplete": len(incomplete),
        "failed_by_cause": dict(Counter(f.record.error_kind or "unknown" for f in failed)),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "token_count_source": (
            Counter(f.record.token_count_source for f in ok).most_common(1)[0][0] if ok else None
        ),
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "max_output_tokens_per_s": peak_output_rate(ok),
        "max_in_flight": run.max_in_flight,
        "workers": run.workers,
        "workers_lost": list(run.workers_lost),
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e),
                         ("client_queue", queue), ("schedule_lag", lag)):
        st = _stats(values)
        s[f"mean_{name}_ms"] = st["mean"]
        s[f"median_{name}_ms"] = st["median"]
        s[f"std_{name}_ms"] = st["std"]
        for p in (90, 95, 99):
            s[f"p{p}_{name}_ms"] = st[f"p{p}"]
        s[f"max_{name}_ms"] = st["max"]
    if slo is not None:
        good = [f for f in ok if slo.met_by_request(
            ttft_s=f.record.ttft_s, tpot_s=f.record.tpot_s, e2e_s=f.record.e2e_s,
            output_tokens=f.record.output_tokens)]
        s["goodput_slo_ms"] = {GOODPUT_NAMES.get(m, m): v for m, v in slo.limits_ms().items()}
        s["good_requests"] = len(good)
        s["request_goodput"] = len(good) / duration
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in s.items()}
