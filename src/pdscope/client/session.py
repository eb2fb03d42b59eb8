"""The HTTP side of a measurement: one session a run, where each time is taken, and timeouts.

**Where ``t_send`` is taken.** When the request's bytes go to the socket. aiohttp buffers the
request line and headers (``on_request_headers_sent`` fires then, before anything is written)
and writes them together with the body from a task; on Python < 3.12 that task runs on the next
turn of the event loop, which under hundreds of streams can be milliseconds later. So ``t_send``
is read (``time.perf_counter_ns()``) at the first ``on_request_chunk_sent``, when the headers and
the first body bytes have been handed to the socket; a request without a body keeps the
headers-sent time. :func:`new_session` installs the trace config that does this. Pool waiting
(``on_connection_queued_*``, kept as ``pool_wait_s``) and opening a connection
(``on_connection_create_*``, kept as ``connect_s``, DNS included) both end before it, so
neither is part of TTFT — the article's "subtract ``time_pretransfer``". Measured against the
reference server, this moved 2-3 ms of the client's own scheduling delay out of TTFT at 50-200
streams (``pdscope selftest``).

A session made elsewhere, without that trace config, still works: ``t_send`` is then taken just
before the request is handed to aiohttp, so it includes any pool wait and connection set-up,
and ``connect_s`` is unknown.

**Timeouts.** ``connect`` is aiohttp's ``sock_connect`` (opening the TCP connection; waiting for
a free pooled connection is not counted, it is load the client created). ``first_token`` runs
from ``t_send`` to the first token-bearing chunk, ``between_tokens`` from one token-bearing chunk
to the next (a server that only sends keep-alive comments does time out), ``total`` from the call
to the end of the stream. One timer a request checks them lazily, waking at most once per
shortest timeout: a chunk only stores its time, so the cost a token is nothing but that store.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import aiohttp
from yarl import URL

from pdscope.client import http1
from pdscope.client.faults import (
    classify_status,
    context_exceeded_line,
    redact,
    server_message,
)
from pdscope.client.record import ErrorKind, RecordBuilder
from pdscope.client.tap import read_stream
from pdscope.errors import InputError
from pdscope.units import NS

now_ns = time.perf_counter_ns

# A finished stream's connection goes back to the pool only once its body is read to the end;
# the end (the chunked terminator) follows the done marker at once on any sane server.
_DRAIN_AFTER_DONE_S = 0.5
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits in seconds. The defaults let a slow CPU server finish a long prompt
    (first token within 5 minutes) and still catch a stalled stream within a minute."""

    connect: float = 10.0
    first_token: float = 300.0
    between_tokens: float = 60.0
    total: float = 900.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_token", "between_tokens", "total"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise InputError(f"the {name.replace('_', ' ')} timeout must be a positive"
                                 f" number of seconds, got {value!r}")


class _PdscopeTrace(aiohttp.TraceConfig):
    """The trace config that times each request into its :class:`RecordBuilder`."""


def _builder(ctx: SimpleNamespace) -> RecordBuilder | None:
    found = getattr(ctx, "trace_request_ctx", None)
    return found if isinstance(found, RecordBuilder) else None


