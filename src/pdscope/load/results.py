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
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pdscope.errors import InputError, RunError
from pdscope.load.runner import Finished
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


class RunFolder:
    """Writes a run folder; ``record`` is the sink a :func:`run_stage` hands each request.

    Raises :class:`InputError` when the folder cannot be made at the start (nothing has been
    measured yet). A write that fails later moves the folder to :func:`rescue_dir`; the
    move is in ``warnings``."""

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
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
        (self.path / "run.json").write_text(json.dumps(self.meta, indent=2))
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
        line = json.dumps(finished.to_json(self.stage)) + "\n"
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

    def finish(self, summaries: Sequence[dict[str, Any]], sweep: bool) -> None:
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

    def _write_end(self, summaries: Sequence[dict[str, Any]], sweep: bool) -> None:
        data: Any = list(summaries) if sweep else (summaries[0] if summaries else {})
        (self.path / "summary.json").write_text(json.dumps(data, indent=2))
        with open(self.path / "requests.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=REQUEST_COLUMNS)
            w.writeheader()
            w.writerows(self._rows)
        with open(self.path / "summary.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for s in summaries:
                w.writerow({**s, "stage": s["stage"]["name"]})


@dataclass(frozen=True)
class BenchRun:
    """A run folder as read back: ``meta`` (``run.json``), every finished request
    (``requests.jsonl``) and the summaries (``summary.json``, a list; empty when the run was
    killed before its end, so that only the requests it finished are known)."""

    path: Path
    meta: dict[str, Any]
    requests: list[dict[str, Any]]
    summaries: list[dict[str, Any]]

    @property
    def complete(self) -> bool:
        return bool(self.summaries)

    def outcomes(self, stage: str | None = None) -> Counter[str]:
        """Requests by outcome: ``ok``, or the failure's cause (``connect``, ``cancelled``...)."""
        return Counter(
            "ok" if r.get("error") is None else str(r.get("error_kind") or "unknown")
            for r in self.requests
            if stage is None or r.get("stage") == stage
        )


def read_run(path: str | Path) -> BenchRun:
    """Read a ``pdscope bench`` run folder, whole or cut short (a killed run has no summary).

    Raises :class:`InputError` for a folder that is not a run folder."""
    folder = Path(path)
    try:
        meta = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        requests = load_requests(folder / "requests.jsonl")
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"{folder} is not a readable bench run folder: {why}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{folder}/run.json is not a JSON object: not a bench run folder")
    summaries: list[dict[str, Any]] = []
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        summaries = [s for s in (data if isinstance(data, list) else [data])
                     if isinstance(s, dict) and s]
    return BenchRun(folder, meta, [r for r in requests if isinstance(r, dict)], summaries)


def load_requests(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ``requests.jsonl`` (a partial last line, from a killed run, is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
