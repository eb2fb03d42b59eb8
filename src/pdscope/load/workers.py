"""Load past one process and one machine: a stage split between load workers.

One asyncio process is a load generator with a ceiling (its one core). Here a stage runs in
``n`` workers, each with its own event loop: processes on this machine (:class:`LocalPool`) or
Ray actors spread over a cluster's nodes (:class:`RayPool`). What a caller may rely on:

* **The same load.** The open-loop schedule is drawn once, here, and each worker sends the
  arrivals whose index is its own modulo ``n`` (:class:`~pdscope.load.runner.Share`); closed
  loop, each runs its streams of the global ones. ``n`` workers send the same requests at the
  same times as one, from one start time set here.
* **Exact percentiles.** Workers send every finished request back as it finishes (AIPerf's
  way); the statistics are computed from all of them, never merged from per-worker summaries.
* **Crash-safe.** Each record is handed to the sink (the run folder's ``requests.jsonl``) as it
  arrives. A worker that dies loses none of the records it had sent; its requests in flight,
  and those it had not sent yet, are counted failed with the cause ``worker_lost``, and the
  stage ends without it.
* **One timeline.** On one machine all processes read the same monotonic clock. On Ray, each
  node's clock offset to the driver is measured by pings (the one with the shortest round trip
  wins, its half round trip is the uncertainty) before and after the run, and records are set
  on the driver's timeline as they arrive (:class:`ClockOffset`).

Progress and ``/metrics`` recording stay with the caller, in the parent process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlparse

from pdscope.client import RequestRecord, Target, Timeouts, new_session
from pdscope.errors import InputError, RunError
from pdscope.load.runner import (
    Finished,
    ProgressFn,
    Share,
    Sink,
    Stage,
    StageRun,
    closed_loop_indices,
    run_stage,
    stage_offsets,
)
from pdscope.units import NS
from pdscope.workload.datasets import WorkItem

# How far ahead of now a stage's common start is set: the job must reach every worker first.
# A worker that gets it late shows it as schedule lag, never as a shifted schedule.
LOCAL_START_S = 0.5
RAY_START_S = 1.0
PINGS = 25  # clock pings to a Ray worker; the one with the shortest round trip counts
READY_S = 120.0  # a worker (a process, an actor on a busy node) must be up within this
RAY_FORMS = "local, auto, ray://HOST:PORT or HOST:PORT"


# --------------------------------------------------------------------------- what workers run


@dataclass(frozen=True)
class WorkerJob:
    """One worker's part of one stage. ``start_ns`` and ``offsets`` are the whole stage's: the
    common start on the driver's clock and the global open-loop schedule."""

    target: Target
    items: tuple[WorkItem, ...]
    stage: Stage
    timeouts: Timeouts
    drain_s: float
    share: Share
    start_ns: int
    offsets: tuple[float, ...] | None
    session_limit: int
    offset_ns: int = 0  # the worker's clock to the driver's: driver = worker + offset


@dataclass(frozen=True)
class WorkerEnd:
    """A worker's last word on a stage."""

    scheduled: int
    sent: int
    interrupted: bool
    t_end_ns: int


# Events a worker sends, in batches (lists), in the order they happened:
#   ("sent", index, t_ns)   a request left (its index in the stage, the driver-clock time)
#   ("done", Finished)      a request finished (its times on the driver's clock)
#   ("end", WorkerEnd)      the worker's part of the stage is over
#   ("error", message)      the worker's part failed; what it finished was sent before
Event = tuple[Any, ...]

_CLIENT_TIMES = ("t_send_ns", "t_first_token_ns", "t_last_token_ns", "t_end_ns", "scheduled_ns",
                 "t_start_ns")


def on_timeline(record: RequestRecord, offset_ns: int) -> RequestRecord:
    """``record`` with the client's times moved by ``offset_ns`` (a worker's clock onto the
    driver's). The server's own times (``server_sent_ns``, ``server_due_ns``) stay on the
    server's clock."""
    if offset_ns == 0:
        return record
    moved: dict[str, Any] = {k: getattr(record, k) + offset_ns for k in _CLIENT_TIMES
                             if getattr(record, k) is not None}
    moved["token_times_ns"] = tuple(t + offset_ns for t in record.token_times_ns)
    return replace(record, **moved)


