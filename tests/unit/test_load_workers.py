"""Load split between worker processes (`bench --workers N`), against the reference server:
N workers send the same requests at the same times as one, every request is accounted for,
the percentiles are those of the raw records, and a worker killed mid-run loses none of the
records it had finished."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdscope.client import RequestRecord, Target, Timeouts, new_session
from pdscope.errors import InputError
from pdscope.load.results import load_requests
from pdscope.load.runner import Finished, Share, Stage, StageRun, closed_loop_indices, run_stage
from pdscope.load.workers import (
    LocalPool,
    best_offset,
    check_ray_address,
    on_timeline,
    run_stage_workers,
    stage_workers,
)
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.units import NS
from pdscope.workload.datasets import WorkItem
from pdscope.workload.schedule import arrival_offsets

FAST = dict(ttft_base_s=0.02, ttft_per_token_s=0.0, itl_s=0.005)
ITEMS = [WorkItem(10, prompt="one two three four five six seven eight", prompt_tokens=8)]


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(**FAST)) as url:  # type: ignore[arg-type]
        yield url


# ----------------------------------------------------------------- the split, in plain numbers


def test_the_shares_of_a_schedule_cover_it_once() -> None:
    offsets = arrival_offsets(101, 50, seed=3)
    owned = [[i for i in range(len(offsets)) if Share(k, 3).owns(i)] for k in range(3)]
    assert sorted(i for part in owned for i in part) == list(range(101))
    # Closed loop: the streams of three workers are the twelve, each once, and so are the
    # requests they send.
    streams = [Share(k, 3).streams(12) for k in range(3)]
    assert sorted(s for r in streams for s in r) == list(range(12))
    sent = [list(closed_loop_indices(12, r, 50)) for r in streams]
    assert sorted(i for part in sent for i in part) == list(range(50))
    assert all(i % 12 in streams[k] for k in range(3) for i in sent[k])
    # One worker with every stream sends in plain order, as one process does.
    assert list(closed_loop_indices(4, range(4), 6)) == [0, 1, 2, 3, 4, 5]
    # A limit on concurrency is split, and adds up.
    assert [Share(k, 3).max_concurrency(8) for k in range(3)] == [3, 3, 2]
    # No more workers than streams (closed loop) or slots (open loop).
    assert stage_workers(Stage(concurrency=3, num_prompts=9), 8) == 3
    assert stage_workers(Stage(request_rate=5, num_prompts=9, max_concurrency=2), 8) == 2
    assert stage_workers(Stage(request_rate=5, num_prompts=9), 8) == 8


def test_a_clock_offset_is_read_from_the_shortest_ping() -> None:
    # The worker's clock runs 1,000,000 ns behind the driver's; pings with long round trips
    # (a reply that waited on the way back) would put it elsewhere.
    samples = [(100, 99_000 + 500, 1_100 + 9_000), (5_000, 4_000 - 1_000_000 + 50, 5_100),
               (9_000, 8_000 - 1_000_000 + 4_000, 19_000)]
    off = best_offset(samples)
    assert off.offset_ns == 5_050 - (4_000 - 1_000_000 + 50)
    assert off.uncertainty_ns == 50
    moved = on_timeline(RequestRecord("r", "openai", "m", 10, 20, 30, t_end_ns=31,
                                      token_times_ns=(20, 30), server_sent_ns=(5, 6)), 1_000)
    assert (moved.t_send_ns, moved.token_times_ns, moved.t_end_ns) == (1_010, (1_020, 1_030),
                                                                          1_031)
    assert moved.server_sent_ns == (5, 6)  # the server's clock is not the worker's
    assert moved.ttft_s == pytest.approx(10 / NS)


@pytest.mark.parametrize("address", ["local", "auto", "ray://head:10001", "10.0.0.5:6379"])
def test_ray_addresses_in_every_form(address: str) -> None:
    assert check_ray_address(address) == address


@pytest.mark.parametrize("address", ["http://head:8265", "head", "ray://head", "head:99999",
                                     ":6379"])
def test_other_ray_addresses_are_refused(address: str) -> None:
    with pytest.raises(InputError, match="not a Ray address"):
        check_ray_address(address)


# ----------------------------------------------------------------- against the server


async def _one_process(url: str, stage: Stage) -> StageRun:
    async with new_session() as session:
        return await run_stage(session, Target(url, model="pdscope-reference"), ITEMS, stage,
                               timeouts=Timeouts(), sink=lambda f: None)


async def _workers(url: str, stage: Stage, n: int, sink: Any = None) -> StageRun:
    pool = await LocalPool(n).start()
    try:
        return await run_stage_workers(pool, Target(url, model="pdscope-reference"), ITEMS,
                                       stage, timeouts=Timeouts(), sink=sink or (lambda f: None))
    finally:
        await pool.close()


def _schedule(run: StageRun) -> dict[int, int]:
    """Each request's scheduled send, from its stage's start."""
    return {f.index: f.record.scheduled_ns - run.t0_ns for f in run.finished}


@pytest.mark.timeout(90)
def test_a_stage_counts_its_failures_and_tokens_as_they_come() -> None:
    # What a progress line reads while the stage runs: counted as each request finishes, in
    # this process and across workers, equal to what the finished records say at the end.
    config = ReferenceConfig(**FAST, faults=("http_500", "reset_mid_stream"),  # type: ignore[arg-type]
                             fault_rate=0.4, seed=5, fault_after_tokens=3)
    stage = Stage(concurrency=4, num_prompts=40)
    with run_in_subprocess(config) as url:
        runs = [asyncio.run(_one_process(url, stage)), asyncio.run(_workers(url, stage, 2))]
    for run in runs:
        failed = [f for f in run.finished if not f.record.ok]
        assert len(run.finished) == 40 and 0 < len(failed) < 40
        assert run.failed == len(failed)
        assert run.output_tokens == sum(f.record.output_tokens or 0 for f in run.finished) > 0


@pytest.mark.timeout(90)
def test_two_workers_send_the_same_requests_at_the_same_times_as_one(reference: str) -> None:
    stage = Stage(request_rate=40, num_prompts=60, seed=11)
    one = asyncio.run(_one_process(reference, stage))
    two = asyncio.run(_workers(reference, stage, 2))
    assert two.workers == 2 and not two.workers_lost
    assert sorted(f.index for f in two.finished) == list(range(60))
    assert all(f.record.ok for f in two.finished)
    # The same schedule, to the nanosecond, and each worker sent its own half of it.
    assert _schedule(two) == _schedule(one)
    assert {f.index % 2 for f in two.finished if f.worker == 1} == {1}
    assert Counter(f.worker for f in two.finished) == {0: 30, 1: 30}
    # ...and they went out on time (an event loop's timer may fire a little early): the start
    # was common, and came before the first send.
    lags = [f.record.schedule_lag_s for f in two.finished]
    assert min(lags) > -0.002  # type: ignore[type-var]
    assert float(np.median(lags)) < 0.005  # type: ignore[arg-type]


@pytest.mark.timeout(90)
def test_a_closed_loop_split_sends_every_request_once(reference: str) -> None:
    stage = Stage(concurrency=4, num_prompts=24, warmup=4)
    run = asyncio.run(_workers(reference, stage, 3))  # three workers, four streams
    assert run.workers == 3 and run.sent == 24
    assert sorted(f.index for f in run.finished) == list(range(24))
    assert sum(f.warmup for f in run.finished) == 4
    # Worker 0 has streams 0 and 3: twice the requests of the others.
    assert Counter(f.worker for f in run.finished) == {0: 12, 1: 6, 2: 6}
    assert run.max_in_flight <= 4


def _bench(url: str, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pdscope", "bench", url, "--input-len", "8", "--output-len",
            "10", "--no-metrics", "--out", str(out), "--json", *args]


@pytest.mark.timeout(90)
def test_the_summary_is_computed_from_every_raw_record(reference: str, tmp_path: Path) -> None:
    r = subprocess.run(_bench(reference, tmp_path, "--request-rate", "40", "--num-prompts", "80",
                              "--seed", "5", "--workers", "2"),
                       capture_output=True, text=True, timeout=80)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    lines = load_requests(tmp_path / "requests.jsonl")
    assert s["workers"] == 2 and s["sent"] == 80 == len(lines)
    assert s["completed"] + s["failed"] == s["sent"]
    assert {x["worker"] for x in lines} == {0, 1}
    assert json.loads((tmp_path / "workers.json").read_text())[1]["pid"] > 0
    ok = [x for x in lines if x["error_kind"] is None]
    ttft = [x["derived"]["ttft_s"] * 1000 for x in ok]
    itl = [(b - a) / 1e6 for x in ok
           for a, b in itertools.pairwise(x["token_times_ns"])]
    e2e = [x["derived"]["e2e_s"] * 1000 for x in ok]
    for name, values in (("ttft", ttft), ("itl", itl), ("e2el", e2e)):
        p50, p99 = np.percentile(values, [50, 99])
        assert s[f"median_{name}_ms"] == pytest.approx(p50, rel=1e-9), name
        assert s[f"p99_{name}_ms"] == pytest.approx(p99, rel=1e-9), name


@pytest.mark.timeout(120)
def test_a_killed_worker_loses_no_finished_record(reference: str, tmp_path: Path) -> None:
    """Worker 1 is killed by its pid 1.5 s into a 4 s open-loop run: the run ends by itself,
    every request it had finished is in requests.jsonl, and the rest of its half (in flight,
    or not sent yet) is counted failed with the cause worker_lost."""
    proc = subprocess.Popen(
        _bench(reference, tmp_path, "--request-rate", "40", "--num-prompts", "160", "--seed", "9",
               "--workers", "2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        jsonl = tmp_path / "requests.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if jsonl.exists() and len(load_requests(jsonl)) >= 20:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run did not start")
        time.sleep(1.0)
        victim = json.loads((tmp_path / "workers.json").read_text())[1]["pid"]
        killed_ns = time.perf_counter_ns()  # the same clock as the records', on one host
        os.kill(victim, signal.SIGKILL)
        before = {x["index"] for x in load_requests(jsonl) if x["worker"] == 1}
        out, err = proc.communicate(timeout=60)  # ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    s = json.loads(out)
    lines = load_requests(tmp_path / "requests.jsonl")
    assert sorted(x["index"] for x in lines) == list(range(160))  # each once, none missing
    assert s["sent"] == 160 and s["completed"] + s["failed"] == 160
    assert len(s["workers_lost"]) == 1 and "SIGKILL" in s["workers_lost"][0]
    assert "worker 1" in err and "worker_lost" in err
    lost = [x for x in lines if x["error_kind"] == "worker_lost"]
    assert s["failed_by_cause"] == {"worker_lost": len(lost)}
    assert {x["worker"] for x in lost} == {1} and {x["index"] % 2 for x in lost} == {1}
    # Worker 0 was not disturbed: its half all completed.
    assert all(x["error_kind"] is None for x in lines if x["worker"] == 0)
    # Nothing worker 1 had finished was lost: what was on file before the kill still is, OK,
    # and every request of its half due well before the kill (a request takes ~70 ms) had
    # finished and came through.
    ok_after = {x["index"] for x in lines if x["worker"] == 1 and x["error_kind"] is None}
    assert before <= ok_after
    due_early = {x["index"] for x in lines if x["index"] % 2 == 1
                 and x["scheduled_ns"] < killed_ns - int(0.5 * NS)}
    assert due_early and due_early <= ok_after
    # What it lost is what was in flight at the kill and what it had still to send.
    assert 160 / 2 * 0.4 < len(lost) < 160 / 2 * 0.8
    never_sent = [x for x in lost if x["t_send_ns"] is None]
    assert all(x["scheduled_ns"] > killed_ns - int(0.5 * NS) for x in lost)
    assert len(never_sent) >= len(lost) - 10


def test_finished_records_keep_their_worker() -> None:
    f = Finished(3, False, None, RequestRecord("r", "openai", "m", 1, 2, 3), worker=1)
    assert f.to_json("s")["worker"] == 1
