"""pdscope prefix on the lab's vLLM, started with its defaults (prefix caching on), and on
llama-server with its prompt cache on (the default) and off (``--no-cache-prompt``)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def pdscope_json(*args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "pdscope", *args, "--json"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_vllm_skips_the_prefill_of_a_repeated_system_prompt(vllm_server: lab.LabServer) -> None:
    out = pdscope_json("prefix", vllm_server.url, "--prefix-tokens", "1500",
                       "--suffix-tokens", "100", "--requests", "3")
    assert out["server"] == "vllm" and out["prompt_tokens"] == 1600
    assert out["prefix_cache_detected"] is True
    # The cache saves most of the prefill: warm requests wait well under half of a unique one.
    assert out["ttft_saved_s"] > 0
    assert out["ttft_a_warm_s"] < 0.5 * out["ttft_b_s"]
    # vLLM 0.32 leaves cached_tokens out of usage by default: the count comes from /metrics.
    cached = out["cached_tokens"]
    assert cached["source"] == "metrics"
    assert cached["metric"] == "vllm:prefix_cache_hits_total"
    # Whole cache blocks of the prefix are hit (128 tokens a block on CPU: 1,408 of 1,500).
    assert 0.8 * 1500 <= cached["a_warm_median"] <= 1500
    assert cached["a_cold"] == 0 and cached["b_median"] == 0
    assert out["server_reports_hits"] is True


def test_a_chat_system_message_is_cached_too(vllm_server: lab.LabServer) -> None:
    out = pdscope_json("prefix", vllm_server.url, "--api", "openai-chat", "--prefix-tokens",
                       "1000", "--suffix-tokens", "50", "--requests", "2")
    assert out["api"] == "openai-chat"
    assert out["prompt_tokens"] > 1050  # the chat template adds its own tokens
    assert out["prefix_cache_detected"] is True
    assert out["cached_tokens"]["a_warm_median"] >= 0.8 * 1000


def test_llama_server_s_prompt_cache_on_and_off(llamacpp_server: lab.LabServer) -> None:
    # A 400-token prefix: llama-server prefills ~200 tokens a second on a 2-core Xeon, and the
    # cache's effect is the whole prefix either way (1,000 tokens took 92-106 s of this test).
    args = ("--prefix-tokens", "400", "--suffix-tokens", "50", "--requests", "3")
    on = pdscope_json("prefix", llamacpp_server.url, *args)
    with lab.running("llamacpp", port=0, extra_args=["--no-cache-prompt"]) as no_cache:
        off = pdscope_json("prefix", no_cache.url, *args)
    assert on["server"] == off["server"] == "llama.cpp"
    # The server's own count (each response's timings.cache_n): the slot kept the prefix...
    assert on["cached_tokens"]["source"] == "server-timings"
    assert on["prefix_cache_detected"] is True and on["server_reports_hits"] is True
    assert 0.9 * 400 <= on["cached_tokens"]["a_warm_median"] <= 450
    # ...and with the cache off, it computed every prompt token again.
    assert off["cached_tokens"]["a_warm_median"] == 0 and off["server_reports_hits"] is False
    # What the cache is for: a warm request waits a fraction of its uncached twin's TTFT
    # (0.26 s against 2.8 s measured here; half leaves room for a busy machine).
    assert on["ttft_a_warm_s"] < 0.5 * off["ttft_a_warm_s"]
