"""Prefill interference: a long prompt lands on streams that are decoding.

The article: "when a large prompt arrives during generation, it takes the device for one long
step and every active stream suffers a pause. Chunked prefill reduces this by splitting the
long prompt into pieces and interleaving each with the decode batches" — the trade vLLM exposes
as ``--max-num-batched-tokens``: smaller values give a better inter-token latency, larger ones a
better TTFT.

The experiment starts ``streams`` requests with short prompts and long answers, waits until
every one of them has streamed ``settle_tokens`` tokens (all are decoding), then sends one
prompt of ``inject_tokens``. The *injection window* runs from that request's send to its first
token: its prefill. Each stream's token gaps are sorted into *before* (after every stream was
decoding, before the send), *during* (a gap that overlaps the window) and *after*. The stall is
the longest gap during the window, set beside the ITL before it and the injected prompt's
length. Two runs with the same workload (see :meth:`InterferenceResult.signature`) compare with
:func:`compare_interference`: "the small budget stalled the streams 0.4 s, the large one 2.1 s".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from pdscope import roofline
from pdscope.charts import Chart, Series, Span
from pdscope.checks import at_least
from pdscope.client import (
    ClientOptions,
    Connection,
    RecordBuilder,
    RequestRecord,
    ServerInfo,
    Target,
    connect,
    raise_for_record,
)
from pdscope.errors import Field, InputError, Note, RunError
from pdscope.experiments.common import CeilingInputs, ProgressFn, output_notes
from pdscope.figures import Figures, Metric, ResultKind, experiment_figures, number, register
from pdscope.stats import percentile
from pdscope.units import NS
from pdscope.workload import Prompt

# A gap during the injection is called a stall when it is longer than the p99 gap before it and
# at least this many times the median one: a pause three steps long is what a reader of the
# stream notices, and a shared machine's jitter rarely triples a step.
STALL_FACTOR = 3.0
# How often the experiment looks whether every stream is decoding yet.
_POLL_S = 0.005
# Two runs compare when they asked for the same streams and answers and their injected prompts
# are this close in length (the stall grows with it).
COMPARABLE_INJECT_SHARE = 0.05


@dataclass(frozen=True, kw_only=True)
class InterferenceConfig(ClientOptions):
    streams: int = 4
    stream_prompt_tokens: int = 32
    stream_tokens: int = 256
    inject_tokens: int = 1800
    inject_max_tokens: int = 4
    settle_tokens: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.streams, 1, "streams")
        at_least(self.stream_prompt_tokens, 1, "stream_prompt_tokens")
        at_least(self.inject_tokens, 1, "inject_tokens")
        at_least(self.inject_max_tokens, 1, "inject_max_tokens")
        if self.settle_tokens < 2:
            raise InputError(Field("settle_tokens"),
                             " must be at least 2 (a gap before the injection)")
        if self.stream_tokens < 2 * self.settle_tokens:
            raise InputError(Field("stream_tokens"), " must leave the streams decoding after the"
                             " injection: at least twice ", Field("settle_tokens"),
                             f" ({2 * self.settle_tokens})")


@dataclass(frozen=True)
class Gap:
    """One gap between token-bearing chunks of a stream, in seconds from the injected
    request's send: it ran from ``start`` to ``end`` and brought ``tokens`` tokens."""

    stream: int
    start: float
    end: float
    tokens: int

    @property
    def length(self) -> float:
        return self.end - self.start


def stream_gaps(record: RequestRecord, stream: int, t0_ns: int) -> list[Gap]:
    """The gaps of one stream, on the clock of the injected request's send (``t0_ns``)."""
    times = record.token_times_ns
    ks = record.chunk_tokens if len(record.chunk_tokens) == len(times) else (1,) * len(times)
    return [Gap(stream, (a - t0_ns) / NS, (b - t0_ns) / NS, max(1, ks[i + 1]))
            for i, (a, b) in enumerate(pairwise(times))]


@dataclass(frozen=True)
class WindowStats:
    """Gaps of every stream in one window: per-token ITL percentiles (a gap that brought k
    tokens counts as k gaps of gap / k, as pdscope's ITL does) and the longest raw gap (the
    pause a reader saw)."""

    gaps: int
    itl_p50_s: float | None
    itl_p99_s: float | None
    max_gap_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"gaps": self.gaps, "itl_p50_s": self.itl_p50_s, "itl_p99_s": self.itl_p99_s,
                "max_gap_s": self.max_gap_s}


def window_stats(gaps: Sequence[Gap]) -> WindowStats:
    itl = [g.length / g.tokens for g in gaps for _ in range(g.tokens)]
    return WindowStats(len(gaps), percentile(itl, 50), percentile(itl, 99),
                       max((g.length for g in gaps), default=None))