async def run_job(job: WorkerJob, stop: asyncio.Event, cancel: asyncio.Event,
                  offset_ns: int = 0) -> AsyncIterator[list[Event]]:
    """Run a job in this event loop; yield its events in batches as they happen (a batch is
    what happened since the last one was taken: one event when the reader keeps up).
    ``offset_ns``: this worker's clock to the driver's (driver = worker + offset)."""
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def on_send(index: int) -> None:
        queue.put_nowait(("sent", index, time.perf_counter_ns() + offset_ns))

    def sink(finished: Finished) -> None:
        f = finished
        queue.put_nowait(("done", replace(f, record=on_timeline(f.record, offset_ns))))

    async def main() -> None:
        try:
            async with new_session(limit=job.session_limit) as session:
                run = await run_stage(
                    session, job.target, job.items, job.stage, timeouts=job.timeouts,
                    sink=sink, stop=stop, cancel=cancel, drain_s=job.drain_s, share=job.share,
                    offsets=job.offsets, start_ns=job.start_ns - offset_ns, on_send=on_send)
            queue.put_nowait(("end", WorkerEnd(run.scheduled, run.sent, run.interrupted,
                                               run.t_end_ns + offset_ns)))
        except Exception as exc:  # the parent counts the rest as lost, with this reason
            queue.put_nowait(("error", f"{type(exc).__name__}: {exc}"))

    task = asyncio.get_running_loop().create_task(main())
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            yield batch
            if batch[-1][0] in ("end", "error"):
                return
    finally:
        if not task.done():
            task.cancel()


# --------------------------------------------------------------------------- pools of workers


class WorkerLost(Exception):
    """A worker died (its process, its actor or its node) before its part ended."""


class Pool(Protocol):
    """Workers that run jobs. ``run`` yields a job's event batches and raises
    :class:`WorkerLost` when the worker dies before the last."""

    size: int
    start_margin_s: float

    def where(self) -> list[dict[str, Any]]: ...
    def run(self, worker: int, job: WorkerJob) -> AsyncIterator[list[Event]]: ...
    async def stop(self, worker: int, cancel: bool = False) -> None: ...
    async def close(self) -> None: ...


def auto_workers(url: str) -> int:
    """``auto``: one worker per core, less one for the server when it runs on this machine
    (its host is a loopback address or this machine's name)."""
    cores = os.cpu_count() or 1
    host = urlparse(url).hostname or ""
    local = host in ("localhost", "::1", "0.0.0.0", socket.gethostname()) or host.startswith(
        "127.")
    return max(1, cores - 1) if local else cores


def stage_workers(stage: Stage, workers: int) -> int:
    """How many of ``workers`` a stage can use: no more than its streams (closed loop) or its
    ``max_concurrency`` (open loop), whose slots are split between them."""
    if stage.concurrency is not None:
        return min(workers, stage.concurrency)
    if stage.max_concurrency:
        return min(workers, stage.max_concurrency)
    return workers


# Messages between the parent and a worker process: a pickle, after its length (8 bytes).
_HEADER = struct.Struct("!Q")


def _frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _read(reader: asyncio.StreamReader) -> Any:
    """The next message, or ``None`` at the end of the stream (a message cut short by the
    sender's death is the end too)."""
    try:
        size = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
        return pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError, pickle.UnpicklingError, EOFError):
        return None


