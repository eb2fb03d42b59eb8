"""Capacity measured: the highest load that meets an SLO on the real server, found by measuring
levels (:func:`pdscope.load.capacity.search_capacity`) from the planner's prediction.

The planner predicts the most users (closed loop) or the highest rate (open loop) that meet the
SLO from a calibration; the search measures that level first, then doubles or halves to a
bracket and bisects it. Each level is one bench stage of about ``level_s`` seconds on one
connection, judged by the SLO at its percentile (a stage with a failed request misses it).
The bracket's two ends are then measured again ``runs`` times, alternated (low, high; high,
low; ...) as ``pdscope ab`` alternates its servers, so a drift of the machine falls on both:
the capacity *holds* when every run of its level met the SLO and every run of the level above
missed it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscope.checks import at_least
from pdscope.client.connection import Connection, connect
from pdscope.errors import Field, InputError
from pdscope.load.bench import BenchConfig, Workload, run_bench
from pdscope.load.capacity import CapacitySearch, LevelResult, search_capacity
from pdscope.load.runner import Stage
from pdscope.load.summary import StageSummary
from pdscope.plan.calibrate import Calibration
from pdscope.plan.capacity import SloUnreachable, max_rate, max_users
from pdscope.plan.demand import DrawnLengths
from pdscope.slo import SLO

BY = ("concurrency", "rate")


@dataclass(frozen=True)
class CapacityConfig:
    """How the search measures: ``by`` concurrency (closed-loop streams, whole numbers) or
    rate (open-loop requests a second); the bracket's width at most ``tolerance`` of its low
    end (concurrency: one stream apart at least); ``level_s`` seconds of load a level; the
    bracket's ends measured again ``runs`` times; at most ``max_levels`` levels in the search
    and ``max_time_s`` seconds."""

    slo: SLO
    by: str = "concurrency"
    tolerance: float = 0.1
    level_s: float = 10.0
    runs: int = 2
    max_levels: int = 10
    max_time_s: float = 900.0

    def __post_init__(self) -> None:
        if self.by not in BY:
            raise InputError(Field("by"), f" is concurrency or rate, got {self.by!r}")
        for name in ("tolerance", "level_s", "max_time_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(Field(name), f" must be a positive number, got {value!r}")
        at_least(self.runs, 0, "runs")
        at_least(self.max_levels, 2, "max_levels")


@dataclass(frozen=True)
class Prediction:
    """The planner's figure the search starts from, and what it was made from."""

    level: float
    source: str


@dataclass(frozen=True)
class LevelRun:
    """One measured stage: its level, the round (0: the search; 1 on: the bracket measured
    again), whether it met the SLO, each objective's latency at the SLO's percentile
    (seconds), the objective nearest or furthest over its limit, the requests a second served,
    its requests and the stage's run folder."""

    level: float
    round: int
    met: bool
    observed: tuple[tuple[str, float], ...]
    binding: str
    throughput: float
    completed: int
    failed: int
    folder: str


@dataclass(frozen=True)
class MeasuredCapacity:
    """The search's answer (:class:`CapacitySearch`: the capacity and the bracket), every
    stage measured, whether the bracket held when measured again, and the planner's figure."""

    by: str
    slo: SLO
    search: CapacitySearch
    runs: tuple[LevelRun, ...]
    held: bool | None  # None: nothing measured again (no bracket, or runs 0)
    predicted: Prediction | None
    elapsed_s: float
    folder: Path

    @property
    def capacity(self) -> float | None:
        return self.search.capacity

    @property
    def first_failing(self) -> float | None:
        return self.search.first_failing

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by, "slo": self.slo.to_json(),
            "capacity": self.capacity, "bracket": [self.capacity, self.first_failing],
            "held": self.held,
            "predicted": None if self.predicted is None else self.predicted.level,
            "predicted_from": None if self.predicted is None else self.predicted.source,
            "levels_measured": len(self.search.levels),
            "stages_measured": len(self.runs),
            "requests": sum(r.completed + r.failed for r in self.runs),
            "elapsed_s": self.elapsed_s, "stopped": self.search.stopped,
            "folder": str(self.folder),
            "runs": [{"level": r.level, "round": r.round, "met": r.met,
                      "observed_s": dict(r.observed), "binding": r.binding,
                      "throughput_rps": r.throughput, "completed": r.completed,
                      "failed": r.failed, "folder": r.folder} for r in self.runs],
        }