def split_windows(
    gaps: Sequence[Gap], decoding_from: float, window_end: float
) -> tuple[list[Gap], list[Gap], list[Gap]]:
    """(before, during, after) the injection window ``[0, window_end]``. *Before* starts when
    every stream was decoding (``decoding_from``); a gap that overlaps the window is *during*
    (the stall may end a moment after the injected first token, in the same step)."""
    before = [g for g in gaps if g.start >= decoding_from and g.end < 0]
    during = [g for g in gaps if g.end >= 0 and g.start <= window_end]
    after = [g for g in gaps if g.start > window_end]
    return before, during, after


@dataclass(frozen=True)
class InterferenceResult:
    server: ServerInfo
    target: Target
    config: InterferenceConfig
    warmup: RequestRecord
    streams: tuple[RequestRecord, ...]
    inject: RequestRecord
    inject_prompt: Prompt
    ceiling: CeilingInputs = field(default_factory=CeilingInputs)
    notes: tuple[str, ...] = ()

    @property
    def t0_ns(self) -> int:
        assert self.inject.t_send_ns is not None
        return self.inject.t_send_ns

    @property
    def inject_ttft_s(self) -> float:
        assert self.inject.ttft_s is not None
        return self.inject.ttft_s

    @property
    def inject_tokens(self) -> int:
        return self.inject.prompt_tokens or self.inject_prompt.tokens

    @property
    def decoding_from(self) -> float:
        """When the last stream's first token came, on the injection clock (negative)."""
        firsts = [r.t_first_token_ns for r in self.streams if r.t_first_token_ns is not None]
        return (max(firsts) - self.t0_ns) / NS if firsts else 0.0

    @property
    def gaps(self) -> list[Gap]:
        return [g for i, r in enumerate(self.streams) for g in stream_gaps(r, i, self.t0_ns)]

    def windows(self) -> tuple[WindowStats, WindowStats, WindowStats]:
        before, during, after = split_windows(self.gaps, self.decoding_from,
                                              self.inject_ttft_s)
        return window_stats(before), window_stats(during), window_stats(after)

    @property
    def stall_s(self) -> float | None:
        """The longest gap of any stream during the injected prefill."""
        return self.windows()[1].max_gap_s

    def stall_by_stream(self) -> list[float | None]:
        _, during, _ = split_windows(self.gaps, self.decoding_from, self.inject_ttft_s)
        return [max((g.length for g in during if g.stream == i), default=None)
                for i in range(len(self.streams))]

    @property
    def stalled(self) -> bool | None:
        """A gap during the window longer than the p99 before and :data:`STALL_FACTOR` × its
        median."""
        before, during, _ = self.windows()
        if during.max_gap_s is None or before.itl_p99_s is None or before.itl_p50_s is None:
            return None
        return during.max_gap_s > max(before.itl_p99_s, STALL_FACTOR * before.itl_p50_s)

    def signature(self) -> dict[str, int]:
        """The workload two runs must share to be compared."""
        return {"streams": self.config.streams, "stream_tokens": self.config.stream_tokens,
                "stream_prompt_tokens": self.config.stream_prompt_tokens,
                "settle_tokens": self.config.settle_tokens,
                "inject_tokens": self.inject_tokens}

    def ceilings(self) -> dict[str, Any]:
        ci = self.ceiling
        if not ci.known:
            return {"inject_ttft_floor_s": None, "batched_step_floor_s": None}
        assert ci.model is not None and ci.device is not None
        floor, step = self.floors_held()
        return {"inject_ttft_floor_s": floor.limit if floor else None,
                "inject_ttft_floor_beaten": floor.beaten if floor else None,
                "batched_step_floor_s": step.limit if step else None,
                "batched_step_floor_beaten": step.beaten if step else None}

    def floors_held(self) -> tuple[roofline.Held | None, roofline.Held | None]:
        """The injected prompt's TTFT beside its floor, and the streams' median gap before it
        beside the floor of a step of them all: neither floor may be above what was
        measured."""
        ci = self.ceiling
        if not ci.known:
            return None, None
        assert ci.model is not None and ci.device is not None
        pc = roofline.prefill_ceiling(ci.model, ci.device, max(1, self.inject_tokens))
        ctx = self.config.stream_prompt_tokens + self.config.stream_tokens // 2
        step = roofline.batched_decode(ci.model, ci.device, self.config.streams,
                                       ctx if ci.model.has_attention_shape else 0)
        before, _, _ = self.windows()
        floor = ci.hold_ttft(self.inject_ttft_s if self.inject_ttft_s > 0 else None, pc.ttft_s)
        step_held = None
        if before.itl_p50_s and step.step_s > 0:
            spec, why = roofline.bandwidth_spec(ci.device.name, ci.device.mem_bandwidth_gb_s,
                                                ci.device.measured)
            step_held = roofline.hold(before.itl_p50_s, step.step_s,
                                      what=f"step of {self.config.streams} streams (ITL p50)",
                                      unit="s", spec=spec, why=why, kind="floor")
        return floor, step_held

    @property
    def ceiling_warnings(self) -> tuple[str, ...]:
        return tuple(h.warning for h in self.floors_held()
                     if h is not None and h.warning is not None)

    def charts(self) -> list[Chart]:
        gaps = self.gaps
        series = []
        for i in range(len(self.streams)):
            mine = [g for g in gaps if g.stream == i and g.start >= self.decoding_from]
            series.append(Series(f"stream {i + 1}", tuple(g.end for g in mine),
                                 tuple(g.length for g in mine), "points", f"stream-{i + 1}"))
        before = self.windows()[0]
        shown = [g.end for g in gaps if g.start >= self.decoding_from]
        if before.itl_p99_s is not None and shown:
            series.append(Series("p99 ITL before", (min(shown), max(shown)),
                                 (before.itl_p99_s, before.itl_p99_s), "line"))
        return [Chart("interference-timeline", "Token gaps of running streams around an"
                      " injected prefill", "time from the injected request's send (s)",
                      "gap between tokens (s)", tuple(series),
                      spans=(Span(f"prefill of {self.inject_tokens:,} tokens", 0.0,
                                  self.inject_ttft_s),))]

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        before, during, after = self.windows()
        stall = during.max_gap_s
        out: dict[str, Any] = {
            "experiment": "interference",
            "server": self.server.kind,
            "server_version": self.server.version,
            "url": self.server.base_url,
            "api": self.target.api,
            "model": self.target.model,
            "config": self.config.to_json(),
            "signature": self.signature(),
            "inject_tokens": self.inject_tokens,
            "inject_ttft_s": self.inject_ttft_s,
            "decoding_from_s": self.decoding_from,
            "before": before.to_json(),
            "during": during.to_json(),
            "after": after.to_json(),
            "stall_s": stall,
            "stall_excess_s": stall - before.itl_p50_s
            if stall is not None and before.itl_p50_s is not None else None,
            "stall_share_of_inject_ttft": stall / self.inject_ttft_s
            if stall is not None and self.inject_ttft_s > 0 else None,
            "stall_s_per_1k_inject_tokens": stall / self.inject_tokens * 1000
            if stall is not None and self.inject_tokens else None,
            "stall_by_stream_s": self.stall_by_stream(),
            "stalled": self.stalled,
            "stall_rule": {"factor": STALL_FACTOR,
                           "rule": "max gap during > max(p99 before, factor x p50 before)"},
            **self.ceilings(),
            **self.ceiling.to_json(),
            "timeline": [{"stream": g.stream, "start_s": g.start, "end_s": g.end,
                          "gap_s": g.length, "tokens": g.tokens} for g in self.gaps],
            "charts": [c.to_json() for c in self.charts()],
            "notes": [*self.notes, *self.ceiling.notes],
            "ceiling_warnings": list(self.ceiling_warnings),
        }
        if raw:
            out["requests"] = [r.to_dict() for r in (self.warmup, *self.streams, self.inject)]
        return out

    def figures(self) -> Figures:
        return interference_figures(self.to_json())


