"""The run folder: every request as it finishes, and the summaries at the end.

``requests.jsonl`` gets one line a finished request, written and flushed at once, so a crash,
a Ctrl-C or a SIGKILL loses nothing that had finished. ``summary.json`` (one object, or a list
for a sweep), ``summary.csv`` (a row a stage) and ``requests.csv`` (a row a request) are
written at the end, also after Ctrl-C.

A folder that cannot be written any more in the middle of a run (the disk filled, the folder
was removed) is not the end of the run: the folder moves to :func:`rescue_dir` (the cache
folder's ``rescued/``, else the current folder), what was recorded is written again there, and
``RunFolder.warnings`` says where.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from pdscope.client.fields import RequestFields
from pdscope.client.record import record_series
from pdscope.errors import InputError, RunError
from pdscope.figures import (
    DECODE_RATE,
    LATENCIES,
    LOAD_METRICS,
    REASONING_METRICS,
    Figures,
    ResultKind,
    register,
    scalars,
)
from pdscope.load.runner import Finished, RunRequest, Stage
from pdscope.load.summary import StageSummary, read_summaries, write_summaries
from pdscope.paths import cache_root

REQUEST_COLUMNS = (
    "stage", "index", "warmup", "ok", "error_kind", "ttft_s", "tpot_s", "e2e_s",
    "prompt_tokens", "output_tokens", "client_queue_s", "schedule_lag_s", "connect_s",
)
SUMMARY_COLUMNS = (
    "stage", "duration_s", "sent", "completed", "failed", "incomplete", "request_throughput",
    "output_throughput", "max_output_tokens_per_s", "median_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms",
    "p99_e2el_ms", "p99_schedule_lag_ms", "request_goodput",
)


def default_run_dir(prefix: str = "bench") -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def rescue_dir() -> Path:
    """Where a result goes that could not be written where it was asked to:
    ``<cache>/rescued`` (``$PDSCOPE_CACHE``, else ``~/.cache/pdscope``)."""
    return cache_root() / "rescued"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


# run.json's keys, in the order they are written; any other key is a caller's (``extra``).
_META_KEYS = ("url", "server", "server_version", "model", "api", "workload", "prefix_groups",
              "prefix_tokens", "stages", "started_at", "workers", "ray_address",
              "request_fields")


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


@dataclass(frozen=True)
class RunMeta:
    """``run.json``: what a bench run measured and how. ``server`` is the family's kind,
    ``workload`` its description (:meth:`~pdscope.load.bench.Workload.describe`),
    ``prefix_groups`` and ``prefix_tokens`` its shared prefixes (the planner's replay needs
    them), ``started_at`` the wall time it began, ``workers`` and ``ray_address`` how the load
    was split, ``request_fields`` what the user added to every request (``None``: nothing;
    written with each header's value redacted). ``extra``: keys a library caller added
    (``run_bench(meta=...)``), written after the others. A field a folder written by another
    version lacks is ``None``."""

    url: str | None = None
    server: str | None = None
    server_version: str | None = None
    model: str | None = None
    api: str | None = None
    workload: str | None = None
    prefix_groups: int | None = None
    prefix_tokens: int | None = None
    stages: tuple[Stage, ...] = ()
    started_at: float | None = None
    workers: int | None = None
    ray_address: str | None = None
    request_fields: RequestFields | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url, "server": self.server, "server_version": self.server_version,
            "model": self.model, "api": self.api, "workload": self.workload,
            "prefix_groups": self.prefix_groups, "prefix_tokens": self.prefix_tokens,
            "stages": [s.to_json() for s in self.stages], "started_at": self.started_at,
            "workers": self.workers, "ray_address": self.ray_address,
        }
        if self.request_fields is not None:
            out["request_fields"] = self.request_fields.to_json()
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunMeta:
        """``run.json`` as :meth:`to_json` wrote it; a key it lacks is ``None``.
        :class:`InputError` for a stage that is not one."""
        stages = d.get("stages") or []
        if not isinstance(stages, list):
            raise InputError("run.json: stages is not a list")
        try:
            typed = tuple(Stage.from_json(s) for s in stages)
        except (AttributeError, TypeError, ValueError) as exc:
            raise InputError(f"run.json: a stage that is not one ({exc})") from None
        started = d.get("started_at")
        fields = d.get("request_fields")
        try:
            request_fields = None if fields is None else RequestFields.from_json(fields)
        except InputError as exc:
            raise InputError(f"run.json: request_fields: {exc}") from None
        return cls(
            url=_text(d.get("url")), server=_text(d.get("server")),
            server_version=_text(d.get("server_version")), model=_text(d.get("model")),
            api=_text(d.get("api")), workload=_text(d.get("workload")),
            prefix_groups=_int(d.get("prefix_groups")),
            prefix_tokens=_int(d.get("prefix_tokens")), stages=typed,
            started_at=started if isinstance(started, (int, float))
            and not isinstance(started, bool) else None,
            workers=_int(d.get("workers")), ray_address=_text(d.get("ray_address")),
            request_fields=request_fields,
            extra={k: v for k, v in d.items() if k not in _META_KEYS},
        )


_encode = msgspec.json.Encoder().encode


def jsonl_line(row: Mapping[str, Any]) -> str:
    """A ``requests.jsonl`` line: ``row`` (numbers, text, lists and dicts of them) as compact
    JSON, with its newline. One call of msgspec's encoder (a request's four lists of 64 token
    times took ``json.dumps`` ~40 us of a ~300 us request at 200 streams); a row holding a
    float that is not finite goes to ``json.dumps`` (NaN, Infinity), which msgspec writes as
    null, so the file reads back the same either way."""
    if any(type(v) is float and not math.isfinite(v) for v in _scalars(row)):
        return json.dumps(row, separators=(",", ":")) + "\n"
    return _encode(row).decode("utf-8") + "\n"


def _scalars(row: Mapping[str, Any]) -> Iterator[Any]:
    """The values of ``row`` and of the dicts in it (a record's ``derived``, its
    ``server_timings``); the lists in it hold integers (times, token counts)."""
    for value in row.values():
        if type(value) is dict:
            yield from _scalars(value)
        else:
            yield value


class RunFolder:
    """Writes a run folder; ``record`` is the sink a :func:`run_stage` hands each request.

    Raises :class:`InputError` when the folder cannot be made at the start (nothing has been
    measured yet). A write that fails later moves the folder to :func:`rescue_dir`; the
    move is in ``warnings``."""

    def __init__(self, path: str | Path, meta: RunMeta) -> None:
        self.path = Path(path)
        self.meta = meta
        self.warnings: list[str] = []
        self._rows: list[dict[str, Any]] = []
        self.stage = ""
        try:
            self._open()
        except OSError as exc:
            raise InputError(f"cannot write the run folder {self.path}: {_reason(exc)}") from None

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "run.json").write_text(json.dumps(self.meta.to_json(), indent=2))
        self._jsonl: TextIO = open(self.path / "requests.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def _rescue(self, exc: OSError) -> None:
        """Move the run to the rescue folder (else the current folder) after a failed write."""
        old = self.path
        with contextlib.suppress(OSError):
            self._jsonl.close()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for folder in (rescue_dir() / f"{old.name}-{stamp}", Path.cwd() / f"{old.name}-rescued"):
            self.path = folder
            try:
                self._open()
            except OSError:
                continue
            copied = ""
            try:
                shutil.copyfile(old / "requests.jsonl", folder / "requests.jsonl.before")
                copied = "; the requests recorded before are in requests.jsonl.before"
            except OSError:
                copied = (f"; the requests recorded before stay in {old / 'requests.jsonl'}"
                          " (requests.csv has them all)")
            self.warnings.append(f"could not write the run folder {old} ({_reason(exc)}):"
                                 f" the run goes on in {folder}{copied}")
            return
        raise RunError(f"cannot write the run folder {old} ({_reason(exc)}), nor"
                       f" {rescue_dir()}, nor the current folder") from None

    def record(self, finished: Finished) -> None:
        line = jsonl_line(RunRequest.of(self.stage, finished).to_json())
        try:
            self._jsonl.write(line)
            self._jsonl.flush()
        except OSError as exc:
            self._rescue(exc)
            try:
                self._jsonl.write(line)
                self._jsonl.flush()
            except OSError as again:
                raise RunError(f"cannot write {self.path / 'requests.jsonl'} either:"
                               f" {_reason(again)}") from None
        r = finished.record
        self._rows.append({
            "stage": self.stage, "index": finished.index, "warmup": finished.warmup,
            "ok": r.ok, "error_kind": r.error_kind, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
            "e2e_s": r.e2e_s, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "client_queue_s": finished.client_queue_s, "schedule_lag_s": r.schedule_lag_s,
            "connect_s": r.connect_s,
        })

    __call__ = record

    def finish(self, summaries: Sequence[StageSummary], sweep: bool) -> None:
        with contextlib.suppress(OSError):
            self._jsonl.close()
        try:
            self._write_end(summaries, sweep)
        except OSError as exc:
            self._rescue(exc)
            with contextlib.suppress(OSError):
                self._jsonl.close()
            try:
                self._write_end(summaries, sweep)
            except OSError as again:
                raise RunError(f"cannot write the summaries to {self.path} either:"
                               f" {_reason(again)}") from None

    def _write_end(self, summaries: Sequence[StageSummary], sweep: bool) -> None:
        write_summaries(self.path / "summary.json", summaries, sweep)
        with open(self.path / "requests.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=REQUEST_COLUMNS)
            w.writeheader()
            w.writerows(self._rows)
        with open(self.path / "summary.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for s in summaries:
                w.writerow({**s.to_json(), "stage": s.name})


@dataclass(frozen=True)
class BenchRun:
    """A run folder as read back: ``meta`` (``run.json``), every finished request
    (``requests.jsonl``) and the summaries (``summary.json``; none when the run was killed
    before its end, so that only the requests it finished are known)."""

    path: Path
    meta: RunMeta
    requests: tuple[RunRequest, ...]
    summaries: tuple[StageSummary, ...]

    @property
    def complete(self) -> bool:
        return bool(self.summaries)

    def figures(self) -> Figures:
        """Its requests' series (no prefill rate: prompt / TTFT under load is queueing) and
        the stage's throughputs. :class:`InputError` for a run of several stages: a
        comparison takes one load level a run."""
        if len(self.summaries) > 1:
            raise InputError(f"{self.path} is a bench run of {len(self.summaries)} stages:"
                             " compare one stage a run (a sweep of rates is several runs)")
        meta = self.meta
        stage = meta.stages[0] if meta.stages else None
        rate = None if stage is None else stage.request_rate
        identity = {"model": meta.model, "server": meta.server,
                    "server_version": meta.server_version, "workload": meta.workload,
                    "mode": None if stage is None else stage.mode,
                    # as run.json writes it (JSON has no infinity)
                    "request_rate": "inf" if rate == float("inf") else rate,
                    "concurrency": None if stage is None else stage.concurrency}
        s = self.summaries[0] if self.summaries else None
        values = scalars() if s is None else scalars(
            request_throughput=s.request_throughput, output_throughput=s.output_throughput,
            request_goodput=s.goodput.request_goodput if s.goodput else None)
        series = record_series([r.record for r in self.requests if not r.warmup])
        series.pop("prefill", None)
        return Figures("bench", BENCH_METRICS, identity, series, values)

    def outcomes(self, stage: str | None = None) -> Counter[str]:
        """Requests by outcome: ``ok``, or the failure's cause (``connect``, ``cancelled``...)."""
        return Counter(
            "ok" if r.record.ok else str(r.record.error_kind or "unknown")
            for r in self.requests
            if stage is None or r.stage == stage
        )


