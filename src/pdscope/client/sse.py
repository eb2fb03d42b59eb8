"""Server-sent events, decoded incrementally from whatever bytes each TCP read brought.

The format (WHATWG HTML, "Server-sent events"): lines ending in ``\\n`` (or ``\\r\\n``); a line
``data: X`` adds X to the event being built; a blank line ends the event; a line starting with
``:`` is a comment (llama.cpp's server sends such pings while a long prompt is processed:
``sse_ping_interval`` in ggml-org/llama.cpp ``tools/server/README.md``); ``event:``, ``id:`` and
``retry:`` lines are not needed here and are skipped.

Two deviations real servers make are tolerated:

* ``data:`` lines with no blank line between them (the vLLM transcript quoted in
  opea-project/GenAIExamples ``SearchQnA/docker_compose/amd/gpu/rocm/README.md``, kept in
  ``tests/data/fixtures/servers/vllm/completions_stream_opea_searchqna.txt``): a new ``data:``
  line that arrives while the pending data is already a whole JSON value (or ``[DONE]``) starts
  a new event.
* an event whose blank line comes in a later read: when a read ends with pending data that is
  already whole, the event is delivered with that read, so its time is the time its bytes came.

An event may be split anywhere across reads, even inside a UTF-8 character: bytes are kept until
their line is complete. A complete line that is not UTF-8 raises :class:`~pdscope.errors.RunError`
(the server sent something else than text); the stream parser records it as a bad chunk.
"""

from __future__ import annotations

from pdscope.client.chunkjson import is_json
from pdscope.errors import RunError

DONE = "[DONE]"


def _whole(data: str) -> bool:
    return data == DONE or is_json(data)


class SSEDecoder:
    """``feed(bytes)`` returns the data of every event completed by those bytes; ``close()``
    returns what was left when the stream ended."""

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[str] = []

    def whole_event(self, chunk: bytes) -> bytes | None:
        """The data of ``chunk`` as bytes when it is one whole event and nothing else
        (``data: X`` and a blank line) and nothing is pending: the common read, which a caller
        may decode itself (then this decoder's state is as if :meth:`feed` had taken it).
        ``None`` for any other read."""
        if (not self._tail and not self._data and chunk.startswith(b"data: ")
                and chunk.find(b"\n") == len(chunk) - 2 and chunk.endswith(b"\n\n")):
            return chunk[6:-3] if chunk.endswith(b"\r\n\n") else chunk[6:-2]
        return None

    def feed(self, chunk: bytes) -> list[str]:
        payload = self.whole_event(chunk)
        if payload is not None:
            try:
                return [payload.decode("utf-8")]
            except UnicodeDecodeError as exc:
                raise RunError(f"a chunk is not UTF-8 text ({exc.reason})") from None
        events: list[str] = []
        buf = self._tail + chunk if self._tail else chunk
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RunError(f"a chunk is not UTF-8 text ({exc.reason})") from None
            self._line(text, events)
        self._tail = buf[start:]
        if self._data and _whole(self._joined()):
            events.append(self._joined())
            self._data = []
        return events

    def close(self) -> list[str]:
        """The stream ended: whatever pending data there is makes a last event."""
        events: list[str] = []
        if self._tail:
            self._line(self._tail.decode("utf-8", errors="replace").rstrip("\r"), events)
            self._tail = b""
        if self._data:
            events.append(self._joined())
            self._data = []
        return events

    def _joined(self) -> str:
        return self._data[0] if len(self._data) == 1 else "\n".join(self._data)

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append(self._joined())
                self._data = []
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if name != "data":
            return
        if not sep:
            value = ""
        elif value.startswith(" "):
            value = value[1:]
        if self._data and _whole(self._joined()):
            events.append(self._joined())
            self._data = []
        self._data.append(value)
