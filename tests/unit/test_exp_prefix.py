"""pdscope prefix against the reference server, which has no prefix cache: the A/B must say so,
and not find one in noise."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from pdscope.experiments import PrefixConfig, run_prefix
from pdscope.selftest import ReferenceConfig, run_in_subprocess

SCHEDULE = ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0.0001, itl_s=0.005)


def test_no_prefix_cache_on_a_server_without_one() -> None:
    config = PrefixConfig(prefix_tokens=1500, suffix_tokens=100, requests=4, max_tokens=4)
    with run_in_subprocess(SCHEDULE) as url:
        result = asyncio.run(run_prefix(url, config))
    assert result.prefix.tokens == 1500 and result.prompt_tokens == 1600
    # Every request of 1,600 tokens waits 0.02 + 0.16 s, shared prefix or not (give or take
    # the lateness of a busy machine).
    for record in (result.cold, *result.warm, *result.unique):
        assert record.ttft_s == pytest.approx(0.18, rel=0.15)
        assert record.prompt_tokens == 1600
    ratio = result.warm_over_unique
    assert ratio is not None and ratio == pytest.approx(1.0, abs=0.1)
    assert result.threshold == pytest.approx(1 - 0.5 * 1500 / 1600)
    assert result.prefix_cache_detected is False
    saved = result.ttft_saved_s
    assert saved is not None and abs(saved) < 0.02
    assert result.cached.source is None and result.server_reports_hits is None
    assert result.verdict.startswith("No prefix cache seen")
    out = result.to_json()
    assert out["ttft_a_cold_s"] == result.cold.ttft_s
    assert out["cached_tokens"]["share_of_prompt"] is None
    bars = next(c for c in out["charts"] if c["id"] == "prefix-ttft")
    assert bars["categories"] == ["A cold", "A warm", "B unique"]


def test_the_chat_api_sends_the_prefix_as_a_system_message() -> None:
    config = PrefixConfig(prefix_tokens=300, suffix_tokens=50, requests=2, max_tokens=4,
                          api="openai-chat")
    with run_in_subprocess(SCHEDULE) as url:
        result = asyncio.run(run_prefix(url, config))
    # The reference server counts the words of every message: system + user.
    assert result.prompt_tokens == 350
    assert result.prefix_cache_detected is False


def test_prefix_command_json_and_terminal() -> None:
    with run_in_subprocess(SCHEDULE) as url:
        r = subprocess.run(
            [sys.executable, "-m", "pdscope", "prefix", url, "--prefix-tokens", "400",
             "--suffix-tokens", "40", "--requests", "2", "--device", "h100-sxm", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["experiment"] == "prefix" and out["prefix_cache_detected"] is False
        assert out["prompt_tokens"] == 440 and out["prefix_tokens"] == 400
        t = subprocess.run(
            [sys.executable, "-m", "pdscope", "prefix", url, "--prefix-tokens", "400",
             "--suffix-tokens", "40", "--requests", "2", "--device", "h100-sxm"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert t.returncode == 0, t.stderr
    assert "prefix cache detected: no" in t.stdout
    assert "the server reports no cached-token count" in t.stdout
