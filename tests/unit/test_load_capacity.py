"""The measured-capacity search on a synthetic measure function."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from pdscope.errors import InputError
from pdscope.load.capacity import CapacitySearch, LevelResult
from pdscope.load.capacity import search_capacity as search_async


def search_capacity(measure: Callable[[float], LevelResult], start: float,
                    **kw: Any) -> CapacitySearch:
    async def measured(level: float) -> LevelResult:
        return measure(level)
    return asyncio.run(search_async(measured, start, **kw))


def synthetic(capacity: float, saturate: float = 1e9
              ) -> tuple[Callable[[float], LevelResult], list[float]]:
    calls: list[float] = []

    def measure(level: float) -> LevelResult:
        calls.append(level)
        return LevelResult(level, level <= capacity, min(level, saturate), 10)
    return measure, calls


@pytest.mark.parametrize("start", [0.3, 1.0, 7.0, 40.0])
def test_finds_the_capacity_within_its_bracket(start: float) -> None:
    measure, calls = synthetic(5.0)
    r = search_capacity(measure, start, tolerance=0.1)
    assert r.capacity is not None and r.first_failing is not None
    assert r.capacity <= 5.0 < r.first_failing
    assert r.first_failing - r.capacity <= 0.1 * r.capacity
    assert len(r.levels) == len(calls) and r.requests == 10 * len(calls)
    assert r.stopped == "bracket"


def test_a_seed_near_the_capacity_needs_fewer_levels_than_one() -> None:
    seeded = search_capacity(synthetic(50.0)[0], 45.0, tolerance=0.1)
    scratch = search_capacity(synthetic(50.0)[0], 1.0, tolerance=0.1)
    assert len(seeded.levels) < len(scratch.levels)


def test_integer_levels_bracket_by_one() -> None:
    r = search_capacity(synthetic(13)[0], 4, integer=True, tolerance=0.01)
    assert (r.capacity, r.first_failing) == (13, 14)


def test_it_stops_at_max_levels_and_max_time() -> None:
    r = search_capacity(synthetic(1e12)[0], 1.0, max_levels=5)
    assert len(r.levels) == 5 and r.stopped == "max levels" and r.first_failing is None
    ticks = itertools.count()
    r = search_capacity(synthetic(1e12)[0], 1.0, max_time_s=3, clock=lambda: next(ticks))
    assert r.stopped == "max time" and len(r.levels) <= 3


def test_it_stops_at_saturation() -> None:
    r = search_capacity(synthetic(1e12, saturate=8.0)[0], 1.0)
    assert r.stopped == "saturated" and r.capacity is not None and r.capacity <= 16


def test_no_level_meets_it() -> None:
    r = search_capacity(synthetic(0.0)[0], 4, integer=True)
    assert r.capacity is None and r.stopped == "lowest level fails"


def test_bad_arguments() -> None:
    with pytest.raises(InputError):
        search_capacity(synthetic(1)[0], -1.0)
    with pytest.raises(InputError):
        search_capacity(synthetic(1)[0], 1.0, tolerance=0)
