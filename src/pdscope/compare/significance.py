"""Is a difference between two runs real? Intervals and tests that hold for latency under load.

Requests in one loaded run are not independent: a request that waited behind a long prompt
is followed by others that waited too. A test that counts every request as a separate
observation then finds "significant" differences in two runs of the same server. Here:

- **Effective sample size.** The autocorrelation of a run's series (its requests, or its
  token gaps, in send order; on ranks, so one huge gap does not rule it) summed with Geyer's
  initial positive sequence gives the integrated autocorrelation time ``tau``; the series
  then carries ``n / tau`` independent observations (Geyer 1992, "Practical Markov chain
  Monte Carlo", Statistical Science 7(4)). Runs of one side add up.
- **Percentile intervals** by a circular block bootstrap (Politis & Romano 1992) over each
  run's series, with blocks ``ceil(tau)`` long, so that a resample keeps the runs of slow
  requests that load makes. A side of six runs or more (the rounds of ``pdscope ab``) is
  resampled in two stages, runs first, so that what changes from run to run counts too.
  The change between two sides is the ratio of independent resamples of each; its 2.5 and
  97.5 percentiles make the interval, and twice the share of resampled changes on the other
  side of zero the p-value. A median's own interval is the order statistics', widened by the
  effective size.
- **A rank test on medians**: Mann-Whitney U (``scipy.stats.mannwhitneyu``), its normal
  deviate shrunk to the effective sizes (``z·sqrt(n1e·n2e/(n1e+n2e) / (n1·n2/(n1+n2)))``).
- **Figures with one value a run** (throughput, capacity): Welch's t-test over the runs of
  each side, as AIPerf and hyperfine do, which needs two runs or more a side.
- **Tails** (p99): a run's p99 moves from one run to the next with the machine (the
  client's own pauses, another job), by more than any resampling of the run can show: on this
  project's reference server, two runs of the same server differed in ITL p99 by 20 % and 60 %
  in 2 of 12 pairs. So a tail is tested across runs, never within one: Welch's t-test on the
  logs of each run's p99, three runs a side or more (``pdscope ab`` makes four).
- **Many figures at once**: one comparison tests every figure both sides have (seven or more),
  so at ``alpha`` each a comparison of a server against itself would call *some* figure
  different far more often than ``alpha``. The p-values are adjusted with Holm's step-down
  method (Holm 1979, "A simple sequentially rejective multiple test procedure", Scandinavian
  Journal of Statistics 6(2)), which keeps the chance of any false call in a comparison under
  ``alpha`` whatever the figures' dependence (TTFT and the prefill rate move together).
- **A minimum effect**: a change smaller than ``threshold`` (2 %) is reported as ``~`` however
  small its p-value, as benchstat's users are told: 10,000 identical requests make 0.01 %
  significant and meaningless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _sps() -> Any:
    """``scipy.stats``, imported when a comparison needs it: it takes 0.6 s to import, and
    every ``pdscope`` command would pay it at start-up (``python -X importtime``)."""
    from scipy import stats

    return stats

ALPHA = 0.05
DEFAULT_THRESHOLD = 0.02
RESAMPLES = 2000
# Series longer than this are thinned (every k-th value, in order) before resampling: the
# interval of a percentile of 20,000 values is already narrow, and resampling stays fast.
MAX_SERIES = 20_000
# Runs a side needs before the runs themselves are resampled too.
MIN_RUNS_TWO_STAGE = 6


@dataclass(frozen=True)
class Estimate:
    """A figure of one side: its value, a 95 % interval, the samples it rests on (``n``) and
    how many of them count as independent (``effective_n``)."""

    value: float
    low: float | None
    high: float | None
    n: int
    effective_n: float


@dataclass(frozen=True)
class Change:
    """B against A: the change in percent with its 95 % interval, the p-value and the test
    that gave it (``bootstrap``, ``mann-whitney``, ``welch``; ``None``: too few samples)."""

    delta_pct: float | None
    low_pct: float | None
    high_pct: float | None
    p_value: float | None
    test: str | None


def autocorrelation_time(x: np.ndarray) -> float:
    """``tau = 1 + 2·Σρ_k``, the sum cut where Geyer's pairs ``ρ_2m + ρ_2m+1`` stop being
    positive; at least 1 (a negatively correlated series is not counted as more than ``n``)."""
    n = len(x)
    if n < 4:
        return 1.0
    r = _sps().rankdata(x)
    r = r - r.mean()
    var = float(np.dot(r, r))
    if var == 0:
        return 1.0
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(r, size)
    acf = np.fft.irfft(f * np.conj(f), size)[:n] / var
    tau = -1.0
    for m in range(n // 2):
        pair = acf[2 * m] + (acf[2 * m + 1] if 2 * m + 1 < n else 0.0)
        if pair <= 0:
            break
        tau += 2 * pair
    return max(1.0, float(tau))


def effective_size(runs: Sequence[np.ndarray]) -> float:
    """Independent observations in a side's runs: ``Σ n_i / tau_i``."""
    return float(sum(len(x) / autocorrelation_time(x) for x in runs if len(x)))


