"""What a result offers a comparison: its figures, each with its unit and which way is better.

Every result that ``pdscope compare`` can set beside another implements :class:`Comparable`:
``figures()`` gives its :class:`Figures`, the *series* (one value a request, or a token gap,
in the order the requests were sent: what a percentile is taken of) and the *scalars* (one
value a run), with the :class:`Metric` of each figure it offers. Names are the planner's
(``ttft_p99_s``), in seconds.

A kind of result says how its saved form is found and read back with a :class:`ResultKind`
given to :func:`register` in its own module (an experiment in ``experiments/NAME.py``): a
folder with a marker file (``run.json``, ``findings.json``), or a JSON file with its
``experiment`` key (or, for the older files, one that :attr:`ResultKind.recognise` knows).
``pdscope.compare`` reads every run through the kinds registered here, and knows none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Metric:
    """A figure: ``series`` and ``q`` for a percentile of per-request values, else a scalar
    (a run's own value of ``name``)."""

    name: str
    label: str
    lower_is_better: bool
    unit: str
    series: str | None = None
    q: float | None = None

    @property
    def tail(self) -> bool:
        """A percentile beyond the median (tested across runs, not requests)."""
        return self.q is not None and self.q != 50


# The figures of timed requests: percentiles of the series every request gives.
TTFT_P50 = Metric("ttft_p50_s", "TTFT p50", True, "s", "ttft", 50)
TTFT_P99 = Metric("ttft_p99_s", "TTFT p99", True, "s", "ttft", 99)
ITL_P50 = Metric("itl_p50_s", "ITL p50", True, "s", "itl", 50)
ITL_P99 = Metric("itl_p99_s", "ITL p99", True, "s", "itl", 99)
TPOT_P50 = Metric("tpot_p50_s", "TPOT p50", True, "s", "tpot", 50)
E2E_P50 = Metric("e2e_p50_s", "E2E p50", True, "s", "e2e", 50)
DECODE_RATE = Metric("decode_tok_s", "decode rate", False, "tok/s", "decode", 50)
PREFILL_RATE = Metric("prefill_tok_s", "prefill rate", False, "tok/s", "prefill", 50)
LATENCIES = (TTFT_P50, TTFT_P99, ITL_P50, ITL_P99, TPOT_P50, E2E_P50)
# A model that thinks before it answers: TTFO, the time to the first answer token (AIPerf's
# "time to first output token"), and the reasoning tokens a request, over the requests that
# reasoned (none: no row).
TTFO_P50 = Metric("ttfo_p50_s", "TTFO p50", True, "s", "ttfo", 50)
TTFO_P99 = Metric("ttfo_p99_s", "TTFO p99", True, "s", "ttfo", 99)
REASONING_TOKENS_P50 = Metric("reasoning_tokens_p50", "reasoning tokens p50", True, "tok",
                              "reasoning_tokens", 50)
REASONING_METRICS = (TTFO_P50, TTFO_P99, REASONING_TOKENS_P50)
REQUEST_METRICS = (*LATENCIES, DECODE_RATE, PREFILL_RATE, *REASONING_METRICS)
# The figures of a load.
REQUEST_THROUGHPUT = Metric("request_throughput", "request throughput", False, "req/s")
OUTPUT_THROUGHPUT = Metric("output_throughput", "output throughput", False, "tok/s")
GOODPUT = Metric("request_goodput", "goodput", False, "req/s")
LOAD_METRICS = (REQUEST_THROUGHPUT, OUTPUT_THROUGHPUT, GOODPUT)


@dataclass(frozen=True)
class FindingState:
    """A doctor's finding as a comparison sees it: ``status`` ``fired``, ``clear`` or
    ``insufficient``, and its severity."""

    id: str
    title: str
    status: str
    severity: str | None


@dataclass(frozen=True)
class Figures:
    """One result's figures: ``kind`` (its :class:`ResultKind`), ``metrics`` (the figures it
    offers, in the order they are shown), ``identity`` (what must be alike for two results
    to be compared: model, server build, workload...), ``series`` (per-request values, send
    order) and ``scalars``; a doctor's ``findings``."""

    kind: str
    metrics: tuple[Metric, ...]
    identity: Mapping[str, Any] = field(default_factory=dict)
    series: Mapping[str, np.ndarray] = field(default_factory=dict)
    scalars: Mapping[str, float] = field(default_factory=dict)
    findings: tuple[FindingState, ...] | None = None

    def figures(self) -> Figures:
        return self


class Comparable(Protocol):
    """A result that can be compared: probe, sweep, context, prefix, interference, a bench
    run, a doctor's run, a plan's prediction."""

    def figures(self) -> Figures: ...


@dataclass(frozen=True)
class ResultKind:
    """How a kind of result is found on disk and read back.

    A folder kind has ``marker`` (the file whose presence makes a folder one of its runs) and
    ``read_folder``; a file kind has ``from_json`` (the file's JSON object) and is found by
    its ``experiment`` key equal to ``kind``, or by ``recognise`` for files written without
    one. ``compares_with``: other kinds whose figures can be set beside its own (a
    prediction beside a measured load)."""

    kind: str
    metrics: tuple[Metric, ...]
    marker: str | None = None
    read_folder: Callable[[Path], Comparable] | None = None
    from_json: Callable[[Mapping[str, Any]], Comparable] | None = None
    recognise: Callable[[Mapping[str, Any]], bool] | None = None
    compares_with: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if (self.marker is None) != (self.read_folder is None):
            raise ValueError(f"result kind {self.kind}: a marker and read_folder go together")
        if (self.marker is None) == (self.from_json is None):
            raise ValueError(f"result kind {self.kind}: give a folder (marker, read_folder)"
                             " or a file (from_json), one of the two")


KINDS: dict[str, ResultKind] = {}


def register(kind: ResultKind) -> ResultKind:
    """Add a kind of result (at the import of the module that defines it)."""
    if kind.kind in KINDS and KINDS[kind.kind] != kind:
        raise ValueError(f"two result kinds are called {kind.kind!r}")
    KINDS[kind.kind] = kind
    return kind


def known_metrics() -> dict[str, Metric]:
    """Every figure some kind offers, by name: the request and load figures first, then each
    kind's own in the order the kinds were registered."""
    out = {m.name: m for m in (*REQUEST_METRICS, *LOAD_METRICS)}
    for k in KINDS.values():
        for m in k.metrics:
            out.setdefault(m.name, m)
    return out


def scalars(**values: float | None) -> dict[str, float]:
    """The figures given a value (``None``: the result has none)."""
    return {k: float(v) for k, v in values.items() if v is not None}


def number(x: Any) -> float | None:
    """A JSON number as a float; ``None`` for anything else (``null``, text, ``true``)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def series_of(values: Mapping[str, Iterable[float]]) -> dict[str, np.ndarray]:
    """Series as arrays, the empty ones left out."""
    out = {k: np.asarray(list(v), dtype=float) for k, v in values.items()}
    return {k: v for k, v in out.items() if v.size}


# What identifies an experiment's result: the model, the server's build, the experiment.
EXPERIMENT_IDENTITY = ("model", "server", "server_version", "experiment")


def experiment_figures(d: Mapping[str, Any], metrics: tuple[Metric, ...],
                       **values: float | None) -> Figures:
    """An experiment's figures from its JSON (``experiment``, ``model``, ``server``...): the
    scalars given, under the names of ``metrics``."""
    return Figures(str(d["experiment"]), metrics, {k: d.get(k) for k in EXPERIMENT_IDENTITY},
                   scalars=scalars(**values))