def predict(calibration: Calibration, workload: Workload, config: CapacityConfig, *,
            source: str, num_requests: int = 400, seed: int = 0) -> Prediction | None:
    """The planner's most users or highest rate at the SLO for this workload's lengths;
    ``None`` where it finds none (the SLO is out of reach even at the lightest load)."""
    lengths = DrawnLengths(workload.input_len, workload.output_len)
    model, scheduler = calibration.step_model, calibration.scheduler
    try:
        if config.by == "concurrency":
            users = max_users(model, scheduler, lengths, config.slo, num_requests=num_requests,
                              seed=seed).users
            return None if users is None else Prediction(float(users), source)
        rate = max_rate(model, scheduler, lengths, config.slo, num_requests=num_requests,
                        seed=seed).rate_rps
        return None if rate is None else Prediction(rate, source)
    except SloUnreachable:
        return None


def _judge(slo: SLO, summary: StageSummary) -> tuple[bool, tuple[tuple[str, float], ...], str]:
    observed = {m: summary.percentile(m, slo.percentile) for m in slo.limits()}
    met = slo.met(summary) and summary.failed == 0 and summary.completed > 0
    return met, tuple(observed.items()), slo.binding(summary)


async def find_capacity(
    url: str | Connection,
    bench: BenchConfig,
    workload: Workload,
    config: CapacityConfig,
    folder: str | Path,
    *,
    predicted: Prediction | None = None,
    on_level: Callable[[LevelRun], None] | None = None,
) -> MeasuredCapacity:
    """Search the server at ``url`` for the highest load meeting ``config.slo``, from
    ``predicted`` (else from one stream, or one request a second); each stage's run folder
    under ``folder``. ``on_level`` is called after each stage."""
    t0 = time.monotonic()
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    runs: list[LevelRun] = []
    integer = config.by == "concurrency"

    async with connect(url, bench) as conn:
        async def stage(level: float, round_: int) -> LevelRun:
            st = (Stage(concurrency=int(level), duration_s=config.level_s) if integer
                  else Stage(request_rate=level, duration_s=config.level_s))
            where = root / f"{len(runs) + 1:02d}-{st.name.replace('=', '-')}"
            result = await run_bench(conn, bench, [st], workload, where,
                                     meta={"capacity_search": {"round": round_}})
            if not result.summaries:
                raise InputError(f"the stage at {st.name} measured nothing")
            summary = result.summaries[0]
            met, observed, binding = _judge(config.slo, summary)
            run = LevelRun(level, round_, met, observed, binding, summary.request_throughput,
                           summary.completed, summary.failed, str(where))
            runs.append(run)
            if on_level is not None:
                on_level(run)
            return run

        async def measure(level: float) -> LevelResult:
            run = await stage(level, 0)
            return LevelResult(level, run.met, run.throughput, run.completed + run.failed)

        start = predicted.level if predicted is not None else 1.0
        search = await search_capacity(
            measure, start, tolerance=config.tolerance, integer=integer,
            max_levels=config.max_levels, max_time_s=config.max_time_s,
            predicted=None if predicted is None else predicted.level)
        held: bool | None = None
        lo, hi = search.capacity, search.first_failing
        if lo is not None and hi is not None and config.runs:
            held = True
            for r in range(1, config.runs + 1):
                order = (lo, hi) if r % 2 else (hi, lo)
                for level in order:
                    run = await stage(level, r)
                    held = held and (run.met if level == lo else not run.met)
    return MeasuredCapacity(config.by, config.slo, search, tuple(runs), held, predicted,
                            time.monotonic() - t0, root)


__all__ = ["BY", "CapacityConfig", "LevelRun", "MeasuredCapacity", "Prediction",
           "find_capacity", "predict"]
