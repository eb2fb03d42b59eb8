"""The OpenAI-compatible streaming APIs: ``/v1/completions`` and ``/v1/chat/completions``.

Requests stream (``stream: true``) and ask for usage in the last chunk
(``stream_options: {"include_usage": true}``: that chunk has ``choices: []``; every other chunk
has ``usage: null``). A server whose family takes ``continuous_usage_stats`` (vLLM, the
reference server) is asked for usage in every chunk, whose running ``completion_tokens`` tells
how many tokens each chunk carried.

What a chunk carries:

* completions: ``choices[0].text``; chat: ``choices[0].delta`` with ``content`` and, for
  reasoning models, ``reasoning_content`` (llama.cpp, DeepSeek style) or ``reasoning`` — reasoning
  tokens are generated tokens, so they count, and are kept apart from the answer's
  (:mod:`pdscope.client.reasoning`, with ``<think>`` tags left in the text). A chat chunk with
  only ``role``, or an empty text, is not a token (vLLM's own benchmark counts the role chunk as
  the first token; pdscope does not); where the running usage count rose on it, those tokens
  count with the next chunk that has text.
* ``usage``: ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
  ``completion_tokens_details.reasoning_tokens`` (OpenAI's and DeepSeek's APIs).
* llama.cpp's ``timings`` (ggml-org/llama.cpp ``tools/server/README.md``, "Timings and context
  usage"): ``prompt_n`` (prompt tokens processed, the cached ones not included), ``cache_n``,
  ``prompt_ms``, ``predicted_n``, ``predicted_ms``. Kept as ``server_timings``.
* ``pdscope_sent_ns`` / ``pdscope_due_ns``: the reference server's send and scheduled times.

Fixed output length (``Target.fixed_output``): the fields each server accepts are its family's
(:mod:`pdscope.servers`, ``fixed_output``, each checked in its source or docs); a generic OpenAI
server gets none (a strict server rejects unknown fields). The user's fields
(``Target.fields``, :mod:`pdscope.client.fields`) are merged after them, and ``Target.extra_body``
overrides any of this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec

from pdscope.client.chunkjson import loads
from pdscope.client.faults import server_message
from pdscope.client.reasoning import Parts, ThinkTags, chat_delta_parts, usage_reasoning_tokens
from pdscope.client.record import RecordBuilder
from pdscope.client.sse import DONE, SSEDecoder
from pdscope.client.target import Target, prompt_fields
from pdscope.errors import RunError
from pdscope.servers import family, fixed_output_fields

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"

# More tokens than this in one chunk is not a per-chunk usage count: the chunk counts as 1.
_MAX_TOKENS_A_CHUNK = 1 << 16

def build_body(
    target: Target,
    max_tokens: int | None,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed request to ``target`` (``openai`` or ``openai-chat``)."""
    body: dict[str, Any] = {"model": target.model,
                            **prompt_fields(target.api == "openai-chat", prompt, messages)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
        if target.fixed_output:
            body.update(fixed_output_fields(target.server_kind, max_tokens))
    body["stream"] = True
    options: dict[str, Any] = {"include_usage": True}
    if target.server_kind is not None and family(target.server_kind).per_chunk_usage:
        options["continuous_usage_stats"] = True
    body["stream_options"] = options
    body.update(target.fields.openai_body())  # checked: none of the fields above
    if target.extra_body:
        body.update(target.extra_body)
    return body


def path(target: Target) -> str:
    return CHAT_PATH if target.api == "openai-chat" else COMPLETIONS_PATH


_INT_END = 2**63


def _int(value: Any) -> int | None:
    """A count or a time from a chunk: a number from 0 to 2**63. Anything else is ``None``,
    NaN, Infinity and integers too large for a float included (Python's json reads them all)."""
    if type(value) is int and 0 <= value < _INT_END:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        if not (math.isfinite(value) and 0 <= value < 2**63):
            return None
    except OverflowError:  # an int beyond float range
        return None
    return int(value)


# A count or a time in a chunk, as :func:`_int` takes it: an integer from 0 to 2**63. Anything
# else (a negative, a float, a bigger integer) fails the typed decode and goes the general way.
_Count = Annotated[int, msgspec.Meta(ge=0, le=_INT_END - 1)]


# ``gc=False``: a chunk's structs are never in a reference cycle (what they hold came from JSON),
# so the collector need not track the three or four of them every token makes.
class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    prompt_tokens_details: Any = None
    completion_tokens_details: Any = None


class _Choice(msgspec.Struct, gc=False):
    text: str | None = None
    finish_reason: str | None = None


class _Completion(msgspec.Struct, gc=False):
    """A completions chunk as vLLM and the reference server send one a token: what
    :meth:`OpenAIStreamParser.event` reads of it, typed (other fields are skipped unread)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    pdscope_sent_ns: _Count | None = None
    pdscope_due_ns: _Count | None = None
    error: Any = None
    timings: Any = None


_decode_completion = msgspec.json.Decoder(_Completion).decode


def _typed_chunk(data: str | bytes) -> _Completion | None:
    """A completions chunk decoded straight into :class:`_Completion` (a chunk is ~0.4 µs
    cheaper so than as dicts: no dict a level, no lookups); ``None`` for anything else (not
    that shape, an error, llama.cpp's timings, usage details, a number out of range, bytes that
    are not UTF-8), which the general path reads as before."""
    try:
        c = _decode_completion(data)
    except msgspec.DecodeError:
        return None
    if c.error is not None or c.timings is not None:
        return None
    usage = c.usage
    if usage is not None and (usage.prompt_tokens_details is not None
                              or usage.completion_tokens_details is not None):
        return None
    return c


class OpenAIStreamParser:
    """Reads an OpenAI-style SSE stream into a :class:`RecordBuilder`."""

    def __init__(self, builder: RecordBuilder, chat: bool) -> None:
        self.builder = builder
        self.chat = chat
        self.decoder = SSEDecoder()
        self._usage_seen_before = False  # usage on an earlier chunk: the server sends it per chunk
        self._prev_completion_tokens = 0
        self._closing = False  # events now come from what was left when the stream ended
        self._tags = ThinkTags()

    def feed(self, data: bytes, t_ns: int) -> None:
        if not self.chat:
            # The common read of a completions stream, one whole event: its JSON decoded from
            # the read's bytes, with no text copy and no event list (``None`` if it is not that
            # read, or not that chunk: the general path below reads it then).
            payload = self.decoder.whole_event(data)
            if payload is not None:
                typed = _typed_chunk(payload)
                if typed is not None:
                    self._completion(t_ns, typed)
                    return
        try:
            events = self.decoder.feed(data)
        except RunError as exc:  # bytes that are not UTF-8 text
            self.builder.fail("bad_chunk", f"{exc} after {self.builder.n_chunks} token chunks")
            return
        for event in events:
            self.event(event, t_ns)
            if self.builder.done or self.builder.error is not None:
                return

    def close(self, t_ns: int) -> None:
        b = self.builder
        self._closing = True
        for event in self.decoder.close():
            if b.done or b.error is not None:
                break
            self.event(event, t_ns)
        if b.done or b.error is not None:
            return
        if b.finish_reason is not None:
            # Ended cleanly after the last choice said why it stopped: complete, just no [DONE].
            b.t_end_ns = t_ns
            return
        b.fail(
            "stream_broken",
            f"the stream ended without 'data: [DONE]' after {b.n_chunks} token chunks",
        )

    def event(self, data: str, t_ns: int) -> None:
        """One SSE event's data, received at ``t_ns``."""
        b = self.builder
        if data == DONE:
            b.done = True
            b.t_end_ns = t_ns
            return
        typed = None if self.chat else _typed_chunk(data)
        if typed is not None:
            self._completion(t_ns, typed)
            return
        try:
            obj = loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            if self._closing:
                b.fail("stream_broken", "the stream ended in the middle of a chunk after"
                       f" {b.n_chunks} token chunks")
            else:
                b.fail("bad_chunk", f"a chunk is not JSON after {b.n_chunks} token chunks:"
                       f" {data[:80]!r}")
            return
        if type(obj) is not dict:
            b.fail("bad_chunk", f"a chunk is not a JSON object: {data[:80]!r}")
            return
        get = obj.get
        if get("error") is not None and not get("choices"):
            b.fail("stream_broken", "the server sent an error mid-stream after"
                   f" {b.n_chunks} token chunks: {server_message(data)}")
            return

        usage = get("usage")
        completion_tokens: int | None = None
        if usage is not None and type(usage) is dict:
            prompt_tokens = _int(usage.get("prompt_tokens"))
            completion_tokens = _int(usage.get("completion_tokens"))
            if prompt_tokens is not None:
                b.usage_prompt_tokens = prompt_tokens
            if completion_tokens is not None:
                b.usage_completion_tokens = completion_tokens
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
                b.cached_tokens = _int(details.get("cached_tokens"))
            reasoning = usage_reasoning_tokens(usage)
            if reasoning is not None:
                b.usage_reasoning_tokens = reasoning
        timings = get("timings")
        if timings is not None and type(timings) is dict:
            b.server_timings = {k: float(v) for k, v in timings.items() if _int(v) is not None}

        thought = answer = ""
        choices = get("choices")
        if choices and type(choices) is list:
            choice = choices[0]
            if type(choice) is dict:
                if self.chat:
                    delta = choice.get("delta")
                    if type(delta) is dict:
                        parts = chat_delta_parts(delta)
                        thought, answer = parts.reasoning, parts.answer
                else:
                    raw = choice.get("text")
                    answer = raw if type(raw) is str else ""
                finish = choice.get("finish_reason")
                if finish is not None:
                    b.finish_reason = str(finish)

        sent, due = get("pdscope_sent_ns"), get("pdscope_due_ns")
        self._tokens(t_ns, thought, answer, completion_tokens,
                     None if sent is None else _int(sent), None if due is None else _int(due))

    def _completion(self, t_ns: int, c: _Completion) -> None:
        """A completions chunk read by :func:`_typed_chunk`."""
        b = self.builder
        completion_tokens = None
        usage = c.usage
        if usage is not None:
            if usage.prompt_tokens is not None:
                b.usage_prompt_tokens = usage.prompt_tokens
            completion_tokens = usage.completion_tokens
            if completion_tokens is not None:
                b.usage_completion_tokens = completion_tokens
        answer = ""
        if c.choices:
            choice = c.choices[0]
            answer = choice.text or ""
            if choice.finish_reason is not None:
                b.finish_reason = choice.finish_reason
        self._tokens(t_ns, "", answer, completion_tokens, c.pdscope_sent_ns, c.pdscope_due_ns)

    def _tokens(self, t_ns: int, thought: str, answer: str, completion_tokens: int | None,
                sent: int | None, due: int | None) -> None:
        """A chunk's text (thought and answer) into the record, as many tokens as its running
        usage count says (else one)."""
        b = self.builder
        if answer and not self._tags.answer_only(answer):
            tagged, retro = self._tags.split(answer)
            thought, answer = thought + tagged.reasoning, tagged.answer
            if retro:
                b.earlier_was_reasoning()
        if thought or answer:
            k = 1
            if completion_tokens is not None and (self._usage_seen_before
                                                  or not b.token_times_ns):
                k = completion_tokens - self._prev_completion_tokens
                k = k if 1 <= k <= _MAX_TOKENS_A_CHUNK else 1
            if thought:
                b.add_parts(t_ns, Parts(thought, answer), k, sent, due)
            else:
                b.add_tokens(t_ns, answer, k, sent, due)
        if completion_tokens is not None:
            if thought or answer or completion_tokens <= self._prev_completion_tokens:
                self._prev_completion_tokens = completion_tokens
            # else a chunk with no text whose running count rose: vLLM sends a token whose text
            # is not whole yet (part of a UTF-8 character) so, with its token ids and an empty
            # text (vllm/entrypoints/openai/completion/serving.py). Its tokens go with the next
            # chunk that has text, so the chunks count what the server counted.
            self._usage_seen_before = True
