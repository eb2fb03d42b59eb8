"""pdscope interference against the reference server, whose streams are independent: a long
prompt landing among them must show no stall."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pdscope.experiments import (
    InterferenceComparison,
    InterferenceConfig,
    InterferenceResult,
    compare_interference,
    run_interference,
)
from pdscope.selftest import ReferenceConfig, run_in_subprocess

ITL = 0.02
SCHEDULE = ReferenceConfig(ttft_base_s=0.05, ttft_per_token_s=0.0002, itl_s=ITL)


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(SCHEDULE) as url:
        yield url


def run(url: str, inject: int = 1800) -> InterferenceResult:
    config = InterferenceConfig(streams=3, stream_tokens=64, inject_tokens=inject,
                                settle_tokens=16, seed=5)
    return asyncio.run(run_interference(url, config))


def test_independent_streams_do_not_stall(reference: str) -> None:
    result = run(reference)
    assert result.inject_tokens == 1800
    assert result.inject_ttft_s == pytest.approx(0.05 + 0.0002 * 1800, rel=0.1)
    before, during, after = result.windows()
    # Every stream had 16 tokens before the send: about 15 gaps each after all were decoding.
    assert before.gaps >= 3 * 10
    # 0.41 s of prefill at 20 ms a token: about 21 gaps a stream during it.
    assert 3 * 18 <= during.gaps <= 3 * 24
    # A stream with k tokens at the send gets token k + j about j x 20 ms after it; the gaps
    # that start after the 0.41 s prefill (20.5 steps) are those of tokens k + 21 to 63: about
    # 42.5 - k a stream (27 at k = 16: 81 in all), give or take a token for the phase. k is
    # counted, not assumed: a busy machine can send the injection a few tokens late.
    at_send = [sum(t < result.t0_ns for t in r.token_times_ns) for r in result.streams]
    assert all(k >= 16 for k in at_send), at_send
    assert abs(after.gaps - sum(42.5 - k for k in at_send)) <= 3 * 1.5, (after.gaps, at_send)
    assert result.stall_s is not None and result.stall_s < 2.5 * ITL
    assert during.itl_p50_s == pytest.approx(ITL, rel=0.1)
    assert result.stalled is False
    stalls = result.stall_by_stream()
    assert len(stalls) == 3 and all(s is not None and s < 2.5 * ITL for s in stalls)
    out = result.to_json()
    assert out["stall_share_of_inject_ttft"] < 0.1
    chart = out["charts"][0]
    assert chart["spans"][0]["start"] == 0.0
    assert chart["spans"][0]["end"] == pytest.approx(result.inject_ttft_s)
    assert [s["name"] for s in chart["series"][:3]] == ["stream 1", "stream 2", "stream 3"]
    # 3 streams of 64 tokens, one token a chunk: 63 gaps each.
    assert [len(r.token_times_ns) for r in result.streams] == [64, 64, 64]
    assert len(out["timeline"]) == 3 * 63


def test_two_runs_of_one_workload_compare_and_others_do_not(reference: str) -> None:
    a, b = run(reference), run(reference)
    same = compare_interference(a, b, ("budget 256", "budget 2048"))
    assert same.comparable and same.differences == ()
    assert same.stall_s == (a.stall_s, b.stall_s)
    # Which run did better is worked on stated stalls below; real ones differ by jitter only.
    assert "budget 256: the streams stalled" in same.summary
    longer = compare_interference(a, run(reference, inject=900))
    assert not longer.comparable and longer.better is None
    assert longer.differences == ("injected 1,800 vs 900 tokens",)


def comparison(stalls: tuple[float | None, float | None], *differences: str
               ) -> InterferenceComparison:
    return InterferenceComparison(("budget 256", "budget 2048"), stalls, (0.05, 0.3),
                                  (0.41, 0.42), not differences, differences)


def test_the_run_whose_streams_stalled_less_did_better() -> None:
    assert comparison((0.4, 2.1)).better == "budget 256"
    assert comparison((2.1, 0.4)).better == "budget 2048"
    assert comparison((0.4, 0.4)).better is None  # a tie
    assert comparison((None, 0.4)).better is None  # one run had no gap in the window
    assert comparison((0.4, 2.1), "injected 1,800 vs 900 tokens").better is None
    assert comparison((0.4, 2.1)).summary == (
        "budget 256: the streams stalled 0.40 s (the injected prompt's TTFT 0.41 s);"
        " budget 2048: 2.10 s (TTFT 0.42 s)")
    assert comparison((0.4, 2.1)).to_json()["better"] == "budget 256"


def test_interference_command_json(reference: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "interference", reference, "--streams", "2",
         "--stream-tokens", "40", "--inject-tokens", "500", "--device", "h100-sxm", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["experiment"] == "interference" and out["stalled"] is False
    assert out["signature"]["inject_tokens"] == 500 and out["signature"]["streams"] == 2
    for key in ("before", "during", "after"):
        assert set(out[key]) == {"gaps", "itl_p50_s", "itl_p99_s", "max_gap_s"}


def test_settle_must_leave_room_to_decode() -> None:
    r = subprocess.run([sys.executable, "-m", "pdscope", "interference", "http://127.0.0.1:9",
                        "--stream-tokens", "20"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "at least twice --settle-tokens (32)" in r.stderr
