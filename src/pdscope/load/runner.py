"""Send a workload at a rate or a concurrency, and record every request as it finishes.

Open loop: every request has a send time fixed in advance (``schedule.arrival_offsets``); a
task is started at that time whatever earlier requests are doing, so a slow server shows up as
latency, not as a slower load. The lag between the scheduled and the actual send is recorded
(``schedule_lag_s``), and so is the time a request waited for ``max_concurrency`` before it
could go (``client_queue_s``), apart from its TTFT.

Closed loop: ``concurrency`` streams, each sending its next request when the last one ends.

Each finished request is handed to the sink at once (the JSONL file is flushed line by line),
so an interrupted run keeps everything that had finished. A stop request (Ctrl-C) ends the
scheduling; requests in flight finish or time out within ``drain_s``; what is still running
then is cancelled and counted as incomplete.

A stage can be split between load workers (:mod:`pdscope.load.workers`): each runs a
:class:`Share` of it, from one start time. Open loop: the global schedule, drawn once, and each
worker sends the arrivals whose index is its own modulo the workers. Closed loop: each worker
runs the streams ``k, k + n, ...`` and stream ``s`` sends the requests whose index is ``s``
modulo the concurrency, so N workers send the same requests as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from pdscope.client import RequestRecord, Target, Timeouts, stream_request
from pdscope.errors import Field, InputError
from pdscope.units import NS
from pdscope.workload.datasets import WorkItem
from pdscope.workload.schedule import arrival_offsets
from pdscope.workload.traces import Trace


@dataclass(frozen=True)
class Stage:
    """One load level. Exactly one of ``request_rate`` (open loop) and ``concurrency`` (closed
    loop) is set. A trace's replay (:meth:`of_trace`) is an open loop whose send times are the
    trace's (``arrivals``, seconds from the start; ``request_rate`` its mean rate), named by
    ``trace``; ``run.json`` keeps the name and the count, not every time (the trace file has
    them)."""

    request_rate: float | None = None
    concurrency: int | None = None
    max_concurrency: int | None = None
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    seed: int = 0
    ramp_s: float = 0.0  # closed loop: start the streams evenly over this many seconds
    trace: str | None = None  # a trace's replay: the trace, described
    arrivals: tuple[float, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.request_rate is None) == (self.concurrency is None):
            raise InputError("give either ", Field("request_rate"), " or ", Field("concurrency"))
        if self.num_prompts is None and self.duration_s is None:
            raise InputError("give ", Field("num_prompts"), " or ", Field("duration_s"),
                             " (or both)")
        if self.arrivals is not None and (self.request_rate is None
                                          or self.num_prompts != len(self.arrivals)):
            raise InputError("a stage of given arrival times is an open loop of one request"
                             " a time")

    @classmethod
    def of_trace(cls, trace: Trace, *, warmup: int = 0,
                 max_concurrency: int | None = None) -> Stage:
        """The open loop that sends each of the trace's requests at its time."""
        return cls(request_rate=trace.mean_rate, max_concurrency=max_concurrency,
                   num_prompts=len(trace), warmup=warmup, trace=trace.describe(),
                   arrivals=trace.offsets)

    @property
    def name(self) -> str:
        if self.trace is not None:
            return "trace"
        if self.request_rate is not None:
            return f"rate={self.request_rate:g}"
        return f"concurrency={self.concurrency}"

    @property
    def mode(self) -> str:
        return "open-loop" if self.request_rate is not None else "closed-loop"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "request_rate": (
                "inf" if self.request_rate == float("inf") else self.request_rate
            ),
            "concurrency": self.concurrency,
            "max_concurrency": self.max_concurrency,
            "burstiness": self.burstiness,
            "num_prompts": self.num_prompts,
            "duration_s": self.duration_s,
            "warmup": self.warmup,
            "ramp_s": self.ramp_s,
            **({"trace": self.trace} if self.trace is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Stage:
        """A stage as :meth:`to_json` wrote it (its ``seed`` is not written: 0; nor a trace's
        ``arrivals``)."""
        rate = d.get("request_rate")
        return cls(request_rate=float(rate) if isinstance(rate, str) else rate,
                   concurrency=d.get("concurrency"), max_concurrency=d.get("max_concurrency"),
                   burstiness=float(d.get("burstiness", 1.0)), num_prompts=d.get("num_prompts"),
                   duration_s=d.get("duration_s"), warmup=int(d.get("warmup") or 0),
                   ramp_s=float(d.get("ramp_s") or 0.0),
                   trace=None if d.get("trace") is None else str(d["trace"]))


@dataclass(frozen=True)
class Finished:
    """A request as a load run keeps it: its record, and where it stood in the run."""

    index: int
    warmup: bool
    client_queue_s: float | None
    record: RequestRecord
    worker: int | None = None  # the load worker that sent it; None: the bench's own process

    def to_json(self, stage: str) -> dict[str, Any]:
        """Its line of ``requests.jsonl`` in stage ``stage`` (see :class:`RunRequest`)."""
        return RunRequest.of(stage, self).to_json()


def _number_or_none(x: Any) -> float | None:
    """A JSON number as it was written (an int stays an int), else ``None``."""
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass(frozen=True)
class RunRequest:
    """One line of a run folder's ``requests.jsonl``: a finished request, the stage it ran
    in and where it stood there (its index in the stage, warm-up or not, the time it waited
    for ``max_concurrency``, the load worker that sent it)."""

    stage: str
    index: int
    warmup: bool
    client_queue_s: float | None
    worker: int | None
    record: RequestRecord

    @classmethod
    def of(cls, stage: str, finished: Finished) -> RunRequest:
        return cls(stage, finished.index, finished.warmup, finished.client_queue_s,
                   finished.worker, finished.record)

    def to_json(self) -> dict[str, Any]:
        """The line: the run's fields first, then the record's (with its derived figures)."""
        out: dict[str, Any] = {
            "index": self.index,
            "stage": self.stage,
            "warmup": self.warmup,
            "client_queue_s": self.client_queue_s,
            "worker": self.worker,
        }
        out.update(self.record.to_dict())
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunRequest:
        """A line as :meth:`to_json` wrote it. ``KeyError``, ``TypeError`` or ``ValueError``
        when it is not one."""
        worker = d.get("worker")
        return cls(stage=str(d["stage"]), index=int(d["index"]),
                   warmup=bool(d.get("warmup", False)),
                   client_queue_s=_number_or_none(d.get("client_queue_s")),
                   worker=None if worker is None else int(worker),
                   record=RequestRecord.from_dict(d))


@dataclass(frozen=True)
class Share:
    """The part of a stage that load worker ``worker`` (from 0) of ``workers`` runs."""

    worker: int
    workers: int

    def __post_init__(self) -> None:
        if not 0 <= self.worker < self.workers:
            raise InputError(f"worker {self.worker} of {self.workers} does not exist")

    def owns(self, index: int) -> bool:
        """Open loop: this worker sends the request ``index`` of the global schedule."""
        return index % self.workers == self.worker

    def streams(self, concurrency: int) -> range:
        """Closed loop: the global numbers of this worker's streams."""
        return range(self.worker, concurrency, self.workers)

    def max_concurrency(self, limit: int) -> int:
        """This worker's part of an open loop's ``max_concurrency`` (the parts add up to it)."""
        return limit // self.workers + (1 if self.worker < limit % self.workers else 0)


def closed_loop_indices(concurrency: int, streams: Sequence[int],
                        total: int | None) -> Iterator[int]:
    """The request indices a set of closed-loop streams sends, in order: those whose index
    modulo the concurrency is one of them (all of them when every stream is there)."""
    own = sorted(streams)
    if len(own) == concurrency:
        yield from itertools.count() if total is None else range(total)
        return
    for base in itertools.count(0, concurrency):
        for s in own:
            if total is not None and base + s >= total:
                return
            yield base + s


class Sink(Protocol):
    def __call__(self, finished: Finished) -> None: ...


@dataclass
class StageRun:
    stage: Stage
    t0_ns: int
    started_wall: float
    finished: list[Finished] = field(default_factory=list)
    scheduled: int = 0
    sent: int = 0
    interrupted: bool = False
    t_end_ns: int = 0
    max_in_flight: int = 0
    workers: int = 1  # load workers that ran it (1: this process, or one worker)
    workers_lost: list[str] = field(default_factory=list)  # each: which, and why
    failed: int = 0  # of ``finished`` (:meth:`add`): requests that failed
    output_tokens: int = 0  # of ``finished``: their output tokens

    def add(self, done: Finished) -> None:
        """A finished request, counted as it comes: a progress line reads the counts, where
        sums over ``finished`` at every refresh cost more the longer the run (0.1 s of CPU a
        refresh at a million requests, four refreshes a second)."""
        self.finished.append(done)
        if not done.record.ok:
            self.failed += 1
        self.output_tokens += done.record.output_tokens or 0

    @property
    def duration_s(self) -> float:
        return max(self.t_end_ns - self.t0_ns, 1) / NS


ProgressFn = Callable[[StageRun, int], None]  # the run so far, requests in flight


async def run_stage(
    session: aiohttp.ClientSession,
    target: Target,
    items: Sequence[WorkItem],
    stage: Stage,
    *,
    timeouts: Timeouts,
    sink: Sink,
    stop: asyncio.Event | None = None,
    cancel: asyncio.Event | None = None,
    drain_s: float = 30.0,
    progress: ProgressFn | None = None,
    share: Share | None = None,
    offsets: Sequence[float] | None = None,
    start_ns: int | None = None,
    on_send: Callable[[int], None] | None = None,
) -> StageRun:
    """Run one stage to its end (count or duration), or until ``stop`` is set. After a stop,
    requests in flight get ``drain_s`` to finish, or until ``cancel`` is set.

    A load worker runs its ``share`` of the stage from ``start_ns`` (``perf_counter_ns``; by
    default in 5 ms), on the global open-loop schedule ``offsets`` (by default drawn here from
    the stage's seed); ``on_send(index)`` is called as each request leaves."""
    if not items:
        raise InputError("the workload is empty")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if start_ns is None:
        start_ns = time.perf_counter_ns() + 5_000_000  # a moment to set up before the first send
    run = StageRun(stage, start_ns, time.time())
    in_flight: set[asyncio.Task[None]] = set()
    max_concurrency = stage.max_concurrency
    if max_concurrency and share is not None:
        max_concurrency = share.max_concurrency(max_concurrency)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    deadline_ns = (
        start_ns + int(stage.duration_s * NS) if stage.duration_s is not None else None
    )

    async def send(index: int, item: WorkItem, scheduled_ns: int | None) -> None:
        queue_s: float | None = None
        if limit is not None:
            await limit.acquire()
            if scheduled_ns is not None:
                # Due when a slot freed: the wait is client queueing, not schedule lag.
                free_ns = time.perf_counter_ns()
                queue_s = max(0, free_ns - scheduled_ns) / NS
                scheduled_ns = max(scheduled_ns, free_ns)
        try:
            run.sent += 1
            if on_send is not None:
                on_send(index)
            record = await stream_request(
                session,
                target,
                item.prompt,
                messages=list(item.messages) if item.messages is not None else None,
                max_tokens=item.max_tokens,
                timeouts=timeouts,
                scheduled_ns=scheduled_ns,
            )
        finally:
            if limit is not None:
                limit.release()
        if item.prompt_tokens is not None:
            record = replace(record, sent_prompt_tokens=item.prompt_tokens,
                             sent_prompt_estimated=item.prompt_estimated)
        if record.prompt_tokens is None and item.prompt_tokens is not None:
            # The server did not say (llama-cpp-python sends no usage in streams); the prompt
            # was built to this many tokens with the server's own tokenizer.
            record = replace(record, prompt_tokens=item.prompt_tokens)
        done = Finished(index, index < stage.warmup, queue_s, record,
                        share.worker if share is not None else None)
        run.add(done)
        run.t_end_ns = max(run.t_end_ns, time.perf_counter_ns())
        sink(done)

    def launch(index: int, item: WorkItem, scheduled_ns: int | None) -> asyncio.Task[None]:
        task = loop.create_task(send(index, item, scheduled_ns))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        run.max_in_flight = max(run.max_in_flight, len(in_flight))
        run.scheduled += 1
        return task

    async def wait_until(t_ns: int) -> bool:
        """Sleep until ``t_ns`` (perf_counter); False when stopped first. Never early: uvloop's
        timers count whole milliseconds and fire up to half of one before their time (a trace
        replay measured sends 0.4 ms before it), so the last millisecond is waited out yielding
        to the loop."""
        while (delay := (t_ns - time.perf_counter_ns()) / NS) > 0 and not stop.is_set():
            if delay > 0.001:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            else:
                await asyncio.sleep(0)
        return not stop.is_set()

    ticker = loop.create_task(_report(run, in_flight, progress)) if progress else None
    workers: list[asyncio.Task[None]] = []
    try:
        if stage.request_rate is not None:
            if offsets is None:
                offsets = stage_offsets(stage)
            for index, offset in enumerate(offsets):
                if share is not None and not share.owns(index):
                    continue
                due = start_ns + int(offset * NS)
                if not await wait_until(due):
                    break
                launch(index, items[index % len(items)], due)
        else:
            assert stage.concurrency is not None
            total = stage.num_prompts
            streams = (share.streams(stage.concurrency) if share is not None
                       else range(stage.concurrency))
            counter = closed_loop_indices(stage.concurrency, streams, total)

            async def stream_worker(k: int) -> None:
                # Streams that all start at once stay in step when their requests take as long
                # as each other, and hit the server in bursts; a ramp spreads them out.
                if stage.ramp_s > 0 and not await wait_until(
                    start_ns + int(k * stage.ramp_s / stage.concurrency * NS)  # type: ignore[operator]
                ):
                    return
                while not stop.is_set():
                    index = next(counter, None)
                    now = time.perf_counter_ns()
                    if index is None or (total is not None and index >= total) or (
                        deadline_ns is not None and now >= deadline_ns
                    ):
                        return
                    # A closed loop has no schedule: a request goes when its stream is free.
                    await launch(index, items[index % len(items)], None)

            await wait_until(start_ns)
            workers.extend(loop.create_task(stream_worker(k)) for k in streams)
            stopper = loop.create_task(stop.wait())
            await asyncio.wait([*workers, stopper], return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                await asyncio.gather(*workers)
            stopper.cancel()
        # Drain: what is in flight finishes or times out on its own; after drain_s (on a stop)
        # it is cancelled and its record says so.
        if in_flight:
            if stop.is_set():
                await _drain(in_flight, drain_s, cancel)
            else:
                await asyncio.wait(list(in_flight))
    finally:
        run.interrupted = stop.is_set()
        if ticker is not None:
            ticker.cancel()
        for task in list(in_flight):
            task.cancel()
        for w in workers:
            w.cancel()
    if run.t_end_ns == 0:
        run.t_end_ns = time.perf_counter_ns()
    return run


def stage_offsets(stage: Stage) -> list[float]:
    """An open-loop stage's global schedule: send times in seconds from its start, drawn from
    its seed (the same draw for one process as for N workers); a trace's, its own times."""
    assert stage.request_rate is not None
    if stage.arrivals is not None:
        return list(stage.arrivals)
    return arrival_offsets(stage.num_prompts, stage.request_rate, burstiness=stage.burstiness,
                           duration_s=stage.duration_s, seed=stage.seed)


async def _drain(
    in_flight: set[asyncio.Task[None]], drain_s: float, cancel: asyncio.Event | None
) -> None:
    """Let requests in flight end within ``drain_s`` (or until ``cancel``); then cancel the
    rest, whose records come back marked ``cancelled``."""
    waiters: list[asyncio.Future[Any]] = [*in_flight]
    canceller = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    deadline = time.monotonic() + drain_s
    while in_flight and time.monotonic() < deadline:
        if canceller is not None and canceller.done():
            break
        waiters = [*in_flight] + ([canceller] if canceller is not None else [])
        await asyncio.wait(waiters, timeout=deadline - time.monotonic(),
                           return_when=asyncio.FIRST_COMPLETED)
    if canceller is not None:
        canceller.cancel()
    pending = list(in_flight)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)


async def _report(run: StageRun, in_flight: set[asyncio.Task[None]],
                  progress: ProgressFn | None) -> None:
    while progress is not None:
        progress(run, len(in_flight))
        await asyncio.sleep(0.25)