def process_main(fd: int) -> None:
    """A worker process (``python -c``, see :class:`LocalPool`): run the jobs the parent sends
    over the socket ``fd``, until it hangs up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which says stop
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(fd))
    else:
        uvloop.run(_serve(fd))


async def _serve(fd: int) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    stop, cancel = asyncio.Event(), asyncio.Event()
    # The transport writes at once when the socket has room, and buffers (never blocks) when
    # the parent is slow: a finished record is out of the process as soon as it can be.
    writer.write(_frame(("ready", os.getpid(), socket.gethostname())))
    job_task: asyncio.Task[None] | None = None

    async def work(job: WorkerJob) -> None:
        async for batch in run_job(job, stop, cancel, job.offset_ns):
            writer.write(_frame(batch))
        await writer.drain()

    while True:
        message = await _read(reader)
        if message is None or message[0] == "quit":
            break
        if message[0] == "job":
            stop.clear()
            cancel.clear()
            job_task = loop.create_task(work(message[1]))
        elif message[0] == "stop":
            stop.set()
        elif message[0] == "cancel":
            stop.set()
            cancel.set()
    if job_task is not None and not job_task.done():
        job_task.cancel()
    writer.close()


class LocalPool:
    """``size`` worker processes on this machine (a fresh interpreter each, no state shared
    with the parent), each with its own event loop (uvloop when installed). Each talks to the
    parent over its own socket pair, so a worker killed mid-message spoils nothing but its own
    stream. They are started with ``python -c``, not ``multiprocessing``: its spawn runs the
    parent's main module again in each child, which a script or a Ray worker cannot afford."""

    start_margin_s = LOCAL_START_S

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InputError(f"workers must be at least 1, got {size}")
        self.size = size
        self._procs: list[subprocess.Popen[bytes]] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._inboxes: list[asyncio.Queue[Any]] = []
        self._pumps: list[asyncio.Task[None]] = []
        self._where: list[dict[str, Any]] = []

    async def start(self) -> LocalPool:
        loop = asyncio.get_running_loop()
        for _ in range(self.size):
            ours, theirs = socket.socketpair()
            fd = theirs.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 f"from pdscope.load.workers import process_main; process_main({fd})"],
                pass_fds=(fd,), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)  # stdout is the parent's (`--json`); errors: stderr
            theirs.close()  # the worker's death then reads as the end of this socket
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            self._procs.append(proc)
            self._writers.append(writer)
            self._inboxes.append(inbox)
            self._pumps.append(loop.create_task(self._pump(reader, inbox)))
        for k, inbox in enumerate(self._inboxes):
            try:
                message = await asyncio.wait_for(inbox.get(), READY_S)
            except asyncio.TimeoutError:
                message = None
            if not message or message[0] != "ready":
                why = self._exit(k)
                await self.close()
                raise RunError(f"load worker {k} did not start within {READY_S:g} s ({why})")
            self._where.append({"worker": k, "pid": message[1], "host": message[2]})
        return self

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, inbox: asyncio.Queue[Any]) -> None:
        while True:
            message = await _read(reader)
            inbox.put_nowait(message)
            if message is None:
                return

    def where(self) -> list[dict[str, Any]]:
        return list(self._where)

    def _exit(self, worker: int) -> str:
        proc = self._procs[worker]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        code = proc.returncode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def _send(self, worker: int, message: Any) -> bool:
        writer = self._writers[worker]
        if writer.is_closing():
            return False
        try:
            writer.write(_frame(message))
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def run(self, worker: int, job: WorkerJob) -> AsyncIterator[list[Event]]:
        inbox = self._inboxes[worker]
        pid = self._where[worker]["pid"]
        if not self._send(worker, ("job", job)):
            raise WorkerLost(f"process {pid}, {self._exit(worker)}")
        while True:
            batch = await inbox.get()
            if batch is None:
                inbox.put_nowait(None)  # a later job on this worker ends at once too
                raise WorkerLost(f"process {pid}, {self._exit(worker)}")
            yield batch
            if batch[-1][0] in ("end", "error"):
                return

    async def stop(self, worker: int, cancel: bool = False) -> None:
        self._send(worker, ("cancel",) if cancel else ("stop",))

    async def close(self) -> None:
        for k in range(len(self._writers)):
            self._send(k, ("quit",))
        deadline = time.monotonic() + 5
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for writer in self._writers:
            writer.close()
        for pump in self._pumps:
            pump.cancel()


# --------------------------------------------------------------------------- Ray


def check_ray_address(address: str) -> str:
    """``local`` (a throwaway Ray instance here), ``auto`` (the cluster this machine belongs
    to), ``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (a cluster's GCS address, as
    ``ray start --head`` prints it)."""
    text = address.strip()
    if text in ("local", "auto"):
        return text
    rest = text[len("ray://"):] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"ray_address {address!r} is not a Ray address: use {RAY_FORMS}")
    return text


def import_ray() -> Any:
    """Ray, or one line on how to get it."""
    try:
        import ray
    except ImportError:
        raise InputError("Ray is not installed: pip install 'pdscope[ray]'") from None
    return ray