PREFILL_STALL = Metric("prefill_stall_s", "prefill stall", True, "s")


def interference_figures(d: Mapping[str, Any]) -> Figures:
    """An interference run's figure: the decode stall the injected prefill caused."""
    return experiment_figures(d, (PREFILL_STALL,), prefill_stall_s=number(d.get("stall_s")))


INTERFERENCE = register(ResultKind("interference", (PREFILL_STALL,),
                                   from_json=interference_figures))


@dataclass(frozen=True)
class InterferenceComparison:
    """Two interference runs side by side (two budgets, two servers, chunking on and off)."""

    labels: tuple[str, str]
    stall_s: tuple[float | None, float | None]
    itl_p99_during_s: tuple[float | None, float | None]
    inject_ttft_s: tuple[float, float]
    comparable: bool
    differences: tuple[str, ...]

    @property
    def better(self) -> str | None:
        """The label whose streams stalled less; ``None`` when not comparable or a tie."""
        a, b = self.stall_s
        if not self.comparable or a is None or b is None or a == b:
            return None
        return self.labels[0] if a < b else self.labels[1]

    @property
    def summary(self) -> str:
        (la, lb), (a, b) = self.labels, self.stall_s
        if a is None or b is None:
            return "one of the runs has no gap during the injection: nothing to compare"
        text = (f"{la}: the streams stalled {a:.2f} s (the injected prompt's TTFT"
                f" {self.inject_ttft_s[0]:.2f} s); {lb}: {b:.2f} s (TTFT"
                f" {self.inject_ttft_s[1]:.2f} s)")
        if not self.comparable:
            text += "; not the same workload: " + "; ".join(self.differences)
        return text

    def to_json(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "stall_s": list(self.stall_s),
                "itl_p99_during_s": list(self.itl_p99_during_s),
                "inject_ttft_s": list(self.inject_ttft_s), "comparable": self.comparable,
                "differences": list(self.differences), "better": self.better,
                "summary": self.summary}