def read_run(path: str | Path) -> BenchRun:
    """Read a ``pdscope bench`` run folder, whole or cut short (a killed run has no summary).

    Raises :class:`InputError` for a folder that is not a run folder."""
    folder = Path(path)
    try:
        meta = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        requests = read_requests(folder / "requests.jsonl")
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"{folder} is not a readable bench run folder: {why}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{folder}/run.json is not a JSON object: not a bench run folder")
    try:
        run_meta = RunMeta.from_json(meta)
    except InputError as exc:
        raise InputError(f"{folder} is not a readable bench run folder: {exc}") from None
    summaries: tuple[StageSummary, ...] = ()
    with contextlib.suppress(InputError):
        summaries = read_summaries(folder / "summary.json")
    return BenchRun(folder, run_meta, requests, summaries)


BENCH_METRICS = (*LATENCIES, DECODE_RATE, *LOAD_METRICS, *REASONING_METRICS)
BENCH = register(ResultKind("bench", BENCH_METRICS, marker="run.json", read_folder=read_run))


def load_requests(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ``requests.jsonl`` as JSON (a partial last line, from a killed run, is
    skipped); :func:`read_requests` reads them as requests."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_requests(path: str | Path) -> tuple[RunRequest, ...]:
    """The requests of a ``requests.jsonl``, in the order they finished. A line that is not
    a request (the partial last line of a killed run, or another object) is skipped."""
    out = []
    for d in load_requests(path):
        if not isinstance(d, dict):
            continue
        try:
            out.append(RunRequest.from_json(d))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)
