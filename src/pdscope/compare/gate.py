"""A gate for CI: limits on the changes a comparison may show.

A spec is a comma-separated list of ``METRIC:±N%``: ``ttft_p99:+10%`` fails when the TTFT p99
grew by more than 10 %, ``decode_tok_s:-5%`` when the decode rate fell by more than 5 %. A limit
trips only on a *significant* change beyond it (its p-value under alpha): noise never fails a
build, and a change too small to matter never does either. Metric names are those of
the kinds of result (:func:`pdscope.figures.known_metrics`), with or without the ``_s`` of seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdscope.compare.comparison import Comparison, Row
from pdscope.errors import InputError
from pdscope.figures import known_metrics

_LIMIT = re.compile(r"^\s*([a-z0-9_]+)\s*:\s*([+-])\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Limit:
    """Fail when ``metric`` changes by more than ``pct`` percent in its sign's direction."""

    metric: str
    pct: float

    def __str__(self) -> str:
        return f"{self.metric}:{self.pct:+g}%"

    def tripped(self, row: Row) -> bool:
        if not row.significant or row.delta_pct is None:
            return False
        return row.delta_pct > self.pct if self.pct >= 0 else row.delta_pct < self.pct


def parse_limits(spec: str) -> tuple[Limit, ...]:
    """``'ttft_p99:+10%,decode_tok_s:-5%'`` → limits; :class:`InputError` on anything else."""
    out = []
    for part in spec.split(","):
        m = _LIMIT.match(part.lower())
        if not m:
            raise InputError(f"bad limit {part.strip()!r}: write METRIC:+N% or METRIC:-N%"
                             " (e.g. ttft_p99:+10%,decode_tok_s:-5%)")
        name, sign, number = m.groups()
        known = known_metrics()
        metric = name if name in known else f"{name}_s"
        if metric not in known:
            raise InputError(f"unknown metric {name!r} in a limit; known: "
                             + ", ".join(known))
        pct = float(number) * (1 if sign == "+" else -1)
        out.append(Limit(metric, pct))
    return tuple(out)


def tripped(comparison: Comparison, limits: tuple[Limit, ...]) -> list[tuple[Limit, Row]]:
    """The limits the comparison trips, each with its row (a figure it lacks trips none)."""
    out = []
    for limit in limits:
        row = comparison.row(limit.metric)
        if row is not None and limit.tripped(row):
            out.append((limit, row))
    return out
