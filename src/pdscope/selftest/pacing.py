"""One timer for every stream of the reference server: when each chunk goes out.

At 1,000 streams of one token every 10 ms the server owes 100,000 chunks a second, 10 µs each
on one core, everything included. A coroutine per stream woken for every token (a future set, a
task step, aiohttp's writer with its drain check) costs several times that, and a timer per
stream more again. So here one :class:`Ticker` holds every due time in one heap, and one
callback, armed for the earliest:

* sleeps with the event loop until ``spin_ns`` before it (the loop's timers are only good to
  about a millisecond: uvloop's to the millisecond), then runs once every loop iteration
  (``call_soon``: a spin that still lets the loop read sockets between turns) until it is due;
* takes every item that is due, then serves them in due order: a parked future is set (the
  slow path: a coroutine that builds its own chunk), a :class:`PacedStream` is written straight
  to its transport (the fast path: no coroutine, no future, no aiohttp writer).

A paced stream's chunks are byte templates made once a request, with only the due and sent
times formatted in (``bytes % (due, sent)``): the send time is read just before the write, as
the slow path reads it, so a chunk still says how late the server itself was.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from dataclasses import dataclass, field

now_ns = time.perf_counter_ns


@dataclass(eq=False)
class PacedStream:
    """A streaming response the ticker writes itself, one chunk at each due time.

    ``cycle[c % len(cycle)]`` is chunk ``c``'s template (SSE bytes with two ``%d``: due, sent)
    and ``last`` the last chunk's; ``tail`` goes out with the last chunk (the usage chunk and
    ``[DONE]``, already framed). Chunks are framed for HTTP/1.1 chunked transfer encoding, as
    aiohttp's writer would: the response's headers are sent, and aiohttp writes the final
    ``0\\r\\n\\r\\n`` when the handler ends it. ``done`` is set to True when the last chunk was
    written and to False when the client was gone first."""

    transport: asyncio.Transport
    cycle: tuple[bytes, ...]
    last: bytes
    tail: bytes
    t_first: int
    step: int
    n_chunks: int
    done: asyncio.Future[bool]
    c: int = field(default=0)

    def emit(self) -> int:
        """Write the chunk that is due; the next one's due time, or -1 when finished."""
        if self.done.done():  # the handler was cancelled (the server stops)
            return -1
        transport = self.transport
        if transport.is_closing():
            self.done.set_result(False)
            return -1
        c = self.c
        due = self.t_first + c * self.step
        if c == self.n_chunks - 1:
            data = self.last % (due, now_ns())
            transport.write(b"%x\r\n%b\r\n%b" % (len(data), data, self.tail))
            self.done.set_result(True)
            return -1
        data = self.cycle[c % len(self.cycle)] % (due, now_ns())
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        self.c = c + 1
        return due + self.step


class Ticker:
    """Wakes many streams at their due times with one timer (module docstring)."""

    def __init__(self, spin_ns: int) -> None:
        self.spin_ns = spin_ns
        self._heap: list[tuple[int, int, asyncio.Future[None] | PacedStream]] = []
        self._seq = 0
        self._handle: asyncio.Handle | None = None
        self._armed_for = math.inf  # the due time the armed callback serves
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self, due_ns: int) -> None:
        """Return at ``due_ns`` (at once if it has passed)."""
        if due_ns <= now_ns():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._push(due_ns, fut)
        await fut

    def pace(self, stream: PacedStream) -> asyncio.Future[bool]:
        """Write ``stream``'s chunks at their due times; its ``done`` future, to await."""
        self._push(stream.t_first + stream.c * stream.step, stream)
        return stream.done

    def _push(self, due: int, item: asyncio.Future[None] | PacedStream) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, item))
        if due < self._armed_for:
            self._arm(due)

    def _arm(self, due: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        ahead = due - self.spin_ns - now_ns()
        self._armed_for = due
        self._handle = (self._loop.call_later(ahead / 1e9, self._fire) if ahead > 0
                        else self._loop.call_soon(self._fire))

    def poll(self) -> None:
        """Serve every item that is due now, at once. The timer's callback gets one turn an
        event loop iteration; a burst of new requests (a hundred handlers at 60 µs each) in one
        iteration would hold it back for milliseconds, so a handler calls this between its
        steps and due chunks go out in between."""
        heap = self._heap
        if not heap or heap[0][0] > now_ns():
            return
        now = now_ns()
        due: list[asyncio.Future[None] | PacedStream] = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        for item in due:
            if isinstance(item, PacedStream):
                nxt = item.emit()
                if nxt >= 0:
                    self._seq += 1
                    heapq.heappush(heap, (nxt, self._seq, item))
            elif not item.done():
                item.set_result(None)

    def _fire(self) -> None:
        self._handle = None
        self._armed_for = math.inf
        self.poll()
        if self._heap:
            self._arm(self._heap[0][0])

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_for = math.inf
