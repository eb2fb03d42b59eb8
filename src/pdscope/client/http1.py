"""Streamed answers read on pdscope's own HTTP/1.1 connections, under aiohttp's.

**Why.** A load generator's CPU a streamed token is its budget (issue 24). Measured side by side
with ``tools/bench_floor.py`` (docs/benchmarks.md, "The floor under a client"): a bare
``asyncio.Protocol`` that only counts events costs 9.4 µs of CPU a token at 200 streams here,
aiohttp reading the same bodies and doing nothing with them 19.0, and pdscope's whole client on
aiohttp 20.5: nearly all of it aiohttp's path for each read (its protocol, its parser's
callbacks, its reader), the same with 256 tokens a request as with 64. Each read here goes from
the socket to httptools' HTTP/1.1 parser (llhttp's binding, made for this; uvicorn's) and
straight into the stream's parser, with the time of the read, as :mod:`pdscope.client.tap`
does on aiohttp.

**What it is.** :class:`OwnConnector` is aiohttp's ``TCPConnector`` that also holds a
:class:`Pool` of these connections: :func:`pdscope.client.new_session` makes every session with
one, and closing the session closes both. :func:`post_and_read` sends one POST and reads its
streamed answer into the builder, keeping the connection for the next request when the answer
ended cleanly and the server keeps it alive. It raises what aiohttp's path raises for the same
faults (``ServerDisconnectedError``, ``ClientOSError``, ``ClientPayloadError``), so
:func:`pdscope.client.session.stream_post` records them alike: the same error kinds, the same
words, the same retry of a pooled connection the server had closed.

**Where.** ``stream_post`` takes this path for ``http://`` URLs on a session with an
:class:`OwnConnector` while :data:`enabled` (on; ``False`` puts every request back on aiohttp);
``https://`` (TLS), credentials in the URL, a session made elsewhere, or a header value aiohttp
would refuse go through aiohttp. Connecting is timed into ``connect_s`` (and bounded by the
connect timeout), ``t_send`` is when the request's bytes were handed to the socket, and a
request that finds the session's ``limit`` of connections busy waits for one (``pool_wait_s``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httptools

from pdscope import __version__
from pdscope.client.record import ErrorKind, RecordBuilder
from pdscope.units import NS

now_ns = time.perf_counter_ns

USER_AGENT = f"pdscope/{__version__}"

# The switch. On: the own path passes the unit suite (every reference fault records alike on
# both paths) and the lab suite (vLLM and llama-server), and takes 16 % off the client's CPU a
# token in tools/bench_floor.py. ``False`` sends every request through aiohttp, as before.
enabled = True

Key = tuple[str, int]


class ConnectFailed(Exception):
    """A connection could not be opened: ``kind`` is the record's error kind (``connect`` or
    ``timeout_connect``), the message says why in the system's words."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


