"""What a run left behind, read as figures that can be set side by side.

A *run* is whatever a pdscope command wrote: a ``bench`` folder (``run.json``,
``requests.jsonl``, ``summary.json``), a ``doctor`` folder (``evidence.json``,
``findings.json``), the ``--out`` JSON file of ``probe``, ``sweep``, ``context``, ``prefix`` or
``interference``, or the ``--json`` answer of ``plan predict`` saved to a file. A *side* is one
run, or a folder of runs of the same kind (the rounds of ``pdscope ab``, repeated benches).

Each run gives *series* (one value a request, or a token gap, in the order the requests were
sent; the per-request figures a percentile is taken of) and *scalars* (one value a run). The
figures and which way is better are in :data:`METRICS`; names as in the planner's JSON
(``ttft_p99_s``), seconds; the bench summary's ``p99_ttft_ms`` is ``ttft_p99_s`` here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdscope.client.record import RequestRecord
from pdscope.errors import InputError
from pdscope.load import read_run


@dataclass(frozen=True)
class Metric:
    """A figure: ``series`` and ``q`` for a percentile of per-request values, else a scalar."""

    name: str
    label: str
    lower_is_better: bool
    unit: str
    series: str | None = None
    q: float | None = None


METRICS: tuple[Metric, ...] = (
    Metric("ttft_p50_s", "TTFT p50", True, "s", "ttft", 50),
    Metric("ttft_p99_s", "TTFT p99", True, "s", "ttft", 99),
    Metric("itl_p50_s", "ITL p50", True, "s", "itl", 50),
    Metric("itl_p99_s", "ITL p99", True, "s", "itl", 99),
    Metric("tpot_p50_s", "TPOT p50", True, "s", "tpot", 50),
    Metric("e2e_p50_s", "E2E p50", True, "s", "e2e", 50),
    Metric("decode_tok_s", "decode rate", False, "tok/s", "decode", 50),
    Metric("prefill_tok_s", "prefill rate", False, "tok/s", "prefill", 50),
    Metric("request_throughput", "request throughput", False, "req/s"),
    Metric("output_throughput", "output throughput", False, "tok/s"),
    Metric("request_goodput", "goodput", False, "req/s"),
    Metric("capacity_users", "users at the SLO", False, "users"),
    Metric("prefill_stall_s", "prefill stall", True, "s"),
    Metric("ttft_saved_share", "TTFT saved by the prefix cache", False, "share"),
)
BY_NAME = {m.name: m for m in METRICS}

# What two runs must share to be compared (as far as both say it): the workload and the
# server's build, not the server's settings (those are what a comparison is usually about).
IDENTITY_KEYS = ("model", "server", "server_version", "workload", "mode", "request_rate",
                 "concurrency", "prompt_tokens", "output_tokens", "experiment")
# Kinds whose figures can be set beside each other: a prediction against a measured load.
COMPATIBLE = {frozenset({"bench", "prediction"})}


@dataclass(frozen=True)
class Run:
    """One run's figures: ``kind`` (bench, probe, doctor, sweep, context, prefix,
    interference, prediction), ``identity`` (what the comparison checks is alike),
    ``series`` (per-request values, send order) and ``scalars``; a doctor run's
    ``findings``."""

    path: Path
    kind: str
    identity: dict[str, Any]
    series: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    findings: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its runs (one, or the rounds of an A/B) and a label."""

    label: str
    runs: tuple[Run, ...]

    @property
    def kind(self) -> str:
        return self.runs[0].kind

    def series(self, key: str) -> list[np.ndarray]:
        return [r.series[key] for r in self.runs if len(r.series.get(key, ())) > 0]

    def scalars(self, key: str) -> list[float]:
        return [r.scalars[key] for r in self.runs if r.scalars.get(key) is not None]


