"""The prefix-cache A/B: does the server skip the prefill of a prompt prefix it has seen?

The article: a long system prompt is prefill work in every request, so it raises every TTFT;
a server with prefix caching keeps the KV cache of a shared prefix and the second request with
the same system prompt skips that part of the prefill entirely.

* **A** — a shared prefix (the "system prompt": for a chat API a system message, for a
  completions API just the start of the prompt) of ``prefix_tokens``, then a different question
  of ``suffix_tokens`` each request. The first (``cold``) computes the prefix; the ``requests``
  after it (``warm``) may find it cached.
* **B** — ``requests`` prompts of the same total length and the same shape, every one unique
  from its first token: nothing to reuse.

A first short request, kept apart, pays for any model load before either arm. The rule and its
threshold are in :func:`detection_threshold`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pdscope import roofline
from pdscope.charts import Chart, Series
from pdscope.checks import at_least
from pdscope.client import ClientOptions, Connection, RequestRecord, ServerInfo, Target, connect
from pdscope.errors import Field, Note, PdscopeError
from pdscope.experiments.common import CeilingInputs, ProgressFn, median, output_notes
from pdscope.figures import Figures, Metric, ResultKind, experiment_figures, number, register
from pdscope.metrics import scrape
from pdscope.servers import detect_metric_map
from pdscope.stats import Summary, summarize
from pdscope.workload import Prompt

# A prefix cache can save at most the prefix's share of the prefill. It is called detected when
# the warm requests save at least this fraction of that share: a half leaves room for the fixed
# overhead no cache removes (HTTP, tokenizing, scheduling, the last partial cache block) and for
# the run-to-run noise of a busy machine (a 25 % spread cannot fake a saving of half the prompt).
# With the default 1,500-token prefix and 100-token question that is warm < 0.53 × B.
DETECT_SAVING_SHARE = 0.5
# Below this share of the prompt a full cache hit would save too little to tell from noise.
MIN_PREFIX_SHARE = 0.3
# A cold A request much faster than B means the prefix was cached before the experiment began
# (the same --seed again, or another client sending it).
COLD_ALREADY_CACHED = 0.6
# The server flag that puts cached_tokens into usage (vLLM 0.32's
# vllm/entrypoints/launchers/cli_args.py: enable_prompt_tokens_details = False; SGLang's
# server arguments: enable_cache_report = False).


def detection_threshold(prefix_share: float) -> float | None:
    """The largest warm/B TTFT ratio read as a working prefix cache, for a prefix that is
    ``prefix_share`` of the prompt: ``1 − DETECT_SAVING_SHARE × prefix_share``. ``None`` when
    the prefix is too small a share to tell."""
    if prefix_share < MIN_PREFIX_SHARE:
        return None
    return 1.0 - DETECT_SAVING_SHARE * prefix_share


@dataclass(frozen=True, kw_only=True)
class PrefixConfig(ClientOptions):
    prefix_tokens: int = 1500
    suffix_tokens: int = 100
    requests: int = 5
    max_tokens: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.prefix_tokens, 1, "prefix_tokens")
        at_least(self.suffix_tokens, 1, "suffix_tokens")
        at_least(self.requests, 1, "requests")
        at_least(self.max_tokens, 1, "max_tokens")


@dataclass(frozen=True)
class CachedTokens:
    """Prompt tokens the server says it took from its cache, per request, and from where:
    ``usage`` (``usage.prompt_tokens_details.cached_tokens``), ``server-timings`` (llama.cpp's
    ``timings.cache_n``), ``metrics`` (the growth of the prefix-cache hit counter on
    ``/metrics`` across the request) or ``None`` (the server does not say)."""

    source: str | None
    cold: int | None
    warm: tuple[int | None, ...]
    unique: tuple[int | None, ...]
    metric: str | None = None

    @property
    def warm_median(self) -> float | None:
        return median([v for v in self.warm if v is not None])

    @property
    def unique_median(self) -> float | None:
        return median([v for v in self.unique if v is not None])


@dataclass(frozen=True)
class PrefixResult:
    server: ServerInfo
    target: Target
    config: PrefixConfig
    warmup: RequestRecord
    cold: RequestRecord
    warm: tuple[RequestRecord, ...]
    unique: tuple[RequestRecord, ...]
    prefix: Prompt
    cached: CachedTokens
    prompt_tokens: int
    ceiling: CeilingInputs = field(default_factory=CeilingInputs)
    notes: tuple[str, ...] = ()

    @property
    def ttft_warm(self) -> Summary | None:
        return summarize(r.ttft_s for r in self.warm)

    @property
    def ttft_unique(self) -> Summary | None:
        return summarize(r.ttft_s for r in self.unique)

    @property
    def prefix_share(self) -> float:
        return self.prefix.tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def threshold(self) -> float | None:
        return detection_threshold(self.prefix_share)

    @property
    def warm_over_unique(self) -> float | None:
        w, u = self.ttft_warm, self.ttft_unique
        return w.median / u.median if w and u and u.median > 0 else None

    @property
    def cold_over_unique(self) -> float | None:
        """A-cold over median B: near 1 when the prefix was not cached before the run."""
        u = self.ttft_unique
        if self.cold.ttft_s is None or u is None or u.median <= 0:
            return None
        return self.cold.ttft_s / u.median

    @property
    def prefix_cache_detected(self) -> bool | None:
        """Warm A requests at most :func:`detection_threshold` × the unique ones' TTFT."""
        ratio, threshold = self.warm_over_unique, self.threshold
        if ratio is None or threshold is None:
            return None
        return ratio <= threshold

    @property
    def ttft_saved_s(self) -> float | None:
        """What the cache saves a request: median B − median A-warm."""
        w, u = self.ttft_warm, self.ttft_unique
        return u.median - w.median if w and u else None

    @property
    def cached_share_of_prompt(self) -> float | None:
        m = self.cached.warm_median
        return m / self.prompt_tokens if m is not None and self.prompt_tokens else None

    @property
    def server_reports_hits(self) -> bool | None:
        """The server's own count says the warm requests found at least half the prefix."""
        m = self.cached.warm_median
        return None if m is None else m >= 0.5 * self.prefix.tokens

    @property
    def verdict(self) -> str:
        detected, saved = self.prefix_cache_detected, self.ttft_saved_s
        if detected is None:
            return Note("The prefix is too small a share of the prompt to tell a cache from"
                        " noise: raise ", Field("prefix_tokens"), " or lower ",
                        Field("suffix_tokens"), ".")
        if detected:
            text = (f"Prefix caching works: a request that repeats the {self.prefix.tokens:,}-"
                    f"token prefix starts {saved:.2f} s sooner than one that does not"
                    f" ({self.warm_over_unique:.0%} of its TTFT).")
            if self.server_reports_hits is False:
                text += " The server's own counter does not show the hits, though."
            return text
        text = (f"No prefix cache seen: repeating the {self.prefix.tokens:,}-token prefix left"
                f" the TTFT at {self.warm_over_unique:.2f} times a unique prompt's (a ratio,"
                " not a share: noise puts it either side of 1). A server with"
                " prefix caching would skip that prefill (vLLM: --enable-prefix-caching;"
                " SGLang: on unless --disable-radix-cache; llama.cpp: --cache-reuse / slots).")
        if self.server_reports_hits:
            text += (" Yet the server counts cache hits: the saving is too small beside the"
                     " fixed overhead to see in the TTFT.")
        return text

    def ceilings(self) -> dict[str, Any]:
        ci = self.ceiling
        if not ci.known:
            return {"prefix_ttft_floor_s": None, "prefix_kv_bytes": None}
        assert ci.model is not None and ci.device is not None
        floor = roofline.prefill_ceiling(ci.model, ci.device, max(1, self.prefix.tokens))
        kv = (roofline.kv_bytes_per_request(ci.model, self.prefix.tokens)
              if ci.model.has_attention_shape else None)
        held = self.floor_held
        return {"prefix_ttft_floor_s": held.limit if held else floor.ttft_s,
                "prefix_ttft_floor_beaten": held.beaten if held else None,
                "prefix_kv_bytes": kv}

    @property
    def floor_held(self) -> roofline.Held | None:
        """The prefix's TTFT floor beside the median TTFT of a unique prompt, which computes
        the prefix and more: the floor may not be above it."""
        ci, u = self.ceiling, self.ttft_unique
        if not ci.known or u is None:
            return None
        assert ci.model is not None and ci.device is not None
        floor = roofline.prefill_ceiling(ci.model, ci.device, max(1, self.prefix.tokens))
        return ci.hold_ttft(u.median, floor.ttft_s)

    @property
    def ceiling_warnings(self) -> tuple[str, ...]:
        held = self.floor_held
        if held is None or held.warning is None:
            return ()
        return (f"a unique prompt, longer than the prefix alone: {held.warning}",)

    def charts(self) -> list[Chart]:
        w, u = self.ttft_warm, self.ttft_unique
        bars = Series("TTFT, median", (0.0, 1.0, 2.0),
                      (self.cold.ttft_s, w.median if w else None, u.median if u else None),
                      "bar")
        a_runs = (self.cold, *self.warm)
        per_request = (
            Series("A: shared prefix (first is cold)", tuple(float(i) for i in
                                                             range(len(a_runs))),
                   tuple(r.ttft_s for r in a_runs), "line"),
            Series("B: unique prompts", tuple(float(i + 1) for i in range(len(self.unique))),
                   tuple(r.ttft_s for r in self.unique), "line"),
        )
        return [
            Chart("prefix-ttft", "TTFT with and without a shared prefix", "", "TTFT (s)",
                  (bars,), categories=("A cold", "A warm", "B unique")),
            Chart("prefix-requests", "TTFT request by request", "request", "TTFT (s)",
                  per_request),
        ]

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        w, u = self.ttft_warm, self.ttft_unique
        out: dict[str, Any] = {
            "experiment": "prefix",
            "server": self.server.kind,
            "server_version": self.server.version,
            "url": self.server.base_url,
            "api": self.target.api,
            "model": self.target.model,
            "config": self.config.to_json(),
            "prefix_tokens": self.prefix.tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefix_share": self.prefix_share,
            "ttft_a_cold_s": self.cold.ttft_s,
            "ttft_a_warm_s": w.median if w else None,
            "ttft_b_s": u.median if u else None,
            "spread": {"a_warm": w.to_json() if w else None,
                       "b": u.to_json() if u else None},
            "warm_over_b": self.warm_over_unique,
            "cold_over_b": self.cold_over_unique,
            "prefix_cache_detected": self.prefix_cache_detected,
            "detection": {
                "rule": "median A-warm TTFT <= threshold x median B TTFT",
                "threshold": self.threshold,
                "saving_share": DETECT_SAVING_SHARE,
                "min_prefix_share": MIN_PREFIX_SHARE,
            },
            "ttft_saved_s": self.ttft_saved_s,
            "ttft_saved_share": 1 - self.warm_over_unique if self.warm_over_unique is not None
            else None,
            "cached_tokens": {
                "source": self.cached.source,
                "metric": self.cached.metric,
                "a_cold": self.cached.cold,
                "a_warm": list(self.cached.warm),
                "b": list(self.cached.unique),
                "a_warm_median": self.cached.warm_median,
                "b_median": self.cached.unique_median,
                "share_of_prompt": self.cached_share_of_prompt,
                "share_of_prefix": self.cached.warm_median / self.prefix.tokens
                if self.cached.warm_median is not None and self.prefix.tokens else None,
            },
            "server_reports_hits": self.server_reports_hits,
            "verdict": self.verdict,
            **self.ceilings(),
            **self.ceiling.to_json(),
            "warmup": {"ttft_s": self.warmup.ttft_s},
            "charts": [c.to_json() for c in self.charts()],
            "notes": [*self.notes, *self.ceiling.notes],
            "ceiling_warnings": list(self.ceiling_warnings),
        }
        if raw:
            out["requests"] = [r.to_dict() for r in (self.warmup, self.cold, *self.warm,
                                                     *self.unique)]
        return out

    def figures(self) -> Figures:
        return prefix_figures(self.to_json())