@dataclass(frozen=True)
class ClockOffset:
    """A worker clock against the driver's: ``driver = worker + offset_ns``, known to within
    ``uncertainty_ns`` (half the shortest ping's round trip: the reply was read somewhere in
    it)."""

    offset_ns: int
    uncertainty_ns: int
    pings: int

    def to_json(self) -> dict[str, Any]:
        return {"offset_ns": self.offset_ns, "uncertainty_ms": self.uncertainty_ns / 1e6,
                "pings": self.pings}


def best_offset(samples: Sequence[tuple[int, int, int]]) -> ClockOffset:
    """From pings ``(driver before, worker, driver after)``: the one with the shortest round
    trip, the worker's reading set at its middle."""
    if not samples:
        raise RunError("no clock ping came back")
    t0, tw, t1 = min(samples, key=lambda s: s[2] - s[0])
    return ClockOffset((t0 + t1) // 2 - tw, max(1, (t1 - t0 + 1) // 2), len(samples))


class RayWorker:
    """The load worker on a Ray node (``ray.remote`` is applied when Ray is used, so that
    importing this module does not need Ray). The actor only relays: the load runs in a worker
    process of its own (a :class:`LocalPool` of one), on uvloop, because an actor's event loop
    shares its process, and the GIL, with Ray's own threads, and reads tokens late. The
    process reads the same clock as the actor, so the actor's clock is the one pinged."""

    def __init__(self) -> None:
        self._pool: LocalPool | None = None

    async def start(self) -> dict[str, Any]:
        import ray

        self._pool = await LocalPool(1).start()
        return {"pid": self._pool.where()[0]["pid"], "actor_pid": os.getpid(),
                "host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}

    async def clock(self) -> int:
        return time.perf_counter_ns()

    async def run(self, job: WorkerJob) -> AsyncIterator[list[Event]]:
        assert self._pool is not None
        async for batch in self._pool.run(0, job):
            yield batch

    async def stop(self, cancel: bool = False) -> None:
        if self._pool is not None:
            await self._pool.stop(0, cancel)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


class RayPool:
    """One load worker (a Ray actor) on each node of a Ray cluster that has a CPU, placed by
    a placement group with the ``SPREAD`` strategy; each node's clock offset measured before
    the first stage (:meth:`start`) and after the last (:meth:`measure_clocks`)."""

    start_margin_s = RAY_START_S

    def __init__(self, address: str) -> None:
        self.address = check_ray_address(address)
        self.size = 0
        self._ray: Any = None
        self._owns_ray = False
        self._pg: Any = None
        self._actors: list[Any] = []
        self._where: list[dict[str, Any]] = []
        self.before: list[ClockOffset] = []
        self.after: list[ClockOffset | None] = []

    async def start(self) -> RayPool:
        ray = self._ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RunError(f"cannot reach the Ray cluster at {self.address}:"
                               f" {' '.join(str(exc).split())[:300]}") from None
            self._owns_ray = True
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1]
        if not nodes:
            await self.close()
            raise RunError(f"the Ray cluster at {self.address} has no node with a free CPU")
        self.size = len(nodes)
        self._pg = placement_group([{"CPU": 1}] * self.size, strategy="SPREAD")
        try:
            await asyncio.wait_for(self._pg.ready(), READY_S)
        except asyncio.TimeoutError:
            await self.close()
            raise RunError(f"Ray could not place {self.size} load workers within"
                           f" {READY_S:g} s") from None
        # Ray starts its workers at niceness 15, to keep its own daemons responsive; a load
        # generator so niced reads tokens late as soon as anything else wants the cores.
        actor = ray.remote(num_cpus=1, max_restarts=0,
                           runtime_env={"env_vars": {"RAY_worker_niceness": "0"}})(RayWorker)
        self._actors = [
            actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=k)).remote()
            for k in range(self.size)
        ]
        where = await asyncio.gather(*(a.start.remote() for a in self._actors))
        self._where = [{"worker": k, **w} for k, w in enumerate(where)]
        before = await self.measure_clocks()
        if any(b is None for b in before):
            await self.close()
            raise RunError("a Ray load worker did not answer its clock pings")
        self.before = [b for b in before if b is not None]
        return self

    async def measure_clocks(self) -> list[ClockOffset | None]:
        """Each worker's clock offset now, ``None`` for one that does not answer (the pings
        go one at a time, so that no worker's answer waits behind another's)."""
        out: list[ClockOffset | None] = []
        for actor in self._actors:
            samples = []
            try:
                for _ in range(PINGS):
                    t0 = time.perf_counter_ns()
                    tw = await asyncio.wait_for(asyncio.wrap_future(
                        actor.clock.remote().future()), 10)
                    samples.append((t0, tw, time.perf_counter_ns()))
            except Exception:  # a lost actor: Ray's errors, or no answer
                out.append(None)
                continue
            out.append(best_offset(samples))
        return out

    def where(self) -> list[dict[str, Any]]:
        return list(self._where)

    async def run(self, worker: int, job: WorkerJob) -> AsyncIterator[list[Event]]:
        gen = self._actors[worker].run.options(num_returns="streaming").remote(
            replace(job, offset_ns=self.before[worker].offset_ns))
        while True:
            try:
                ref = await gen.__anext__()
                batch = await ref
            except StopAsyncIteration:
                return
            except Exception as exc:  # the actor or its node is gone: Ray's several errors
                last = (str(exc).strip().splitlines() or [""])[-1][:200]
                raise WorkerLost(f"Ray actor on {self._where[worker]['host']}:"
                                 f" {type(exc).__name__}: {last}") from None
            yield batch
            if batch[-1][0] in ("end", "error"):
                return

    async def stop(self, worker: int, cancel: bool = False) -> None:
        with contextlib.suppress(Exception):
            self._actors[worker].stop.remote(cancel)

    def clocks(self) -> list[dict[str, Any]]:
        """Per worker: where it ran and its clock's offset before and after (the drift between
        them is a part of the uncertainty of the records placed with the first)."""
        out = []
        for k, w in enumerate(self._where):
            row: dict[str, Any] = {**w}
            if k < len(self.before):
                row["before"] = self.before[k].to_json()
            after = self.after[k] if k < len(self.after) else None
            if after is not None and k < len(self.before):
                row["after"] = after.to_json()
                drift = after.offset_ns - self.before[k].offset_ns
                row["drift_ms"] = drift / 1e6
                row["uncertainty_ms"] = max(
                    self.before[k].uncertainty_ns, after.uncertainty_ns, abs(drift)) / 1e6
            out.append(row)
        return out

    async def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(a.close.remote() for a in self._actors),
                                                  return_exceptions=True), 10)
        for a in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
        if self._owns_ray:
            ray.shutdown()
        self._ray = None


