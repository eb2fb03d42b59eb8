"""What a streamed token costs a client, layer by layer: the floor under ``pdscope bench``.

Five readers drive the same closed loop (C streams, each sending its next request when its
answer ends) against one reference server (TTFT 50 ms, then a token every 10 ms, 64 tokens a
request unless ``--output-len`` says, one chunk a token), in this one process, on uvloop:

- ``raw``: an ``asyncio.Protocol`` that writes a prepared request and counts the SSE events of
  each read: no HTTP library, no JSON. The operating system's and the event loop's share.
- ``aiohttp``: aiohttp's client, ``iter_any()`` over the body, counting events: what the HTTP
  library adds (its parser, its reader, a task woken a read, a request's set-up).
- ``pdscope``: :func:`pdscope.client.stream_request` on aiohttp's connections (``client/http1.py``
  switched off): each read parsed where it arrives (``client/tap.py``), every chunk's JSON
  decoded and timed, a record built a request.
- ``pdscope-own``: ``pdscope`` on its own HTTP/1.1 connections (``client/http1.py``, as
  ``pdscope bench`` sends every plain-HTTP request): the whole client, pool, timeouts and error
  paths included.
- ``own``: what a reader of pdscope's own under aiohttp's would cost: an ``asyncio.Protocol``
  with httptools' HTTP/1.1 parser feeding the same stream parser and record builder (the floor
  of such a reader: no pool, retry, timeout or error path). Needs ``httptools`` (in the lab's
  venv); left out with a line where it is missing.

The figure is the process's CPU time (user + system, ``getrusage``) over the stage, per token
received; the server runs in a process of its own and is not counted. Stages alternate between
readers, ``--runs`` rounds after a warm-up stage each; medians and spread (min-max) as hyperfine
reports them. ``--pin`` puts the server on the first core and this process on the second.

    .venv/bin/python tools/bench_floor.py                        # 200 streams, 3 rounds
    .venv/bin/python tools/bench_floor.py --concurrency 50,200,500 --runs 5 --pin
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import urlsplit

import aiohttp

from pdscope.client import stream_request
from pdscope.client.session import new_session
from pdscope.client.target import Target
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.selftest.pin import pinned

MODEL = "pdscope-reference"
OUTPUT_TOKENS = 64
PROMPT = "hello " * 128
SERVER = ReferenceConfig(ttft_base_s=0.05, ttft_per_token_s=0.0, itl_s=0.01)
EVENT = b"data: {"


class _Counter:
    def __init__(self, n_requests: int, output_tokens: int) -> None:
        self.left = n_requests
        self.output = output_tokens
        self.tokens = 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def _body(output_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": output_tokens, "stream": True}


async def _streams(url: str, concurrency: int,
                   protocol: Callable[[asyncio.Future[None]], asyncio.Protocol]) -> None:
    """``concurrency`` connections at once, each ``protocol(done)``, until every one is closed."""
    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    waits = [loop.create_future() for _ in range(concurrency)]
    await asyncio.gather(*(loop.create_connection(functools.partial(protocol, done),
                                                  parts.hostname or "127.0.0.1",
                                                  parts.port or 80) for done in waits))
    await asyncio.gather(*waits)


async def run_raw(url: str, concurrency: int, counter: _Counter) -> None:
    """Prepared requests over raw connections; a response ends with the chunked body's end."""
    parts = urlsplit(url)
    body = json.dumps(_body(counter.output)).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (parts.netloc.encode(), len(body))) + body

    class Stream(asyncio.Protocol):
        def __init__(self, done: asyncio.Future[None]) -> None:
            self.done = done
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
            self.next()

        def next(self) -> None:
            assert self.transport is not None
            if counter.take():
                self.transport.write(request)
            else:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            counter.tokens += data.count(EVENT)
            if data.endswith(b"0\r\n\r\n"):
                self.next()

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.done.done():
                self.done.set_result(None)

    await _streams(url, concurrency, Stream)


async def run_aiohttp(url: str, concurrency: int, counter: _Counter) -> None:
    body = _body(counter.output)

    async def stream(session: aiohttp.ClientSession) -> None:
        while counter.take():
            async with session.post(url + "/v1/completions", json=body) as resp:
                async for data in resp.content.iter_any():
                    counter.tokens += data.count(EVENT)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(stream(session) for _ in range(concurrency)))


async def run_pdscope(url: str, concurrency: int, counter: _Counter, own: bool = False) -> None:
    """:func:`pdscope.client.stream_request` in a closed loop; ``own``: on pdscope's own HTTP/1.1
    connections (``client/http1.py``), else on aiohttp's."""
    from pdscope.client import http1

    before, http1.enabled = http1.enabled, own
    try:
        await _run_pdscope(url, concurrency, counter)
    finally:
        http1.enabled = before


async def _run_pdscope(url: str, concurrency: int, counter: _Counter) -> None:
    target = Target(base_url=url, api="openai", model=MODEL)

    async def stream(session: aiohttp.ClientSession) -> None:
        while counter.take():
            record = await stream_request(session, target, PROMPT, max_tokens=counter.output)
            if record.error:
                raise RuntimeError(record.error)
            counter.tokens += record.output_tokens or 0

    async with new_session(limit=0) as session:
        await asyncio.gather(*(stream(session) for _ in range(concurrency)))


