"""pdscope bench against the reference streaming server: faults counted, nothing lost when
interrupted, open-loop timing kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdscope.load.results import load_requests, read_run
from pdscope.plan.demand import replay
from pdscope.selftest import FAULTS, ReferenceConfig, run_in_subprocess
from tests.noise import server_first_token_late_ms

FAST = dict(ttft_base_s=0.02, ttft_per_token_s=0.0, itl_s=0.005)


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(**FAST)) as url:  # type: ignore[arg-type]
        yield url


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdscope", "bench", *args],
                          capture_output=True, text=True, timeout=timeout)


# Every fault kind, at 10% of requests each (70% faulted in all), with timeouts short enough to
# end the stalled and never-ending streams.
@pytest.mark.timeout(120)
def test_every_fault_is_counted_by_its_cause_and_nothing_hangs(tmp_path: Path) -> None:
    config = ReferenceConfig(
        **FAST, faults=FAULTS, fault_rate=0.7, seed=3, fault_after_tokens=2  # type: ignore[arg-type]
    )
    with run_in_subprocess(config) as url:
        t0 = time.monotonic()
        r = bench(url, "--concurrency", "16", "--num-prompts", "200", "--input-len", "20",
                  "--output-len", "20", "--timeout-between-tokens", "1", "--timeout-total", "5",
                  "--out", str(tmp_path), "--json")
        took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["sent"] == 200 and s["completed"] + s["failed"] == s["sent"]
    assert s["incomplete"] == 0
    causes = s["failed_by_cause"]
    # Each fault shows up as its own kind of failure.
    expected = {"connect", "http_429", "http_5xx", "stream_broken", "timeout_between_tokens",
                "bad_chunk", "overrun"}
    assert expected <= set(causes), causes
    assert 0.55 * 200 < s["failed"] < 0.85 * 200
    # Failed requests stay out of the latency statistics: every completed one has 20 tokens.
    lines = load_requests(tmp_path / "requests.jsonl")
    assert len(lines) == 200
    ok = [x for x in lines if x["error_kind"] is None]
    assert len(ok) == s["completed"] and all(x["output_tokens"] == 20 for x in ok)
    assert Counter(x["error_kind"] for x in lines if x["error_kind"]) == Counter(causes)
    # Read back as a run folder: the same counts, by outcome.
    assert read_run(tmp_path).outcomes() == Counter({"ok": s["completed"], **causes})
    # No hang: the stalls end at the 1 s between-token timeout, the endless streams at overrun.
    assert took < 60


def test_open_loop_sends_on_schedule_and_reports_the_lag(reference: str, tmp_path: Path) -> None:
    r = bench(reference, "--request-rate", "20", "--num-prompts", "60", "--input-len", "10",
              "--output-len", "10", "--seed", "7", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["completed"] == 60 and s["stage"]["mode"] == "open-loop"
    assert s["p99_schedule_lag_ms"] is not None and s["median_schedule_lag_ms"] < 5
    lines = load_requests(tmp_path / "requests.jsonl")
    sends = sorted(x["scheduled_ns"] for x in lines)
    span = (sends[-1] - sends[0]) / 1e9
    assert 60 / 20 * 0.6 < span < 60 / 20 * 1.6  # about num_prompts / rate seconds
    # The planner replays the run: the same requests, at the times they were sent.
    demand = replay(tmp_path)
    assert len(demand) == 60 and demand.arrival_s is not None
    assert demand.arrival_s[0] == 0 and list(demand.arrival_s) == sorted(demand.arrival_s)
    sent = sorted(x["t_send_ns"] for x in lines)
    assert demand.arrival_s[-1] == pytest.approx((sent[-1] - sent[0]) / 1e9)
    assert set(demand.prompt_tokens.tolist()) == {x["prompt_tokens"] for x in lines}
    assert set(demand.output_tokens.tolist()) == {10}
    # The server's schedule (20 ms), as the server kept it on a busy machine: a TTFT read from
    # the wrong moment (the role chunk, the last token) is off by 20 ms or more.
    late = server_first_token_late_ms(lines)
    assert s["median_ttft_ms"] == pytest.approx(20.0 + late, abs=3.0), late


def test_max_concurrency_wait_is_reported_apart_from_ttft(reference: str, tmp_path: Path) -> None:
    r = bench(reference, "--request-rate", "inf", "--max-concurrency", "2", "--num-prompts", "8",
              "--input-len", "10", "--output-len", "10", "--out", str(tmp_path), "--json")
    s = json.loads(r.stdout)
    assert s["completed"] == 8
    # Eight sent at once, two at a time: the last pair waited three turns of ~70 ms...
    assert s["max_client_queue_ms"] > 150
    # ...and that wait is not in their TTFT, which stays the server's 20 ms.
    assert s["p99_ttft_ms"] < 40


def test_a_sweep_gives_one_summary_a_stage(reference: str, tmp_path: Path) -> None:
    r = bench(reference, "--concurrency", "1,4", "--num-prompts", "8", "--input-len", "10",
              "--output-len", "10", "--out", str(tmp_path), "--json")
    summaries = json.loads(r.stdout)
    assert [s["stage"]["name"] for s in summaries] == ["concurrency=1", "concurrency=4"]
    assert summaries[1]["request_throughput"] > 2.5 * summaries[0]["request_throughput"]
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("stage,")


def _start_bench(url: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pdscope", "bench", url, "--concurrency", "4", "--num-prompts",
         "400", "--input-len", "10", "--output-len", "20", "--out", str(out), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_lines(path: Path, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} lines in {path}")


def _dense(indices: list[int], concurrency: int) -> bool:
    """In a closed loop, request i starts only after an earlier one on its stream finished, so
    every index more than ``concurrency`` below the highest must have finished (and be on file)."""
    have = set(indices)
    return all(i in have for i in range(max(indices) - concurrency))


def test_sigint_keeps_every_finished_request_and_writes_the_summary(
    reference: str, tmp_path: Path
) -> None:
    proc = _start_bench(reference, tmp_path)
    _wait_for_lines(tmp_path / "requests.jsonl", 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = load_requests(tmp_path / "requests.jsonl")
    summary = json.loads(out)
    assert summary["interrupted"] is True
    # Requests in flight were let finish: every sent request is on file and none failed.
    assert summary["sent"] == len(lines) == summary["completed"]
    assert _dense([x["index"] for x in lines], 4)
    assert json.loads((tmp_path / "summary.json").read_text())["completed"] == len(lines)


def test_sigkill_leaves_every_finished_request_on_file(reference: str, tmp_path: Path) -> None:
    proc = _start_bench(reference, tmp_path)
    _wait_for_lines(tmp_path / "requests.jsonl", 20)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    raw = (tmp_path / "requests.jsonl").read_text()
    lines = load_requests(tmp_path / "requests.jsonl")
    # Every line is a whole record (lines are written and flushed one by one)...
    assert len(lines) == len(raw.splitlines()) >= 20
    assert all(x["output_tokens"] == 20 for x in lines)
    # ...and no finished request is missing.
    assert _dense([x["index"] for x in lines], 4)