def compare_interference(
    a: InterferenceResult, b: InterferenceResult, labels: tuple[str, str] = ("A", "B")
) -> InterferenceComparison:
    """Set two runs side by side; they are ``comparable`` when their workloads match (the
    injected prompts within :data:`COMPARABLE_INJECT_SHARE` of each other)."""
    sa, sb = a.signature(), b.signature()
    differences = []
    for key in sa:
        if key == "inject_tokens":
            big = max(sa[key], sb[key])
            if big and abs(sa[key] - sb[key]) / big > COMPARABLE_INJECT_SHARE:
                differences.append(f"injected {sa[key]:,} vs {sb[key]:,} tokens")
        elif sa[key] != sb[key]:
            differences.append(f"{key} {sa[key]} vs {sb[key]}")
    if a.target.model != b.target.model:
        differences.append(f"model {a.target.model} vs {b.target.model}")
    return InterferenceComparison(
        labels, (a.stall_s, b.stall_s),
        (a.windows()[1].itl_p99_s, b.windows()[1].itl_p99_s),
        (a.inject_ttft_s, b.inject_ttft_s), not differences, tuple(differences))


def _tokens(builder: RecordBuilder | None) -> int:
    return sum(builder.chunk_tokens) if builder is not None else 0


async def run_interference(
    url: str | Connection,
    config: InterferenceConfig,
    *,
    ceiling: CeilingInputs | None = None,
    progress: ProgressFn | None = None,
) -> InterferenceResult:
    """Inject a long prompt into decoding streams on the server at ``url``. Raises
    :class:`RunError` when a request fails or the streams never decode together (a server that
    runs one request at a time), :class:`InputError` for a bad config."""
    steps = 4
    async with connect(url, config) as conn:
        if progress:
            progress("warm-up", 0, steps)
        warmup = await conn.send(await conn.prompt(config.stream_prompt_tokens, 0), 8)
        prompts = [await conn.prompt(config.stream_prompt_tokens, 10 + i)
                   for i in range(config.streams)]
        inject_prompt = await conn.prompt(config.inject_tokens, 1)  # fitted before, not during
        builders: list[RecordBuilder | None] = [None] * config.streams

        def keep(i: int) -> Callable[[RecordBuilder], None]:
            def watch(b: RecordBuilder) -> None:
                builders[i] = b
            return watch

        if progress:
            progress(f"starting {config.streams} streams", 1, steps)
        tasks = [asyncio.create_task(conn.send(p, config.stream_tokens, watch=keep(i),
                                               check=False))
                 for i, p in enumerate(prompts)]
        try:
            while min(_tokens(b) for b in builders) < config.settle_tokens:
                if any(t.done() for t in tasks):
                    for t in tasks:
                        if t.done():
                            raise_for_record(t.result())
                    raise RunError(
                        f"a stream finished before all {config.streams} were decoding: the"
                        " server does not run them at once (llama-cpp-python serves one request"
                        " at a time), so there is nothing for a prefill to interrupt")
                await asyncio.sleep(_POLL_S)
            if progress:
                progress(f"injecting {config.inject_tokens:,} tokens", 2, steps)
            inject = await conn.send(inject_prompt, config.inject_max_tokens, check=False)
            if progress:
                progress("streams finishing", 3, steps)
            streams = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for record in (*streams, inject):
            raise_for_record(record)
        if progress:
            progress("done", steps, steps)
        notes = [*conn.notes, *output_notes(streams, config.stream_tokens)]
        info, target = conn.info, conn.target
    result = InterferenceResult(info, target, config, warmup, tuple(streams), inject,
                                inject_prompt, ceiling or CeilingInputs(), tuple(notes))
    if result.windows()[2].gaps < config.streams:
        result = replace(result, notes=(*result.notes, Note(
            "the streams ended before the injected prefill did: nothing is known of after it"
            " (raise ", Field("stream_tokens"), ")")))
    return result