def request_series(records: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Per-request series of the completed, measured requests, in send order."""
    done = []
    for d in records:
        if d.get("error") is not None or d.get("warmup") or d.get("t_first_token_ns") is None:
            continue
        done.append(RequestRecord.from_dict(d))
    done.sort(key=lambda r: r.t_send_ns or 0)
    out: dict[str, list[float]] = {"ttft": [], "itl": [], "tpot": [], "e2e": [], "decode": [],
                                   "prefill": []}
    for r in done:
        for key, value in (("ttft", r.ttft_s), ("tpot", r.tpot_s), ("e2e", r.e2e_s),
                           ("decode", r.decode_tok_s), ("prefill", r.prefill_tok_s)):
            if value is not None:
                out[key].append(value)
        out["itl"].extend(r.itl_s)
    return {k: np.asarray(v, dtype=float) for k, v in out.items() if v}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _bench(path: Path) -> Run:
    run = read_run(path)
    if len(run.summaries) > 1:
        raise InputError(f"{path} is a bench run of {len(run.summaries)} stages: compare one"
                         " stage a run (a sweep of rates is several runs)")
    stage = (run.meta.get("stages") or [{}])[0]
    identity = {"model": run.meta.get("model"), "server": run.meta.get("server"),
                "server_version": run.meta.get("server_version"),
                "workload": run.meta.get("workload"), "mode": stage.get("mode"),
                "request_rate": stage.get("request_rate"),
                "concurrency": stage.get("concurrency")}
    scalars: dict[str, float] = {}
    if run.summaries:
        s = run.summaries[0]
        for key in ("request_throughput", "output_throughput", "request_goodput"):
            if _num(s.get(key)) is not None:
                scalars[key] = float(s[key])
    series = request_series(run.requests)
    series.pop("prefill", None)  # prompt / TTFT under load is queueing, not a prefill rate
    return Run(path, "bench", identity, series, scalars)


def _probe(path: Path, d: dict[str, Any]) -> Run:
    identity = {k: d.get(k) for k in ("model", "server", "server_version", "prompt_tokens",
                                      "output_tokens")}
    records = d.get("requests") or []
    runs = d.get("runs")
    if isinstance(runs, int) and 0 < runs < len(records):
        records = records[-runs:]  # the first is the cold request, reported apart
    series = request_series(records)
    scalars = {}
    if not series:  # written without its records: the medians only
        for key in ("decode_tok_s", "prefill_tok_s", "itl_p50_s", "itl_p99_s"):
            if _num(d.get(key)) is not None:
                scalars[key] = float(d[key])
        if _num(d.get("ttft_s")) is not None:
            scalars["ttft_p50_s"] = float(d["ttft_s"])
    return Run(path, "probe", identity, series, scalars)


def _experiment(path: Path, d: dict[str, Any]) -> Run:
    kind = str(d["experiment"])
    identity = {k: d.get(k) for k in ("model", "server", "server_version", "experiment")}
    scalars: dict[str, float] = {}
    if kind == "sweep":
        fit = d.get("fit") or {}
        if _num(fit.get("prefill_tok_s")) is not None:
            scalars["prefill_tok_s"] = float(fit["prefill_tok_s"])
    elif kind == "prefix":
        if _num(d.get("ttft_saved_share")) is not None:
            scalars["ttft_saved_share"] = float(d["ttft_saved_share"])
    elif kind == "interference":
        if _num(d.get("stall_s")) is not None:
            scalars["prefill_stall_s"] = float(d["stall_s"])
    elif kind == "context":  # the decode rate at the shortest context it measured
        first = d.get("first") or {}
        rate = _num(first.get("decode_tok_s")) if isinstance(first, dict) else None
        if rate is not None:
            scalars["decode_tok_s"] = rate
    return Run(path, kind, identity, {}, scalars)


def _prediction(path: Path, d: dict[str, Any]) -> Run:
    scalars = {k: float(d[k]) for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                                         "tpot_p50_s", "e2e_p50_s", "request_throughput",
                                         "output_throughput") if _num(d.get(k)) is not None}
    return Run(path, "prediction", {}, {}, scalars)


def _doctor(path: Path) -> Run:
    try:
        evidence = json.loads((path / "evidence.json").read_text(encoding="utf-8"))
        findings = json.loads((path / "findings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable doctor folder: {exc}") from None
    server = evidence.get("server") or {}
    phases = evidence.get("phases") or {}
    identity = {"model": server.get("model"), "server": server.get("kind"),
                "server_version": server.get("version"),
                "prompt_tokens": phases.get("prompt_tokens"),
                "output_tokens": phases.get("output_tokens")}
    probe = (evidence.get("experiments") or {}).get("probe") or {}
    series = request_series(probe.get("requests") or [])
    scalars: dict[str, float] = {}
    if not series:
        for key, name in (("decode_tok_s", "decode_tok_s"), ("prefill_tok_s", "prefill_tok_s"),
                          ("ttft_s", "ttft_p50_s"), ("itl_p50_s", "itl_p50_s"),
                          ("itl_p99_s", "itl_p99_s")):
            if _num(phases.get(key)) is not None:
                scalars[name] = float(phases[key])
    stalls = [_num(i.get("p99_during_s")) for i in evidence.get("interference") or []]
    if stalls and stalls[0] is not None:
        scalars["prefill_stall_s"] = stalls[0]
    plan = evidence.get("plan") or {}
    if _num(plan.get("predicted_users")) is not None:
        scalars["capacity_users"] = float(plan["predicted_users"])
    prefix = evidence.get("prefix") or {}
    cold, warm = _num(prefix.get("unique_ttft_s")), _num(prefix.get("warm_ttft_s"))
    if cold and warm is not None:
        scalars["ttft_saved_share"] = 1 - warm / cold
    return Run(path, "doctor", identity, series, scalars,
               tuple(f for f in findings if isinstance(f, dict)))


def read_one(path: str | Path) -> Run:
    """One run, of whatever command wrote it. :class:`InputError` when it is not a run."""
    p = Path(path)
    if p.is_dir():
        if (p / "run.json").is_file():
            return _bench(p)
        if (p / "findings.json").is_file():
            return _doctor(p)
        raise InputError(f"{p} is not a run: no run.json (bench) or findings.json (doctor) in"
                         " it, and no runs in its subfolders")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"{p} is not a run: not JSON") from None
    if isinstance(d, dict) and isinstance(d.get("experiment"), str):
        return _experiment(p, d)
    if isinstance(d, dict) and "decode_tok_s" in d and "prompt_tokens_requested" in d:
        return _probe(p, d)
    if isinstance(d, dict) and "simulated_requests" in d:
        return _prediction(p, d)
    raise InputError(f"{p} is not a run: a JSON file that no pdscope command wrote (probe,"
                     " sweep, context, prefix, interference --out; plan predict --json)")


def _is_run(p: Path) -> bool:
    if p.is_dir():
        return (p / "run.json").is_file() or (p / "findings.json").is_file()
    return p.suffix == ".json"


def read_side(path: str | Path) -> Side:
    """A run, or a folder of runs of one kind (sorted by name)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist")
    if p.is_dir() and not _is_run(p):
        children = sorted(c for c in p.iterdir() if _is_run(c))
        if not children:
            raise InputError(f"{p} is not a run: no run.json (bench) or findings.json (doctor)"
                             " in it, and no runs in its subfolders")
        runs = tuple(read_one(c) for c in children)
        kinds = sorted({r.kind for r in runs})
        if len(kinds) > 1:
            raise InputError(f"{p} holds runs of different kinds ({', '.join(kinds)}):"
                             " a side is runs of one kind")
        return Side(p.name, runs)
    return Side(p.name or str(p), (read_one(p),))


def differences(a: Side, b: Side) -> list[str]:
    """What makes the two sides unlike: their kinds, or an identity field both state."""
    if a.kind != b.kind and frozenset({a.kind, b.kind}) not in COMPATIBLE:
        return [f"kind: {a.kind} against {b.kind}"]
    out = []
    for key in IDENTITY_KEYS:
        va = {json.dumps(r.identity.get(key)) for r in a.runs if r.identity.get(key) is not None}
        vb = {json.dumps(r.identity.get(key)) for r in b.runs if r.identity.get(key) is not None}
        if va and vb and va != vb:
            out.append(f"{key}: {', '.join(sorted(va))} against {', '.join(sorted(vb))}")
    return out

