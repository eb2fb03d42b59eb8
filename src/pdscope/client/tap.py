"""A streamed body read as its bytes arrive: each read parsed in the callback that received it.

aiohttp hands the bytes of every read to the response's ``StreamReader`` (``feed_data``, called
from the connection's ``data_received``), which buffers them and wakes the task waiting in
``readany()``; that task runs on a later turn of the event loop. A wake a chunk costs a task
step, and under load it lands after every callback queued before it: the receive time taken
there is late by that queue. Measured side by side on the reference server at 200 streams
(``tools/bench_clients.py``, two runs each): 31 µs of client CPU a token with ``readany()``,
25.5 with the tap; ITL p99 error 5.0 ms against 2.8.

The tap gives that ``StreamReader`` a subclass (:class:`_Tapped`, no new fields, so the object
keeps its layout) whose ``feed_data``, ``feed_eof`` and ``set_exception`` pass the bytes, the
end or the error straight to the stream's parser, with the time of the read. Those three are
aiohttp's own entry points into a reader (``aiohttp/streams.py``; the payload parser and the
decompressor call them); nothing else of aiohttp is touched, and the class is put back when the
stream ends, so the response is drained and released as usual. Where the tap cannot be placed
(a reader of another class, a layout that refuses the subclass), the stream is read with
``readany()``: same parser, same records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

now_ns = time.perf_counter_ns

# The switch, for comparing the two ways of reading (tests, benchmarks): ``False`` reads every
# stream with ``readany()``.
enabled = True

_SINKS: dict[int, _Sink] = {}


class _Tapped(aiohttp.StreamReader):
    __slots__ = ()

    def feed_data(self, data: bytes, *args: Any, **kwargs: Any) -> bool:
        sink = _SINKS.get(id(self))
        if sink is None:  # the stream is over, the class not yet put back
            return super().feed_data(data, *args, **kwargs)
        sink.data(data)
        return False

    def feed_eof(self) -> None:
        super().feed_eof()
        sink = _SINKS.get(id(self))
        if sink is not None:
            sink.eof()

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        super().set_exception(exc, *args, **kwargs)
        sink = _SINKS.get(id(self))
        if sink is not None:
            sink.fail(exc)


class _Sink:
    """Where a tapped reader's bytes go: ``on_data(bytes, t_ns)`` returns ``True`` once the
    stream needs no more; ``on_end(t_ns)`` is the end of the body."""

    def __init__(self, future: asyncio.Future[None], on_data: Callable[[bytes, int], bool],
                 on_end: Callable[[int], None]) -> None:
        self.future = future
        self.on_data = on_data
        self.on_end = on_end

    def data(self, data: bytes) -> None:
        if self.future.done() or not data:
            return
        t = now_ns()
        try:
            if self.on_data(data, t):
                self.future.set_result(None)
        except Exception as exc:  # surfaces in the task, as it would from readany()
            self.future.set_exception(exc)

    def eof(self) -> None:
        if self.future.done():
            return
        try:
            self.on_end(now_ns())
            self.future.set_result(None)
        except Exception as exc:
            self.future.set_exception(exc)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


async def read_stream(content: aiohttp.StreamReader, on_data: Callable[[bytes, int], bool],
                      on_end: Callable[[int], None]) -> None:
    """Feed ``on_data(bytes, receive time)`` every read of ``content`` until it returns
    ``True``, or the body ends (``on_end(time)``); an error of the connection is raised."""
    if enabled and type(content) is aiohttp.StreamReader:
        try:
            await _tapped(content, on_data, on_end)
            return
        except _Refused:
            pass
    while True:
        data = await content.readany()
        t = now_ns()
        if not data:
            on_end(t)
            return
        if on_data(data, t):
            return


class _Refused(Exception):
    """The reader would not take the subclass: read it the usual way."""


async def _tapped(content: aiohttp.StreamReader, on_data: Callable[[bytes, int], bool],
                  on_end: Callable[[int], None]) -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    sink = _Sink(future, on_data, on_end)
    pending = content.read_nowait()  # what came before the tap (raises a stored error)
    try:
        content.__class__ = _Tapped
    except TypeError:
        if pending:
            t = now_ns()
            if on_data(pending, t):
                return
        raise _Refused from None
    _SINKS[id(content)] = sink
    try:
        if pending:
            sink.data(pending)
        if content.is_eof():
            sink.eof()
        await future
    finally:
        _SINKS.pop(id(content), None)
        content.__class__ = aiohttp.StreamReader
