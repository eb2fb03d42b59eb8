"""pdscope sweep on the lab's vLLM: the article's claims about prompt length, measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def test_doubling_the_prompt_at_least_doubles_the_prefill(vllm_server: lab.LabServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "sweep", vllm_server.url, "--prompt-tokens",
         "200,1000,2000", "--max-tokens", "48", "--runs", "3", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    points = {p["prompt_tokens"]: p for p in out["points"]}
    assert sorted(points) == [200, 1000, 2000]
    assert all(p["output_tokens"] == 48 for p in points.values())
    a = max(out["fit"]["a_s"], 0.0)
    # Exactly: median TTFT(2000) − a >= 2 × (median TTFT(1000) − a), a the fitted overhead.
    assert points[2000]["ttft_s"] - a >= 2 * (points[1000]["ttft_s"] - a)
    assert out["checks"]["doubling_at_least_doubles_prefill"] is True
    assert out["fit"]["b_s_per_token"] > 0 and out["fit"]["r2"] > 0.95
    # The TTFT grows more than tenfold from 200 to 2,000 tokens; the decode rate moves far
    # less. On this lab it drops 16-33 % (measured over repeated runs on two shared cores): a
    # 135M model's KV cache is large beside its weights (23 KB a token against 269 MB) and the
    # CPU attention kernel costs several times its bytes, so the bound is 40 %, not the 30 % the
    # check uses for "barely" (an 8B model on a GPU moves under 5 %).
    assert points[2000]["ttft_s"] > 10 * points[200]["ttft_s"]
    change = out["checks"]["decode_rate_change"]
    assert change < 0.4
    assert out["checks"]["decode_rate_barely_moves"] is (change < 0.3)
    # The lab's geometry and this CPU are known: the roofline's numbers are attached.
    assert out["attention_share_tokens"] > 0
    assert all(p["decode_ceiling_tok_s"] > p["decode_tok_s"] for p in points.values())
