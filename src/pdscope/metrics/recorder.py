"""Record a server's ``/metrics`` beside a load run, one scrape a line, and read it back.

A load generator measures what its own requests saw; the server's ``/metrics`` says what the
server did meanwhile (how many waited, how full the KV pool was). To set the two side by side,
run a recorder for the length of the run::

    async with MetricsRecorder("http://127.0.0.1:8000", "run.metrics.jsonl"):
        await run_the_load()
    snapshots = load_recording("run.metrics.jsonl")
    window = recording_window(snapshots)   # the whole run, as the server saw it

or, from code that is not async, ``with ThreadedMetricsRecorder(url, path): ...``.

The file is JSON Lines. The first line is a header (``"kind": "header"``: the ``/metrics`` URL
and the interval); each scrape is a line ``{"kind": "scrape", "t", "wall", "types", "samples"}``
in the form of :meth:`Snapshot.to_json`; a scrape that failed is a line ``{"kind": "error", "t",
"wall", "error"}``, never an exception, so a server that restarts or stalls during a run leaves a
hole in the record, not a dead run. ``t`` is ``time.monotonic()``, the clock
``time.perf_counter()`` also reads on Linux, so it lines up with a load generator's timestamps
on the same host; ``wall`` is ``time.time()``. Every line is flushed as it is written, so a run
killed half-way leaves every scrape up to then.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import aiohttp

from pdscope.errors import InputError, PdscopeError
from pdscope.metrics.scrape import Snapshot, metrics_url, scrape
from pdscope.metrics.window import Window, make_window
from pdscope.servers import MetricMap, detect_metric_map

FORMAT = "pdscope-metrics-recording"
VERSION = 1


class MetricsRecorder:
    """Scrape ``url``'s ``/metrics`` every ``interval`` seconds into the JSONL file ``path``.

    An async context manager: the first scrape is taken on entry, then one on every tick of a
    fixed schedule (a slow scrape skips the ticks it overran rather than drifting), and one
    more on exit (``final_scrape``) so the record spans the whole block. ``scrapes`` and
    ``errors`` count the lines written so far.
    """

    def __init__(
        self,
        url: str,
        path: str | Path,
        interval: float = 1.0,
        *,
        timeout: float = 5.0,
        final_scrape: bool = True,
    ) -> None:
        if interval <= 0:
            raise InputError(f"the recording interval must be above 0 s, got {interval:g}")
        self.url = url
        self.path = Path(path)
        self.interval = interval
        self.timeout = timeout
        self.final_scrape = final_scrape
        self.scrapes = 0
        self.errors = 0
        self._file: IO[str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    async def scrape_once(self) -> Snapshot | None:
        """Take one scrape now and write its line; ``None`` (and an error line) on failure."""
        assert self._session is not None, "use the recorder as a context manager"
        try:
            snap = await scrape(self.url, self._session, timeout=self.timeout)
        except PdscopeError as exc:
            self.errors += 1
            self._write({"kind": "error", "t": time.monotonic(), "wall": time.time(),
                         "error": str(exc)})
            return None
        self.scrapes += 1
        self._write({"kind": "scrape", **snap.to_json()})
        return snap

    async def _loop(self) -> None:
        start = time.monotonic()
        tick = 1
        while True:
            await asyncio.sleep(max(0.0, start + tick * self.interval - time.monotonic()))
            await self.scrape_once()
            # The next tick still ahead of us: overrun ticks are skipped, not bunched.
            tick = max(tick + 1, int((time.monotonic() - start) / self.interval) + 1)

    async def __aenter__(self) -> MetricsRecorder:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._session = aiohttp.ClientSession()
        self._write({"kind": "header", "format": FORMAT, "version": VERSION,
                     "url": metrics_url(self.url), "interval_s": self.interval,
                     "t": time.monotonic(), "wall": time.time()})
        await self.scrape_once()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            if self.final_scrape and exc_type is None:
                await self.scrape_once()
        finally:
            if self._session is not None:
                await self._session.close()
            if self._file is not None:
                self._file.close()


class ThreadedMetricsRecorder:
    """:class:`MetricsRecorder` for code that is not async: it runs in a thread of its own
    with its own event loop, from ``__enter__`` (which returns once the first scrape is
    written) to ``__exit__`` (which returns once the final scrape is written)."""

    def __init__(
        self,
        url: str,
        path: str | Path,
        interval: float = 1.0,
        *,
        timeout: float = 5.0,
        final_scrape: bool = True,
    ) -> None:
        self.recorder = MetricsRecorder(
            url, path, interval, timeout=timeout, final_scrape=final_scrape
        )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.recorder:
            self._started.set()
            await self._stop.wait()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # handed to the caller's thread in __enter__/__exit__
            self._failure = exc
        finally:
            self._started.set()

    def __enter__(self) -> MetricsRecorder:
        self._thread = threading.Thread(target=self._run, name="pdscope-metrics", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure
        return self.recorder

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join()
        if self._failure is not None and exc_type is None:
            raise self._failure


@dataclass(frozen=True)
class Recording:
    """What a recording file holds: the ``/metrics`` URL, the interval, the snapshots in
    order, and each failed scrape as ``(wall time, message)``."""

    url: str | None
    interval_s: float | None
    snapshots: list[Snapshot]
    errors: list[tuple[float, str]]


def read_recording(path: str | Path) -> Recording:
    """Read a file :class:`MetricsRecorder` wrote.

    A last line cut short (the recording process was killed mid-write) is ignored; any other
    line that is not a record raises ``InputError`` naming the file and the line.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read the metrics recording {path}: {exc.strerror}") from exc
    url: str | None = None
    interval: float | None = None
    snapshots: list[Snapshot] = []
    errors: list[tuple[float, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record["kind"]
            if kind == "header":
                if record.get("format") != FORMAT:
                    raise ValueError(f"format {record.get('format')!r}")
                url, interval = record.get("url"), record.get("interval_s")
            elif kind == "scrape":
                snapshots.append(Snapshot.from_json(record))
            elif kind == "error":
                errors.append((float(record["wall"]), str(record["error"])))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines) and isinstance(exc, json.JSONDecodeError):
                break  # the writer was stopped half-way through its last line
            raise InputError(
                f"{path}:{number}: not a line of a pdscope metrics recording ({exc})"
            ) from exc
    return Recording(url=url, interval_s=interval, snapshots=snapshots, errors=errors)


def load_recording(path: str | Path) -> list[Snapshot]:
    """The snapshots of a recording file, in the order they were taken."""
    return read_recording(path).snapshots


def bracket(snapshots: Sequence[Snapshot], start_t: float, end_t: float) -> tuple[int, int]:
    """Indices of the snapshots that enclose ``[start_t, end_t]`` (monotonic seconds).

    The last snapshot taken at or before ``start_t`` and the first at or after ``end_t``; where
    none is that early (or late), the first (or last) snapshot. A load run that started at
    ``start_t`` and ended at ``end_t`` lies wholly inside the window between the two.
    """
    if len(snapshots) < 2:
        raise InputError("a window needs at least two scrapes")
    first = 0
    for i, snap in enumerate(snapshots):
        if snap.t <= start_t:
            first = i
    last = len(snapshots) - 1
    for i in range(len(snapshots) - 1, -1, -1):
        if snapshots[i].t >= end_t:
            last = i
    if last <= first:
        last = min(first + 1, len(snapshots) - 1)
        first = last - 1
    return first, last


def recording_window(
    snapshots: Sequence[Snapshot],
    family: MetricMap | None = None,
    *,
    first: int = 0,
    last: int = -1,
    model: str | None = None,
    engine: str | None = None,
) -> Window:
    """The :class:`Window` between two snapshots of a recording (by default the first and the
    last: the whole recording). The family is detected from the later snapshot when not given.
    """
    if len(snapshots) < 2:
        raise InputError(
            f"a window needs at least two scrapes; the recording has {len(snapshots)}"
        )
    before, after = snapshots[first], snapshots[last]
    if family is None:
        family = detect_metric_map(after.names)
        if family is None:
            raise InputError(
                "the recording holds no metrics of vLLM, SGLang, llama.cpp or TGI: "
                "give the family"
            )
    return make_window(before, after, family, model=model, engine=engine)


def peak_waiting_window(snapshots: Sequence[Snapshot], family: MetricMap) -> Window | None:
    """Of the windows between consecutive snapshots, the one that ended with the most
    requests waiting (gauges are read at a window's end): the moment a run queued most.
    ``None`` when the server exports no waiting gauge or there are fewer than two scrapes."""
    windows = [make_window(a, b, family) for a, b in itertools.pairwise(snapshots)]
    waiting = [w for w in windows if w.num_requests_waiting is not None]
    if not waiting:
        return None
    return max(waiting, key=lambda w: w.num_requests_waiting or 0.0)