async def open_pool(workers: int | None, ray_address: str | None) -> LocalPool | RayPool | None:
    """The pool a bench config asks for, started; ``None``: run in this process."""
    if ray_address is not None:
        return await RayPool(ray_address).start()
    if workers is not None:
        return await LocalPool(workers).start()
    return None


# --------------------------------------------------------------------------- one stage


@dataclass
class _Part:
    """The parent's view of one worker's part of a stage."""

    planned: list[int] | None  # request indices it is to send; None: until the deadline
    in_flight: dict[int, int] = field(default_factory=dict)  # index -> send time
    seen: set[int] = field(default_factory=set)  # indices sent or finished
    end: WorkerEnd | None = None
    lost: str | None = None


async def run_stage_workers(
    pool: Pool,
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
) -> StageRun:
    """:func:`~pdscope.load.runner.run_stage` split between the pool's workers: the same
    requests at the same times, every record handed to ``sink`` as it arrives. The returned
    run's ``finished`` holds every record; a lost worker's unfinished requests are there as
    failures of cause ``worker_lost``."""
    if not items:
        raise InputError("the workload is empty")
    stop = stop or asyncio.Event()
    n = stage_workers(stage, pool.size)
    offsets = stage_offsets(stage) if stage.request_rate is not None else None
    start_ns = time.perf_counter_ns() + int(pool.start_margin_s * NS)
    run = StageRun(stage, start_ns, time.time() + pool.start_margin_s, workers=n)
    parts: list[_Part] = []
    jobs: list[WorkerJob] = []
    for k in range(n):
        share = Share(k, n)
        streams = 0
        if offsets is not None:
            planned: list[int] | None = [i for i in range(len(offsets)) if share.owns(i)]
            streams = share.max_concurrency(stage.max_concurrency) if stage.max_concurrency \
                else len(planned or ())
        else:
            assert stage.concurrency is not None
            own = share.streams(stage.concurrency)
            streams = len(own)
            planned = (list(closed_loop_indices(stage.concurrency, own, stage.num_prompts))
                       if stage.num_prompts is not None else None)
        parts.append(_Part(planned))
        jobs.append(WorkerJob(
            target, tuple(items), stage, timeouts, drain_s, share, start_ns,
            tuple(offsets) if offsets is not None else None,
            session_limit=max(16, min(streams, 100_000) + 16)))
    in_flight = 0

    def take(part: _Part, event: Event) -> None:
        nonlocal in_flight
        kind = event[0]
        if kind == "sent":
            part.in_flight[event[1]] = event[2]
            part.seen.add(event[1])
            run.sent += 1
            in_flight += 1
            run.max_in_flight = max(run.max_in_flight, in_flight)
        elif kind == "done":
            f: Finished = event[1]
            if part.in_flight.pop(f.index, None) is not None:
                in_flight -= 1
            part.seen.add(f.index)
            run.add(f)
            end = f.record.t_end_ns or f.record.t_last_token_ns or time.perf_counter_ns()
            run.t_end_ns = max(run.t_end_ns, end)
            sink(f)
        elif kind == "end":
            part.end = event[1]
            run.scheduled += part.end.scheduled
        elif kind == "error":
            part.lost = str(event[1])

    async def drive(k: int) -> None:
        nonlocal in_flight
        part = parts[k]
        try:
            async for batch in pool.run(k, jobs[k]):
                for event in batch:
                    take(part, event)
        except WorkerLost as exc:
            part.lost = str(exc)
        if part.lost is not None:
            in_flight -= len(part.in_flight)
            for f in _lost(part, k, stage, target, start_ns, offsets, stop.is_set()):
                run.add(f)
                sink(f)
            run.t_end_ns = max(run.t_end_ns, time.perf_counter_ns())
            run.workers_lost.append(f"worker {k}: {part.lost}")

    async def forward() -> None:
        """Say stop (then cancel) to every worker when the caller does."""
        await stop.wait()
        for k in range(n):
            await pool.stop(k)
        if cancel is not None:
            await cancel.wait()
            for k in range(n):
                await pool.stop(k, cancel=True)

    async def report() -> None:
        while progress is not None:
            progress(run, in_flight)
            await asyncio.sleep(0.25)

    helpers = [asyncio.ensure_future(forward()), asyncio.ensure_future(report())]
    try:
        await asyncio.gather(*(drive(k) for k in range(n)))
    finally:
        for h in helpers:
            h.cancel()
    run.interrupted = stop.is_set() or any(p.end is not None and p.end.interrupted
                                           for p in parts)
    if run.t_end_ns == 0:
        run.t_end_ns = time.perf_counter_ns()
    return run


