"""pdscope watch and the metrics recorder on the lab's real vLLM, under more load than it admits.

The load: 10 streamed completions sent at once, each a different 1,400-word prompt (about
1,420 tokens). vLLM for CPU schedules at most 2,048 tokens a step (its default
``--max-num-batched-tokens`` on CPU; ``--max-num-seqs`` is 128 there and never binds), so it
takes one and a half prompts a step and the rest wait. The KV pool holds 93,184 tokens
(``VLLM_CPU_KVCACHE_SPACE=2``): 14,000 tokens fill about 15% of it. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from pdscope import lab
from pdscope.load.results import read_requests
from pdscope.metrics import (
    FULL_POOL_KV_USAGE,
    ThreadedMetricsRecorder,
    bracket,
    detect_metric_map,
    load_recording,
    make_window,
    recording_window,
    scrape,
)
from tests.lab.live import Watch

pytestmark = pytest.mark.lab

REQUESTS = 10
WORDS = 1400
MAX_TOKENS = 16
WINDOWS = 9
# Seconds a window. vLLM publishes its gauges (requests waiting among them) when a step ends, so
# no window sees the queue before the first step of 2,048 prompt tokens is done: about 1.3 s on
# a CPU with a bfloat16 dot product, 12 s on an AMD EPYC with AVX2 only (float32), where eight
# windows of a second all read 0 waiting in CI (2026-12-06). The first window ends before the
# load starts; eight of 4 s after it reach past 30.
WINDOW_S = 4
RUN = f"{time.time_ns():x}"
WORDS_POOL = (
    "prefill decode cache token prompt batch queue memory bandwidth compute server request "
    "stream latency scheduler block pool engine step model layer head attention"
).split()


@dataclass(frozen=True)
class Sent:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class WatchedLoad:
    windows: list[dict]
    watch_stderr: str
    watch_status: int
    sent: list[Sent]
    recording: Path
    load_start_t: float
    load_end_t: float


async def stream(session: aiohttp.ClientSession, url: str, model: str, index: int) -> Sent:
    rng = random.Random(1000 + index)
    # A prompt of its own each run: a server that has seen these prompts (the load run twice on
    # one server) serves them from its prefix cache, and the load is over in 2 s.
    prompt = f"Request {index} of run {RUN}: " + " ".join(
        rng.choice(WORDS_POOL) for _ in range(WORDS))
    body = {
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    usage: dict = {}
    async with session.post(
        url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)
    ) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return Sent(usage["prompt_tokens"], usage["completion_tokens"])


async def load(url: str, model: str) -> list[Sent]:
    async with aiohttp.ClientSession() as session:
        streams = (stream(session, url, model, i) for i in range(REQUESTS))
        return list(await asyncio.gather(*streams))


@pytest.fixture(scope="module")
def watched_load(
    vllm_server: lab.LabServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WatchedLoad]:
    """One load run, watched by `pdscope watch --json` and recorded beside it."""
    recording = tmp_path_factory.mktemp("watch") / "load.metrics.jsonl"
    with ThreadedMetricsRecorder(vllm_server.url, recording, interval=0.5):
        watch = Watch(vllm_server.url, "--count", str(WINDOWS), "--interval", str(WINDOW_S))
        try:
            # The load starts once the watch's first window (before it) is out: CI once had a
            # watch take its first scrape after a 15 s load had ended, and every window read 0.
            watch.first_window()
            start = time.monotonic()
            sent = asyncio.run(load(vllm_server.url, vllm_server.model))
            end = time.monotonic()
            status = watch.wait(timeout=WINDOWS * WINDOW_S + 60)
        finally:
            watch.kill()
    yield WatchedLoad(
        windows=watch.windows(),
        watch_stderr="".join(watch.errors),
        watch_status=status,
        sent=sent,
        recording=recording,
        load_start_t=start,
        load_end_t=end,
    )


def test_watch_shows_requests_waiting_and_says_why(watched_load: WatchedLoad) -> None:
    assert watched_load.watch_status == 0, watched_load.watch_stderr
    windows = watched_load.windows
    assert len(windows) == WINDOWS
    assert all(w["family"] == "vllm" for w in windows)
    # More prompt tokens than a step takes: some window saw requests waiting.
    assert max(w["num_requests_waiting"] for w in windows) > 0
    for w in windows:
        waiting, kv = w["num_requests_waiting"], w["kv_cache_usage"]
        assert waiting is not None and kv is not None
        # The rule: nobody waiting is "none"; waiting with the pool at least FULL_POOL_KV_USAGE
        # full is "capacity", below it "scheduler".
        if waiting == 0:
            assert w["queueing"] == "none"
        elif kv >= FULL_POOL_KV_USAGE:
            assert w["queueing"] == "capacity"
        else:
            assert w["queueing"] == "scheduler"
        # A null is never a 0 in disguise: each has its reason.
        assert set(w["missing"]) == {key for key, value in w.items() if value is None}
    # This lab's pool is far from full, so the queueing it sees is the scheduler's.
    assert max(w["kv_cache_usage"] for w in windows) < FULL_POOL_KV_USAGE
    assert "scheduler" in {w["queueing"] for w in windows}


def test_watch_percentiles_lie_in_their_buckets(watched_load: WatchedLoad) -> None:
    read = [
        (w[key], w["resolution"][key])
        for w in watched_load.windows
        for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
        if w[key] is not None
    ]
    assert read, "no window saw a first token or a generated token"
    for value, (lower, upper) in read:
        if upper is None:
            # Past the last finite bound (+Inf): Prometheus' rule gives that bound itself.
            assert value == lower
        else:
            assert lower <= value <= upper


def test_the_recording_accounts_for_the_whole_load(watched_load: WatchedLoad) -> None:
    snapshots = load_recording(watched_load.recording)
    assert len(snapshots) >= 4
    first, last = bracket(snapshots, watched_load.load_start_t, watched_load.load_end_t)
    w = recording_window(snapshots, first=first, last=last)
    assert w.family == "vllm"
    # The server's own account of the run matches what the client sent and received.
    assert w.requests_finished == REQUESTS
    assert w.generation_tokens_per_s is not None and w.prompt_tokens_per_s is not None
    generated = w.generation_tokens_per_s * w.duration_s
    assert generated == pytest.approx(REQUESTS * MAX_TOKENS)
    assert sum(s.completion_tokens for s in watched_load.sent) == REQUESTS * MAX_TOKENS
    prompted = w.prompt_tokens_per_s * w.duration_s
    assert prompted == pytest.approx(sum(s.prompt_tokens for s in watched_load.sent))
    # While the load ran, some scrape saw requests waiting.
    assert max(s.gauge("vllm:num_requests_waiting") or 0 for s in snapshots) > 0


def test_watch_once_prints_the_dashboard(vllm_server: lab.LabServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "watch", vllm_server.url + "/v1", "--once",
         "--interval", "1"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "120"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"vLLM {vllm_server.url}/metrics  window ")
    rows = [line.split()[0] for line in r.stdout.splitlines() if line]
    for label in ("running", "waiting", "KV-cache", "TTFT", "ITL", "queueing", "preemptions"):
        assert label in rows, label
    assert "the five names: vllm:num_requests_running" in r.stdout


def test_llama_server_s_slots_fill_and_the_rest_are_deferred(llamacpp_server: lab.LabServer,
                                                            tmp_path: Path) -> None:
    """Eight users on four slots: watch shows every slot busy and requests deferred
    (``llamacpp:requests_processing``, ``llamacpp:requests_deferred``), bench's own record of
    /metrics says the same, and on the client the waiting half shows in the TTFT."""
    # Watched from before the bench starts until it is done, then stopped as a user stops it.
    live = Watch(llamacpp_server.url, "--count", "300", "--interval", "1")
    live.first_window()
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "bench", llamacpp_server.url, "--concurrency", "8",
         "--num-prompts", "12", "--input-len", "200", "--output-len", "32",
         "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert live.stop() == 0, "".join(live.errors)
    assert r.returncode == 0, r.stderr
    bench = json.loads(r.stdout)
    windows = live.windows()
    assert max(w["num_requests_running"] for w in windows) == 4  # the lab's -np 4
    assert max(w["num_requests_waiting"] for w in windows) > 0
    peak = bench["server_metrics"]["peak"]
    assert peak["num_requests_running"] == 4 and peak["num_requests_waiting"] > 0, peak
    # Half the requests wait for a whole request's time before their prefill starts.
    assert bench["p99_ttft_ms"] > bench["median_tpot_ms"] * 32 * 0.5, bench


def test_watch_beside_bench_queues_and_agrees_with_the_clients_ttft(
    vllm_server: lab.LabServer, tmp_path: Path
) -> None:
    """`pdscope bench` loads the server with eight times the prompt tokens a step admits; a watch
    shows the queue second by second until it is stopped, and the server's own window around the
    whole run (two scrapes, as watch takes them) puts the client's median TTFT in its bucket."""
    # A watch for longer than the run on a machine several times slower than this one, from
    # before the bench starts, stopped (Ctrl-C) when it is done: its windows by then are all kept.
    live = Watch(vllm_server.url, "--count", "300", "--interval", "1")
    live.first_window()
    before = asyncio.run(scrape(vllm_server.url))
    # Sixteen prompts of 600 tokens: 9,600 prompt tokens against a step of 2,048, so requests wait
    # through four steps (vLLM publishes its gauges when a step ends). Eight of them kept a queue
    # for one step only, about a second on a CPU with a bfloat16 dot product, which the scrapes
    # of a busy 2-core machine missed in CI (2026-12-07); sixteen kept it in 4 to 5 windows here,
    # 9 beside a busy core.
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "bench", vllm_server.url, "--concurrency", "16",
         "--num-prompts", "16", "--input-len", "600", "--output-len", "16", "--no-metrics",
         "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    after = asyncio.run(scrape(vllm_server.url))
    assert live.stop() == 0, "".join(live.errors)
    assert r.returncode == 0, r.stderr
    bench = json.loads(r.stdout)
    live_windows = live.windows()
    assert max(w["num_requests_waiting"] for w in live_windows) > 0, live_windows
    waiting = [w for w in live_windows if w["num_requests_waiting"]]
    assert all(w["queueing"] == "scheduler" for w in waiting)  # the pool stays far from full
    family = detect_metric_map(before.names)
    assert family is not None and family.name == "vllm"
    window = make_window(before, after, family)
    assert window.requests_finished == 16
    lower, upper = window.resolution["ttft_p50_s"]
    # vLLM's TTFT buckets are finite up to 2,560 s: a median of a few seconds is in one of
    # them, never in +Inf (whose missing upper bound would leave the client's figure unchecked).
    assert math.isfinite(upper), window.resolution
    # A histogram's p50 is read in the bucket that holds the request of rank ceil(0.5 n) (the 8th
    # of 16, as Prometheus' histogram_quantile ranks), while the client's median is halfway
    # between the 8th and the 9th; long prompts finish their prefill in steps, so those two can
    # lie in different buckets (2.58 s median against a bucket ending at 2.5 s, on a fast CPU).
    # The client's own 8th TTFT lies in the server's bucket, give or take the few milliseconds
    # of HTTP and tokenizing between the two clocks.
    ttfts = sorted(r.record.ttft_s for r in read_requests(tmp_path / "requests.jsonl")
                   if not r.warmup and r.record.ttft_s is not None)
    assert len(ttfts) == 16, ttfts
    client = ttfts[math.ceil(0.5 * len(ttfts)) - 1]
    assert lower - 0.01 <= client <= upper + 0.05, (lower, upper, ttfts)
    assert abs(bench["median_ttft_ms"] / 1000 - statistics.median(ttfts)) < 1e-6
