"""The metrics recorder: one line a scrape beside a run, failures kept as lines, read back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pdscope.errors import InputError
from pdscope.metrics import (
    VLLM,
    MetricsRecorder,
    ThreadedMetricsRecorder,
    bracket,
    load_recording,
    read_recording,
    recording_window,
)
from tests.unit.test_metrics_captured import Response, closed_port, serving, snap, text

LOAD = [text("at-rest"), text("load-05s"), text("load-10s"), text("load-15s"), text("after-load")]


async def record(
    url: str, path: Path, until: Callable[[MetricsRecorder], bool], interval: float = 0.05
) -> MetricsRecorder:
    """Record until ``until(recorder)`` holds (at most 10 s: a slow machine scrapes late)."""
    async with MetricsRecorder(url, path, interval=interval) as recorder:
        deadline = time.monotonic() + 10
        while not until(recorder) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    return recorder


def test_a_recording_holds_every_scrape_and_rebuilds_the_window(tmp_path: Path) -> None:
    path = tmp_path / "run.metrics.jsonl"
    with serving(LOAD) as base:
        recorder = asyncio.run(record(base, path, lambda r: r.scrapes >= 6))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["kind"] == "header"
    assert lines[0]["url"] == base + "/metrics" and lines[0]["interval_s"] == 0.05
    # The first scrape on entry, one a tick, one more on exit.
    assert recorder.scrapes >= 7 and recorder.errors == 0
    assert len(lines) == 1 + recorder.scrapes
    snapshots = load_recording(path)
    assert len(snapshots) == recorder.scrapes
    assert [s.t for s in snapshots] == sorted(s.t for s in snapshots)
    # The server answered the five texts in turn, then the last one again.
    waiting = [s.gauge(VLLM.waiting) for s in snapshots]
    assert waiting[:5] == [0, 20, 15, 11, 0]
    # The whole recording is the whole load: 24 requests finished, 1,536 tokens generated.
    w = recording_window(snapshots)
    assert w.family == "vllm"
    assert w.requests_finished == 24
    assert w.generation_tokens_per_s is not None
    assert w.generation_tokens_per_s * w.duration_s == pytest.approx(1536)
    # 24 first tokens; p50 rank 12 in (10, 20], which holds the 9th to 15th: 10 + 10 * 4 / 7
    # (worked in test_metrics_captured.py).
    assert w.ttft_p50_s == pytest.approx(10 + 10 * 4 / 7)
    # Any two snapshots make a window: the first five seconds of the load.
    early = recording_window(snapshots, first=0, last=1)
    assert early.num_requests_waiting == 20 and early.ttft_p50_s == pytest.approx(3.125)


def test_scrape_failures_are_lines_not_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "down.jsonl"
    asyncio.run(record(f"http://127.0.0.1:{closed_port()}", path, lambda r: r.errors >= 3))
    recording = read_recording(path)
    assert recording.snapshots == []
    assert len(recording.errors) >= 3
    wall, message = recording.errors[0]
    assert abs(wall - time.time()) < 60
    assert message.startswith("cannot reach http://127.0.0.1:")


def test_a_server_that_fails_in_the_middle_leaves_a_hole(tmp_path: Path) -> None:
    path = tmp_path / "hole.jsonl"
    answers: list[str | Response] = [
        text("at-rest"), (503, "restarting", "text/plain"), text("after-load")
    ]
    with serving(answers) as base:
        recorder = asyncio.run(record(base, path, lambda r: r.scrapes >= 2))
    recording = read_recording(path)
    assert recorder.errors == 1 and len(recording.errors) == 1
    assert "HTTP 503" in recording.errors[0][1]
    assert recording_window(recording.snapshots).requests_finished == 24


def test_the_threaded_recorder_for_code_that_is_not_async(tmp_path: Path) -> None:
    path = tmp_path / "threaded.jsonl"
    with serving(LOAD) as base:
        with ThreadedMetricsRecorder(base, path, interval=0.05) as recorder:
            # The first scrape is written before the block starts.
            assert len(load_recording(path)) >= 1
            deadline = time.monotonic() + 10
            while recorder.scrapes < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert recorder.scrapes >= 4  # and the final one on exit
    assert len(load_recording(path)) == recorder.scrapes


def test_a_last_line_cut_short_is_ignored_and_others_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    with serving(LOAD) as base:
        asyncio.run(record(base, path, lambda r: r.scrapes >= 2))
    whole = path.read_text()
    count = len(load_recording(path))
    path.write_text(whole + whole.splitlines()[-1][:100])  # killed while writing
    assert len(load_recording(path)) == count
    path.write_text(whole.replace('"kind":"scrape"', '"kind":"nonsense"', 1))
    with pytest.raises(InputError, match=r"cut\.jsonl:2: not a line of a pdscope metrics"):
        load_recording(path)
    with pytest.raises(InputError, match="cannot read the metrics recording"):
        load_recording(tmp_path / "absent.jsonl")


def test_bracket_finds_the_scrapes_around_a_run() -> None:
    snapshots = [snap(name) for name in ("at-rest", "load-05s", "load-10s", "load-15s")]
    # A run from 6 s to 12 s lies inside the scrapes at 5 s and 15 s.
    assert bracket(snapshots, 6.0, 12.0) == (1, 3)
    assert bracket(snapshots, 5.0, 10.0) == (1, 2)
    # A run longer than the recording: the first and the last.
    assert bracket(snapshots, -3.0, 99.0) == (0, 3)
    with pytest.raises(InputError, match="at least two scrapes"):
        bracket(snapshots[:1], 0.0, 1.0)
    with pytest.raises(InputError, match="at least two scrapes"):
        recording_window(snapshots[:1])


def test_a_bad_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="above 0 s"):
        MetricsRecorder("http://h", tmp_path / "x.jsonl", interval=0)