def _thin(x: np.ndarray) -> np.ndarray:
    step = math.ceil(len(x) / MAX_SERIES)
    return x[::step] if step > 1 else x


def bootstrap_percentile(runs: Sequence[np.ndarray], q: float, rng: np.random.Generator,
                         resamples: int = RESAMPLES) -> np.ndarray:
    """``resamples`` draws of the ``q``-th percentile of the side's runs, pooled, each run
    resampled by circular blocks ``ceil(tau)`` long. With :data:`MIN_RUNS_TWO_STAGE` runs or
    more, the runs themselves are drawn with replacement first (a two-stage bootstrap), so
    that what differs from one run to the next (the machine's state) widens the interval
    too."""
    parts = []
    for x in (_thin(np.asarray(r, dtype=float)) for r in runs):
        n = len(x)
        if n == 0:
            continue
        block = max(1, min(n, math.ceil(autocorrelation_time(x))))
        blocks = math.ceil(n / block)
        starts = rng.integers(0, n, size=(resamples, blocks))
        idx = (starts[:, :, None] + np.arange(block)) % n
        parts.append(x[idx.reshape(resamples, -1)[:, :n]])
    if len(parts) < MIN_RUNS_TWO_STAGE:
        return np.percentile(np.concatenate(parts, axis=1), q, axis=1)
    picks = rng.integers(0, len(parts), size=(resamples, len(parts)))
    return np.array([np.percentile(np.concatenate([parts[j][b] for j in picks[b]]), q)
                     for b in range(resamples)])


def percentile_estimate(runs: Sequence[np.ndarray], q: float, draws: np.ndarray) -> Estimate:
    """The side's ``q``-th percentile with its 95 % interval: for a median, the order
    statistics ``n/2 ± 1.96·sqrt(n/4)`` ranks, widened by ``sqrt(n / effective n)``; for
    another percentile, the bootstrap's."""
    pooled = np.sort(np.concatenate([np.asarray(r, dtype=float) for r in runs]))
    n, ne = len(pooled), effective_size(runs)
    if q == 50 and n >= 2:
        half = 1.96 * math.sqrt(n / 4) * math.sqrt(n / max(1.0, min(ne, n)))
        lo = max(0, math.floor(n / 2 - half))
        hi = min(n - 1, math.ceil(n / 2 + half) - 1)
        return Estimate(float(np.percentile(pooled, q)), float(pooled[lo]), float(pooled[hi]),
                        n, ne)
    low, high = np.percentile(draws, [2.5, 97.5])
    return Estimate(float(np.percentile(pooled, q)), float(low), float(high), n, ne)


def bootstrap_change(draws_a: np.ndarray, draws_b: np.ndarray, a: float, b: float) -> Change:
    """B's change against A from independent resamples of each."""
    if a == 0:
        return Change(None, None, None, None, None)
    ok = draws_a != 0
    ratio = draws_b[ok] / draws_a[ok] - 1
    low, high = np.percentile(ratio, [2.5, 97.5])
    below = float(np.mean(ratio <= 0))
    above = float(np.mean(ratio >= 0))
    p = min(1.0, max(2 * min(below, above), 1 / len(ratio)))
    return Change(100 * (b / a - 1), 100 * float(low), 100 * float(high), p, "bootstrap")


