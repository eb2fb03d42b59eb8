"""What a server did between two scrapes of its ``/metrics``.

Counters and histograms on ``/metrics`` are totals since the server started. Only the
difference between two scrapes says something about the run pdscope just made, so everything
here works on pairs: :func:`histogram_delta` and :func:`counter_delta` subtract, :func:`quantile`
reads a percentile from the difference the way Prometheus' ``histogram_quantile`` does, and
:func:`make_window` puts it together for one server family.

A value a server does not give is ``None`` with a reason in ``Window.missing``, never 0: "no
request finished in this window" and "not exported by llama.cpp" are facts, a 0 would be a lie.
A counter that went down means the server restarted between the scrapes; the later scrape is
then the whole window and ``reset`` says so. No rate is ever negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from pdscope.metrics.scrape import Histogram, Snapshot
from pdscope.servers import MetricMap


def histogram_delta(before: Histogram | None, after: Histogram) -> Histogram:
    """Observations made between two scrapes, bucket by bucket.

    With no earlier histogram (the series appeared during the window) the later one is the
    window. When any cumulative count or the total went down, or the bucket bounds changed, the
    server restarted: the later histogram is the whole window and ``reset`` is ``True``.
    """
    if before is None:
        return replace(after, reset=False)
    if [le for le, _ in before.buckets] != [le for le, _ in after.buckets]:
        return replace(after, reset=True)
    went_down = after.count < before.count or any(
        a < b for (_, b), (_, a) in zip(before.buckets, after.buckets, strict=True)
    )
    if went_down:
        return replace(after, reset=True)
    pairs = zip(before.buckets, after.buckets, strict=True)
    buckets = tuple((le, a - b) for (le, b), (_, a) in pairs)
    total = None
    if before.sum is not None and after.sum is not None:
        total = after.sum - before.sum
    return Histogram(buckets=buckets, count=after.count - before.count, sum=total)


def _usable_buckets(hist: Histogram) -> list[tuple[float, float]] | None:
    """Buckets ready for interpolation, as Prometheus' bucketQuantile prepares them.

    Buckets with the same bound are merged and counts are made monotonic (a bucket never holds
    fewer observations than the one below it). ``None`` when Prometheus would answer NaN: fewer
    than two buckets or no observations.
    """
    merged: list[tuple[float, float]] = []
    for le, count in sorted(hist.buckets):
        if merged and merged[-1][0] == le:
            merged[-1] = (le, merged[-1][1] + count)
        else:
            merged.append((le, count))
    highest = merged[0][1]
    for i, (le, count) in enumerate(merged):
        highest = max(highest, count)
        merged[i] = (le, highest)
    if len(merged) < 2 or merged[-1][1] <= 0:
        return None
    return merged


def _locate(q: float, buckets: list[tuple[float, float]]) -> tuple[int, float]:
    """Index of the bucket holding the q-quantile, and the rank (q times the total)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    rank = q * buckets[-1][1]
    # Like Go's sort.Search over all buckets but +Inf: the first whose count reaches the rank,
    # or the +Inf bucket when none does.
    for i in range(len(buckets) - 1):
        if buckets[i][1] >= rank:
            return i, rank
    return len(buckets) - 1, rank


def quantile(q: float, hist: Histogram | None) -> float | None:
    """The q-quantile (0 <= q <= 1) of a histogram, as Prometheus' ``histogram_quantile``.

    Linear interpolation inside the bucket where the rank ``q * count`` falls. The lowest
    bucket starts at 0 when its upper bound is above 0 (else its upper bound is returned); a
    quantile in the ``+Inf`` bucket returns the highest finite bound, so it is a floor, not a
    value. ``None`` where Prometheus answers NaN: no observations, or no finite bucket. One
    departure: when q is 0 and the lowest bucket is empty, Prometheus divides 0 by 0; this
    returns the bucket's lower bound. Algorithm: ``prometheus/prometheus`` ``promql/quantile.go``
    ``bucketQuantile``.
    """
    if hist is None:
        return None
    buckets = _usable_buckets(hist)
    if buckets is None:
        return None
    b, rank = _locate(q, buckets)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    upper, count = buckets[b]
    if b == 0 and upper <= 0:
        return upper
    lower = 0.0
    if b > 0:
        lower = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    if count <= 0:
        return lower
    return lower + (upper - lower) * (rank / count)


