"""The timing record of one streamed request, and the definitions every figure follows.

Times are ``time.perf_counter_ns()`` on the client. The definitions are pdscope's own (see the
README, "Definitions"); other tools use the same names for other things:

* ``t_send``: just before the request bytes are written, after a connection was taken from the
  pool (see :mod:`pdscope.client.session` for the exact place). Opening a new connection is
  ``connect_s`` and is not part of TTFT.
* TTFT: ``t_send`` to the first chunk that carries at least one generated token. A chat chunk
  with only the role, a chunk with only usage, or one with empty text does not count. A token
  of reasoning ("thinking") is a generated token: TTFT ends with the prefill.
* TTFO: ``t_send`` to the first chunk that carries answer text (content, a tool call), not
  only reasoning: the time to first output token, AIPerf's ``time_to_first_output_token``
  (:mod:`pdscope.client.reasoning`). Equal to TTFT for a model that does not reason; the
  difference is the thinking.
* ITL: the gaps between consecutive token-bearing chunks, per token: a chunk with k tokens gives
  k gaps of gap / k. The raw chunk gaps are kept too (``chunk_gaps_s``).
* TPOT: ``(t_last - t_first) / (n_out - 1)``; the decode rate is ``1 / TPOT`` tokens/s.
* E2E: ``t_send`` to the last token.
* prefill rate: prompt tokens / prefill time, preferring what the server reports (Ollama
  ``prompt_eval_count / prompt_eval_duration``, llama.cpp ``timings.prompt_n / prompt_ms``) over
  prompt tokens / TTFT; ``prefill_source`` says which.
* token counts: the server's ``usage``, else its own counters, else the count of token-bearing
  chunks, flagged ``chunks-estimate``.
* a prompt cut short: ``sent_prompt_tokens`` is what the client sent (the prompt builder's count,
  by the server's tokenizer unless ``sent_prompt_estimated``) beside the ``prompt_tokens`` the
  server reports; a shortfall past :func:`pdscope.client.truncation.allowed_shortfall` marks the
  request ``truncated`` (a chat template only adds tokens, so only a shortfall counts).
  chunks, flagged ``chunks-estimate``. Reasoning tokens: the server's
  ``completion_tokens_details.reasoning_tokens``, else the tokens of the chunks that carried
  reasoning; they are part of the output tokens.

A record never holds an API key: nothing here is given one.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any, Literal, get_args

import numpy as np

from pdscope.client.counters import implausible_prefill
from pdscope.client.reasoning import Parts, reasoning_share
from pdscope.client.target import Api
from pdscope.client.truncation import is_truncated
from pdscope.figures import series_of
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
    "context_exceeded",  # the server refused a prompt (+ max_tokens) longer than its context
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
    sent_prompt_tokens: int | None = None  # what the client sent, by its prompt builder
    sent_prompt_estimated: bool = False  # that count is an estimate (no server tokenizer)
    reasoning_tokens: int | None = None  # None: the stream carried no reasoning
    t_first_answer_ns: int | None = None  # the first chunk with answer text (not only thought)

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

    @property
    def truncated(self) -> bool:
        """The server reports fewer prompt tokens than were sent, past the tolerance: it cut
        the prompt (Ollama past ``num_ctx``), so the model never saw all of it and the TTFT is
        that of a shorter prompt."""
        if not self.ok or self.sent_prompt_tokens is None or self.prompt_tokens is None:
            return False
        return is_truncated(self.sent_prompt_tokens, self.prompt_tokens,
                            estimated=self.sent_prompt_estimated)

    # ---------------------------------------------------------------------------- latency

    @property
    def ttft_s(self) -> float | None:
        """``t_send`` to the first token-bearing chunk, in seconds."""
        if self.t_send_ns is None or self.t_first_token_ns is None:
            return None
        return (self.t_first_token_ns - self.t_send_ns) / NS

    @property
    def reasoned(self) -> bool:
        """The stream carried reasoning (thinking) before or beside its answer."""
        return self.reasoning_tokens is not None

    @property
    def ttfo_s(self) -> float | None:
        """``t_send`` to the first answer token (TTFO), in seconds: TTFT plus the thinking.
        ``None`` when no answer came (the output ended while the model still thought)."""
        if self.t_send_ns is None or self.t_first_answer_ns is None:
            return None
        return (self.t_first_answer_ns - self.t_send_ns) / NS

    @property
    def thinking_s(self) -> float | None:
        """From the first token to the first answer token: the time spent thinking, in
        seconds (``None`` for a stream with no reasoning, or no answer)."""
        if not self.reasoned or self.t_first_token_ns is None or self.t_first_answer_ns is None:
            return None
        return (self.t_first_answer_ns - self.t_first_token_ns) / NS

    @property
    def answer_tokens(self) -> int:
        """Output tokens that were answer, not reasoning."""
        return max(0, self.n_out - (self.reasoning_tokens or 0))

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
        ks = self.chunk_tokens if len(self.chunk_tokens) == len(self.token_times_ns) else None
        if ks is None or max(ks[1:], default=1) <= 1:  # a token a chunk: the gaps themselves
            return self.chunk_gaps_s
        out: list[float] = []
        for i, gap in enumerate(self.chunk_gaps_s, start=1):
            k = max(1, ks[i]) if ks is not None else 1
            out.extend([gap / k] * k)
        return tuple(out)

    @property
    def first_gap_index(self) -> int:
        """The output position ``j`` of the first gap in :attr:`itl_s` (gap ``j`` lies between
        tokens ``j`` and ``j + 1``): 0, unless the first chunk brought ``k`` tokens, whose
        ``k − 1`` gaps nobody saw; then ``k − 1``."""
        if self.chunk_tokens and len(self.chunk_tokens) == len(self.token_times_ns):
            return max(1, self.chunk_tokens[0]) - 1
        return 0

    @property
    def writes(self) -> tuple[tuple[int, int], ...]:
        """``(receive time, tokens)`` of each write the client read: chunks received at one
        instant came in one read (a server short of CPU sends what piled up in one write, as
        vLLM's API server does), so they count as one write of all their tokens."""
        ks = (self.chunk_tokens if len(self.chunk_tokens) == len(self.token_times_ns)
              else (1,) * len(self.token_times_ns))
        out: list[tuple[int, int]] = []
        for t, k in zip(self.token_times_ns, ks, strict=True):
            if out and out[-1][0] == t:
                out[-1] = (t, out[-1][1] + max(1, k))
            else:
                out.append((t, max(1, k)))
        return tuple(out)

    @property
    def step_gaps_s(self) -> tuple[float, ...]:
        """Gaps per token with every write spread over its tokens: a write that brought k
        tokens after a gap g gives k gaps of g / k, so a burst of tokens that piled up reads as
        the steps that made them, not as one long gap and k − 1 zeros. The first is gap
        :attr:`first_step_index`."""
        w = self.writes
        return tuple(g for (a, _), (b, k) in pairwise(w) for g in [(b - a) / NS / k] * k)

    @property
    def first_step_index(self) -> int:
        """The output position of the first gap in :attr:`step_gaps_s`: the tokens of the
        first write have no gap between them, so it is that write's tokens less one."""
        w = self.writes
        return w[0][1] - 1 if w else 0

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
        prefill_tok_s, prefill_source = self._prefill()
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "decode_tok_s": self.decode_tok_s,
            "e2e_s": self.e2e_s,
            "median_itl_s": statistics.median(itl) if itl else None,
            "prefill_tok_s": prefill_tok_s,
            "prefill_source": prefill_source,
            "n_out": self.n_out,
            "truncated": self.truncated,
            "ttfo_s": self.ttfo_s if self.reasoned else None,
            "thinking_s": self.thinking_s,
        }

    def to_dict(self, with_derived: bool = True) -> dict[str, Any]:
        """A JSON-ready dict; ``from_dict`` reads it back to an equal record."""
        # Field by field, not ``asdict``: that deep-copies every token time one by one, and a
        # load test writes a record per request (the fields are numbers, text, tuples of them).
        d = {name: getattr(self, name) for name in _RECORD_FIELDS}
        for key, value in d.items():
            if type(value) is tuple:
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


