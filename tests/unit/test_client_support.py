"""Helpers for the client tests: real local HTTP servers that answer with recorded responses.

No mocks: each helper runs an aiohttp server on 127.0.0.1 that speaks HTTP like the real one,
with bodies from ``tests/data/fixtures/servers/``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from tests.conftest import SERVERS

T = TypeVar("T")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def app_server(routes: dict[tuple[str, str], Handler]) -> AsyncIterator[str]:
    """A local server with these ``(method, path) -> handler`` routes; yields its base URL."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def json_route(body: Any, status: int = 200) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(text=text, status=status, content_type="application/json")

    return handler


def text_route(text: str, content_type: str = "text/plain") -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type=content_type)

    return handler


def replay_route(
    data: bytes, content_type: str, pieces: Sequence[int] = (), gap_s: float = 0.002
) -> Handler:
    """Stream ``data`` cut at the byte offsets ``pieces``, a short pause between writes, the way
    a server's chunks arrive in separate TCP reads."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        bounds = [0, *sorted(pieces), len(data)]
        for a, b in pairwise(bounds):
            if b > a:
                await resp.write(data[a:b])
                await asyncio.sleep(gap_s)
        await resp.write_eof()
        return resp

    return handler


def fixture_bytes(*parts: str) -> bytes:
    return SERVERS.joinpath(*parts).read_bytes()


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def test_app_server_answers_with_the_recorded_body() -> None:
    body = json.loads(fixture_bytes("ollama", "version_response.json"))

    async def main() -> Any:
        async with (
            app_server({("GET", "/api/version"): json_route(body)}) as url,
            aiohttp.ClientSession() as s,
            s.get(url + "/api/version") as r,
        ):
            return await r.json()

    assert run(main()) == {"version": "0.5.1"}
