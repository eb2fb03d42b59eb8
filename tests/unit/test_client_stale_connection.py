"""A server that closes a connection its headers said it would keep, as llama-server does after
every streamed answer (its content provider returns false once the stream is done, and
cpp-httplib then closes the socket, with ``Keep-Alive: timeout=5, max=100`` in the headers:
tools/server/server-http.cpp of llama.cpp 0c1e570). The next request on that pooled connection
must go again on a new one, not fail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from pdscope.client import Target, new_session, stream_request
from pdscope.client.session import get_json
from tests.unit.test_client_support import run

CHUNK = json.dumps({"choices": [{"index": 0, "text": " token", "finish_reason": None}]})


def _chunked(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@asynccontextmanager
async def closing_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Answers each request on a connection of its own, says keep-alive, then closes."""
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        if head.startswith(b"POST /tokenize"):
            body = b'{"tokens": [1, 2, 3]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Keep-Alive: timeout=5, max=100\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n")
            for _ in range(3):
                writer.write(_chunked(f"data: {CHUNK}\n\n"))
            writer.write(_chunked("data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the client has sent its next request on this connection
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.timeout(30)
def test_a_request_after_a_closed_keep_alive_goes_again_on_a_new_connection() -> None:
    async def main() -> tuple[list[bool], object, int]:
        async with closing_server() as (url, connections), new_session() as session:
            target = Target(url, "openai", "m")
            oks = []
            for _ in range(3):
                record = await stream_request(session, target, "hi", max_tokens=3)
                oks.append(record.ok and record.output_tokens == 3)
            tokens = await get_json(session, url + "/tokenize", method="POST",
                                    payload={"content": "x"})
            return oks, tokens, connections[0]

    oks, tokens, connections = run(main())
    assert oks == [True, True, True]
    assert tokens == {"tokens": [1, 2, 3]}
    assert connections == 4  # one a request: each failed reuse went again on a new one
