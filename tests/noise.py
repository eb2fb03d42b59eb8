"""Bounds for timing tests that a busy machine does not break.

A lab test measures on a machine it shares (two cores, other work). A fixed bound on a noisy
figure then fails when the machine was busy, not when the claim is false: a flaky test is a
broken test. These helpers read a bound against the spread the test itself measured, so that a
claim fails only when no reading within the runs' own scatter supports it. Their arithmetic is
checked by hand-calculated and published figures in tests/unit/test_noise.py.

Two readings:

- :class:`Runs`: repeated measurements of one figure as its median give or take half the runs'
  range, the reading pdscope's sweep uses for its doubling check. :func:`ratio_range` and
  :func:`change_range` give the lowest and highest ratio (or relative change) of two figures
  that those readings allow; a test asserts that the claimed side is reachable.
- :func:`lack_of_fit`: a fitted curve's R² is capped by the runs' own scatter (no curve can go
  through three different TTFTs at one prompt length). The classical lack-of-fit split of the
  residual (pure error: the scatter within each length; lack of fit: the rest) separates the
  two, and the curve is judged on the lack of fit alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Runs:
    """Repeated measurements of one figure: ``median ± half_range``."""

    median: float
    half_range: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Runs:
        xs = [float(v) for v in values if v is not None]
        if not xs:
            raise ValueError("no measurement to read")
        return cls(statistics.median(xs), (max(xs) - min(xs)) / 2, len(xs))

    @classmethod
    def from_spread(cls, spread: Mapping[str, float]) -> Runs:
        """From pdscope's summary JSON (``Summary.to_json``: median, min, max, n)."""
        return cls(spread["median"], (spread["max"] - spread["min"]) / 2, int(spread["n"]))

    @property
    def lo(self) -> float:
        return self.median - self.half_range

    @property
    def hi(self) -> float:
        return self.median + self.half_range

    def __str__(self) -> str:
        return f"{self.median:.4g} ± {self.half_range:.2g} ({self.n} runs)"


def ratio_range(num: Runs, den: Runs, offset: float = 0.0) -> tuple[float, float]:
    """The lowest and highest ``(num − offset) / (den − offset)`` within the runs' readings.

    ``offset`` (a fixed overhead, say) is taken off both. The highest is ``inf`` when the
    denominator's lowest reading is not above ``offset``; the lowest is ``0`` when the
    numerator's lowest reading is not above it (neither figure is then told from ``offset``)."""
    den_lo, den_hi = den.lo - offset, den.hi - offset
    num_lo, num_hi = num.lo - offset, num.hi - offset
    if den_hi <= 0:
        raise ValueError(f"the denominator {den} is not above the offset {offset:.4g}")
    highest = num_hi / den_lo if den_lo > 0 else math.inf
    lowest = max(num_lo, 0.0) / den_hi
    return lowest, highest


def change_range(new: Runs, base: Runs) -> tuple[float, float]:
    """The lowest and highest ``|new − base| / base`` within the runs' readings (0 when the two
    ranges overlap)."""
    if base.lo <= 0:
        raise ValueError(f"the base {base} is not positive")
    gap = max(new.lo - base.hi, base.lo - new.hi, 0.0)
    widest = max(new.hi - base.lo, base.hi - new.lo)
    return gap / base.hi, widest / base.lo


# ---------------------------------------------------------------------------------- R² of a fit

# A curve misses the group means by a share of the variance; above this share (the 1 − 0.95 of
# the former fixed "R² > 0.95") it fails, unless the miss is within the noise (below).
LACK_OF_FIT_SHARE = 0.05
# ... and the miss is told from noise by the lack-of-fit F-test at this level: a curve that fits
# fails by chance once in a thousand runs.
LACK_OF_FIT_ALPHA = 0.001