def bucket_resolution(q: float, hist: Histogram) -> tuple[float, float]:
    """The (lower, upper) bounds of the bucket the q-quantile falls in.

    A caller states a percentile as "between lower and upper": a TTFT p99 of 0.9 s read from a
    bucket (0.5, 1.0] is not known to better than that. The ``+Inf`` bucket gives
    ``(highest finite bound, inf)``. Raises ``ValueError`` where :func:`quantile` returns
    ``None``; call it only for a quantile that exists.
    """
    buckets = _usable_buckets(hist)
    if buckets is None:
        raise ValueError("the histogram has no observations in finite buckets")
    b, _ = _locate(q, buckets)
    upper = buckets[b][0]
    if b == 0:
        return (-math.inf, upper) if upper <= 0 else (0.0, upper)
    return buckets[b - 1][0], upper


def counter_delta(before: float | None, after: float | None) -> tuple[float | None, bool]:
    """Increase of a counter between two scrapes, and whether it was reset.

    ``None`` when the later scrape lacks the counter. A counter absent from the earlier scrape
    started during the window, from 0. A counter that went down was reset by a restart: the
    later value is the whole increase, flagged ``True``.
    """
    if after is None:
        return None, False
    if before is None:
        return after, False
    if after < before:
        return after, True
    return after - before, False


def counter_rate(before: float | None, after: float | None, dt: float) -> float | None:
    """Increase per second of a counter over ``dt`` seconds, reset-aware, never negative."""
    if dt <= 0:
        raise ValueError(f"a rate needs a window longer than 0 s, got {dt}")
    delta, _ = counter_delta(before, after)
    return None if delta is None else delta / dt


@dataclass(frozen=True)
class Window:
    """A server's own account of one interval, read from two scrapes of its ``/metrics``.

    Gauges are read at the later scrape; quantiles, counts and rates cover the interval.
    Every field that is ``None`` has its reason in ``missing``. ``requests_finished`` counts
    end-to-end observations (requests that finished), else first tokens where the server has no
    end-to-end histogram. ``prefix_cache_hit_rate`` is the share of looked-up prompt tokens found
    in the prefix cache in the interval (vLLM; llama.cpp's cached against computed prompt
    tokens), or SGLang's own hit-rate gauge at the later
    scrape. ``mean_iteration_tokens`` is the mean number of tokens one engine step processed.

    ``start_wall`` and ``end_wall`` are the wall times (``time.time()``) of the two scrapes.
    ``resolution`` gives, for each quantile field that has a value, the (lower, upper) bounds of
    the histogram bucket it was interpolated in: the quantile is known to no better than that
    (``upper`` is ``inf`` when it fell in the ``+Inf`` bucket, where the value is a floor).
    """

    family: str
    duration_s: float
    num_requests_running: float | None
    num_requests_waiting: float | None
    kv_cache_usage: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    requests_finished: float | None
    prefix_cache_hit_rate: float | None
    preemptions: float | None
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    waiting_capacity: float | None
    read_bytes_per_s: float | None
    mean_iteration_tokens: float | None
    reset: bool
    missing: dict[str, str] = field(default_factory=dict)
    start_wall: float | None = None
    end_wall: float | None = None
    resolution: dict[str, tuple[float, float]] = field(default_factory=dict)


class _Reader:
    """Reads one family's roles from a pair of snapshots, noting why a value is missing."""

    def __init__(
        self,
        before: Snapshot,
        after: Snapshot,
        family: MetricMap,
        where: dict[str, str],
    ) -> None:
        self.before = before
        self.after = after
        self.family = family
        self.where = where
        self.missing: dict[str, str] = {}
        self.resolution: dict[str, tuple[float, float]] = {}
        self.reset = False

    def note(self, key: str, reason: str) -> None:
        self.missing.setdefault(key, reason)

    def gauge(self, key: str, role: str, where: dict[str, str] | None = None) -> float | None:
        names = self.family.names(role)
        value = self.after.gauge(
            names, where={**self.where, **(where or {})}, replicas=self.family.replica_labels
        )
        if value is None:
            self.note(key, self.family.missing_reason(role))
        return value

    def gauge_max(self, key: str, role: str) -> float | None:
        """A ratio gauge over engines: the fullest engine, since ratios do not add up."""
        per_engine = self.after.gauge(
            self.family.names(role),
            by_engine=True,
            engine_label=self.family.engine_label or "engine",
            where=self.where,
            replicas=self.family.replica_labels,
        )
        if not per_engine:
            self.note(key, self.family.missing_reason(role))
            return None
        return max(per_engine.values())

    def counter(self, role: str) -> tuple[float | None, float | None]:
        names = self.family.names(role)
        kw: dict[str, Any] = {"where": self.where, "replicas": self.family.replica_labels}
        return self.before.counter(names, **kw), self.after.counter(names, **kw)

    def counter_delta(self, key: str, role: str) -> float | None:
        before, after = self.counter(role)
        delta, reset = counter_delta(before, after)
        self.reset |= reset
        if delta is None:
            self.note(key, self.family.missing_reason(role))
        return delta

    def histogram(self, keys: tuple[str, ...], role: str) -> Histogram | None:
        names = self.family.names(role)
        kw: dict[str, Any] = {"where": self.where, "replicas": self.family.replica_labels}
        after = self.after.histogram(names, **kw)
        if after is None:
            for key in keys:
                self.note(key, self.family.missing_reason(role))
            return None
        delta = histogram_delta(self.before.histogram(names, **kw), after)
        self.reset |= delta.reset
        return delta

    def quantiles(
        self, keys: dict[str, float], hist: Histogram | None, empty_reason: str
    ) -> dict[str, float | None]:
        """Quantiles of a window's histogram, each with its reason when there is none, and
        the bucket each was read from in ``self.resolution``."""
        out: dict[str, float | None] = {}
        for key, q in keys.items():
            if hist is None:  # the reason was noted when the histogram was looked up
                out[key] = None
                continue
            value = quantile(q, hist)
            if value is None:
                if hist.count <= 0:
                    self.note(key, empty_reason)
                else:
                    self.note(key, "the histogram has no finite buckets to interpolate in")
            else:
                self.resolution[key] = bucket_resolution(q, hist)
            out[key] = value
        return out


