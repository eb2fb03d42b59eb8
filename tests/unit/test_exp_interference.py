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
    assert after.gaps > 0
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
    assert len(out["timeline"]) == sum(len(r.token_times_ns) - 1 for r in result.streams)


def test_two_runs_of_one_workload_compare_and_others_do_not(reference: str) -> None:
    a, b = run(reference), run(reference)
    same = compare_interference(a, b, ("budget 256", "budget 2048"))
    assert same.comparable and same.differences == ()
    assert same.stall_s == (a.stall_s, b.stall_s)
    assert same.better in ("budget 256", "budget 2048")  # a tie is possible, but not likely
    assert "budget 256: the streams stalled" in same.summary
    longer = compare_interference(a, run(reference, inject=900))
    assert not longer.comparable and longer.better is None
    assert longer.differences == ("injected 1,800 vs 900 tokens",)


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
