"""The statistics of a load run, with ``vllm bench serve``'s key names beside pdscope's own.

Only completed requests enter the latency statistics; a failed request is counted by its cause
and never pollutes a percentile. Warm-up requests are left out of everything but the counts.

Definitions (README, "Definitions"): TTFT from the actual send; ITL per token (a chunk of k
tokens gives k gaps of gap/k; ``vllm bench serve`` takes per-chunk gaps, identical when every
chunk holds one token); TPOT = (last token - first token) / (output tokens - 1); E2E from the
send to the last token; ``client_queue`` the wait for ``--max-concurrency``; ``schedule_lag``
the open-loop delay between the scheduled and the actual send. Throughputs divide by the
stage's duration: from its start to the last request's end.

A model that thinks before it answers: TTFO (the time to the first answer token, AIPerf's
``time_to_first_output_token``) over the requests that reasoned, as ``mean_ttfo_ms``,
``median_ttfo_ms``, ``p99_ttfo_ms``..., and ``total_reasoning_tokens`` (part of
``total_output_tokens``); absent when no request reasoned.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdscope.errors import InputError
from pdscope.load.runner import Finished, Stage, StageRun
from pdscope.metrics.dashboard import WindowRecord
from pdscope.slo import SLO
from pdscope.units import NS

PERCENTILES = (50, 90, 95, 99)
# The objectives' names in ``goodput_slo_ms``: ``vllm bench serve --goodput``'s.
GOODPUT_NAMES = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el"}
# Each latency's name in the summary's keys (``p99_{name}_ms``): ``vllm bench serve``'s.
LATENCY_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el",
                 "client_queue": "client_queue", "schedule_lag": "schedule_lag"}
# A distribution's statistics in the order the summary writes them, with their key prefix.
_STAT_KEYS = (("mean_s", "mean"), ("median_s", "median"), ("std_s", "std"), ("p90_s", "p90"),
              ("p95_s", "p95"), ("p99_s", "p99"), ("max_s", "max"))


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


@dataclass(frozen=True)
class Distribution:
    """One latency's statistics over a stage's requests, in seconds; all ``None`` when no
    request gave a value."""

    mean_s: float | None = None
    median_s: float | None = None
    std_s: float | None = None
    p90_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls()
        xs = np.asarray(values, dtype=float)
        p50, p90, p95, p99 = np.percentile(xs, PERCENTILES)
        return cls(*(_finite(float(v)) for v in (xs.mean(), p50, xs.std(), p90, p95, p99,
                                                 xs.max())))

    def to_json(self, name: str) -> dict[str, float | None]:
        """``{mean_NAME_ms: ..., median_NAME_ms: ..., ...}``, milliseconds."""
        out = {}
        for attr, prefix in _STAT_KEYS:
            v = getattr(self, attr)
            out[f"{prefix}_{name}_ms"] = None if v is None else v * 1000
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], name: str) -> Distribution:
        return cls(**{attr: _seconds(d.get(f"{prefix}_{name}_ms")) for attr, prefix in _STAT_KEYS})


def _seconds(ms: Any) -> float | None:
    return float(ms) / 1000 if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None


@dataclass(frozen=True)
class Goodput:
    """The requests that met every objective of ``slo`` by their own latencies."""

    slo: SLO
    good_requests: int
    request_goodput: float

    def limits_ms(self) -> dict[str, float]:
        """The objectives in milliseconds, under ``vllm bench serve --goodput``'s names."""
        return {GOODPUT_NAMES.get(m, m): v for m, v in self.slo.limits_ms().items()}

    def to_json(self) -> dict[str, Any]:
        return {"goodput_slo_ms": self.limits_ms(), "good_requests": self.good_requests,
                "request_goodput": self.request_goodput}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Goodput:
        names = {v: k for k, v in GOODPUT_NAMES.items()}
        limits = {f"{names.get(m, m)}_s": float(v) / 1000
                  for m, v in (d.get("goodput_slo_ms") or {}).items()}
        return cls(SLO(**limits), int(d["good_requests"]), float(d["request_goodput"]))


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass(frozen=True)
class StageSummary:
    """The statistics of one stage, in seconds. Rates divide by ``duration_s``, which is at
    least a nanosecond.

    ``server``, ``model``, ``api`` and ``server_metrics`` (the server's own ``/metrics``
    over the stage: the window's record, with its ``peak``) are set by
    :func:`~pdscope.load.bench.run_bench`; :func:`summarize_stage` alone leaves them out
    (``server`` ``None``), and so does the JSON. ``goodput``: with an SLO only."""

    stage: Stage
    started_at: float
    duration_s: float
    interrupted: bool
    sent: int
    warmup_requests: int
    completed: int
    failed: int
    incomplete: int
    failed_by_cause: Mapping[str, int]
    total_input_tokens: int
    total_output_tokens: int
    token_count_source: str | None
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float | None
    max_in_flight: int
    workers: int
    workers_lost: tuple[str, ...]
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    client_queue: Distribution
    schedule_lag: Distribution
    goodput: Goodput | None = None
    server: str | None = None
    model: str | None = None
    api: str | None = None
    server_metrics: WindowRecord | None = None
    # Completed requests whose prompt the server reported shorter than what was sent
    # (RequestRecord.truncated): their TTFT is that of a shorter prompt.
    truncated_prompts: int = 0
    ttfo: Distribution | None = None  # the requests that reasoned; None: none did
    total_reasoning_tokens: int | None = None

    @property
    def name(self) -> str:
        return self.stage.name

    def percentile(self, metric: str, q: float) -> float:
        """A latency's percentile over the stage (seconds), so an :class:`~pdscope.slo.SLO`
        judges a stage as it judges a simulation; ``nan`` where no request gave one.
        ``q``: 50, 90, 95 or 99, the percentiles a stage keeps."""
        dist = {"ttft": self.ttft, "itl": self.itl, "tpot": self.tpot, "e2e": self.e2e}[metric]
        attr = {50.0: "median_s", 90.0: "p90_s", 95.0: "p95_s", 99.0: "p99_s"}.get(float(q))
        if attr is None:
            raise InputError(f"a stage keeps the 50th, 90th, 95th and 99th percentiles, not"
                             f" the {q:g}th")
        value = getattr(dist, attr)
        return math.nan if value is None else float(value)

    def served(self, server: str, model: str, api: str,
               server_metrics: WindowRecord | None) -> StageSummary:
        """This summary with the server it ran against."""
        return replace(self, server=server, model=model, api=api, server_metrics=server_metrics)

    def to_json(self) -> dict[str, Any]:
        """The summary JSON of the stage: ``vllm bench serve``'s keys beside pdscope's own,
        latencies in milliseconds."""
        s: dict[str, Any] = {
            "stage": self.stage.to_json(),
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "duration": self.duration_s,  # vllm bench serve's name
            "interrupted": self.interrupted,
            "sent": self.sent,
            "warmup_requests": self.warmup_requests,
            "completed": self.completed,
            "failed": self.failed,
            "incomplete": self.incomplete,
            "failed_by_cause": dict(self.failed_by_cause),
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "token_count_source": self.token_count_source,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_in_flight": self.max_in_flight,
            "workers": self.workers,
            "workers_lost": list(self.workers_lost),
            "truncated_prompts": self.truncated_prompts,
        }
        for attr, name in LATENCY_NAMES.items():
            s.update(getattr(self, attr).to_json(name))
        if self.ttfo is not None:
            s.update(self.ttfo.to_json("ttfo"))
            s["total_reasoning_tokens"] = self.total_reasoning_tokens
        if self.goodput is not None:
            s.update(self.goodput.to_json())
        if self.server is not None:
            s.update(server=self.server, model=self.model, api=self.api,
                     server_metrics=None if self.server_metrics is None
                     else self.server_metrics.to_json())
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in s.items()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageSummary:
        """A summary as :meth:`to_json` wrote it. :class:`InputError` when it is not one."""
        try:
            return cls(
                stage=Stage.from_json(d["stage"]), started_at=float(d["started_at"]),
                duration_s=float(d["duration_s"]), interrupted=bool(d["interrupted"]),
                sent=int(d["sent"]), warmup_requests=int(d["warmup_requests"]),
                completed=int(d["completed"]), failed=int(d["failed"]),
                incomplete=int(d["incomplete"]),
                failed_by_cause={str(k): int(v) for k, v in d["failed_by_cause"].items()},
                total_input_tokens=int(d["total_input_tokens"]),
                total_output_tokens=int(d["total_output_tokens"]),
                token_count_source=d.get("token_count_source"),
                request_throughput=float(d["request_throughput"]),
                output_throughput=float(d["output_throughput"]),
                total_token_throughput=float(d["total_token_throughput"]),
                max_output_tokens_per_s=_number(d.get("max_output_tokens_per_s")),
                max_in_flight=int(d.get("max_in_flight") or 0),
                workers=int(d.get("workers") or 1),
                workers_lost=tuple(str(w) for w in d.get("workers_lost") or ()),
                **{attr: Distribution.from_json(d, name)
                   for attr, name in LATENCY_NAMES.items()},
                goodput=Goodput.from_json(d) if "goodput_slo_ms" in d else None,
                server=d.get("server"), model=d.get("model"), api=d.get("api"),
                server_metrics=None if d.get("server_metrics") is None
                else WindowRecord.from_json(d["server_metrics"]),
                truncated_prompts=int(d.get("truncated_prompts") or 0),
                ttfo=Distribution.from_json(d, "ttfo") if "median_ttfo_ms" in d else None,
                total_reasoning_tokens=None if d.get("total_reasoning_tokens") is None
                else int(d["total_reasoning_tokens"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"not a stage summary: {type(exc).__name__} {exc}") from None


def read_summaries(path: str | Path) -> tuple[StageSummary, ...]:
    """The summaries of a ``summary.json`` (one object, or a list for a sweep); none for an
    empty one (``{}``: no stage ran). :class:`InputError` when it cannot be read."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"{p} is not JSON") from None
    items = data if isinstance(data, list) else [data]
    return tuple(StageSummary.from_json(s) for s in items if isinstance(s, dict) and s)


def write_summaries(path: str | Path, summaries: Sequence[StageSummary], sweep: bool) -> None:
    """``summary.json``: one object (``{}`` when no stage ran), or a list for a sweep."""
    rows = [s.to_json() for s in summaries]
    data: Any = rows if sweep else (rows[0] if rows else {})
    Path(path).write_text(json.dumps(data, indent=2))


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


def summarize_stage(run: StageRun, slo: SLO | None = None) -> StageSummary:
    """The statistics of one stage."""
    measured = [f for f in run.finished if not f.warmup]
    ok = [f for f in measured if f.record.ok]
    failed = [f for f in measured if not f.record.ok and f.record.error_kind != "cancelled"]
    incomplete = [f for f in measured if f.record.error_kind == "cancelled"]
    duration = run.duration_s

    def known(values: Sequence[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    out_tokens = sum(f.record.output_tokens or 0 for f in ok)
    in_tokens = sum(f.record.prompt_tokens or 0 for f in ok)
    reasoned = [f for f in ok if f.record.reasoned]
    goodput = None
    if slo is not None:
        good = [f for f in ok if slo.met_by_request(
            ttft_s=f.record.ttft_s, tpot_s=f.record.tpot_s, e2e_s=f.record.e2e_s,
            output_tokens=f.record.output_tokens)]
        goodput = Goodput(slo, len(good), len(good) / duration)
    return StageSummary(
        stage=run.stage,
        started_at=run.started_wall,
        duration_s=duration,
        interrupted=run.interrupted,
        sent=len(measured),
        warmup_requests=len(run.finished) - len(measured),
        completed=len(ok),
        failed=len(failed),
        incomplete=len(incomplete),
        failed_by_cause=dict(Counter(f.record.error_kind or "unknown" for f in failed)),
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        token_count_source=(
            Counter(f.record.token_count_source for f in ok).most_common(1)[0][0] if ok else None
        ),
        request_throughput=len(ok) / duration,
        output_throughput=out_tokens / duration,
        total_token_throughput=(in_tokens + out_tokens) / duration,
        max_output_tokens_per_s=_finite(peak_output_rate(ok)),
        max_in_flight=run.max_in_flight,
        workers=run.workers,
        workers_lost=tuple(run.workers_lost),
        ttft=Distribution.of(known([f.record.ttft_s for f in ok])),
        tpot=Distribution.of(known([f.record.tpot_s for f in ok])),
        itl=Distribution.of([g for f in ok for g in f.record.itl_s]),
        e2e=Distribution.of(known([f.record.e2e_s for f in ok])),
        client_queue=Distribution.of(known([f.client_queue_s for f in measured])),
        schedule_lag=Distribution.of(known([f.record.schedule_lag_s for f in measured])),
        goodput=goodput,
        truncated_prompts=sum(1 for f in ok if f.record.truncated),
        ttfo=Distribution.of(known([f.record.ttfo_s for f in reasoned])) if reasoned else None,
        total_reasoning_tokens=sum(f.record.reasoning_tokens or 0 for f in reasoned)
        if reasoned else None,
    )