def request_series(saved: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The per-request series (:mod:`pdscope.figures`) of saved records (a probe's
    ``requests``, as :meth:`RequestRecord.to_dict` wrote them): :func:`record_series`."""
    return record_series([RequestRecord.from_dict(d) for d in saved
                          if d.get("error") is None and d.get("t_first_token_ns") is not None])


def record_series(records: Iterable[RequestRecord]) -> dict[str, np.ndarray]:
    """The per-request series (:mod:`pdscope.figures`) of records: the completed ones that
    got a token, in send order."""
    done = [r for r in records if r.ok and r.t_first_token_ns is not None]
    done.sort(key=lambda r: r.t_send_ns or 0)
    return series_of({
        "ttft": [r.ttft_s for r in done if r.ttft_s is not None],
        "itl": [g for r in done for g in r.itl_s],
        "tpot": [r.tpot_s for r in done if r.tpot_s is not None],
        "e2e": [r.e2e_s for r in done if r.e2e_s is not None],
        "decode": [r.decode_tok_s for r in done if r.decode_tok_s is not None],
        "prefill": [r.prefill_tok_s for r in done if r.prefill_tok_s is not None],
        # Only the requests that reasoned: for the others TTFO is TTFT.
        "ttfo": [r.ttfo_s for r in done if r.reasoned and r.ttfo_s is not None],
        "reasoning_tokens": [float(r.reasoning_tokens) for r in done
                             if r.reasoning_tokens is not None],
    })


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))


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
    chunk_reasoning: list[int] = field(default_factory=list)  # reasoning tokens a chunk
    t_first_answer_ns: int | None = None
    saw_reasoning: bool = False
    usage_reasoning_tokens: int | None = None
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
        reasoning_k: int = 0,
        answer: bool = True,
    ) -> None:
        """One token-bearing chunk, received at ``t_ns``, carrying ``k`` tokens, of which
        ``reasoning_k`` were reasoning; ``answer``: it carried answer text too."""
        # Comparisons, not max() and min(): this runs for every chunk of every stream.
        if k < 1:
            k = 1
        self.token_times_ns.append(t_ns)
        self.chunk_tokens.append(k)
        if reasoning_k > 0 or not answer:
            self.chunk_reasoning.append(max(0, min(k, reasoning_k)))
            self.saw_reasoning = True
        else:
            self.chunk_reasoning.append(0)
        if answer and self.t_first_answer_ns is None:
            self.t_first_answer_ns = t_ns
        self.text_parts.append(text)
        if sent_ns is not None:
            self.server_sent_ns.append(sent_ns)
        if due_ns is not None:
            self.server_due_ns.append(due_ns)

    def add_parts(self, t_ns: int, parts: Parts, k: int = 1, sent_ns: int | None = None,
                  due_ns: int | None = None) -> None:
        """One token-bearing chunk as :mod:`pdscope.client.reasoning` split it."""
        self.add_tokens(t_ns, parts.text, k, sent_ns, due_ns, reasoning_share(parts, max(1, k)),
                        bool(parts.answer))

    def earlier_was_reasoning(self) -> None:
        """Every chunk so far was reasoning (a ``</think>`` closed a thought the prompt had
        opened): no answer yet."""
        self.chunk_reasoning = list(self.chunk_tokens)
        self.t_first_answer_ns = None
        self.saw_reasoning = True

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
        reasoning: int | None = None
        if self.usage_reasoning_tokens is not None and (self.saw_reasoning
                                                        or self.usage_reasoning_tokens > 0):
            reasoning = self.usage_reasoning_tokens
        elif self.saw_reasoning:
            thought: int = sum(self.chunk_reasoning)
            counted: int = sum(self.chunk_tokens)
            if source != "chunks-estimate" and counted > 0:
                # Chunks counted k = 1 each: scale to the server's count of the output.
                thought = round(out * thought / counted)
            reasoning = thought
        if reasoning is not None:
            reasoning = min(reasoning, out)
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
            reasoning_tokens=reasoning,
            t_first_answer_ns=self.t_first_answer_ns if reasoning is not None
            else (self.token_times_ns[0] if n else None),
        )