def _lost(part: _Part, worker: int, stage: Stage, target: Target, start_ns: int,
          offsets: Sequence[float] | None, stopped: bool) -> list[Finished]:
    """The requests a lost worker did not finish: those in flight, and (unless the run was
    stopped) those it had still to send, each a failure of cause ``worker_lost``."""
    why = f"load worker {worker} was lost ({part.lost})"
    out = []

    def lost(index: int, t_send: int | None, message: str) -> Finished:
        scheduled = start_ns + int(offsets[index] * NS) if offsets is not None else None
        record = RequestRecord(
            request_id=f"lost-{index}", api=target.api, model=target.model, t_send_ns=t_send,
            t_first_token_ns=None, t_last_token_ns=None, t_end_ns=time.perf_counter_ns(),
            scheduled_ns=scheduled, error=message, error_kind="worker_lost")
        return Finished(index, index < stage.warmup, None, record, worker)

    for index, t_send in sorted(part.in_flight.items()):
        out.append(lost(index, t_send, f"{why} while this request was in flight"))
    # A closed loop with a duration may end before its count: its unsent requests are unknown.
    if part.planned is not None and not stopped and (
            offsets is not None or stage.duration_s is None):
        for index in part.planned:
            if index in part.seen:
                continue
            out.append(lost(index, None, f"{why} before this request was sent"))
    part.in_flight.clear()
    return out


__all__ = [
    "ClockOffset",
    "LocalPool",
    "Pool",
    "RayPool",
    "RayWorker",
    "WorkerJob",
    "WorkerLost",
    "auto_workers",
    "best_offset",
    "check_ray_address",
    "import_ray",
    "on_timeline",
    "open_pool",
    "run_job",
    "run_stage_workers",
    "stage_workers",
]

