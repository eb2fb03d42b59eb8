"""Compare: did the change help? Runs side by side with intervals, a significance test and a
verdict; interleaved A/B on live servers; a gate for CI."""

from pdscope.compare.comparison import Comparison, FindingChange, Row, compare, compare_sides
from pdscope.compare.gate import Limit, parse_limits, tripped
from pdscope.compare.runs import METRICS, Metric, Run, Side, read_one, read_side

__all__ = [
    "METRICS",
    "Comparison",
    "FindingChange",
    "Limit",
    "Metric",
    "Row",
    "Run",
    "Side",
    "compare",
    "compare_sides",
    "parse_limits",
    "read_one",
    "read_side",
    "tripped",
]
