"""Ollama's native streaming APIs: ``/api/generate`` and ``/api/chat``.

The stream is NDJSON, one JSON object a line (ollama/ollama ``docs/api.md`` and
``docs/api/streaming.mdx``; examples in ``tests/data/fixtures/servers/ollama/``). A line carries
``response`` (generate) or ``message.content`` (chat), and ``thinking`` / ``message.thinking`` for
reasoning models. The last line has ``"done": true`` — it may still carry a token — and the
server's counters, durations in nanoseconds: ``prompt_eval_count``, ``prompt_eval_duration``,
``eval_count``, ``eval_duration``, ``load_duration``, ``total_duration``. A line
``{"error": "..."}`` is a failure mid-stream. ``options.num_predict`` caps the output; Ollama has
no way to ignore the end-of-sequence token, so a fixed output length is a cap, not a promise.

The article's formulas, on those counters:

* decode rate = ``eval_count / eval_duration * 1e9`` tokens/s;
* prefill rate = ``prompt_eval_count / prompt_eval_duration * 1e9`` tokens/s.

Caution on the second: newer Ollama releases reuse the KV cache of a previous prompt and still
count the reused tokens in ``prompt_eval_count``, while ``prompt_eval_duration`` covers only the
part that was computed. A repeated prompt then shows an absurd prefill rate (millions of
tokens/s, or a few tokens' worth of time for thousands of tokens). :func:`implausible_prefill`
says when a rate looks like that, so a report can set it aside instead of printing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pdscope.client.record import RecordBuilder
from pdscope.client.target import Target

GENERATE_PATH = "/api/generate"
CHAT_PATH = "/api/chat"

COUNTERS = (
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
    "load_duration",
    "total_duration",
)

# No processor prefills faster than this; above it the duration left out cached tokens.
MAX_PLAUSIBLE_PREFILL_TOK_S = 1e6
# Many prompt tokens "evaluated" in less than this is a cache hit counted as work.
MIN_PLAUSIBLE_PREFILL_NS = 1_000_000
MANY_PROMPT_TOKENS = 64


def build_body(
    target: Target,
    max_tokens: int | None,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed request to ``target`` (``ollama`` or ``ollama-chat``)."""
    body: dict[str, Any] = {"model": target.model, "stream": True}
    if target.api == "ollama-chat":
        if messages is None:
            messages = [{"role": "user", "content": prompt or ""}]
        body["messages"] = [dict(m) for m in messages]
    else:
        body["prompt"] = prompt or ""
    if max_tokens is not None:
        body["options"] = {"num_predict": max_tokens}
    if target.extra_body:
        for key, value in target.extra_body.items():
            if key == "options" and isinstance(value, Mapping):
                body["options"] = {**body.get("options", {}), **value}
            else:
                body[key] = value
    return body


def path(target: Target) -> str:
    return CHAT_PATH if target.api == "ollama-chat" else GENERATE_PATH


def counters(obj: Mapping[str, Any]) -> dict[str, float]:
    """The timing counters of a final (``done``) Ollama response, those it has."""
    return {
        key: float(obj[key])
        for key in COUNTERS
        if isinstance(obj.get(key), (int, float)) and not isinstance(obj.get(key), bool)
    }


def decode_rate(c: Mapping[str, float]) -> float | None:
    """``eval_count / eval_duration * 1e9``: output tokens a second of decode."""
    n, dur = c.get("eval_count"), c.get("eval_duration")
    return n / dur * 1e9 if n and dur else None


def prefill_rate(c: Mapping[str, float]) -> float | None:
    """``prompt_eval_count / prompt_eval_duration * 1e9``: prompt tokens a second of prefill.
    See :func:`implausible_prefill` before trusting it on a repeated prompt."""
    n, dur = c.get("prompt_eval_count"), c.get("prompt_eval_duration")
    return n / dur * 1e9 if n and dur else None


def implausible_prefill(c: Mapping[str, float]) -> str | None:
    """Why the prefill rate of these counters cannot be real, or ``None`` if it can.

    Newer Ollama counts cached prompt tokens in ``prompt_eval_count`` but times only the
    uncached part in ``prompt_eval_duration``: a cache hit looks like an impossible rate.
    """
    n, dur = c.get("prompt_eval_count"), c.get("prompt_eval_duration")
    if not n or dur is None:
        return None
    if dur <= 0 or (n >= MANY_PROMPT_TOKENS and dur < MIN_PLAUSIBLE_PREFILL_NS):
        return (
            f"{n:.0f} prompt tokens in {dur / 1e6:.3f} ms: the prompt was mostly cached"
            " (Ollama counts cached tokens in prompt_eval_count but not their time)"
        )
    rate = n / dur * 1e9
    if rate > MAX_PLAUSIBLE_PREFILL_TOK_S:
        return (
            f"prefill rate {rate:,.0f} tok/s is beyond any hardware: the prompt was mostly"
            " cached (Ollama counts cached tokens in prompt_eval_count but not their time)"
        )
    return None


class OllamaStreamParser:
    """Reads an Ollama NDJSON stream into a :class:`RecordBuilder`."""

    def __init__(self, builder: RecordBuilder, chat: bool) -> None:
        self.builder = builder
        self.chat = chat
        self._tail = b""

    def feed(self, data: bytes, t_ns: int) -> None:
        buf = self._tail + data if self._tail else data
        lines = buf.split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            self.line(line, t_ns)
            if self.builder.done or self.builder.error is not None:
                return

    def close(self, t_ns: int) -> None:
        b = self.builder
        tail, self._tail = self._tail.strip(), b""
        if tail and not b.done and b.error is None:
            try:
                json.loads(tail)
            except ValueError:
                b.fail("stream_broken", "the stream ended in the middle of a line after"
                       f" {b.n_chunks} token chunks")
                return
            self.line(tail, t_ns)
        if not b.done and b.error is None:
            b.fail("stream_broken", 'the stream ended without a "done": true line after'
                   f" {b.n_chunks} token chunks")

    def line(self, raw: bytes, t_ns: int) -> None:
        """One NDJSON line, received at ``t_ns``."""
        b = self.builder
        text_line = raw.decode("utf-8").strip()
        if not text_line:
            return
        try:
            obj = json.loads(text_line)
        except ValueError:
            b.fail("bad_chunk", f"a line is not JSON after {b.n_chunks} token chunks:"
                   f" {text_line[:80]!r}")
            return
        if not isinstance(obj, dict):
            b.fail("bad_chunk", f"a line is not a JSON object: {text_line[:80]!r}")
            return
        if obj.get("error"):
            b.fail("stream_broken", f"Ollama sent an error mid-stream after {b.n_chunks}"
                   f" token chunks: {' '.join(str(obj['error']).split())}")
            return
        if self.chat:
            message = obj.get("message")
            message = message if isinstance(message, dict) else {}
            parts = (message.get("thinking"), message.get("content"))
        else:
            parts = (obj.get("thinking"), obj.get("response"))
        text = "".join(p for p in parts if isinstance(p, str))
        if text:
            b.add_tokens(t_ns, text)
        if obj.get("done") is True:
            found = counters(obj)
            if found:
                b.server_timings = found
            if obj.get("done_reason") is not None:
                b.finish_reason = str(obj["done_reason"])
            b.done = True
            b.t_end_ns = t_ns
