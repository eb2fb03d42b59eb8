"""What a run left behind, read as figures that can be set side by side.

A *run* is whatever a pdscope command wrote: a ``bench`` folder (``run.json``,
``requests.jsonl``, ``summary.json``), a ``doctor`` folder (``evidence.json``,
``findings.json``), the ``--out`` JSON file of ``probe``, ``sweep``, ``context``, ``prefix`` or
``interference``, or the ``--json`` answer of ``plan predict`` saved to a file. A *side* is one
run, or a folder of runs of the same kind (the rounds of ``pdscope ab``, repeated benches).

Each run gives *series* (one value a request, or a token gap, in the order the requests were
sent; the per-request figures a percentile is taken of) and *scalars* (one value a run), as its
kind says (:mod:`pdscope.figures`): which figures it offers, their units and which way is
better. Names as in the planner's JSON (``ttft_p99_s``), seconds; the bench summary's
``p99_ttft_ms`` is ``ttft_p99_s`` here. This module knows no kind: each registers itself
(:func:`pdscope.figures.register`) in the module that writes its results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The packages whose modules register the kinds of result (pdscope.figures.register).
import pdscope.doctor.report
import pdscope.experiments
import pdscope.load
import pdscope.plan  # noqa: F401
from pdscope.errors import InputError
from pdscope.figures import (
    KINDS,
    Comparable,
    FindingState,
    Metric,
    ResultKind,
    experiment_figures,
    known_metrics,
)

# Every figure the kinds registered at import offer (a kind registered later adds its own:
# :func:`pdscope.figures.known_metrics`).
METRICS: tuple[Metric, ...] = tuple(known_metrics().values())


@dataclass(frozen=True)
class Run:
    """One run's figures (:class:`pdscope.figures.Figures`) and where it was read from:
    ``kind``, ``identity`` (what the comparison checks is alike), ``series`` (per-request
    values, send order), ``scalars``, a doctor run's ``findings``, and ``metrics``, the
    figures it offers (``None``: those its kind registered)."""

    path: Path
    kind: str
    identity: Mapping[str, Any]
    series: Mapping[str, np.ndarray] = field(default_factory=dict)
    scalars: Mapping[str, float] = field(default_factory=dict)
    findings: tuple[FindingState, ...] | None = None
    metrics: tuple[Metric, ...] | None = None

    @classmethod
    def of(cls, path: Path, result: Comparable) -> Run:
        f = result.figures()
        return cls(path, f.kind, f.identity, f.series, f.scalars, f.findings, f.metrics)

    @property
    def offered(self) -> tuple[Metric, ...]:
        if self.metrics is not None:
            return self.metrics
        kind = KINDS.get(self.kind)
        return kind.metrics if kind is not None else ()


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its runs (one, or the rounds of an A/B) and a label."""

    label: str
    runs: tuple[Run, ...]

    @property
    def kind(self) -> str:
        return self.runs[0].kind

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The figures its runs offer, in the order they are shown."""
        out: dict[str, Metric] = {}
        for r in self.runs:
            for m in r.offered:
                out.setdefault(m.name, m)
        return tuple(out.values())

    def series(self, key: str) -> list[np.ndarray]:
        return [r.series[key] for r in self.runs if len(r.series.get(key, ())) > 0]

    def scalars(self, key: str) -> list[float]:
        return [r.scalars[key] for r in self.runs if r.scalars.get(key) is not None]


def _folder_kinds() -> list[ResultKind]:
    return [k for k in KINDS.values() if k.marker is not None]


def _markers() -> str:
    return " or ".join(f"{k.marker} ({k.kind})" for k in _folder_kinds())


def read_one(path: str | Path) -> Run:
    """One run, of whatever command wrote it. :class:`InputError` when it is not a run."""
    p = Path(path)
    if p.is_dir():
        for k in _folder_kinds():
            if k.marker is not None and k.read_folder is not None and (p / k.marker).is_file():
                return Run.of(p, k.read_folder(p))
        raise InputError(f"{p} is not a run: no {_markers()} in it, and no runs in its"
                         " subfolders")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"{p} is not a run: not JSON") from None
    if isinstance(d, dict):
        named = d.get("experiment")
        if isinstance(named, str):
            own = KINDS.get(named)
            if own is None or own.from_json is None:  # a kind this version does not know
                return Run.of(p, experiment_figures(d, ()))
            return Run.of(p, own.from_json(d))
        for k in KINDS.values():
            if k.recognise is not None and k.from_json is not None and k.recognise(d):
                return Run.of(p, k.from_json(d))
    raise InputError(f"{p} is not a run: a JSON file that no pdscope command wrote (the result"
                     " of a probe, sweep, context, prefix or interference, or of plan predict)")


def _is_run(p: Path) -> bool:
    if p.is_dir():
        return any((p / str(k.marker)).is_file() for k in _folder_kinds())
    return p.suffix == ".json"


def read_side(path: str | Path) -> Side:
    """A run, or a folder of runs of one kind (sorted by name)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist")
    if p.is_dir() and not _is_run(p):
        children = sorted(c for c in p.iterdir() if _is_run(c))
        if not children:
            raise InputError(f"{p} is not a run: no {_markers()} in it, and no runs in its"
                             " subfolders")
        runs = tuple(read_one(c) for c in children)
        kinds = sorted({r.kind for r in runs})
        if len(kinds) > 1:
            raise InputError(f"{p} holds runs of different kinds ({', '.join(kinds)}):"
                             " a side is runs of one kind")
        return Side(p.name, runs)
    return Side(p.name or str(p), (read_one(p),))


def _compatible(a: str, b: str) -> bool:
    """Whether one kind says its figures can be set beside the other's."""
    ka, kb = KINDS.get(a), KINDS.get(b)
    return bool((ka and b in ka.compares_with) or (kb and a in kb.compares_with))


def differences(a: Side, b: Side) -> list[str]:
    """What makes the two sides unlike: their kinds, or an identity field both state (what
    each kind says identifies its runs: the model, the server's build, the workload; not the
    server's settings, which are what a comparison is usually about)."""
    if a.kind != b.kind and not _compatible(a.kind, b.kind):
        return [f"kind: {a.kind} against {b.kind}"]
    out = []
    keys = dict.fromkeys(k for r in (*a.runs, *b.runs) for k in r.identity)
    for key in keys:
        va = {json.dumps(r.identity.get(key)) for r in a.runs if r.identity.get(key) is not None}
        vb = {json.dumps(r.identity.get(key)) for r in b.runs if r.identity.get(key) is not None}
        if va and vb and va != vb:
            out.append(f"{key}: {', '.join(sorted(va))} against {', '.join(sorted(vb))}")
    return out

