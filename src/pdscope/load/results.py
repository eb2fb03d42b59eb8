"""The run folder: every request as it finishes, and the summaries at the end.

``requests.jsonl`` gets one line a finished request, written and flushed at once, so a crash,
a Ctrl-C or a SIGKILL loses nothing that had finished. ``summary.json`` (one object, or a list
for a sweep), ``summary.csv`` (a row a stage) and ``requests.csv`` (a row a request) are
written at the end, also after Ctrl-C.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pdscope.load.runner import Finished

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


class RunFolder:
    """Writes a run folder; ``record`` is the sink a :func:`run_stage` hands each request."""

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "run.json").write_text(json.dumps(meta, indent=2))
        self._jsonl: TextIO = open(self.path / "requests.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._rows: list[dict[str, Any]] = []
        self.stage = ""

    def record(self, finished: Finished) -> None:
        line = finished.to_json(self.stage)
        self._jsonl.write(json.dumps(line) + "\n")
        self._jsonl.flush()
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
        self._jsonl.close()
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


def load_requests(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ``requests.jsonl`` (a partial last line, from a killed run, is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
