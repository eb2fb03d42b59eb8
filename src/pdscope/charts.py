"""Chart data: what a report needs to draw a chart, as plain x/y series.

Experiments, the doctor and the planner fill these; :mod:`pdscope.report.svg` draws them without
knowing where they came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Series:
    """One line or set of points: ``x`` and ``y`` of equal length (``None``: no value)."""

    name: str
    x: tuple[float, ...]
    y: tuple[float | None, ...]
    kind: str = "line"  # "line", "points" or "bar"
    group: str | None = None  # e.g. the stream a gap belongs to

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"series {self.name!r}: {len(self.x)} x values, {len(self.y)} y")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "x": list(self.x),
                               "y": [None if v is None or not math.isfinite(v) else v
                                     for v in self.y]}
        if self.group is not None:
            out["group"] = self.group
        return out


@dataclass(frozen=True)
class Span:
    """A stretch of the x axis to shade, such as the injected prefill."""

    name: str
    start: float
    end: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class Chart:
    """What a report needs to draw one chart: axes and plain x/y series."""

    id: str
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    spans: tuple[Span, ...] = ()
    categories: tuple[str, ...] | None = None  # bar charts: x values index these labels

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "x_label": self.x_label,
                               "y_label": self.y_label,
                               "series": [s.to_json() for s in self.series]}
        if self.spans:
            out["spans"] = [s.to_json() for s in self.spans]
        if self.categories is not None:
            out["categories"] = list(self.categories)
        return out
