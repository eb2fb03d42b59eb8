"""Two sides set beside each other: every figure both have, with its change, interval, p-value
and verdict; a geometric-mean row; for doctor runs, the findings that appeared, cleared or
changed severity.

    >>> from pdscope.compare import compare
    >>> result = compare("runs/before", "runs/after")
    >>> [(r.metric, r.verdict) for r in result.rows]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdscope.compare.runs import Side, differences, read_side
from pdscope.compare.significance import (
    ALPHA,
    DEFAULT_THRESHOLD,
    Change,
    Estimate,
    bootstrap_change,
    bootstrap_percentile,
    holm,
    mean_estimate,
    percentile_estimate,
    rank_test,
    verdict,
    welch_change,
    welch_log_change,
)
from pdscope.errors import InputError
from pdscope.figures import FindingState, Metric

# Samples a side needs beyond a tail percentile for it to be tested: a bootstrap of the
# largest few values of a run says nothing (the p99 of 100 requests rests on one).
MIN_TAIL_SAMPLES = 5
# Runs a side needs for a tail to be tested at all: a run's p99 moves with the machine from
# one run to the next, so only runs can tell that variation from a change.
MIN_RUNS_TAIL = 3


@dataclass(frozen=True)
class Row:
    """One figure: A's and B's values with their 95 % intervals, the change in percent with
    its interval, the p-value (adjusted for the comparison's other figures, Holm; the test's
    own is ``p_raw``), the test, and the verdict (``better``, ``worse``, ``~``)."""

    metric: str
    label: str
    unit: str
    lower_is_better: bool
    a: float
    b: float
    a_low: float | None
    a_high: float | None
    b_low: float | None
    b_high: float | None
    n_a: int
    n_b: int
    effective_n_a: float
    effective_n_b: float
    delta_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    p_value: float | None
    test: str | None
    significant: bool
    verdict: str
    p_raw: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FindingChange:
    """A doctor finding whose state differs between the sides: ``appeared``, ``cleared`` or
    ``severity`` (the same finding, another severity)."""

    id: str
    title: str
    change: str
    a: str | None
    b: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """B against A. ``geomean_pct``: the geometric mean of the rows' changes, each turned so
    that a positive change is better (a 10 % lower TTFT counts as +11 %)."""

    a: str
    b: str
    kind_a: str
    kind_b: str
    rows: tuple[Row, ...]
    geomean_pct: float | None
    findings: tuple[FindingChange, ...]
    differences: tuple[str, ...]
    threshold: float
    alpha: float
    notes: tuple[str, ...]

    def row(self, metric: str) -> Row | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "kind_a": self.kind_a, "kind_b": self.kind_b,
            "metric_names": "planner-style keys in seconds (ttft_p99_s is bench's p99_ttft_ms"
                            " / 1000)",
            "threshold": self.threshold, "alpha": self.alpha,
            "rows": [r.to_json() for r in self.rows],
            "geomean_pct": self.geomean_pct,
            "findings": [f.to_json() for f in self.findings],
            "differences": list(self.differences), "notes": list(self.notes),
        }


def _row(m: Metric, ea: Estimate, eb: Estimate, ch: Change, alpha: float,
         threshold: float) -> Row:
    significant, v = verdict(ch, m.lower_is_better, alpha=alpha, threshold=threshold)
    return Row(m.name, m.label, m.unit, m.lower_is_better, ea.value, eb.value, ea.low, ea.high,
               eb.low, eb.high, ea.n, eb.n, ea.effective_n, eb.effective_n, ch.delta_pct,
               ch.low_pct, ch.high_pct, ch.p_value, ch.test, significant, v)


def _percentile_row(m: Metric, a: Side, b: Side, rng: np.random.Generator, alpha: float,
                    threshold: float) -> Row | None:
    assert m.series is not None and m.q is not None
    sa, sb = a.series(m.series), b.series(m.series)
    if not sa or not sb:
        return None
    da = bootstrap_percentile(sa, m.q, rng)
    db = bootstrap_percentile(sb, m.q, rng)
    ea, eb = percentile_estimate(sa, m.q, da), percentile_estimate(sb, m.q, db)
    if m.q != 50:
        return _tail_row(m, sa, sb, ea, eb, alpha, threshold)
    ch = bootstrap_change(da, db, ea.value, eb.value)
    if ch.delta_pct is not None:  # medians: the rank test's p-value
        ch = Change(ch.delta_pct, ch.low_pct, ch.high_pct, rank_test(sa, sb), "mann-whitney")
    return _row(m, ea, eb, ch, alpha, threshold)


def _tail_row(m: Metric, sa: list[np.ndarray], sb: list[np.ndarray], ea: Estimate,
              eb: Estimate, alpha: float, threshold: float) -> Row:
    """A tail percentile: tested across runs (Welch on the logs of each run's value), with
    :data:`MIN_RUNS_TAIL` runs a side, :data:`MIN_TAIL_SAMPLES` samples beyond it on each side
    and one at least in each run (else a run's "p99" is its largest value, stretched)."""
    assert m.q is not None
    share = 1 - m.q / 100
    per_run = min(len(x) for x in (*sa, *sb)) * share
    pooled = min(sum(len(x) for x in sa), sum(len(x) for x in sb)) * share
    if min(len(sa), len(sb)) < MIN_RUNS_TAIL or per_run < 1 or pooled < MIN_TAIL_SAMPLES:
        # A p99 of 100 requests is their largest but one: no interval or test holds on it.
        bare = Estimate(ea.value, None, None, ea.n, ea.effective_n)
        delta = 100 * (eb.value / ea.value - 1) if ea.value else None
        return _row(m, bare, Estimate(eb.value, None, None, eb.n, eb.effective_n),
                    Change(delta, None, None, None, None), alpha, threshold)
    va = [float(np.percentile(x, m.q)) for x in sa]
    vb = [float(np.percentile(x, m.q)) for x in sb]
    return _row(m, ea, eb, welch_log_change(va, vb, ea.value, eb.value), alpha, threshold)


def _values(side: Side, m: Metric) -> list[float]:
    """One value a run: the run's scalar, else the percentile of its series."""
    out = []
    for run in side.runs:
        if run.scalars.get(m.name) is not None:
            out.append(run.scalars[m.name])
        elif m.series is not None and m.q is not None and len(run.series.get(m.series, ())):
            out.append(float(np.percentile(run.series[m.series], m.q)))
    return out


def _scalar_row(m: Metric, a: Side, b: Side, alpha: float, threshold: float) -> Row | None:
    va, vb = _values(a, m), _values(b, m)
    if not va or not vb:
        return None
    return _row(m, mean_estimate(va), mean_estimate(vb), welch_change(va, vb), alpha, threshold)


def _findings(a: Side, b: Side) -> tuple[FindingChange, ...]:
    fa, fb = a.runs[-1].findings, b.runs[-1].findings
    if fa is None or fb is None:
        return ()

    def state(fs: tuple[FindingState, ...]) -> dict[str, FindingState]:
        return {f.id: f for f in fs if f.status == "fired"}

    sa, sb = state(fa), state(fb)
    out = []
    for fid in sorted(sa.keys() | sb.keys()):
        x, y = sa.get(fid), sb.get(fid)
        if x is None:
            assert y is not None
            out.append(FindingChange(fid, y.title, "appeared", None, str(y.severity)))
        elif y is None:
            out.append(FindingChange(fid, x.title, "cleared", str(x.severity), None))
        elif x.severity != y.severity:
            out.append(FindingChange(fid, y.title, "severity", str(x.severity),
                                     str(y.severity)))
    return tuple(out)


def _adjusted(rows: list[Row], alpha: float, threshold: float) -> tuple[Row, ...]:
    """The rows with their p-values adjusted for one another (Holm) and their verdicts read
    again from the adjusted ones; the test's own p-value stays as ``p_raw``."""
    adjusted = holm([r.p_value for r in rows])
    out = []
    for r, p in zip(rows, adjusted, strict=True):
        ch = Change(r.delta_pct, r.ci_low_pct, r.ci_high_pct, p, r.test)
        significant, v = verdict(ch, r.lower_is_better, alpha=alpha, threshold=threshold)
        out.append(replace(r, p_value=p, p_raw=r.p_value, significant=significant, verdict=v))
    return tuple(out)


def _geomean(rows: tuple[Row, ...]) -> float | None:
    logs = []
    for r in rows:
        if r.a > 0 and r.b > 0:
            ratio = r.a / r.b if r.lower_is_better else r.b / r.a
            logs.append(math.log(ratio))
    return 100 * (math.exp(sum(logs) / len(logs)) - 1) if logs else None


def compare_sides(a: Side, b: Side, *, threshold: float = DEFAULT_THRESHOLD,
                  alpha: float = ALPHA, force: bool = False, seed: int = 0) -> Comparison:
    """Every figure both sides have. Unlike sides (another kind, model, workload or server
    build) raise :class:`InputError` naming what differs, unless ``force``."""
    if not 0 <= threshold < 1:
        raise InputError("threshold must be from 0 to 1 (a share: 0.02 is 2 %)")
    if not 0 < alpha < 1:
        raise InputError("alpha must be between 0 and 1")
    diff = differences(a, b)
    if diff and not force:
        raise InputError(f"{a.label} and {b.label} are unlike runs ({'; '.join(diff)}):"
                         " compare runs of one workload, or force it")
    rng = np.random.default_rng(seed)
    rows = []
    offered = {m.name for m in b.metrics}
    metrics = [m for m in a.metrics if m.name in offered]
    for m in metrics:
        row = (_percentile_row(m, a, b, rng, alpha, threshold)
               if m.series is not None and a.series(m.series) and b.series(m.series)
               else _scalar_row(m, a, b, alpha, threshold))
        if row is not None:
            rows.append(row)
    tested = sum(r.p_value is not None for r in rows)
    rows = list(_adjusted(rows, alpha, threshold))
    notes = []
    if tested > 1:
        notes.append(f"p-values adjusted for the {tested} figures tested together (Holm):"
                     f" a server against itself is called different in any figure at most"
                     f" {alpha:g} of the time")
    tails_of = {m.name for m in metrics if m.tail}
    tails = [r.label for r in rows if r.test is None and r.metric in tails_of]
    if tails:
        notes.append(f"{', '.join(tails)}: no test — a tail is tested across runs"
                     f" ({MIN_RUNS_TAIL} or more a side, 100 samples a run for a p99): use"
                     " pdscope ab, or folders of repeated runs")
    if any(r.test is None and r.metric not in tails_of for r in rows):
        notes.append("a figure with one value a run on either side has no test: repeat the"
                     " run (or use pdscope ab) for an interval")
    if any(r.test == "mann-whitney" for r in rows):
        notes.append("median intervals: block bootstrap over each run's requests in send"
                     " order, blocks as long as the autocorrelation time")
    if any(r.test == "welch-log" for r in rows):
        notes.append("tails: Welch's t-test on the logs of each run's percentile")
    if any(r.test == "mann-whitney" for r in rows):
        notes.append("medians: Mann-Whitney U, its sample sizes shrunk to the effective sizes"
                     " (autocorrelation of ranks, Geyer's initial positive sequence)")
    return Comparison(a.label, b.label, a.kind, b.kind, tuple(rows), _geomean(tuple(rows)),
                      _findings(a, b), tuple(diff), threshold, alpha, tuple(notes))


def compare(a: str | Path | Side, b: str | Path | Side, *,
            threshold: float = DEFAULT_THRESHOLD, alpha: float = ALPHA, force: bool = False,
            seed: int = 0) -> Comparison:
    """B against A, each a run (a bench or doctor folder, an experiment's or a prediction's
    JSON) or a folder of runs."""
    sa = a if isinstance(a, Side) else read_side(a)
    sb = b if isinstance(b, Side) else read_side(b)
    return compare_sides(sa, sb, threshold=threshold, alpha=alpha, force=force, seed=seed)