def make_window(
    before: Snapshot,
    after: Snapshot,
    family: MetricMap,
    *,
    model: str | None = None,
    engine: str | None = None,
) -> Window:
    """The :class:`Window` between two snapshots of a server of ``family``.

    ``model`` and ``engine`` keep only the series with that model name or engine; without them
    every series is summed (gauges and counters add up across engines, histograms bucket by
    bucket), except KV-cache usage, which is the fullest engine's.
    """
    where: dict[str, str] = {}
    if model is not None and family.model_label is not None:
        where[family.model_label] = model
    if engine is not None and family.engine_label is not None:
        where[family.engine_label] = engine
    r = _Reader(before, after, family, where)
    dt = after.t - before.t

    running = r.gauge("num_requests_running", "running")
    waiting = r.gauge("num_requests_waiting", "waiting")
    kv = r.gauge_max("kv_cache_usage", "kv_usage")
    waiting_capacity = r.gauge("waiting_capacity", "waiting_by_reason", {"reason": "capacity"})

    ttft = r.histogram(("ttft_p50_s", "ttft_p99_s"), "ttft")
    itl = r.histogram(("itl_p50_s", "itl_p99_s"), "itl")
    e2e = r.histogram(("e2e_p50_s",), "e2e")
    qs = {
        **r.quantiles(
            {"ttft_p50_s": 0.5, "ttft_p99_s": 0.99},
            ttft,
            "no request got its first token in this window",
        ),
        **r.quantiles(
            {"itl_p50_s": 0.5, "itl_p99_s": 0.99}, itl, "no token was generated in this window"
        ),
        **r.quantiles({"e2e_p50_s": 0.5}, e2e, "no request finished in this window"),
    }

    finished: float | None = None
    if e2e is not None:
        finished = e2e.count
    elif ttft is not None:
        finished = ttft.count
    else:
        r.note("requests_finished", family.missing_reason("e2e"))

    hit_rate = _prefix_hit_rate(r)
    preemptions = r.counter_delta("preemptions", "preemptions")

    prompt_delta = r.counter_delta("prompt_tokens_per_s", "prompt_tokens")
    gen_delta = r.counter_delta("generation_tokens_per_s", "generation_tokens")
    read_delta = _read_bytes_delta(r)

    def per_s(key: str, delta: float | None) -> float | None:
        if delta is None:
            return None
        if dt <= 0:
            r.note(key, "the two scrapes were taken at the same time")
            return None
        return delta / dt

    iteration_tokens = _mean_iteration_tokens(r, prompt_delta, gen_delta)

    window = Window(
        family=family.name,
        duration_s=dt,
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage=kv,
        ttft_p50_s=qs["ttft_p50_s"],
        ttft_p99_s=qs["ttft_p99_s"],
        itl_p50_s=qs["itl_p50_s"],
        itl_p99_s=qs["itl_p99_s"],
        e2e_p50_s=qs["e2e_p50_s"],
        requests_finished=finished,
        prefix_cache_hit_rate=hit_rate,
        preemptions=preemptions,
        prompt_tokens_per_s=per_s("prompt_tokens_per_s", prompt_delta),
        generation_tokens_per_s=per_s("generation_tokens_per_s", gen_delta),
        waiting_capacity=waiting_capacity,
        read_bytes_per_s=per_s("read_bytes_per_s", read_delta),
        mean_iteration_tokens=iteration_tokens,
        reset=r.reset,
        missing={},
        start_wall=before.wall,
        end_wall=after.wall,
        resolution=dict(r.resolution),
    )
    # One reason for each field that ended up None, in field order, and none for the others.
    missing = {
        f.name: r.missing.get(f.name, "not reported")
        for f in fields(Window)
        if getattr(window, f.name) is None
    }
    return replace(window, missing=missing)