async def run_own(url: str, concurrency: int, counter: _Counter) -> None:
    """What a protocol of pdscope's own would cost: each connection an ``asyncio.Protocol``
    whose bytes go through httptools' HTTP/1.1 parser (llhttp's binding) straight into
    pdscope's stream parser and record builder, with the read's time; a record built a request.
    No pool, retry, timeout or error path: the floor of such a reader, not one."""
    import httptools  # in the lab's venv (uvicorn's, through vLLM); not a pdscope dependency

    from pdscope.client.openai import OpenAIStreamParser, build_body
    from pdscope.client.record import RecordBuilder

    parts = urlsplit(url)
    target = Target(base_url=url, api="openai", model=MODEL)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\n" % parts.netloc.encode())
    loop = asyncio.get_running_loop()
    now_ns = time.perf_counter_ns

    class Stream(asyncio.Protocol):
        def __init__(self, done: asyncio.Future[None]) -> None:
            self.done = done
            self.http = httptools.HttpResponseParser(self)
            self.transport: asyncio.Transport | None = None
            self.t_ns = 0
            self.builder = RecordBuilder(request_id="", api="openai", model=MODEL)
            self.parser = OpenAIStreamParser(self.builder, False)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.next()

        def next(self) -> None:
            assert self.transport is not None
            if not counter.take():
                self.transport.close()
                return
            body = json.dumps(build_body(target, counter.output, PROMPT, None)).encode()
            self.builder = RecordBuilder(request_id=f"{id(self):x}", api="openai", model=MODEL)
            self.parser = OpenAIStreamParser(self.builder, False)
            self.builder.t_start_ns = self.builder.t_send_ns = now_ns()
            self.transport.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

        def data_received(self, data: bytes) -> None:
            self.t_ns = now_ns()
            self.http.feed_data(data)

        def on_headers_complete(self) -> None:
            self.builder.headers_received = True
            self.builder.http_status = self.http.get_status_code()

        def on_body(self, body: bytes) -> None:
            self.parser.feed(body, self.t_ns)

        def on_message_complete(self) -> None:
            self.parser.close(self.t_ns)
            counter.tokens += self.builder.build().output_tokens or 0
            loop.call_soon(self.next)  # not from inside the parser's callback

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.done.done():
                self.done.set_result(None)

    await _streams(url, concurrency, Stream)


async def run_pdscope_own(url: str, concurrency: int, counter: _Counter) -> None:
    await run_pdscope(url, concurrency, counter, own=True)


READERS: dict[str, Callable[[str, int, _Counter], Awaitable[None]]] = {
    "raw": run_raw, "aiohttp": run_aiohttp, "pdscope": run_pdscope, "own": run_own,
    "pdscope-own": run_pdscope_own,
}


async def stage(reader: str, url: str, concurrency: int, requests: int, output_tokens: int
                ) -> tuple[float, float]:
    """CPU µs a token, and tokens a second against the schedule's ideal (a share)."""
    counter = _Counter(requests, output_tokens)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await READERS[reader](url, concurrency, counter)
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    if counter.tokens != requests * output_tokens:
        raise RuntimeError(f"{reader}: {counter.tokens} tokens, {requests * output_tokens} sent")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    per_request_s = SERVER.ttft_base_s + (output_tokens - 1) * SERVER.itl_s
    ideal = concurrency * output_tokens / per_request_s
    return cpu / counter.tokens * 1e6, counter.tokens / wall / ideal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: bench_floor.py --concurrency 200 --runs 3")
    parser.add_argument("--concurrency", default="200",
                        help="comma-separated stream counts (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="rounds a level (default 3)")
    parser.add_argument("--requests-per-stream", type=int, default=7,
                        help="requests a stream sends in a stage (default 7: about 5 s)")
    parser.add_argument("--output-len", type=int, default=OUTPUT_TOKENS,
                        help=f"tokens a request (default {OUTPUT_TOKENS})")
    parser.add_argument("--readers", default=",".join(READERS),
                        help=f"comma-separated, of {', '.join(READERS)}")
    parser.add_argument("--pin", action="store_true",
                        help="server on the first core, this process on the second")
    ns = parser.parse_args(argv)
    try:
        levels = [int(c) for c in ns.concurrency.split(",")]
        readers = ns.readers.split(",")
        if (any(c < 1 for c in levels) or ns.runs < 1 or ns.output_len < 2
                or set(readers) - set(READERS)):
            raise ValueError
    except ValueError:
        parser.error("--concurrency: positive integers; --runs >= 1; --output-len >= 2;"
                     " --readers of " + ", ".join(READERS))
    if "own" in readers and importlib.util.find_spec("httptools") is None:
        print("# own: left out, httptools is not installed (pip install httptools)")
        readers.remove("own")
    cores = sorted(os.sched_getaffinity(0))
    if ns.pin and len(cores) < 2:
        parser.error("--pin needs two cores")
    print(f"# {len(cores)} cores, Python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}"
          f"; load average {os.getloadavg()[0]:.2f}; {'pinned' if ns.pin else 'not pinned'}")
    print("| C | reader | CPU µs/token, median (min-max) | of ideal tok/s |")
    print("|---|---|---|---|")
    import uvloop

    server = run_in_subprocess(SERVER, cpu=cores[0] if ns.pin else None)
    with server as url, pinned(cores[1]) if ns.pin else contextlib.nullcontext():
        for c in levels:
            got: dict[str, list[tuple[float, float]]] = {r: [] for r in readers}
            for round_ in range(ns.runs + 1):  # the first is a warm-up
                order = readers if round_ % 2 == 0 else readers[::-1]
                for reader in order:
                    figure = uvloop.run(stage(reader, url, c, c * ns.requests_per_stream,
                                          ns.output_len))
                    if round_:
                        got[reader].append(figure)
            for reader in readers:
                cpu = [x for x, _ in got[reader]]
                rate = statistics.median(y for _, y in got[reader])
                print(f"| {c} | {reader} | {statistics.median(cpu):.1f} "
                      f"({min(cpu):.1f}-{max(cpu):.1f}) | {rate:.0%} |", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
