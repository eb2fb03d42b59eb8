"""pdscope's own HTTP/1.1 connections for streamed answers (``client/http1.py``): the same
records as aiohttp's path for every fault the reference server makes, connections kept alive
and closed with the session, and aiohttp wherever the own path does not apply."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest

from pdscope.client import Target, http1, new_session, stream_request
from pdscope.selftest import ReferenceServer
from tests.unit.test_client_faults import QUICK, request
from tests.unit.test_client_tap import spy_feeds, summary


@pytest.fixture(autouse=True)
def own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The own path on (its default), whatever an earlier test left."""
    monkeypatch.setattr(http1, "enabled", True)


FAULTS = ["refuse", "http_429", "http_500", "reset_mid_stream", "stall", "malformed_chunk",
          "never_ending"]


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return spy_feeds(monkeypatch)


@pytest.mark.timeout(90)
def test_own_connections_record_what_aiohttp_records_for_every_fault(
        feeds: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []
    take = http1.Pool.take

    def counting(self: http1.Pool, key: http1.Key) -> object:
        opened.append(self.opened)
        return take(self, key)

    monkeypatch.setattr(http1.Pool, "take", counting)
    own = [summary(f) for f in [None, *FAULTS]]
    assert opened  # the own path was taken
    assert feeds and not any(feeds)  # each read parsed in the protocol's callback
    monkeypatch.setattr(http1, "enabled", False)
    opened.clear()
    aio = [summary(f) for f in [None, *FAULTS]]
    assert not opened
    assert own == aio
    assert own[0][0] is None and own[0][1] == 20  # a clean stream: 20 tokens, no error


def test_the_error_words_are_aiohttps() -> None:
    """The record's message for a refused connection, an HTTP error and a reset stream reads
    the same on both paths (the port differs from run to run: compared without it), up to the
    library's own exception in the parenthesis (aiohttp's wording of a reset is its own)."""
    def strip(error: str | None) -> str | None:
        return error.split(":", 3)[-1].split(" (")[0] if error else error

    for fault in ("refuse", "http_500", "reset_mid_stream"):
        r_own, _ = request(fault=fault)
        http1.enabled = False
        try:
            r_aio, _ = request(fault=fault)
        finally:
            http1.enabled = True
        assert r_own.error_kind == r_aio.error_kind, (r_own.error, r_aio.error)
        assert strip(r_own.error) == strip(r_aio.error), (r_own.error, r_aio.error)


@pytest.mark.timeout(60)
def test_one_connection_carries_a_sessions_requests_and_closes_with_it() -> None:
    async def main() -> tuple[int, int, int, list[int]]:
        async with ReferenceServer(QUICK) as server:
            target = Target(server.base_url, "openai", "pdscope-reference")
            session = new_session()
            async with session:
                assert isinstance(session.connector, http1.OwnConnector)
                pool = session.connector.own
                tokens = []
                for _ in range(12):
                    r = await stream_request(session, target, "one two", max_tokens=5)
                    assert r.error is None, r.error
                    tokens.append(r.output_tokens or 0)
                # two at once: a second connection, both kept
                both = await asyncio.gather(*(stream_request(session, target, "x", max_tokens=5)
                                              for _ in range(2)))
                assert all(r.error is None for r in both)
                opened, open_now = pool.opened, len(pool.open)
            return opened, open_now, len(pool.open), tokens

    opened, open_during, open_after, tokens = asyncio.run(main())
    assert tokens == [5] * 12
    assert opened == 2 and open_during == 2
    assert open_after == 0  # closed with the session


def test_the_own_path_applies_to_plain_http_on_pdscopes_sessions_only() -> None:
    async def main() -> list[bool]:
        async with new_session() as ours, aiohttp.ClientSession() as theirs:
            return [http1.usable(ours, "http://127.0.0.1:8000/v1/completions", {}),
                    http1.usable(ours, "https://example.org/v1/completions", {}),
                    http1.usable(theirs, "http://127.0.0.1:8000/v1/completions", {}),
                    http1.usable(ours, "http://127.0.0.1:8000/v1", {"X-A": "1\r\nX-B: 2"})]

    assert asyncio.run(main()) == [True, False, False, False]


@pytest.mark.timeout(60)
def test_the_sessions_headers_go_with_each_request() -> None:
    """The user's headers set on the session (``new_session(headers=)``) reach the server on
    the own path, as aiohttp merges them."""

    async def main() -> object:
        async with ReferenceServer(QUICK) as server:
            target = Target(server.base_url, "openai", "pdscope-reference")
            async with new_session(headers={"X-Pdscope-Test": "kept"}) as session:
                r = await stream_request(session, target, "one", max_tokens=2)
                assert r.error is None, r.error
                async with session.get(server.base_url + "/pdscope/received") as resp:
                    return await resp.json()

    got = asyncio.run(main())
    assert isinstance(got, dict) and got["requests"]
    headers = got["requests"][-1]["headers"]
    assert headers.get("x-pdscope-test") == hashlib.sha256(b"kept").hexdigest(), headers
    # The client names itself, as aiohttp does on its path (a server's log tells who called).
    ua = hashlib.sha256(http1.USER_AGENT.encode()).hexdigest()
    assert headers.get("user-agent") == ua and http1.USER_AGENT.startswith("pdscope/"), headers


@pytest.mark.timeout(60)
def test_a_session_limit_holds_and_the_wait_is_recorded() -> None:
    """``new_session(limit=1)``: two requests at once share one connection, the second waits
    for it (``pool_wait_s``), as with aiohttp's pool."""

    async def main() -> tuple[int, list[float | None]]:
        async with ReferenceServer(QUICK) as server:
            target = Target(server.base_url, "openai", "pdscope-reference")
            async with new_session(limit=1) as session:
                assert isinstance(session.connector, http1.OwnConnector)
                both = await asyncio.gather(*(stream_request(session, target, "x", max_tokens=5)
                                              for _ in range(2)))
                assert all(r.error is None and r.output_tokens == 5 for r in both)
                return session.connector.own.opened, [r.pool_wait_s for r in both]

    opened, waits = asyncio.run(main())
    assert opened == 1
    waited = [w for w in waits if w is not None]
    assert len(waited) == 1 and waited[0] > 0.02  # the first stream's length, about


@pytest.mark.timeout(30)
def test_a_body_that_ends_with_the_connection_is_read_whole() -> None:
    """An answer with neither a length nor chunks (HTTP/1.0 style: the body ends when the
    server closes) gives its tokens and ends cleanly."""
    events = b"".join(b'data: {"choices":[{"text":" w%d","index":0}]}\n\n' % i
                      for i in range(3)) + b"data: [DONE]\n\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\n")
        for line in events.split(b"\n\n")[:-1]:
            writer.write(line + b"\n\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    async def main() -> object:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, new_session() as session:
            target = Target(f"http://127.0.0.1:{port}", "openai", "m")
            return await stream_request(session, target, "x", max_tokens=3)

    r = asyncio.run(main())
    assert r.error is None, r.error
    assert r.output_text == " w0 w1 w2" and len(r.token_times_ns) == 3