class Pool:
    """Idle keep-alive connections by host and port, at most ``limit`` open at once (0: no
    limit; the session's, as aiohttp's connector holds it); closed with the session."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.idle: dict[Key, list[_Connection]] = {}
        self.open: set[_Connection] = set()
        self.opening = 0
        self.opened = 0  # connections opened in all (tests, figures)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self, key: Key) -> _Connection | None:
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
        return None

    def full(self) -> bool:
        return bool(self.limit) and len(self.open) + self.opening >= self.limit

    async def wait(self) -> None:
        """Until a connection is given back or closed."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def give(self, key: Key, conn: _Connection) -> None:
        if conn.usable():
            self.idle.setdefault(key, []).append(conn)
        self.wake()

    def lost(self, conn: _Connection) -> None:
        self.open.discard(conn)
        for idle in self.idle.values():
            if conn in idle:
                idle.remove(conn)
        self.wake()

    def close(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.idle.clear()


class OwnConnector(aiohttp.TCPConnector):
    """aiohttp's connector with a :class:`Pool` of pdscope's own connections beside its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own = Pool(self.limit)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        self.own.close()
        return super().close(*args, **kwargs)


def usable(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> bool:
    """Whether this request can go on pdscope's own connections."""
    if not enabled or not url.startswith("http://") or "@" in urlsplit(url).netloc:
        return False  # TLS, or credentials in the URL: aiohttp's
    if not isinstance(session.connector, OwnConnector):
        return False
    return not any(_unsafe(k) or _unsafe(v) for k, v in _all_headers(session, headers).items())


def _unsafe(text: str) -> bool:
    """A header aiohttp would refuse or encode its own way: left to aiohttp."""
    if "\r" in text or "\n" in text:
        return True
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return True
    return False


def _all_headers(session: aiohttp.ClientSession, headers: Mapping[str, str]) -> dict[str, str]:
    """The session's default headers (the user's, from :func:`new_session`) under this
    request's own, as aiohttp merges them."""
    merged = {k: v for k, v in session.headers.items()}
    merged.update(headers)
    return merged


class _Exchange:
    """One request's answer as it arrives: the stream's callbacks, and the futures the request's
    task waits on (``stopped``: nothing more is wanted; ``complete``: the body ended)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, builder: RecordBuilder,
                 on_data: Callable[[bytes, int], bool], on_end: Callable[[int], None],
                 expect_sse: bool) -> None:
        self.builder = builder
        self.on_data = on_data
        self.on_end = on_end
        self.expect_sse = expect_sse
        self.stopped: asyncio.Future[None] = loop.create_future()
        self.complete = False
        self.ended: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.reason = ""
        self.content_type = ""
        self.content_encoding = ""
        self.framed = False  # a Content-Length or chunked body: its end is in the bytes
        self.keep_alive = False
        self.headers_done = False
        self.collect: list[bytes] | None = None  # an error's body, kept whole up to a limit
        self.collected = 0

    def stop(self, exc: BaseException | None = None) -> None:
        if self.stopped.done():
            return
        if exc is None:
            self.stopped.set_result(None)
        else:
            self.stopped.set_exception(exc)

    def end(self) -> None:
        self.complete = True
        if not self.ended.done():
            self.ended.set_result(None)
        self.stop()


_BODY_LIMIT = 64 * 1024


class _Connection(asyncio.Protocol):
    """One kept-alive connection; httptools' parser turns its bytes into the current
    exchange's callbacks."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.http: httptools.HttpResponseParser | None = None
        self.t_ns = 0
        self.lost = False
        self.used = False  # has carried a request before this one

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.pool.open.add(self)

    def data_received(self, data: bytes) -> None:
        self.t_ns = now_ns()
        ex, http = self.exchange, self.http
        if ex is None or http is None or (ex.stopped.done() and ex.complete):
            self.close()  # bytes nobody asked for: the connection is not in a known state
            return
        try:
            http.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(aiohttp.ClientPayloadError("the server upgraded the connection"))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ or exc
            self._fail(cause if isinstance(cause, Exception) else exc)
        except httptools.HttpParserError as exc:
            self._fail(aiohttp.ClientPayloadError(f"a malformed HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.lost(self)
        ex = self.exchange
        if ex is None or ex.complete:
            return
        if ex.headers_done and not ex.framed:  # a body delimited by the connection's end
            if ex.collect is None:
                try:
                    ex.on_end(now_ns())
                except Exception as problem:
                    ex.stop(problem)
            ex.end()
            return
        if exc is None or (self.used and not ex.headers_done):
            # Nothing answered on a pooled connection: the request never reached the server
            # (stream_post sends it again on a new connection), or a clean end mid-answer.
            ex.stop(aiohttp.ServerDisconnectedError())
        else:
            err = (aiohttp.ClientOSError(exc.errno, exc.strerror)
                   if isinstance(exc, OSError) and exc.strerror
                   else aiohttp.ClientOSError(str(exc)))
            ex.stop(err)
        if not ex.ended.done():
            ex.ended.set_result(None)

    # httptools' callbacks
    def on_status(self, status: bytes) -> None:
        if self.exchange is not None:
            self.exchange.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.exchange
        if ex is None:
            return
        lower = name.lower()
        if lower == b"content-type":
            ex.content_type = value.decode("latin-1").split(";")[0].strip().lower()
        elif lower == b"content-length" or (lower == b"transfer-encoding"
                                            and b"chunked" in value.lower()):
            ex.framed = True
        elif lower == b"content-encoding":
            ex.content_encoding = value.decode("latin-1").strip().lower()

    def on_headers_complete(self) -> None:
        ex, http = self.exchange, self.http
        if ex is None or http is None:
            return
        ex.headers_done = True
        ex.status = http.get_status_code()
        ex.keep_alive = http.should_keep_alive()
        ex.builder.headers_received = True
        ex.builder.http_status = ex.status
        if ex.status >= 400 or (ex.expect_sse and ex.content_type == "application/json"):
            ex.collect = []
        elif ex.content_encoding not in ("", "identity"):
            self._fail(aiohttp.ClientPayloadError(
                f"the server compressed the stream ({ex.content_encoding}) unasked"))
        elif ex.status < 200 or ex.status >= 300:
            self._fail(aiohttp.ClientPayloadError(f"HTTP {ex.status} {ex.reason}".strip()))

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex is None or ex.stopped.done():
            return  # the rest of a body nobody wants (drained after the done marker)
        if ex.collect is not None:
            if ex.collected < _BODY_LIMIT:
                ex.collect.append(body[: _BODY_LIMIT - ex.collected])
                ex.collected += len(body)
            return
        try:
            if ex.on_data(body, self.t_ns):
                ex.stop()
        except Exception as exc:  # surfaces in the task, as it would from aiohttp's reader
            ex.stop(exc)

    def on_message_complete(self) -> None:
        ex = self.exchange
        if ex is None:
            return
        if ex.collect is None and not ex.stopped.done():
            try:
                ex.on_end(self.t_ns)
            except Exception as exc:
                ex.stop(exc)
        ex.end()

    # the request's side
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def start(self, exchange: _Exchange) -> None:
        self.exchange = exchange
        self.http = httptools.HttpResponseParser(self)

    def _fail(self, exc: Exception) -> None:
        if self.exchange is not None:
            self.exchange.stop(exc)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _connect_reason(exc: OSError, host: str) -> str:
    """Why a connection failed, in the system's words, as aiohttp's path says it
    (:func:`pdscope.client.session.connect_reason`)."""
    if isinstance(exc, socket.gaierror):
        return f"the host name {host!r} could not be resolved ({exc.strerror or exc})"
    if exc.errno and exc.errno > 0:
        return os.strerror(exc.errno)
    return str(exc)


async def _open(pool: Pool, host: str, port: int, origin: str, builder: RecordBuilder,
                connect_timeout: float) -> _Connection:
    loop = asyncio.get_running_loop()
    builder.connect_start_ns = now_ns()
    pool.opening += 1
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(pool), host, port), connect_timeout)
    except asyncio.TimeoutError:
        raise ConnectFailed("timeout_connect", f"cannot connect to {origin} within"
                            f" {connect_timeout:g} s") from None
    except OSError as exc:
        raise ConnectFailed("connect", f"cannot connect to {origin}:"
                            f" {_connect_reason(exc, host)}") from None
    finally:
        pool.opening -= 1
        pool.wake()
    builder.connect_s = (now_ns() - builder.connect_start_ns) / NS
    pool.opened += 1
    return conn


async def post_and_read(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    builder: RecordBuilder,
    on_data: Callable[[bytes, int], bool],
    on_end: Callable[[int], None],
    connect_timeout: float,
    expect_sse: bool,
    drain_s: float,
    fresh: bool = False,
) -> tuple[int, str, str] | None:
    """POST ``payload`` and feed the streamed answer's body to ``on_data(bytes, read time)``
    until it returns ``True`` or the body ends (``on_end(time)``). An answer that is not a
    stream (a status of 400 or more; JSON where an event stream was asked for) is returned as
    ``(status, reason, body text)`` for the caller to classify, and ``on_data`` sees none of it.
    ``fresh``: open a new connection even if one is idle (a retry after a stale one)."""
    assert isinstance(session.connector, OwnConnector)
    pool = session.connector.own
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 80
    key = (host, port)
    conn = None if fresh else pool.take(key)
    if conn is None and pool.full():  # as aiohttp's pool: wait for a connection to be free
        builder.queued_start_ns = now_ns()
        while conn is None and pool.full():
            await pool.wait()
            conn = None if fresh else pool.take(key)
        builder.pool_wait_s = (now_ns() - builder.queued_start_ns) / NS
    if conn is None:
        conn = await _open(pool, host, port, f"http://{host}:{port}", builder, connect_timeout)
    else:
        conn.used = True
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc}"]
    sent = _all_headers(session, headers)
    if not any(k.lower() == "user-agent" for k in sent):  # as aiohttp names itself, ours
        sent["User-Agent"] = USER_AGENT
    lines += [f"{k}: {v}" for k, v in sent.items()]
    lines += [f"Content-Length: {len(payload)}", "", ""]
    loop = asyncio.get_running_loop()
    ex = _Exchange(loop, builder, on_data, on_end, expect_sse)
    conn.start(ex)
    assert conn.transport is not None
    keep = False
    try:
        data = "\r\n".join(lines).encode("latin-1") + payload
        # Stamped as the bytes are handed over: uvloop's write sends at once, and the server, in
        # its own process, may start its clock before the write returns here.
        builder.t_send_ns = now_ns()
        conn.transport.write(data)
        builder.body_sent = True
        await ex.stopped
        if ex.collect is not None:  # an answer to classify: read it whole (up to the limit)
            await ex.ended
            text = b"".join(ex.collect).decode("utf-8", errors="replace")
            keep = ex.complete and ex.keep_alive
            return ex.status, ex.reason, text
        if builder.error is None and builder.done and not ex.complete:
            # The done marker came: the body's end follows at once on any sane server.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(ex.ended), drain_s)
        keep = ex.complete and ex.keep_alive and builder.error is None
        return None
    finally:
        conn.exchange = None
        if keep:
            pool.give(key, conn)
        else:
            conn.close()
