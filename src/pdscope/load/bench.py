"""A whole load run: detect the server, build the workload, run each stage, summarise.

The library entry of ``pdscope bench``::

    result = await run_bench("http://127.0.0.1:8000", BenchConfig(), [Stage(request_rate=2,
                             num_prompts=40)], Workload(input_len=parse_lengths("512")))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdscope.checks import at_least
from pdscope.client import ClientOptions, Connection, ServerInfo, Target, connect
from pdscope.client.truncation import count_truncation, truncation_warning
from pdscope.errors import Field, InputError
from pdscope.figures import Figures
from pdscope.load.results import RunFolder, RunMeta, read_run
from pdscope.load.runner import ProgressFn, Stage, StageRun, run_stage
from pdscope.load.summary import StageSummary, summarize_stage
from pdscope.load.workers import RayPool, check_ray_address, open_pool, run_stage_workers
from pdscope.metrics import (
    MetricsRecorder,
    Peak,
    Snapshot,
    WindowRecord,
    detect_metric_map,
    load_recording,
    make_window,
    peak_waiting_window,
)
from pdscope.slo import SLO
from pdscope.workload.datasets import (
    Lengths,
    WorkItem,
    load_dataset,
    sample,
    shared_prefix,
    synthetic,
)
from pdscope.workload.traces import Trace, trace_items

# Schedule lag that says the client, not the server, is falling behind: an open-loop request
# should leave within a few milliseconds of its time.
LAG_WARN_S = 0.010


@dataclass(frozen=True)
class Workload:
    input_len: Lengths = field(default_factory=lambda: Lengths("fixed", 512))
    output_len: Lengths = field(default_factory=lambda: Lengths("fixed", 128))
    dataset: str | None = None
    dataset_format: str = "auto"
    prefix_groups: int | None = None
    prefix_tokens: int = 0
    trace: Trace | None = None  # a trace's requests, replayed with Stage.of_trace

    def describe(self) -> str:
        if self.trace is not None:
            return self.trace.describe()
        if self.dataset:
            return f"dataset {self.dataset}"
        if self.prefix_groups:
            return (f"{self.prefix_groups} groups sharing a {self.prefix_tokens}-token prefix,"
                    f" {self.input_len} more tokens each, {self.output_len} out")
        return f"synthetic: {self.input_len} tokens in, {self.output_len} out"


@dataclass(frozen=True, kw_only=True)
class BenchConfig(ClientOptions):
    """A load run's settings beside the client options. ``seed`` ``None`` or 0: new prompts
    each run. ``client_capacity_streams``: the streams ``pdscope selftest`` found this client
    keeps within 1 ms on this machine (the CLI passes the saved figure), to warn past it.
    ``max_failed``: the share of a stage's requests that may fail (0 to 1) before the run is
    called failed (:meth:`BenchResult.failure`); ``None``: only a stage with no request
    completed fails. ``workers``: split each stage between this many worker processes
    (:mod:`pdscope.load.workers`); ``None``: run it in this process. ``ray_address``: split it
    between Ray actors, one on each node of that cluster (``local``, ``auto``,
    ``ray://HOST:PORT`` or ``HOST:PORT``). ``slo``: the objectives each request is judged by
    for goodput."""

    slo: SLO | None = None
    drain_s: float = 30.0
    record_metrics: bool = True  # scrape /metrics beside the load, when the server has one
    metrics_interval_s: float = 1.0
    client_capacity_streams: int | None = None
    max_failed: float | None = None
    workers: int | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.drain_s, 0, "drain_s")
        if self.slo is not None and self.slo.itl_s is not None:
            raise InputError("goodput judges each request by ttft_s, tpot_s or e2e_s: a request"
                             " has no one ITL, so slo cannot hold itl_s")
        if self.workers is not None:
            at_least(self.workers, 1, "workers")
            if self.ray_address is not None:
                raise InputError(Field("workers"), " and ", Field("ray_address"), " exclude each"
                                 " other: on Ray, one worker runs on each node of the cluster")
        if self.ray_address is not None:
            check_ray_address(self.ray_address)
        if self.max_failed is not None:
            at_least(self.max_failed, 0, "max_failed")
            if self.max_failed > 1:
                raise InputError(Field("max_failed"),
                                 f" is a share from 0 to 1, got {self.max_failed:g}")
        if self.metrics_interval_s <= 0:
            raise InputError(Field("metrics_interval_s"),
                             f" must be positive, got {self.metrics_interval_s}")


@dataclass(frozen=True)
class BenchResult:
    """A finished load run: the server and target, the run folder, each stage's summary and
    run (in the order they ran) and the warnings."""

    server: ServerInfo
    target: Target
    folder: Path
    summaries: tuple[StageSummary, ...]
    runs: tuple[StageRun, ...]
    warnings: tuple[str, ...]

    @property
    def sweep(self) -> bool:
        return len(self.summaries) > 1

    def figures(self) -> Figures:
        """The figures of its run folder, as ``pdscope compare`` reads them."""
        return read_run(self.folder).figures()

    def failure(self, max_failed: float | None = None) -> str | None:
        """Why the run did not measure what it was asked to, or ``None``: a stage in which no
        request completed, or (with ``max_failed``) one whose failed share is above it.
        Requests cut off by a stop or the end of ``duration`` count neither way."""
        for s in self.summaries:
            name, completed, failed = s.name, s.completed, s.failed
            causes = ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_cause.items()))
            why = f" ({causes})" if causes else ""
            if completed == 0:
                return (f"{name}: no request completed, {failed} failed{why}; results in"
                        f" {self.folder}")
            share = failed / (completed + failed)
            if max_failed is not None and share > max_failed:
                return (f"{name}: {failed} of {completed + failed} requests failed{why},"
                        f" {share:.0%}, more than the {max_failed:.0%} allowed; results in"
                        f" {self.folder}")
        if not self.summaries:
            return f"no stage ran; results in {self.folder}"
        return None


async def build_items(workload: Workload, count: int, conn: Connection,
                      seed: int) -> list[WorkItem]:
    """``count`` requests of the workload, prompts fitted to the server's tokenizer when it has
    one (as every experiment's: a chat's message text too, its template aside)."""
    if workload.dataset:
        return sample(load_dataset(workload.dataset, workload.dataset_format), count, seed)
    builder = conn.prompts(seed)
    if workload.trace is not None:
        return await trace_items(workload.trace, builder)
    if workload.prefix_groups:
        return await shared_prefix(
            count, workload.prefix_groups, workload.prefix_tokens, workload.input_len,
            workload.output_len, builder, seed,
        )
    return await synthetic(count, workload.input_len, workload.output_len, builder, seed)


def _stage_seed(conn: Connection, index: int) -> int:
    """Stage ``index``'s prompt seed: from the connection's when a seed was given (not 0),
    else new for every run."""
    seed = conn.builder.base_seed if conn.options.seed else None
    return seed * 1000 + index if seed else random.randrange(1 << 30)


# Prompts made ahead of a stage at most; a longer stage cycles through them (a prompt comes
# back only after this many others, long after a prefix cache of useful size has moved on).
POOL = 1000


def _count_needed(stage: Stage) -> int:
    if stage.arrivals is not None:  # a trace: one request an arrival, none repeated
        return len(stage.arrivals)
    if stage.num_prompts is not None:
        return min(stage.num_prompts + stage.warmup, POOL)
    assert stage.duration_s is not None
    if stage.request_rate is not None and stage.request_rate != float("inf"):
        return min(POOL, max(1, int(stage.request_rate * stage.duration_s * 1.5) + 10))
    return POOL


def server_window(before: Snapshot | None, after: Snapshot | None,
                  recorder: MetricsRecorder | None = None) -> WindowRecord | None:
    """What the server's own /metrics say about a stage: the window between a scrape just
    before it and one just after (percentiles with their bucket resolution, counters), and,
    from the scrapes recorded during it, the moment most requests waited (``peak``)."""
    if before is None or after is None:
        return None
    family = detect_metric_map(after.names)
    if family is None:
        return None
    peak = None
    if recorder is not None:
        snaps = [s for s in load_recording(recorder.path) if before.t <= s.t <= after.t]
        peak = peak_waiting_window(snaps, family) if len(snaps) >= 2 else None
    return WindowRecord.of(make_window(before, after, family),
                           peak=None if peak is None else Peak.of(peak))


def capacity_warning(summary: StageSummary, capacity: int | None) -> str | None:
    """The load went past what ``pdscope selftest`` showed this client holds to 1 ms."""
    peak = summary.max_in_flight
    if capacity is not None and peak > capacity:
        return (f"{summary.name}: {peak} requests were in flight at once, more than"
                f" the {capacity} streams `pdscope selftest` found this client keeps within 1 ms"
                " of a known schedule on this machine: expect client overhead in the"
                " latencies")
    return None


def lag_warning(summary: StageSummary) -> str | None:
    p99 = summary.schedule_lag.p99_s
    if p99 is not None and p99 > LAG_WARN_S:
        return (f"{summary.name}: open-loop sends were up to {p99 * 1000:.0f} ms late (p99):"
                " the client fell behind its schedule; latencies include that delay. Lower the"
                " rate, or check the client's limits with `pdscope selftest`")
    return None


async def run_bench(
    where: str | Connection,
    config: BenchConfig,
    stages: Sequence[Stage],
    workload: Workload,
    folder: str | Path,
    *,
    stop: asyncio.Event | None = None,
    cancel: asyncio.Event | None = None,
    progress: Callable[[Stage], ProgressFn] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> BenchResult:
    """Run every stage in order against the server at ``where``; results go to ``folder`` as
    they come. An open :class:`Connection` is reused as it was opened (its session, target and
    timeouts; the server is not detected again), with prompts of its own. ``meta``: keys of
    the caller's own for ``run.json`` (:attr:`RunMeta.extra`)."""
    if not stages:
        raise InputError("no load stage given")
    stop = stop or asyncio.Event()
    max_streams = max((s.concurrency or s.max_concurrency or 256) for s in stages)
    async with connect(where, config, limit=max(256, max_streams + 16)) as conn:
        info, target, timeouts = conn.info, conn.target, conn.options.timeouts
        run_meta = RunMeta(
            url=info.base_url, server=info.kind, server_version=info.version,
            model=target.model, api=target.api, workload=workload.describe(),
            prefix_groups=workload.prefix_groups, prefix_tokens=workload.prefix_tokens,
            stages=tuple(stages), started_at=time.time(), workers=config.workers,
            ray_address=config.ray_address,
            request_fields=None if target.fields.empty else target.fields,
        )
        if meta:  # a caller's own keys, written after (or over) the run's
            run_meta = RunMeta.from_json({**run_meta.to_json(), **meta})
        out = RunFolder(folder, run_meta)
        try:
            pool = await open_pool(config.workers, config.ray_address)
        except BaseException:
            out.finish([], sweep=len(stages) > 1)
            raise
        if pool is not None:
            # Where each worker runs (a pid to watch, a node to look at), before the first stage.
            (out.path / "workers.json").write_text(json.dumps(pool.where(), indent=2))
        summaries: list[StageSummary] = []
        runs: list[StageRun] = []
        warnings: list[str] = []
        recorder = (
            MetricsRecorder(info.base_url, out.path / "metrics.jsonl", config.metrics_interval_s)
            if config.record_metrics and info.metrics
            else None
        )
        try:
            if recorder is not None:
                await recorder.__aenter__()
            for i, stage in enumerate(stages):
                if stop.is_set():
                    break
                items = await build_items(workload, _count_needed(stage), conn,
                                          _stage_seed(conn, i))
                out.stage = stage.name
                before = await recorder.scrape_once() if recorder is not None else None
                if pool is None:
                    run = await run_stage(
                        conn.session, target, items, stage, timeouts=timeouts, sink=out,
                        stop=stop, cancel=cancel, drain_s=config.drain_s,
                        progress=progress(stage) if progress else None,
                    )
                else:
                    run = await run_stage_workers(
                        pool, target, items, stage, timeouts=timeouts, sink=out,
                        stop=stop, cancel=cancel, drain_s=config.drain_s,
                        progress=progress(stage) if progress else None,
                    )
                after = await recorder.scrape_once() if recorder is not None else None
                summary = summarize_stage(run, config.slo).served(
                    info.kind, target.model, target.api, server_window(before, after, recorder))
                runs.append(run)
                summaries.append(summary)
                capacity = config.client_capacity_streams
                for w in (lag_warning(summary), capacity_warning(summary, capacity),
                          truncation_warning(count_truncation(
                              f.record for f in run.finished if not f.warmup), stage.name)):
                    if w:
                        warnings.append(w)
                warnings.extend(f"{stage.name}: {lost}; its unfinished requests are counted"
                                " failed (worker_lost)" for lost in run.workers_lost)
        finally:
            if recorder is not None:
                await recorder.__aexit__(None, None, None)
            if isinstance(pool, RayPool):
                with contextlib.suppress(Exception):
                    pool.after = await pool.measure_clocks()
                with contextlib.suppress(OSError):
                    (out.path / "clocks.json").write_text(json.dumps(pool.clocks(), indent=2))
            if pool is not None:
                await pool.close()
            out.finish(summaries, sweep=len(stages) > 1)
    return BenchResult(info, target, out.path, tuple(summaries), tuple(runs),
                       (*out.warnings, *warnings))
