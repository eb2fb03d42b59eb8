"""The timing record of one streamed request, and the definitions every figure follows.

Times are ``time.perf_counter_ns()`` on the client. The definitions are pdscope's own (see the
README, "Definitions"); other tools use the same names for other things:

* ``t_send``: just before the request bytes are written, after a connection was taken from the
  pool (see :mod:`pdscope.client.session` for the exact place). Opening a new connection is
  ``connect_s`` and is not part of TTFT.
* TTFT: ``t_send`` to the first chunk that carries at least one generated token. A chat chunk
  with only the role, a chunk with only usage, or one with empty text does not count.
* ITL: the gaps between consecutive token-bearing chunks, per token: a chunk with k tokens gives
  k gaps of gap / k. The raw chunk gaps are kept too (``chunk_gaps_s``).
* TPOT: ``(t_last - t_first) / (n_out - 1)``; the decode rate is ``1 / TPOT`` tokens/s.
* E2E: ``t_send`` to the last token.
* prefill rate: prompt tokens / prefill time, preferring what the server reports (Ollama
  ``prompt_eval_count / prompt_eval_duration``, llama.cpp ``timings.prompt_n / prompt_ms``) over
  prompt tokens / TTFT; ``prefill_source`` says which.
* token counts: the server's ``usage``, else its own counters, else the count of token-bearing
  chunks, flagged ``chunks-estimate``.

A record never holds an API key: nothing here is given one.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from typing import Any, Literal, get_args

from pdscope.client.counters import implausible_prefill
from pdscope.client.target import Api
from pdscope.units import NS

ErrorKind = Literal[
    "connect",  # refused, DNS, or closed before any response
    "http_4xx",
    "http_429",
    "http_5xx",
    "auth",  # 401 / 403
    "model_not_found",
    "timeout_connect",
    "timeout_first_token",
    "timeout_between_tokens",
    "timeout_total",
    "stream_broken",  # reset or ended mid-stream without a done marker, or an error event
    "bad_chunk",  # a chunk that is not JSON
    "overrun",  # the server kept streaming far past max_tokens; the client hung up
    "cancelled",  # the task running the request was cancelled
    "worker_lost",  # the load worker (process, Ray actor or node) died before it finished
]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)

TokenCountSource = Literal[
    "usage", "server-timings", "ollama-counters", "server-tokenizer", "chunks-estimate"
]
PrefillSource = Literal["ollama-counters", "llama.cpp-timings", "ttft"]



@dataclass(frozen=True)
class RequestRecord:
    """What happened to one streamed request. Failed requests are records too (``error`` set),
    so a load test counts them; :func:`pdscope.client.raise_for_record` turns one into an error.

    ``token_times_ns`` holds the receive time of every token-bearing chunk and ``chunk_tokens``
    the tokens in each (1 when the server does not say). ``server_sent_ns`` and
    ``server_due_ns`` are the send and scheduled times the reference server writes into each
    token-bearing chunk (same clock on one host); ``None`` for other servers.
    """

    request_id: str
    api: Api
    model: str
    t_send_ns: int | None
    t_first_token_ns: int | None
    t_last_token_ns: int | None
    t_end_ns: int | None = None  # when the stream ended (done marker, error or hang-up)
    scheduled_ns: int | None = None  # load tests: when the request was due to be sent
    t_start_ns: int | None = None  # when the caller asked for the request (before the pool)
    connect_s: float | None = None  # None: a pooled connection was reused
    pool_wait_s: float | None = None  # time queued for a free connection, when it had to wait
    token_times_ns: tuple[int, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_count_source: TokenCountSource = "chunks-estimate"
    cached_tokens: int | None = None
    server_timings: Mapping[str, float] | None = None
    finish_reason: str | None = None
    output_text: str = ""
    http_status: int | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    server_sent_ns: tuple[int, ...] | None = None
    server_due_ns: tuple[int, ...] | None = None

    # ---------------------------------------------------------------------------- outcome

    @property
    def ok(self) -> bool:
        """The request completed: no error. (A completed request may have 0 tokens.)"""
        return self.error is None

    @property
    def n_out(self) -> int:
        """Output tokens: the server's count when known, else the chunks' (an estimate)."""
        if self.output_tokens is not None:
            return self.output_tokens
        return sum(self.chunk_tokens)

    # ---------------------------------------------------------------------------- latency

    @property
    def ttft_s(self) -> float | None:
        """``t_send`` to the first token-bearing chunk, in seconds."""
        if self.t_send_ns is None or self.t_first_token_ns is None:
            return None
        return (self.t_first_token_ns - self.t_send_ns) / NS

    @property
    def e2e_s(self) -> float | None:
        """``t_send`` to the last token, in seconds."""
        if self.t_send_ns is None or self.t_last_token_ns is None:
            return None
        return (self.t_last_token_ns - self.t_send_ns) / NS

    @property
    def chunk_gaps_s(self) -> tuple[float, ...]:
        """Raw gaps between consecutive token-bearing chunks (what vLLM's benchmark calls ITL)."""
        return tuple((b - a) / NS for a, b in pairwise(self.token_times_ns))

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Gaps per token: a chunk that brought k tokens after a gap g gives k gaps of g / k."""
        out: list[float] = []
        ks = self.chunk_tokens if len(self.chunk_tokens) == len(self.token_times_ns) else None
        for i, gap in enumerate(self.chunk_gaps_s, start=1):
            k = max(1, ks[i]) if ks is not None else 1
            out.extend([gap / k] * k)
        return tuple(out)

    @property
    def tpot_s(self) -> float | None:
        """``(t_last - t_first) / (n_out - 1)``: the mean time a token after the first."""
        if self.t_first_token_ns is None or self.t_last_token_ns is None:
            return None
        n = self.n_out
        span = self.t_last_token_ns - self.t_first_token_ns
        if n < 2 or span <= 0:
            return None
        return span / NS / (n - 1)

    @property
    def decode_tok_s(self) -> float | None:
        """``1 / TPOT``: the decode rate one stream saw, tokens/s."""
        tpot = self.tpot_s
        return None if tpot is None else 1.0 / tpot

    @property
    def schedule_lag_s(self) -> float | None:
        """Load tests: how late the request went out against its schedule."""
        if self.scheduled_ns is None or self.t_send_ns is None:
            return None
        return (self.t_send_ns - self.scheduled_ns) / NS

    @property
    def client_lateness_ns(self) -> tuple[int, ...] | None:
        """Per token-bearing chunk: receive time minus the server's send time (reference server
        only). The client's own overhead, apart from the server's scheduling."""
        sent = self.server_sent_ns
        if sent is None or len(sent) != len(self.token_times_ns):
            return None
        return tuple(r - s for r, s in zip(self.token_times_ns, sent, strict=True))

    # ---------------------------------------------------------------------------- prefill

    @property
    def prefill_warning(self) -> str | None:
        """Why the server's own prefill figures were set aside, if they were (an Ollama cache hit
        counted as work: see :func:`pdscope.client.counters.implausible_prefill`)."""
        return implausible_prefill(self.server_timings) if self.server_timings else None

    def _prefill(self) -> tuple[float | None, PrefillSource | None]:
        st = self.server_timings or {}
        count, dur = st.get("prompt_eval_count"), st.get("prompt_eval_duration")
        if count and dur and self.prefill_warning is None:  # Ollama, durations in ns
            return count / dur * 1e9, "ollama-counters"
        n, ms = st.get("prompt_n"), st.get("prompt_ms")
        if n and ms:  # llama.cpp timings
            return n / ms * 1000.0, "llama.cpp-timings"
        ttft = self.ttft_s
        if self.prompt_tokens and ttft and ttft > 0:
            return self.prompt_tokens / ttft, "ttft"
        return None, None

    @property
    def prefill_tok_s(self) -> float | None:
        """Prompt tokens a second of prefill; see ``prefill_source`` for where it came from."""
        return self._prefill()[0]

    @property
    def prefill_source(self) -> PrefillSource | None:
        """``ollama-counters``, ``llama.cpp-timings`` (server-reported) or ``ttft`` (prompt
        tokens / TTFT, which includes queueing and network)."""
        return self._prefill()[1]

    # ---------------------------------------------------------------------------- JSON

    def derived(self) -> dict[str, Any]:
        """The derived figures, for people reading a JSONL file (ignored by ``from_dict``)."""
        itl = self.itl_s
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "decode_tok_s": self.decode_tok_s,
            "e2e_s": self.e2e_s,
            "median_itl_s": statistics.median(itl) if itl else None,
            "prefill_tok_s": self.prefill_tok_s,
            "prefill_source": self.prefill_source,
            "n_out": self.n_out,
        }

    def to_dict(self, with_derived: bool = True) -> dict[str, Any]:
        """A JSON-ready dict; ``from_dict`` reads it back to an equal record."""
        d = asdict(self)
        for key, value in d.items():
            if isinstance(value, tuple):
                d[key] = list(value)
        if self.server_timings is not None:
            d["server_timings"] = dict(self.server_timings)
        if with_derived:
            d["derived"] = self.derived()
        return d

    def to_json(self, with_derived: bool = True) -> str:
        """One line of JSON (a JSONL row)."""
        return json.dumps(self.to_dict(with_derived), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        for key in ("token_times_ns", "chunk_tokens"):
            kw[key] = tuple(kw.get(key) or ())
        for key in ("server_sent_ns", "server_due_ns"):
            if kw.get(key) is not None:
                kw[key] = tuple(kw[key])
        if kw.get("server_timings") is not None:
            kw["server_timings"] = dict(kw["server_timings"])
        return cls(**kw)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        return cls.from_dict(json.loads(line))


@dataclass
class RecordBuilder:
    """The mutable side of a record while its stream is read. Adapters fill it; ``build()``
    freezes it. Token counts are settled in ``build()``: usage, else server counters, else
    chunks."""

    request_id: str
    api: Api
    model: str
    scheduled_ns: int | None = None
    t_start_ns: int | None = None
    t_send_ns: int | None = None
    t_end_ns: int | None = None
    connect_start_ns: int | None = None
    connect_s: float | None = None
    queued_start_ns: int | None = None
    body_sent: bool = False  # t_send moved to the first body write
    pool_wait_s: float | None = None
    headers_received: bool = False
    http_status: int | None = None
    token_times_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    server_sent_ns: list[int] = field(default_factory=list)
    server_due_ns: list[int] = field(default_factory=list)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None
    server_timings: dict[str, float] | None = None
    finish_reason: str | None = None
    done: bool = False  # the stream's own end marker was seen ([DONE] or "done": true)
    error: str | None = None
    error_kind: ErrorKind | None = None

    def add_tokens(
        self,
        t_ns: int,
        text: str,
        k: int = 1,
        sent_ns: int | None = None,
        due_ns: int | None = None,
    ) -> None:
        """One token-bearing chunk, received at ``t_ns``, carrying ``k`` tokens."""
        self.token_times_ns.append(t_ns)
        self.chunk_tokens.append(max(1, k))
        self.text_parts.append(text)
        if sent_ns is not None:
            self.server_sent_ns.append(sent_ns)
        if due_ns is not None:
            self.server_due_ns.append(due_ns)

    def fail(self, kind: ErrorKind, message: str) -> None:
        """Keep the first failure: later ones are consequences of it."""
        if self.error is None:
            self.error_kind = kind
            self.error = " ".join(message.split())  # one line, always

    @property
    def n_chunks(self) -> int:
        return len(self.token_times_ns)

    def build(self) -> RequestRecord:
        st = self.server_timings or {}
        source: TokenCountSource
        if self.usage_completion_tokens is not None:
            out, source = self.usage_completion_tokens, "usage"
        elif "predicted_n" in st:
            out, source = int(st["predicted_n"]), "server-timings"
        elif "eval_count" in st:
            out, source = int(st["eval_count"]), "ollama-counters"
        else:
            out, source = sum(self.chunk_tokens), "chunks-estimate"
        prompt = self.usage_prompt_tokens
        if prompt is None and "prompt_n" in st:  # llama.cpp: prompt_n excludes the cached part
            prompt = int(st["prompt_n"] + st.get("cache_n", 0))
        if prompt is None and "prompt_eval_count" in st:
            prompt = int(st["prompt_eval_count"])
        cached = self.cached_tokens
        if cached is None and "cache_n" in st:
            cached = int(st["cache_n"])
        n = len(self.token_times_ns)
        return RequestRecord(
            request_id=self.request_id,
            api=self.api,
            model=self.model,
            t_send_ns=self.t_send_ns,
            t_first_token_ns=self.token_times_ns[0] if n else None,
            t_last_token_ns=self.token_times_ns[-1] if n else None,
            t_end_ns=self.t_end_ns,
            scheduled_ns=self.scheduled_ns,
            t_start_ns=self.t_start_ns,
            connect_s=self.connect_s,
            pool_wait_s=self.pool_wait_s,
            token_times_ns=tuple(self.token_times_ns),
            chunk_tokens=tuple(self.chunk_tokens),
            prompt_tokens=prompt,
            output_tokens=out,
            token_count_source=source,
            cached_tokens=cached,
            server_timings=dict(self.server_timings) if self.server_timings else None,
            finish_reason=self.finish_reason,
            output_text="".join(self.text_parts),
            http_status=self.http_status,
            error=self.error,
            error_kind=self.error_kind,
            server_sent_ns=tuple(self.server_sent_ns) if len(self.server_sent_ns) == n and n
            else None,
            server_due_ns=tuple(self.server_due_ns) if len(self.server_due_ns) == n and n
            else None,
        )
