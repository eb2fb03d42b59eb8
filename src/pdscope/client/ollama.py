"""Ollama's native streaming APIs: ``/api/generate`` and ``/api/chat``.

The stream is NDJSON, one JSON object a line (ollama/ollama ``docs/api.md`` and
``docs/api/streaming.mdx``; examples in ``tests/data/fixtures/servers/ollama/``). A line carries
``response`` (generate) or ``message.content`` (chat), and ``thinking`` / ``message.thinking`` for
reasoning models (kept apart from the answer: :mod:`pdscope.client.reasoning`). The last line
has ``"done": true`` — it may still carry a token — and the server's counters, durations in
nanoseconds: ``prompt_eval_count``, ``prompt_eval_duration``, ``eval_count``,
``eval_duration``, ``load_duration``, ``total_duration``. A line ``{"error": "..."}`` is a
failure mid-stream. ``options.num_predict`` caps the output; Ollama has no way to ignore the
end-of-sequence token, so a fixed output length is a cap, not a promise.

The counters and the article's formulas on them are in :mod:`pdscope.client.counters`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pdscope.client.chunkjson import loads
from pdscope.client.counters import counters  # also read from here by older callers
from pdscope.client.reasoning import Parts, ThinkTags, ollama_parts
from pdscope.client.record import RecordBuilder
from pdscope.client.target import Target, prompt_fields

GENERATE_PATH = "/api/generate"
CHAT_PATH = "/api/chat"


def build_body(
    target: Target,
    max_tokens: int | None,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed request to ``target`` (``ollama`` or ``ollama-chat``)."""
    body: dict[str, Any] = {"model": target.model, "stream": True,
                            **prompt_fields(target.api == "ollama-chat", prompt, messages)}
    options = target.fields.ollama_options()  # checked: no num_predict among them
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    if options:
        body["options"] = options
    for extra in (target.fields.extra_body, target.extra_body or {}):
        for key, value in extra.items():
            if key == "options" and isinstance(value, Mapping):
                body["options"] = {**body.get("options", {}), **value}
            else:
                body[key] = value
    return body


def path(target: Target) -> str:
    return CHAT_PATH if target.api == "ollama-chat" else GENERATE_PATH


def _plausible(value: Any) -> bool:
    """False for a number no counter can be: negative, NaN, infinite or past 2**63 (Python's json
    reads NaN, Infinity and integers of any size)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    try:
        return math.isfinite(value) and 0 <= value < 2**63
    except OverflowError:  # an int beyond float range
        return False


class OllamaStreamParser:
    """Reads an Ollama NDJSON stream into a :class:`RecordBuilder`."""

    def __init__(self, builder: RecordBuilder, chat: bool) -> None:
        self.builder = builder
        self.chat = chat
        self._tail = b""
        self._tags = ThinkTags()

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
                loads(tail)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
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
        try:
            text_line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            b.fail("bad_chunk", f"a line is not UTF-8 text ({exc.reason}) after {b.n_chunks}"
                   " token chunks")
            return
        if not text_line:
            return
        try:
            obj = loads(text_line)
        except (ValueError, RecursionError):
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
        parts = ollama_parts(obj, self.chat)
        if parts.answer:  # an Ollama that does not parse the thought leaves <think> in it
            tagged, retro = self._tags.split(parts.answer)
            parts = Parts(parts.reasoning + tagged.reasoning, tagged.answer)
            if retro:
                b.earlier_was_reasoning()
        if parts:
            b.add_parts(t_ns, parts)
        if obj.get("done") is True:
            found = counters({k: v for k, v in obj.items() if _plausible(v)})
            if found:
                b.server_timings = found
            if obj.get("done_reason") is not None:
                b.finish_reason = str(obj["done_reason"])
            b.done = True
            b.t_end_ns = t_ns
