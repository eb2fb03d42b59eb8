"""Service-level objectives: the latency limits a server is judged by.

One type for the whole library. The planner and the doctor judge a run by the ``percentile`` of
each latency (:meth:`SLO.met`); a bench's goodput judges each request by its own latencies
(:meth:`SLO.met_by_request`). Limits are in seconds; ``ttft:MS,itl:MS`` text, in milliseconds
as the CLI takes it, is read by :func:`parse_slo`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pdscope.errors import InputError

METRICS = ("ttft", "itl", "tpot", "e2e")
_WORDS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "end-to-end latency"}
# ``vllm bench serve --goodput`` calls the end-to-end latency ``e2el``.
_ALIASES = {"e2el": "e2e"}


class Percentiles(Protocol):
    """A run that gives a latency's percentile (``pdscope.plan.SimResult``)."""

    def percentile(self, metric: str, q: float) -> float: ...


@dataclass(frozen=True)
class SLO:
    """Service-level objectives: the ``percentile`` of each latency given (seconds) must be at
    most its limit. ``None``: no objective on that latency; at least one is given."""

    ttft_s: float | None = None
    itl_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: float = 99

    def __post_init__(self) -> None:
        limits = self.limits()
        if not limits:
            raise InputError("an SLO needs at least one objective: ttft_s, itl_s, tpot_s or"
                             " e2e_s")
        for metric, limit in limits.items():
            # A bool is an int to Python, and True would read as a limit of one second.
            if isinstance(limit, bool) or not (isinstance(limit, (int, float))
                                               and math.isfinite(limit) and limit > 0):
                raise InputError(f"{metric}_s must be a positive number of seconds, got"
                                 f" {limit!r}")
        q = self.percentile
        if isinstance(q, bool) or not (isinstance(q, (int, float)) and 0 < q <= 100):
            raise InputError(f"the SLO's percentile must be above 0 and at most 100, got {q!r}")

    def limits(self) -> dict[str, float]:
        """The objectives given, by metric, in seconds."""
        out = {}
        for metric in METRICS:
            limit = getattr(self, f"{metric}_s")
            if limit is not None:
                out[metric] = limit
        return out

    def limits_ms(self) -> dict[str, float]:
        """The objectives given, by metric, in milliseconds: the very numbers of the
        ``ttft:MS`` text they were read from (``x / 1000 * 1000`` can be one ulp off ``x``;
        twelve significant digits take it back)."""
        return {m: float(f"{v * 1000:.12g}") for m, v in self.limits().items()}

    def observed(self, source: Percentiles | Mapping[str, Any]) -> dict[str, float]:
        """Each objective's latency at the SLO's percentile, from a result or its summary
        (which holds p50 and p99, and p90 of the TTFT); ``nan`` where there is none."""
        out = {}
        for metric in self.limits():
            if not isinstance(source, Mapping):
                out[metric] = source.percentile(metric, self.percentile)
                continue
            key = f"{metric}_p{self.percentile:g}_s"
            if key not in source:
                raise InputError(f"a summary has no {_WORDS[metric]} at percentile"
                                 f" {self.percentile:g}: judge the result itself")
            value = source[key]
            out[metric] = math.nan if value is None else float(value)
        return out

    def ratios(self, source: Percentiles | Mapping[str, Any]) -> dict[str, float]:
        """Each objective's latency over its limit (``inf`` with no latency to judge)."""
        limits = self.limits()
        return {m: (math.inf if math.isnan(v) else v / limits[m])
                for m, v in self.observed(source).items()}

    def met(self, source: Percentiles | Mapping[str, Any]) -> bool:
        return all(r <= 1 for r in self.ratios(source).values())

    def binding(self, source: Percentiles | Mapping[str, Any]) -> str:
        """The objective furthest over its limit (or closest to it, when all are met)."""
        ratios = self.ratios(source)
        return max(ratios, key=lambda m: ratios[m])

    def describe(self, metric: str) -> str:
        return f"{_WORDS[metric]} p{self.percentile:g}"

    def met_by_request(self, *, ttft_s: float | None, tpot_s: float | None,
                       e2e_s: float | None, output_tokens: int | None) -> bool:
        """Whether one request met every objective with its own latencies (goodput, as
        ``vllm bench serve --goodput`` counts it): no percentile. A request that has no value
        for an objective misses it, but a one-token answer has no TPOT and cannot miss that
        one. A request has many inter-token gaps and no one ITL: ``itl_s`` is refused."""
        if self.itl_s is not None:
            raise InputError("a request has no one ITL: judge each request by ttft_s, tpot_s"
                             " or e2e_s")
        values = {"ttft": ttft_s, "tpot": tpot_s, "e2e": e2e_s}
        # In milliseconds, as the limits were given, so a latency at a limit meets it.
        for metric, limit_ms in self.limits_ms().items():
            value = values[metric]
            if value is None and metric == "tpot" and (output_tokens or 0) <= 1:
                continue
            if value is None or value * 1000 > limit_ms:
                return False
        return True

    def to_json(self) -> dict[str, float]:
        """The objectives given (``ttft_s``, ...) and the percentile."""
        return {**{f"{m}_s": v for m, v in self.limits().items()}, "percentile": self.percentile}

    @classmethod
    def from_json(cls, data: Any) -> SLO:
        """An SLO as :meth:`to_json` wrote it: a JSON object of objectives (seconds) and the
        percentile; anything else is refused in one line."""
        if not isinstance(data, Mapping):
            raise InputError(f"an SLO is a JSON object of objectives (ttft_s, ...), got a"
                             f" {type(data).__name__}")
        known = {f"{m}_s" for m in METRICS} | {"percentile"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"an SLO has no {', '.join(unknown)}: it has"
                             f" {', '.join(sorted(known))}")
        return cls(**data)


def parse_slo(text: str, metrics: Sequence[str] = METRICS) -> SLO:
    """``ttft:1000,itl:100`` (milliseconds; ``e2el`` for ``e2e`` as ``vllm bench serve``
    writes it) as an :class:`SLO` (seconds) at percentile 99. ``metrics``: the objectives the
    caller can judge; any other is refused. A later objective on one latency replaces an
    earlier one."""
    usage = f"use {','.join(f'{m}:MS' for m in metrics)} (limits in milliseconds, one or more)"
    limits: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition(":")
        name = name.strip().lower()
        name = _ALIASES.get(name, name)
        if name not in metrics or not sep:
            raise InputError(f"bad objective {part!r}: {usage}")
        try:
            ms = float(value)
        except ValueError:
            raise InputError(f"bad objective {part!r}: the limit is a number of"
                             " milliseconds") from None
        if not 0 < ms < math.inf:
            raise InputError(f"bad objective {part!r}: the limit must be a positive number of"
                             " milliseconds")
        limits[f"{name}_s"] = ms / 1000
    return SLO(**limits)


__all__ = ["METRICS", "SLO", "Percentiles", "parse_slo"]