def _prefix_hit_rate(r: _Reader) -> float | None:
    key = "prefix_cache_hit_rate"
    family = r.family
    if family.names("prefix_hits") and (family.names("prefix_queries")
                                        or family.names("prefix_misses")):
        hits = r.counter_delta(key, "prefix_hits")
        if family.names("prefix_queries"):
            queries = r.counter_delta(key, "prefix_queries")
        else:  # found and computed: llama.cpp counts the two apart
            misses = r.counter_delta(key, "prefix_misses")
            queries = hits + misses if hits is not None and misses is not None else None
        if queries is not None and hits is not None:
            if queries <= 0:
                r.missing[key] = "no prompt token was looked up in the prefix cache in this window"
                return None
            return hits / queries
    if family.names("prefix_hit_rate"):
        return r.gauge(key, "prefix_hit_rate")
    if not family.names("prefix_queries"):
        r.note(key, family.missing_reason("prefix_queries"))
    return None


def _read_bytes_delta(r: _Reader) -> float | None:
    key = "read_bytes_per_s"
    delta = r.counter_delta(key, "read_bytes")
    if delta is None:
        return None
    _, read_total = r.counter("read_bytes")
    _, prompt_total = r.counter("prompt_tokens")
    _, gen_total = r.counter("generation_tokens")
    worked = (prompt_total or 0) + (gen_total or 0) > 0
    if read_total == 0 and worked:
        # vLLM always exports the counter but only fills it when asked to estimate.
        flag = r.family.estimates_flag
        hint = f" (start {r.family.display} with {flag})" if flag else ""
        r.missing[key] = (
            f"{r.family.display}'s read-bytes estimate is 0 although it has processed tokens: "
            f"its estimates are off{hint}"
        )
        return None
    return delta


def _mean_iteration_tokens(
    r: _Reader, prompt_delta: float | None, gen_delta: float | None
) -> float | None:
    key = "mean_iteration_tokens"
    family = r.family
    if family.names("iteration_tokens"):
        hist = r.histogram((key,), "iteration_tokens")
        if hist is None:
            return None
        if hist.count <= 0 or hist.sum is None:
            r.note(key, "no engine step ran in this window")
            return None
        return hist.sum / hist.count
    if family.names("engine_steps"):
        steps = r.counter_delta(key, "engine_steps")
        if steps is None:
            return None
        if steps <= 0 or prompt_delta is None or gen_delta is None:
            r.note(key, "no engine step ran in this window")
            return None
        return (prompt_delta + gen_delta) / steps
    r.note(key, family.missing_reason("iteration_tokens"))
    return None


def to_json(window: Window) -> dict[str, Any]:
    """The window as a JSON-ready dict: one key per field, ``missing`` included.

    ``resolution`` becomes ``{"ttft_p50_s": [lower, upper], ...}`` with an infinite bound
    written ``null`` (strict JSON has no infinity).
    """
    out: dict[str, Any] = {}
    for f in fields(Window):
        value = getattr(window, f.name)
        out[f.name] = dict(value) if isinstance(value, dict) else value
    out["resolution"] = {
        key: [None if math.isinf(bound) else bound for bound in bounds]
        for key, bounds in window.resolution.items()
    }
    return out


# What a window must hold to be one; any other field a file lacks (one written before the
# field existed) reads as ``None``.
_REQUIRED = ("family", "duration_s", "reset")


def from_json(d: Mapping[str, Any]) -> Window:
    """A window as :func:`to_json` wrote it, values as they were written; a ``null`` bound of
    ``resolution`` is infinite again (a lower one ``-inf``, an upper one ``inf``). ``KeyError``,
    ``TypeError`` or ``ValueError`` when it is not one."""
    kw: dict[str, Any] = {}
    for f in fields(Window):
        if f.name in ("missing", "resolution"):
            continue
        if f.name in _REQUIRED:
            kw[f.name] = d[f.name]
        elif f.name in d or f.default is MISSING:
            kw[f.name] = d.get(f.name)
    resolution = {}
    for key, (lower, upper) in (d.get("resolution") or {}).items():
        resolution[str(key)] = (-math.inf if lower is None else lower,
                                math.inf if upper is None else upper)
    return Window(**kw, missing={str(k): str(v) for k, v in (d.get("missing") or {}).items()},
                  resolution=resolution)