TTFT_SAVED = Metric("ttft_saved_share", "TTFT saved by the prefix cache", False, "share")


def prefix_figures(d: Mapping[str, Any]) -> Figures:
    """A prefix test's figure: the share of the TTFT its cached prefix saved."""
    return experiment_figures(d, (TTFT_SAVED,),
                              ttft_saved_share=number(d.get("ttft_saved_share")))


PREFIX = register(ResultKind("prefix", (TTFT_SAVED,), from_json=prefix_figures))


class _HitCounter:
    """The prefix-cache hit counter on ``/metrics`` (vLLM, SGLang ...), read around each
    request: the experiment sends one request at a time, so the growth is that request's
    hits (unless another client is busy on the same server)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.names: tuple[str, ...] = ()
        self.metric: str | None = None

    async def start(self) -> None:
        if not self.conn.info.metrics:
            return
        try:
            snap = await scrape(self.conn.info.base_url, self.conn.session)
        except PdscopeError:
            return
        metric_map = detect_metric_map(snap.names)
        if metric_map is None:
            return
        names = metric_map.names("prefix_hits")
        if names and snap.counter(names) is not None:
            self.names = names
            self.metric = snap.found(names, "counter") or names[0]

    async def read(self) -> float | None:
        if not self.names:
            return None
        try:
            snap = await scrape(self.conn.info.base_url, self.conn.session)
        except PdscopeError:
            return None
        return snap.counter(self.names)


async def _send_counted(
    conn: Connection, counter: _HitCounter, prompt: Prompt, max_tokens: int,
    system: Prompt | None = None,
) -> tuple[RequestRecord, int | None]:
    before = await counter.read()
    record = await conn.send(prompt, max_tokens, system=system)
    after = await counter.read()
    delta = round(after - before) if before is not None and after is not None else None
    return record, delta


async def run_prefix(
    url: str | Connection,
    config: PrefixConfig,
    *,
    ceiling: CeilingInputs | None = None,
    progress: ProgressFn | None = None,
) -> PrefixResult:
    """The prefix-cache A/B on the server at ``url``. Raises :class:`RunError` when a request
    fails, :class:`InputError` for a bad config."""
    total_tokens = config.prefix_tokens + config.suffix_tokens
    steps = 2 + 2 * config.requests
    async with connect(url, config) as conn:
        counter = _HitCounter(conn)
        await counter.start()
        if progress:
            progress("warm-up", 0, steps)
        warmup = await conn.send(await conn.prompt(32, 0), config.max_tokens)
        prefix = await conn.prompt(config.prefix_tokens, 1)

        async def arm_a(i: int) -> tuple[RequestRecord, int | None]:
            if conn.chat:
                question = await conn.prompt(config.suffix_tokens, 1000 + i)
                return await _send_counted(conn, counter, question, config.max_tokens, prefix)
            prompt = await conn.prompt(total_tokens, 1000 + i, prefix=prefix.text)
            return await _send_counted(conn, counter, prompt, config.max_tokens)

        async def arm_b(i: int) -> tuple[RequestRecord, int | None]:
            if conn.chat:
                system = await conn.prompt(config.prefix_tokens, 2000 + i)
                question = await conn.prompt(config.suffix_tokens, 3000 + i)
                return await _send_counted(conn, counter, question, config.max_tokens, system)
            prompt = await conn.prompt(total_tokens, 2000 + i)
            return await _send_counted(conn, counter, prompt, config.max_tokens)

        if progress:
            progress("A: shared prefix, cold", 1, steps)
        cold, cold_hits = await arm_a(0)
        warm: list[tuple[RequestRecord, int | None]] = []
        for i in range(config.requests):
            if progress:
                progress(f"A: shared prefix, warm {i + 1} of {config.requests}", 2 + i, steps)
            warm.append(await arm_a(1 + i))
        unique: list[tuple[RequestRecord, int | None]] = []
        for i in range(config.requests):
            if progress:
                progress(f"B: unique prompt {i + 1} of {config.requests}",
                         2 + config.requests + i, steps)
            unique.append(await arm_b(i))
        if progress:
            progress("done", steps, steps)
        info, target = conn.info, conn.target
        notes = list(conn.notes)
        metric = counter.metric

    records = [cold, *(r for r, _ in warm), *(r for r, _ in unique)]
    cached = _cached_tokens(cold, cold_hits, warm, unique, metric)
    if cached.source == "metrics":
        notes.append(f"cached tokens are the growth of {metric} across each request"
                     " (another client on the server would add to them)")
    flag = info.family.cached_tokens_flag
    if flag is not None and cached.source != "usage":
        notes.append(f"{info.kind} sends usage.prompt_tokens_details.cached_tokens only when"
                     f" started with {flag} (off by default)")
    notes += output_notes(records, config.max_tokens)
    counts = [r.prompt_tokens for r, _ in warm if r.prompt_tokens is not None]
    prompt_tokens = sorted(counts)[len(counts) // 2] if counts else total_tokens
    result = PrefixResult(info, target, config, warmup, cold, tuple(r for r, _ in warm),
                          tuple(r for r, _ in unique), prefix, cached, prompt_tokens,
                          ceiling or CeilingInputs(), tuple(notes))
    ratio = result.cold_over_unique
    if ratio is not None and ratio < COLD_ALREADY_CACHED:
        result = replace(result, notes=(
            *result.notes,
            Note(f"the cold request was already {ratio:.0%} of a unique prompt's TTFT: the"
                 " prefix was probably cached before this run (the same ", Field("seed"),
                 " again, or another client)"),
        ))
    return result


def _cached_tokens(
    cold: RequestRecord,
    cold_hits: int | None,
    warm: list[tuple[RequestRecord, int | None]],
    unique: list[tuple[RequestRecord, int | None]],
    metric: str | None,
) -> CachedTokens:
    records = [cold, *(r for r, _ in warm), *(r for r, _ in unique)]
    if any(r.cached_tokens is not None for r in records):
        source = "server-timings" if any((r.server_timings or {}).get("cache_n") is not None
                                         for r in records) else "usage"
        return CachedTokens(source, cold.cached_tokens,
                            tuple(r.cached_tokens for r, _ in warm),
                            tuple(r.cached_tokens for r, _ in unique))
    if metric is not None:
        return CachedTokens("metrics", cold_hits, tuple(h for _, h in warm),
                            tuple(h for _, h in unique), metric)
    return CachedTokens(None, None, tuple(None for _ in warm), tuple(None for _ in unique))