async def _queued_start(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    if (b := _builder(ctx)) is not None:
        b.queued_start_ns = now_ns()


async def _queued_end(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    if (b := _builder(ctx)) is not None and b.queued_start_ns is not None:
        b.pool_wait_s = (now_ns() - b.queued_start_ns) / NS


async def _create_start(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    if (b := _builder(ctx)) is not None:
        b.connect_start_ns = now_ns()


async def _create_end(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    if (b := _builder(ctx)) is not None and b.connect_start_ns is not None:
        b.connect_s = (now_ns() - b.connect_start_ns) / NS


async def _headers_sent(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    # The headers (with the Authorization header) are in the params: never look at them.
    if (b := _builder(ctx)) is not None:
        b.t_send_ns = now_ns()
        b.body_sent = False


async def _chunk_sent(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: Any) -> None:
    # The first body chunk went out with the buffered headers: that is when the request left.
    if (b := _builder(ctx)) is not None and not b.body_sent:
        b.t_send_ns = now_ns()
        b.body_sent = True


def trace_config() -> aiohttp.TraceConfig:
    """The trace config :func:`new_session` installs; add it to a session of your own to get
    the same timing."""
    tc = _PdscopeTrace()
    tc.on_connection_queued_start.append(_queued_start)
    tc.on_connection_queued_end.append(_queued_end)
    tc.on_connection_create_start.append(_create_start)
    tc.on_connection_create_end.append(_create_end)
    tc.on_request_headers_sent.append(_headers_sent)
    tc.on_request_chunk_sent.append(_chunk_sent)
    return tc


def new_session(limit: int = 256, limit_per_host: int = 0,
                headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """One session for a whole run: its pool holds at most ``limit`` connections (0: no limit),
    so a load test's concurrency must fit; ``headers`` go with every request it sends (the
    user's, e.g. a proxy's auth header: detection and tokenizer calls need them too). Call it
    inside a running event loop and close it (``async with new_session() as session:``)."""
    connector = http1.OwnConnector(limit=limit, limit_per_host=limit_per_host)
    return aiohttp.ClientSession(
        connector=connector,
        trace_configs=[trace_config()],
        timeout=aiohttp.ClientTimeout(total=None),
        headers=dict(headers) if headers else None,
    )


def is_traced(session: aiohttp.ClientSession) -> bool:
    configs = getattr(session, "trace_configs", None) or getattr(session, "_trace_configs", None)
    return any(isinstance(tc, _PdscopeTrace) for tc in configs or ())


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class StreamParser(Protocol):
    """A stream format: fed each read's bytes with its receive time, it fills the builder
    (tokens, usage, ``done``, or a failure)."""

    def feed(self, data: bytes, t_ns: int) -> None: ...

    def close(self, t_ns: int) -> None: ...


class _Watchdog:
    """One timer a request. It wakes at the earliest deadline, re-reads the builder (a chunk may
    have come since) and either sleeps again or cancels the request's task."""

    def __init__(self, builder: RecordBuilder, timeouts: Timeouts, t0_ns: int) -> None:
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "a request runs inside a task"
        self.task = task
        self.builder = builder
        self.timeouts = timeouts
        self.total_deadline = t0_ns + int(timeouts.total * NS)
        self.fired: ErrorKind | None = None
        self.caught = False  # the request's task caught the cancel the timer sent
        self.message = ""
        self.active = True
        self._handle: asyncio.TimerHandle | None = None

    def _deadline(self) -> tuple[int, ErrorKind, str]:
        t, b = self.timeouts, self.builder
        best: tuple[int, ErrorKind, str] = (
            self.total_deadline,
            "timeout_total",
            f"the stream did not end within the total timeout of {t.total:g} s",
        )
        if b.t_send_ns is not None:
            if b.token_times_ns:
                cand: tuple[int, ErrorKind, str] = (
                    b.token_times_ns[-1] + int(t.between_tokens * NS),
                    "timeout_between_tokens",
                    f"no token for {t.between_tokens:g} s after token {b.n_chunks}",
                )
            else:
                cand = (
                    b.t_send_ns + int(t.first_token * NS),
                    "timeout_first_token",
                    f"no first token within {t.first_token:g} s",
                )
            if cand[0] < best[0]:
                best = cand
        return best

    def arm(self) -> None:
        # A deadline can move earlier than the one now in force (t_send becomes known; the first
        # token starts the shorter between-tokens clock), but never earlier than ``now +`` the
        # shortest timeout still ahead: waking at the sooner of the two misses nothing.
        deadline = self._deadline()[0]
        t = self.timeouts
        ahead = t.between_tokens if self.builder.token_times_ns else min(t.first_token,
                                                                          t.between_tokens)
        now = now_ns()
        wake = min(deadline, now + int(ahead * NS))
        self._handle = self.loop.call_later(max(0.0, (wake - now) / NS), self._check)

    def _check(self) -> None:
        if not self.active:
            return
        deadline, kind, message = self._deadline()
        if now_ns() >= deadline - 1_000_000:  # the loop's timers wake up to 1 ms early
            self.fired, self.message, self.active = kind, message, False
            self.task.cancel()
        else:
            self.arm()

    def disarm(self) -> None:
        self.active = False
        if self._handle is not None:
            self._handle.cancel()

    def ended_late(self) -> bool:
        """The stream's end (its done marker's read) came past the total deadline. A loop
        that was held up (a busy machine) reads a whole stream in one go and may run the timer
        only after it: the measured end, not the timer's turn, says whether it was in time."""
        end = self.builder.t_end_ns
        return end is not None and end > self.total_deadline


def connect_reason(exc: aiohttp.ClientConnectorError) -> str:
    """Why a connection failed, in the system's words ("Connection refused"). A name lookup
    that failed says so with the host name: its error numbers (``EAI_*``, negative) are not
    ``errno`` values, and ``os.strerror`` would read them as "Unknown error -2"."""
    err = exc.os_error
    if isinstance(err, socket.gaierror):  # aiohttp >= 3.10 raises ClientConnectorDNSError
        why = getattr(err, "strerror", None) or str(err or exc)
        return f"the host name {exc.host!r} could not be resolved ({why})"
    if err is not None and err.errno and err.errno > 0:
        return os.strerror(err.errno)
    return str(err or exc)


def _origin(url: str) -> str:
    u = URL(url)
    return f"{u.scheme}://{u.host}:{u.port}"



# What aiohttp raises when it sends on a pooled connection that the server has already closed.
STALE_CONNECTION = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)


def stale_connection(exc: BaseException, answered: bool) -> bool:
    """``exc`` says that a request was written to a connection the server had closed, before
    any answer came: nothing reached the server, so sending it again is safe."""
    if answered or isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return "Can not write request body" in str(exc)


async def _post_and_read(session: aiohttp.ClientSession, url: str, payload: bytes,
                         headers: Mapping[str, str], builder: RecordBuilder,
                         parser: StreamParser, timeouts: Timeouts, accept: str,
                         max_chunks: int | None) -> None:
    async with session.post(
        url,
        data=payload,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
        trace_request_ctx=builder,
    ) as resp:
        builder.headers_received = True
        builder.http_status = resp.status
        if resp.status >= 400 or (accept == "text/event-stream"
                                  and resp.content_type == "application/json"):
            _fail_answer(builder, url, resp.status, resp.reason or "", await _read_body(resp))
            return
        await _read_stream(resp, builder, parser, max_chunks)
        if builder.error is not None:
            resp.close()  # a half-read stream must not go back to the pool
        elif not resp.content.at_eof():
            try:
                await asyncio.wait_for(resp.content.read(), _DRAIN_AFTER_DONE_S)
            except (asyncio.TimeoutError, aiohttp.ClientError):
                resp.close()


def _fail_answer(builder: RecordBuilder, url: str, status: int, reason: str, text: str) -> None:
    """An answer that is not a stream: an HTTP error (its kind from the status and the body's
    words), or one JSON body where an event stream was asked for."""
    if status >= 400:
        kind = classify_status(status, text)
        said = (context_exceeded_line(text) if kind == "context_exceeded"
                else server_message(text) or reason)
        builder.fail(kind, f"{url}: HTTP {status}: {said}")
    else:
        builder.fail("stream_broken", f"{url}: the server answered with one JSON body,"
                     f" not a stream: {server_message(text, limit=120)}")


async def _post_and_read_own(session: aiohttp.ClientSession, url: str, payload: bytes,
                             headers: Mapping[str, str], builder: RecordBuilder,
                             parser: StreamParser, timeouts: Timeouts, accept: str,
                             max_chunks: int | None, fresh: bool) -> None:
    """:func:`_post_and_read` on pdscope's own connection (:mod:`pdscope.client.http1`)."""
    answer = await http1.post_and_read(
        session, url, payload, headers, builder, _feeder(url, builder, parser, max_chunks),
        parser.close, timeouts.connect, accept == "text/event-stream", _DRAIN_AFTER_DONE_S,
        fresh)
    if answer is not None:
        _fail_answer(builder, url, *answer)


async def stream_post(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    *,
    builder: RecordBuilder,
    parser: StreamParser,
    timeouts: Timeouts,
    api_key: str | None = None,
    accept: str = "text/event-stream",
    max_chunks: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """POST ``payload`` (JSON bytes) and read the streamed answer into ``builder``.

    Never raises for what the server or the network did: every fault becomes
    ``builder.fail(kind, message)``. A cancelled task records ``cancelled`` and returns, so a
    load test that cancels its stragglers still gets their records. ``max_chunks``: more
    token-bearing chunks than this and the client hangs up (``overrun``). ``headers``: the
    user's own, sent too; their values, like the key, are redacted from any error.
    """
    secrets = (api_key, *(headers or {}).values())
    sent = {**(headers or {}), "Content-Type": "application/json", "Accept": accept,
            **auth_headers(api_key)}
    t0 = now_ns()
    if builder.t_start_ns is None:
        builder.t_start_ns = t0
    watchdog = _Watchdog(builder, timeouts, t0)
    watchdog.arm()
    traced = is_traced(session)
    own = http1.usable(session, url, sent)
    try:
        for attempt in (1, 2):
            if not traced:
                builder.t_send_ns = now_ns()
            try:
                if own:
                    await _post_and_read_own(session, url, payload, sent, builder, parser,
                                             timeouts, accept, max_chunks, attempt == 2)
                else:
                    await _post_and_read(session, url, payload, sent, builder, parser,
                                         timeouts, accept, max_chunks)
                break
            except STALE_CONNECTION as exc:
                # A kept-alive connection the server had closed: the request never reached
                # it, so it goes again, once, on a new connection (llama-server closes the
                # connection after every streamed answer while its headers say keep-alive).
                if attempt == 2 or not stale_connection(exc, builder.headers_received):
                    raise
    except asyncio.CancelledError:
        if watchdog.fired is None:
            builder.fail("cancelled", f"{url}: request cancelled after {builder.n_chunks} chunks")
        else:
            watchdog.caught = True
            if not builder.done:  # a complete stream timed out only while its tail was read
                builder.fail(watchdog.fired, f"{url}: {watchdog.message}")
            uncancel = getattr(watchdog.task, "uncancel", None)  # Python >= 3.11
            if uncancel is not None:
                uncancel()
    except http1.ConnectFailed as exc:
        builder.fail(exc.kind, str(exc))
    except aiohttp.ClientConnectorError as exc:
        builder.fail("connect", f"cannot connect to {_origin(url)}: {connect_reason(exc)}")
    except aiohttp.ServerTimeoutError:
        builder.fail("timeout_connect", f"cannot connect to {_origin(url)} within"
                     f" {timeouts.connect:g} s")
    except UnicodeDecodeError as exc:
        builder.fail("bad_chunk", f"{url}: a chunk is not UTF-8 text ({exc.reason})")
    except (aiohttp.ClientError, OSError) as exc:
        what = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        if not builder.headers_received:
            builder.fail("connect", f"{_origin(url)} closed the connection before answering"
                         f" ({what})")
        else:
            builder.fail("stream_broken", f"{url}: the stream broke off after"
                         f" {builder.n_chunks} token chunks ({what})")
    finally:
        watchdog.disarm()
        if watchdog.fired is not None and not watchdog.caught:
            # The timer's cancel was swallowed (asyncio.wait_for before Python 3.12 drops one
            # that comes as its inner future completes): take it back, as above.
            uncancel = getattr(watchdog.task, "uncancel", None)
            if uncancel is not None:
                uncancel()
        if builder.error is None and watchdog.ended_late():
            builder.fail("timeout_total", f"{url}: the stream did not end within the total"
                         f" timeout of {timeouts.total:g} s")
        if builder.t_end_ns is None:
            builder.t_end_ns = now_ns()
        if builder.error is not None:
            if not builder.error.startswith(("http://", "https://", "cannot connect")):
                builder.error = f"{url}: {builder.error}"  # the parsers do not know the URL
            for secret in secrets:
                builder.error = redact(builder.error, secret)


async def _read_body(resp: aiohttp.ClientResponse) -> str:
    """The start of a (non-streamed) body, up to a limit."""
    chunks: list[bytes] = []
    size = 0
    while size < _ERROR_BODY_LIMIT:
        data = await resp.content.read(_ERROR_BODY_LIMIT - size)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _feeder(url: object, builder: RecordBuilder, parser: StreamParser,
            max_chunks: int | None) -> Callable[[bytes, int], bool]:
    """``on_data(bytes, read time)``: each read's bytes to the parser; ``True`` once the
    stream is done, failed or over-long."""

    def on_data(data: bytes, t: int) -> bool:
        parser.feed(data, t)
        if builder.done or builder.error is not None:
            return True
        if max_chunks is not None and builder.n_chunks > max_chunks:
            builder.fail(
                "overrun",
                f"{url}: the server kept streaming past the {max_chunks} chunks allowed"
                " for this request; the client hung up",
            )
            return True
        return False

    return on_data


async def _read_stream(
    resp: aiohttp.ClientResponse,
    builder: RecordBuilder,
    parser: StreamParser,
    max_chunks: int | None,
) -> None:
    """Each read's bytes to the parser with the time they came (:mod:`pdscope.client.tap`:
    in the callback that received them), until the stream is done, failed or over-long."""
    await read_stream(resp.content, _feeder(resp.url, builder, parser, max_chunks),
                      parser.close)


async def get_json(
    session: aiohttp.ClientSession,
    url: str,
    *,
    api_key: str | None = None,
    timeout: float = 5.0,
    method: str = "GET",
    payload: Mapping[str, Any] | None = None,
) -> Any:
    """The JSON a small request answers, or ``None`` for any failure or non-JSON answer
    (detection asks many questions a server may not know). Connection failures propagate."""
    for attempt in (1, 2):
        try:
            async with session.request(
                method,
                url,
                json=payload,
                headers=auth_headers(api_key),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                if resp.status >= 400:
                    return None
                return await resp.json(content_type=None)
        except aiohttp.ClientConnectorError:
            raise
        except STALE_CONNECTION as exc:
            if attempt == 2 or not stale_connection(exc, answered=False):
                return None  # once more on a new connection: see stream_post
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
    return None


async def get_text(
    session: aiohttp.ClientSession, url: str, *, api_key: str | None = None, timeout: float = 5.0
) -> str | None:
    """The text a GET answers, or ``None`` for any failure. Connection failures propagate."""
    try:
        async with session.get(
            url, headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status >= 400:
                return None
            return await resp.text(errors="replace")
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return None
