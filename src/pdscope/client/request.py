"""One streamed request, any API: the call every experiment and load test makes."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from pdscope.client import ollama, openai
from pdscope.client.faults import redact
from pdscope.client.record import RecordBuilder, RequestRecord
from pdscope.client.session import StreamParser, Timeouts, stream_post
from pdscope.client.target import Target
from pdscope.errors import InputError

DEFAULT_TIMEOUTS = Timeouts()


def overrun_limit(max_tokens: int | None) -> int | None:
    """Token chunks after which a stream that should have stopped at ``max_tokens`` is cut off.
    Generous: a chunk count can exceed a token count only through servers that split a token."""
    if max_tokens is None:
        return None
    return max(2 * max_tokens, max_tokens + 64)


def build_request(
    target: Target,
    max_tokens: int | None,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The URL and JSON body of one streamed request to ``target``."""
    if prompt is None and messages is None:
        raise InputError("a request needs a prompt or messages")
    if messages is not None and target.api in ("openai", "ollama"):
        raise InputError(f"the {target.api!r} API takes a prompt, not messages:"
                         f" use {target.api}-chat")
    if target.api in ("openai", "openai-chat"):
        return target.base_url + openai.path(target), openai.build_body(
            target, max_tokens, prompt, messages
        )
    return target.base_url + ollama.path(target), ollama.build_body(
        target, max_tokens, prompt, messages
    )


async def stream_request(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = 128,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    request_id: str | None = None,
    scheduled_ns: int | None = None,
    extra: Mapping[str, Any] | None = None,
    watch: Callable[[RecordBuilder], None] | None = None,
) -> RequestRecord:
    """Send one streamed request and time it; see :mod:`pdscope.client.record` for the
    definitions.

    Never raises for a server or network fault: the record comes back with ``error`` and
    ``error_kind`` set, so a load test counts failures (use
    :func:`pdscope.client.raise_for_record` where one failure should stop the run). Bad
    arguments raise :class:`~pdscope.errors.InputError`. ``extra`` adds fields to this
    request's body only (after ``target.extra_body``). ``scheduled_ns`` is the
    ``perf_counter_ns()`` time a load test meant to send it. ``watch`` is handed the live
    record builder before the request goes, to see tokens arrive while the stream runs (the
    interference experiment waits for running streams to decode before it injects a prompt).
    """
    url, body = build_request(target, max_tokens, prompt, messages)
    if extra:
        body.update(extra)
    builder = RecordBuilder(
        request_id=request_id or uuid.uuid4().hex[:16],
        api=target.api,
        model=target.model,
        scheduled_ns=scheduled_ns,
    )
    if watch is not None:
        watch(builder)
    chat = target.api.endswith("-chat")
    parser: StreamParser
    if target.api.startswith("openai"):
        parser, accept = openai.OpenAIStreamParser(builder, chat), "text/event-stream"
    else:
        parser, accept = ollama.OllamaStreamParser(builder, chat), "application/x-ndjson"
    await stream_post(
        session,
        url,
        json.dumps(body).encode(),
        builder=builder,
        parser=parser,
        timeouts=timeouts,
        api_key=target.api_key,
        accept=accept,
        max_chunks=overrun_limit(max_tokens),
        headers=target.fields.header_map(),
    )
    record = builder.build()
    text = record.output_text
    for secret in (target.api_key, *target.fields.secrets()):  # a server that echoes one
        text = redact(text, secret)
    if text != record.output_text:
        record = dataclasses.replace(record, output_text=text)
    return record
