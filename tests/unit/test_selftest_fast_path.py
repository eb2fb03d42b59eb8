"""The reference server's fast path (the ticker writes chunks from templates) against its slow
path (a coroutine builds each chunk): what a client reads must be the same."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
import pytest

from pdscope.selftest.pacing import PacedStream, Ticker, now_ns
from pdscope.selftest.server import ReferenceConfig, ReferenceServer, _template

# Times that change from one request to the next; the rest of every chunk must be equal.
VARYING = ("id", "created", "pdscope_sent_ns", "pdscope_due_ns")
FAST: dict[str, Any] = {"ttft_base_s": 0.005, "ttft_per_token_s": 0.0, "itl_s": 0.002}


async def _events(url: str, path: str, body: dict[str, Any],
                  session: aiohttp.ClientSession) -> tuple[list[str], dict[str, str]]:
    """The ``data:`` payloads of one streamed answer, and its headers."""
    async with session.post(url + path, json=body) as resp:
        assert resp.status == 200
        text = (await resp.read()).decode()
        headers = dict(resp.headers)
    events = [block[len("data: "):] for block in text.split("\n\n") if block]
    return events, headers


def _request(chat: bool, max_tokens: int, usage: bool) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": "pdscope-reference", "max_tokens": max_tokens,
                            "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "one two three"}]
        return "/v1/chat/completions", body
    body["prompt"] = "one two three"
    return "/v1/completions", body


async def _both(config: dict[str, Any], chat: bool, max_tokens: int,
                usage: bool) -> tuple[list[str], list[str]]:
    path, body = _request(chat, max_tokens, usage)
    out = []
    for fast in (True, False):
        async with ReferenceServer(ReferenceConfig(**FAST, **config, fast_path=fast)) as server, \
                aiohttp.ClientSession() as session:
            events, headers = await _events(server.base_url, path, body, session)
            assert headers["Content-Type"].startswith("text/event-stream")
            assert server.paced_streams == (1 if fast else 0)  # each path took its stream
            out.append(events)
    return out[0], out[1]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("tokens_per_chunk, max_tokens", [(1, 11), (3, 11), (1, 1), (4, 8)])
def test_fast_and_slow_chunks_parse_to_the_same_fields(
    chat: bool, usage: bool, tokens_per_chunk: int, max_tokens: int
) -> None:
    fast, slow = asyncio.run(_both({"tokens_per_chunk": tokens_per_chunk}, chat,
                                      max_tokens, usage))
    assert len(fast) == len(slow) and fast[-1] == slow[-1] == "[DONE]"
    dues: list[list[int]] = [[], []]
    for a_text, b_text in zip(fast[:-1], slow[:-1], strict=True):
        a, b = json.loads(a_text), json.loads(b_text)
        assert list(a) == list(b)  # the same fields, in the same order
        assert {k: v for k, v in a.items() if k not in VARYING} == {
            k: v for k, v in b.items() if k not in VARYING}
        for i, chunk in enumerate((a, b)):
            if "pdscope_due_ns" in chunk:
                dues[i].append(chunk["pdscope_due_ns"])
                # The server's own lateness: sent just before the write, never before due.
                assert chunk["pdscope_sent_ns"] >= chunk["pdscope_due_ns"]
    # The schedule is the same: each chunk due the same time after the first.
    assert [d - dues[0][0] for d in dues[0]] == [d - dues[1][0] for d in dues[1]]
    text = "".join(_text(json.loads(e), chat) for e in fast[:-1])
    assert len(text.split()) == max_tokens


def _text(chunk: dict[str, Any], chat: bool) -> str:
    if not chunk["choices"]:  # the usage chunk
        return ""
    choice = chunk["choices"][0]
    return str(choice["delta"].get("content") or "") if chat else str(choice["text"])


def test_the_fast_path_keeps_the_connection_alive_and_its_schedule() -> None:
    """Two streams one after the other on one connection: the chunked framing the ticker
    writes and the end aiohttp writes make one well-formed answer each."""

    async def main() -> list[list[str]]:
        async with ReferenceServer(ReferenceConfig(**FAST)) as server, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1)) as session:
            path, body = _request(False, 5, True)
            answers = [(await _events(server.base_url, path, body, session))[0]
                       for _ in range(2)]
            assert server.requests == 2
            return answers

    for events in asyncio.run(main()):
        chunks = [json.loads(e) for e in events[:-1]]
        dues = [c["pdscope_due_ns"] for c in chunks if "pdscope_due_ns" in c]
        assert [b - a for a, b in itertools.pairwise(dues)] == [2_000_000] * 4
        assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_a_client_gone_mid_stream_is_dropped() -> None:
    async def main() -> None:
        async with ReferenceServer(ReferenceConfig(**FAST)) as server, \
                aiohttp.ClientSession() as session:
            path, body = _request(False, 10_000, False)
            async with session.post(server.base_url + path, json=body) as resp:
                await resp.content.readline()  # the first chunk came
                resp.close()  # and the client hangs up
            for _ in range(200):  # the ticker finds the transport closing at its next write
                await asyncio.sleep(0.01)
                if not any(isinstance(item, PacedStream) for _, _, item in
                           server._ticker._heap):
                    break
            assert not any(isinstance(item, PacedStream) for _, _, item in server._ticker._heap)
            path, body = _request(True, 3, False)  # and the server serves on
            events, _ = await _events(server.base_url, path, body, session)
            assert events[-1] == "[DONE]"

    asyncio.run(main())


def test_the_slow_path_serves_what_the_fast_path_does_not() -> None:
    """A thought, jitter and usage in every chunk are built a chunk at a time: they still
    stream (the fast path's conditions are the exceptions, not a break)."""

    async def main() -> None:
        for config, extra in (({"reasoning_tokens": 2}, {}), ({"itl_jitter_s": 0.001}, {}),
                              ({}, {"stream_options": {"continuous_usage_stats": True}})):
            async with ReferenceServer(ReferenceConfig(**FAST, **config)) as server, \
                    aiohttp.ClientSession() as session:
                path, body = _request(True, 4, False)
                events, _ = await _events(server.base_url, path, {**body, **extra}, session)
                assert events[-1] == "[DONE]" and len(events) == 6
                assert server.paced_streams == 0

    asyncio.run(main())


def test_the_ticker_wakes_in_due_order_never_early() -> None:
    async def main() -> list[tuple[int, int]]:
        ticker = Ticker(spin_ns=1_000_000)
        start = now_ns()
        woke: list[tuple[int, int]] = []

        async def one(due: int) -> None:
            await ticker.wait(due)
            woke.append((due, now_ns()))

        dues = [start + ms * 1_000_000 for ms in (9, 3, 6, 1, 12, 3)]
        await asyncio.gather(*(one(d) for d in dues))
        ticker.close()
        return woke

    woke = asyncio.run(main())
    assert [d for d, _ in woke] == sorted(d for d, _ in woke)
    assert all(t >= d for d, t in woke)


def test_a_template_escapes_percent_and_needs_the_due_time_last() -> None:
    tmpl = _template({"model": "50%-off", "pdscope_due_ns": 0})
    data = tmpl % (7, 9)
    assert data == b'data: {"model":"50%-off","pdscope_due_ns":7,"pdscope_sent_ns":9}\n\n'
    with pytest.raises(ValueError):
        _template({"pdscope_due_ns": 0, "model": "x"})


class _Transport:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_poll_writes_what_is_due_and_nothing_before() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ticker = Ticker(spin_ns=0)
        transport = _Transport()
        template = _template({"pdscope_due_ns": 0})
        t_first = now_ns() + 3_600 * 10**9  # an hour ahead: nothing is due
        stream = PacedStream(transport, (template,), template, b"END", t_first,  # type: ignore[arg-type]
                             10**6, 2, loop.create_future())
        ticker.pace(stream)
        ticker.poll()
        assert transport.written == []
        stream.t_first = now_ns() - 2 * 10**6  # both chunks due now
        ticker._heap = [(stream.t_first, 0, stream)]
        ticker.poll()
        assert len(transport.written) == 1  # one chunk a turn: the next is pushed, due later
        ticker.poll()
        assert len(transport.written) == 2 and transport.written[1].endswith(b"END")
        assert stream.done.result() is True and ticker._heap == []
        ticker.close()

    asyncio.run(main())


def test_a_closing_transport_ends_the_stream_unwritten() -> None:
    async def main() -> None:
        transport = _Transport()
        transport.closing = True
        template = _template({"pdscope_due_ns": 0})
        stream = PacedStream(transport, (template,), template, b"", 0, 1, 3,  # type: ignore[arg-type]
                             asyncio.get_running_loop().create_future())
        assert stream.emit() == -1 and transport.written == []
        assert stream.done.result() is False

    asyncio.run(main())