@dataclass(frozen=True)
class LackOfFit:
    """A fit's residual split into the runs' own scatter and what the curve misses."""

    r2: float
    noise_share: float  # pure error / total: the R² no curve can reach is 1 − this
    lack_share: float  # (residual − pure error) / total: what the curve itself misses
    df_lack: int  # distinct lengths − fitted parameters
    df_noise: int  # runs − distinct lengths
    f: float | None  # (lack / df_lack) / (pure error / df_noise); None when undefined
    f_critical: float | None

    def fits(self, max_share: float = LACK_OF_FIT_SHARE) -> bool:
        """The curve goes through the group means, within ``max_share`` of the variance or
        within the noise (the F-test does not tell its miss from the runs' scatter)."""
        if self.df_lack <= 0 or self.lack_share <= max_share:
            return True
        return self.f is not None and self.f_critical is not None and self.f <= self.f_critical

    def __str__(self) -> str:
        f = "" if self.f is None else f", F = {self.f:.3g} against {self.f_critical:.3g}"
        return (f"R² {self.r2:.4f}: the runs' own scatter is {self.noise_share:.2%} of the"
                f" variance, the curve misses the group means by {self.lack_share:.2%}"
                f" (allowed {LACK_OF_FIT_SHARE:.0%}, or within the noise{f};"
                f" {self.df_lack} and {self.df_noise} degrees of freedom)")


def lack_of_fit(groups: Sequence[Mapping[str, float]], r2: float, params: int,
                alpha: float = LACK_OF_FIT_ALPHA) -> LackOfFit:
    """Split a least-squares fit's residual, from the summaries of its groups of runs.

    ``groups``: one summary a distinct x (``n``, ``mean``, ``stdev`` with ddof 1, as pdscope's
    ``Summary.to_json``); ``r2``: the fit's ``1 − residual / total`` over every run;
    ``params``: the curve's coefficients (2 for a line, 3 for a quadratic)."""
    counts = [int(g["n"]) for g in groups]
    total_n = sum(counts)
    if len(groups) < 2 or total_n <= len(groups):
        raise ValueError("need two groups or more, and a group of two runs or more")
    grand = sum(n * g["mean"] for n, g in zip(counts, groups, strict=True)) / total_n
    pure = sum((n - 1) * g["stdev"] ** 2 for n, g in zip(counts, groups, strict=True))
    between = sum(n * (g["mean"] - grand) ** 2 for n, g in zip(counts, groups, strict=True))
    total = pure + between
    if total <= 0:
        raise ValueError("every run measured the same: nothing to fit")
    residual = (1.0 - r2) * total
    # A least-squares curve never beats the group means, so residual >= pure error, up to
    # rounding and to runs whose x differ by a token within one group.
    lack = max(residual - pure, 0.0)
    df_lack, df_noise = len(groups) - params, total_n - len(groups)
    f = f_crit = None
    if df_lack > 0 and pure > 0:
        f = (lack / df_lack) / (pure / df_noise)
        f_crit = f_quantile(1.0 - alpha, df_lack, df_noise)
    return LackOfFit(r2, pure / total, lack / total, df_lack, df_noise, f, f_crit)


# ------------------------------------------------------------ the F distribution, without scipy


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (continued fraction, as in
    Numerical Recipes' ``betai``)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def f_cdf(f: float, d1: int, d2: int) -> float:
    """P(F ≤ f) for Fisher's F with ``d1`` and ``d2`` degrees of freedom."""
    if f <= 0:
        return 0.0
    return betainc(d1 / 2.0, d2 / 2.0, d1 * f / (d1 * f + d2))


def f_quantile(q: float, d1: int, d2: int) -> float:
    """The ``q`` quantile of Fisher's F (bisection on :func:`f_cdf`)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must lie between 0 and 1")
    lo, hi = 0.0, 1.0
    while f_cdf(hi, d1, d2) < q:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if f_cdf(mid, d1, d2) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2.0


def server_first_token_late_ms(records: Iterable[Mapping[str, object]]) -> float:
    """The reference server's own lateness on the first token, median over the requests, in ms
    (sent − due, from the times it writes into every chunk; 0 where a record has none). On a
    busy machine the server itself sends late: a client's TTFT is read against the schedule
    *as the server kept it*, so that the bound fails on the client's error, not the machine's."""
    late = []
    for r in records:
        sent, due = r.get("server_sent_ns"), r.get("server_due_ns")
        if isinstance(sent, list) and isinstance(due, list) and sent and due:
            late.append(max(0.0, (sent[0] - due[0]) / 1e6))
    return statistics.median(late) if late else 0.0
