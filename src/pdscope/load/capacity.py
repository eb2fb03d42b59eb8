"""Capacity measured: the highest load level that meets an SLO, found by measuring.

A pure search (:func:`search_capacity`) over a ``measure(level) -> LevelResult`` callable, so
it runs the same on a real server (each level a bench stage) and on a synthetic function in a
test. It starts from a seed (the planner's prediction, or 1), goes up while the SLO holds
(doubling), down while it fails (halving), then bisects the bracket [last passing, first
failing] until its width is at most ``tolerance`` of its lower end. It stops early at
saturation (a passing level whose throughput grew less than ``SATURATION_GAIN`` over the last
passing level below it is still a pass, but more load is not tried past a failing one) and is
bounded by ``max_levels`` and ``max_time_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pdscope.checks import at_least
from pdscope.errors import Field, InputError


@dataclass(frozen=True)
class LevelResult:
    """One measured load level: whether it met the SLO, its achieved throughput (requests a
    second) and the requests it measured."""

    level: float
    met: bool
    throughput: float
    requests: int


@dataclass(frozen=True)
class CapacitySearch:
    """The search's answer: ``capacity`` the highest level that met the SLO (``None``: none
    did), ``first_failing`` the lowest level above it that missed it (``None``: none missed),
    every level measured in order, the requests and seconds it took, why it stopped, and the
    ``predicted`` seed it started from."""

    capacity: float | None
    first_failing: float | None
    levels: tuple[LevelResult, ...]
    requests: int
    elapsed_s: float
    stopped: str
    predicted: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "capacity": self.capacity, "bracket": [self.capacity, self.first_failing],
            "levels_measured": len(self.levels), "requests": self.requests,
            "elapsed_s": self.elapsed_s, "stopped": self.stopped, "predicted": self.predicted,
            "levels": [{"level": r.level, "met": r.met, "throughput": r.throughput,
                        "requests": r.requests} for r in self.levels],
        }


async def search_capacity(measure: Callable[[float], Awaitable[LevelResult]], start: float, *,
                    tolerance: float = 0.1, integer: bool = False, max_levels: int = 12,
                    max_time_s: float = math.inf, predicted: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> CapacitySearch:
    """Bracket and bisect the highest level ``measure`` says meets the SLO (see the module).
    ``integer``: levels are whole numbers (concurrency), at least 1."""
    if not start > 0:
        raise InputError(Field("start"), f" must be positive, got {start}")
    if not tolerance > 0:
        raise InputError(Field("tolerance"), f" must be positive, got {tolerance}")
    at_least(max_levels, 1, "max_levels")
    t0 = clock()
    done: dict[float, LevelResult] = {}
    order: list[LevelResult] = []

    def fit(x: float) -> float:
        return float(max(1, round(x))) if integer else x

    async def run(x: float) -> LevelResult:
        x = fit(x)
        if x not in done:
            r = await measure(x)
            done[x] = r
            order.append(r)
        return done[x]

    def out_of_budget() -> str | None:
        if len(order) >= max_levels:
            return "max levels"
        if clock() - t0 >= max_time_s:
            return "max time"
        return None

    def result(stopped: str) -> CapacitySearch:
        passing = [r.level for r in order if r.met]
        lo = max(passing) if passing else None
        above = [r.level for r in order if not r.met and (lo is None or r.level > lo)]
        hi = min(above) if above else None
        return CapacitySearch(lo, hi, tuple(order), sum(r.requests for r in order),
                              clock() - t0, stopped, predicted)

    lo: float | None = None
    hi: float | None = None
    x = fit(start)
    first = await run(x)
    if first.met:
        lo = x
        while hi is None:
            if (why := out_of_budget()) is not None:
                return result(why)
            nxt = fit(lo * 2)
            r = await run(nxt)
            below = done[lo]
            if r.met:
                if r.throughput <= below.throughput * 1.02:
                    return result("saturated")  # more load, no more served
                lo = nxt
            else:
                hi = nxt
    else:
        hi = x
        while lo is None:
            if (why := out_of_budget()) is not None:
                return result(why)
            nxt = fit(hi / 2)
            if nxt >= hi:  # the lowest level already failed
                return result("lowest level fails")
            r = await run(nxt)
            if r.met:
                lo = nxt
            else:
                hi = nxt
    while (hi - lo) > tolerance * lo and not (integer and hi - lo <= 1):
        if (why := out_of_budget()) is not None:
            return result(why)
        mid = fit(math.sqrt(lo * hi)) if not integer else float((int(lo) + int(hi)) // 2)
        if mid in (lo, hi):
            break
        if (await run(mid)).met:
            lo = mid
        else:
            hi = mid
    return result("bracket")


__all__ = ["CapacitySearch", "LevelResult", "search_capacity"]
