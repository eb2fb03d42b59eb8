"""Summaries of repeated measurements."""

from __future__ import annotations

import numpy as np
import pytest

from pdscope.stats import percentile, summarize


def test_summary_of_known_values() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s is not None
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 100.0)
    assert s.mean == pytest.approx(22.0)
    # Linear interpolation between ranks: p90 of 5 values sits 60% of the way from 4 to 100.
    assert s.p90 == pytest.approx(4 + 0.6 * 96)
    assert s.spread == pytest.approx(99 / 3) and s.noisy


def test_runs_that_agree_are_not_noisy() -> None:
    s = summarize([1.00, 1.01, 0.99, 1.02])
    assert s is not None and not s.noisy and s.spread < 0.05


def test_missing_values_are_left_out_and_nothing_gives_none() -> None:
    s = summarize([None, 2.0, None, 4.0])
    assert s is not None and s.n == 2 and s.median == 3.0
    assert summarize([None]) is None and summarize([]) is None
    assert percentile([], 50) is None


def test_percentile_matches_numpy() -> None:
    xs = list(np.random.default_rng(0).exponential(size=1001))
    assert percentile(xs, 99) == pytest.approx(float(np.percentile(xs, 99)))
