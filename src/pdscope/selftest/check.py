"""Measuring the measurer: pdscope's client against a server whose timing is known.

The reference server streams on an exact schedule and writes, into every chunk, when it was due
and when it was sent. On one host the client reads the same monotonic clock, so each token's
error splits into its parts:

* *schedule error*: what the client reported minus what the server scheduled (TTFT and ITL) —
  what a user of the numbers cares about;
* *request transit*: from the client's send to the server starting its clock;
* *server lateness*: the server's send minus its due time (its own scheduling jitter on a busy
  machine, not the client's fault);
* *client lateness*: the client's receive time minus the server's send — the client's own
  overhead, what the client can improve.

The check runs closed-loop stages of rising concurrency and reports the highest it sustains with
the median TTFT and ITL errors under 1 ms. ``pdscope bench`` warns when asked for more streams
than that.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdscope.client import Target, Timeouts, new_session
from pdscope.load.runner import Stage, StageRun, run_stage
from pdscope.load.workers import LocalPool, run_stage_workers
from pdscope.paths import cache_root
from pdscope.selftest.pin import Pinning, choose, pinned
from pdscope.selftest.server import ReferenceConfig, resolve_loop, run_in_subprocess
from pdscope.units import NS
from pdscope.workload.datasets import WorkItem

ERROR_LIMIT_MS = 1.0  # "sustained": median TTFT and ITL errors under this
DEFAULT_LEVELS = (1, 10, 50, 100, 200, 400)


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    failed: int
    ttft_err_p50_ms: float
    ttft_err_p99_ms: float
    itl_err_p50_ms: float
    itl_err_p99_ms: float
    transit_p50_ms: float
    server_late_p50_ms: float
    server_late_p99_ms: float
    client_late_p50_ms: float
    client_late_p99_ms: float
    output_tok_s: float
    ideal_tok_s: float

    @property
    def sustained(self) -> bool:
        return (
            self.failed == 0
            and abs(self.ttft_err_p50_ms) < ERROR_LIMIT_MS
            and abs(self.itl_err_p50_ms) < ERROR_LIMIT_MS
        )


@dataclass(frozen=True)
class SelftestResult:
    itl_s: float
    ttft_s: float
    output_tokens: int
    levels: tuple[LevelResult, ...]
    loop: str
    measured_at: float
    ramp: bool = True
    workers: int | None = None  # load worker processes; None: the client's own process
    pinning: Pinning | None = None  # the server's core and the client's, when pinned
    server_loop: str = "auto"  # the reference server's event loop (server.LOOPS)

    @property
    def max_sustained(self) -> int | None:
        """The highest concurrency at which this level and every lower one held the limit."""
        best = None
        for lv in self.levels:
            if not lv.sustained:
                break
            best = lv.concurrency
        return best

    def to_json(self) -> dict[str, Any]:
        return {
            "itl_ms": self.itl_s * 1000,
            "ttft_ms": self.ttft_s * 1000,
            "output_tokens": self.output_tokens,
            "loop": self.loop,
            "ramp": self.ramp,
            "workers": self.workers,
            "pinning": asdict(self.pinning) if self.pinning is not None else None,
            "server_loop": self.server_loop,
            "measured_at": self.measured_at,
            "error_limit_ms": ERROR_LIMIT_MS,
            "max_sustained_concurrency": self.max_sustained,
            "levels": [{**asdict(lv), "sustained": lv.sustained} for lv in self.levels],
        }


def _p(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")


def analyse(run: StageRun, config: ReferenceConfig, prompt_tokens: int) -> LevelResult:
    """Split the errors of one stage into their parts (module docstring)."""
    scheduled_ttft = config.ttft_s(prompt_tokens)
    ttft_err: list[float] = []
    itl_err: list[float] = []
    transit: list[float] = []
    server_late: list[float] = []
    client_late: list[float] = []
    failed = 0
    measured = [f for f in run.finished if not f.warmup]
    for f in measured:
        r = f.record
        if not r.ok or r.ttft_s is None or r.t_send_ns is None:
            failed += 1
            continue
        ttft_err.append((r.ttft_s - scheduled_ttft) * 1000)
        itl_err.extend((g - config.itl_s) * 1000 for g in r.itl_s)
        if r.server_due_ns and r.server_sent_ns:
            t0_server = r.server_due_ns[0] - int(scheduled_ttft * NS)
            transit.append((t0_server - r.t_send_ns) / 1e6)
            server_late.extend((s - d) / 1e6 for s, d in zip(r.server_sent_ns, r.server_due_ns,
                                                              strict=False))
        late = r.client_lateness_ns
        if late:
            client_late.extend(x / 1e6 for x in late)
    # Throughput as the streams saw it: each stream's decode rate (1 / TPOT), summed over the
    # streams: the ramp and the tail of a stage do not dilute it.
    rates = [f.record.decode_tok_s for f in measured if f.record.ok and f.record.decode_tok_s]
    stream_rate = float(np.median(rates)) if rates else 0.0
    return LevelResult(
        concurrency=run.stage.concurrency or 0,
        requests=len(measured),
        failed=failed,
        ttft_err_p50_ms=_p(ttft_err, 50),
        ttft_err_p99_ms=_p(ttft_err, 99),
        itl_err_p50_ms=_p(itl_err, 50),
        itl_err_p99_ms=_p(itl_err, 99),
        transit_p50_ms=_p(transit, 50),
        server_late_p50_ms=_p(server_late, 50),
        server_late_p99_ms=_p(server_late, 99),
        client_late_p50_ms=_p(client_late, 50),
        client_late_p99_ms=_p(client_late, 99),
        output_tok_s=stream_rate * (run.stage.concurrency or 0),
        ideal_tok_s=(run.stage.concurrency or 0) / config.itl_s,
    )


async def run_selftest(
    levels: Sequence[int] = DEFAULT_LEVELS,
    *,
    itl_s: float = 0.01,
    ttft_s: float = 0.05,
    output_tokens: int = 100,
    rounds: int = 2,
    ramp: bool = True,
    stop_after_failure: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    pin: bool = False,
    server_loop: str = "auto",
) -> SelftestResult:
    """Closed-loop stages at each concurrency against a reference server in its own process.

    Each stream sends ``rounds + 1`` requests; its first (the connection set-up and the burst
    of a stage's start) is a warm-up, left out. ``workers``: split each stage between this many
    worker processes (:mod:`pdscope.load.workers`), as ``bench --workers`` does. ``pin``: the
    server on one core and the client (its workers too) on another
    (:mod:`pdscope.selftest.pin`; an :class:`InputError` with fewer than two cores).
    ``server_loop``: the server's event loop (``server.LOOPS``: uvloop when installed, or
    asyncio's own, to measure what uvloop is worth)."""
    config = ReferenceConfig(ttft_base_s=ttft_s, ttft_per_token_s=0.0, itl_s=itl_s)
    import asyncio

    pinning = choose() if pin else None
    loop_name = type(asyncio.get_running_loop()).__module__.split(".")[0]
    with pinned(pinning.client_cpu) if pinning else contextlib.nullcontext():
        pool = await LocalPool(workers).start() if workers is not None else None
        try:
            results = await _levels(levels, config, ttft_s, itl_s, output_tokens, rounds, ramp,
                                    stop_after_failure, progress, pool,
                                    pinning.server_cpu if pinning else None, server_loop)
        finally:
            if pool is not None:
                await pool.close()
    return SelftestResult(itl_s, ttft_s, output_tokens, tuple(results), loop_name, time.time(),
                          ramp, workers, pinning, resolve_loop(server_loop))


async def _levels(levels: Sequence[int], config: ReferenceConfig, ttft_s: float, itl_s: float,
                  output_tokens: int, rounds: int, ramp: bool, stop_after_failure: bool,
                  progress: Callable[[int], None] | None,
                  pool: LocalPool | None, server_cpu: int | None,
                  server_loop: str) -> list[LevelResult]:
    prompt = " ".join(["word"] * 16)
    results: list[LevelResult] = []
    with run_in_subprocess(config, cpu=server_cpu, loop=server_loop) as url:
        target = Target(url, model=config.model)
        for c in levels:
            if progress:
                progress(c)
            items = [WorkItem(output_tokens, prompt=prompt, prompt_tokens=16)]
            # Streams start spread over one request's length, as independent users would
            # arrive: the server then sees a steady rate of new requests, not a wave of c.
            stage = Stage(concurrency=c, num_prompts=c * (rounds + 1), warmup=c,
                          ramp_s=(ttft_s + output_tokens * itl_s) if ramp else 0.0)
            if pool is not None:
                run = await run_stage_workers(pool, target, items, stage, timeouts=Timeouts(),
                                              sink=lambda f: None)
            else:
                async with new_session(limit=c + 16) as session:
                    run = await run_stage(session, target, items, stage, timeouts=Timeouts(),
                                          sink=lambda f: None)
            level = analyse(run, config, 16)
            results.append(level)
            if stop_after_failure and not level.sustained and c > 1:
                break
    return results


def result_path(workers: int | None = None) -> Path:
    """The saved self-test: the client's own process (what ``bench`` compares its load with),
    or, apart, one run with worker processes."""
    name = "selftest.json" if workers is None else f"selftest-workers-{workers}.json"
    return cache_root() / name


def save(result: SelftestResult) -> Path:
    path = result_path(result.workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2))
    return path


def saved_capacity() -> int | None:
    """The highest concurrency the last selftest on this machine sustained, if it ran."""
    try:
        data = json.loads(result_path().read_text())
    except (OSError, ValueError):
        return None
    value = data.get("max_sustained_concurrency")
    return int(value) if isinstance(value, int) else None