def rank_test(runs_a: Sequence[np.ndarray], runs_b: Sequence[np.ndarray]) -> float | None:
    """Mann-Whitney U's two-sided p-value, its deviate shrunk to the effective sizes."""
    a = np.concatenate([np.asarray(r, dtype=float) for r in runs_a])
    b = np.concatenate([np.asarray(r, dtype=float) for r in runs_b])
    if len(a) < 2 or len(b) < 2:
        return None
    if np.all(a == a[0]) and np.all(b == b[0]):
        return 1.0 if a[0] == b[0] else 0.0
    res = _sps().mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    z = float(_sps().norm.isf(max(float(res.pvalue), 1e-300) / 2))
    n1, n2 = len(a), len(b)
    e1 = min(n1, effective_size(runs_a))
    e2 = min(n2, effective_size(runs_b))
    shrink = math.sqrt((e1 * e2 / (e1 + e2)) / (n1 * n2 / (n1 + n2)))
    return float(2 * _sps().norm.sf(z * shrink))


def mean_estimate(values: Sequence[float]) -> Estimate:
    """The mean of one value a run, with a t interval when there are two runs or more."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return Estimate(m, None, None, len(x), float(len(x)))
    half = float(_sps().t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return Estimate(m, m - half, m + half, len(x), float(len(x)))


def _welch(xa: np.ndarray, xb: np.ndarray) -> tuple[float, float, float] | None:
    """Welch's t-test of two samples (two values or more each): the difference of the means
    (B − A), the half-width of its 95 % interval (Welch-Satterthwaite degrees of freedom) and
    the two-sided p-value; ``None`` when neither sample has any spread."""
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0:
        return None
    d = float(xb.mean() - xa.mean())
    df = (va + vb) ** 2 / ((va**2 / (len(xa) - 1)) + (vb**2 / (len(xb) - 1)))
    return d, float(_sps().t.ppf(0.975, df) * se), float(2 * _sps().t.sf(abs(d) / se, df))


def welch_change(a: Sequence[float], b: Sequence[float]) -> Change:
    """B's change against A for one value a run: Welch's t-test; its interval is that of the
    difference of means over A's mean."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma, mb = float(xa.mean()), float(xb.mean())
    if ma == 0:
        return Change(None, None, None, None, None)
    delta = 100 * (mb / ma - 1)
    if len(xa) < 2 or len(xb) < 2:
        return Change(delta, None, None, None, None)
    w = _welch(xa, xb)
    if w is None:
        return Change(delta, delta, delta, 1.0 if ma == mb else 0.0, "welch")
    d, half, p = w
    return Change(delta, 100 * (d - half) / ma, 100 * (d + half) / ma, p, "welch")


def welch_log_change(a: Sequence[float], b: Sequence[float], a_value: float,
                     b_value: float) -> Change:
    """B's change against A for a figure with one value a run that varies from run to run by
    a factor (a p99): Welch's t-test on the logs of the runs' values, its interval turned
    back into a ratio. The change shown is that of the pooled values ``a_value``/``b_value``."""
    xa, xb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    delta = 100 * (b_value / a_value - 1) if a_value else None
    if len(xa) < 2 or len(xb) < 2 or not (np.all(np.isfinite(xa)) and np.all(np.isfinite(xb))):
        return Change(delta, None, None, None, None)
    w = _welch(xa, xb)
    if w is None:
        d = float(xb.mean() - xa.mean())
        return Change(delta, 100 * math.expm1(d), 100 * math.expm1(d), 1.0 if d == 0 else 0.0,
                      "welch-log")
    d, half, p = w
    return Change(delta, 100 * math.expm1(d - half), 100 * math.expm1(d + half), p, "welch-log")


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values of one family of tests (``None``: no test,
    left out of the family and of the count): sorted ascending, the ``i``-th (from 0) of ``m``
    becomes ``(m - i)·p``, never below the one before it, at most 1."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(tested)
    out: list[float | None] = list(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def verdict(change: Change, lower_is_better: bool, *, alpha: float = ALPHA,
            threshold: float = DEFAULT_THRESHOLD) -> tuple[bool, str]:
    """(significant, ``better``/``worse``/``~``): significant when the p-value is under
    ``alpha`` and the change's interval does not hold 0 (the test and the interval agree); a
    verdict other than ``~`` needs the change to be at least ``threshold`` too."""
    if change.p_value is None or change.delta_pct is None:
        return False, "~"
    holds_zero = (change.low_pct is not None and change.high_pct is not None
                  and change.low_pct <= 0 <= change.high_pct)
    significant = change.p_value < alpha and not holds_zero
    if not significant or abs(change.delta_pct) < 100 * threshold:
        return significant, "~"
    up = change.delta_pct > 0
    return True, "worse" if up == lower_is_better else "better"
