"""Summaries of repeated measurements: a measurement is never a single number.

Percentiles use numpy's default (linear interpolation between closest ranks), the method
``vllm bench serve`` uses too, so pdscope's p99 and vLLM's agree on the same samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Spread (max - min) / median above which a summary warns that runs disagree, as hyperfine
# warns about outliers: the machine was busy, or the first run paid a warm-up.
NOISY_SPREAD = 0.25


@dataclass(frozen=True)
class Summary:
    """Median and spread of repeated measurements of one figure."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    p90: float
    p95: float
    p99: float
    stdev: float

    @property
    def spread(self) -> float:
        """(max - min) / median: 0 when every run agreed."""
        return (self.max - self.min) / self.median if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.n >= 3 and self.spread > NOISY_SPREAD

    def to_json(self) -> dict[str, float | int]:
        return {
            "n": self.n,
            "median": self.median,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "p90": self.p90,
            "p95": self.p95,
            "p99": self.p99,
            "stdev": self.stdev,
            "spread": self.spread,
        }


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Summary of the values that are not None; None when there are none."""
    xs = np.asarray([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return None
    p90, p95, p99 = np.percentile(xs, [90, 95, 99])
    return Summary(
        n=int(xs.size),
        median=float(np.median(xs)),
        mean=float(xs.mean()),
        min=float(xs.min()),
        max=float(xs.max()),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        stdev=float(xs.std(ddof=1)) if xs.size > 1 else 0.0,
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) of the values, or None when there are none."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))
