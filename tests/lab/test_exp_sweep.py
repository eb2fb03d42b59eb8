"""pdscope sweep on the lab's vLLM: the article's claims about prompt length, measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdscope import lab
from pdscope.experiments.sweep import DOUBLING_SLACK
from tests.noise import Runs, change_range, lack_of_fit, ratio_range

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
    # Every timing bound below is read against the runs' own spread (tests/noise.py: each
    # median give or take half its runs' range): a busy shared machine widens the spread, and
    # a claim fails only when no reading within it supports the claim.
    ttft = {n: Runs.from_spread(p["spread"]["ttft_s"]) for n, p in points.items()}
    decode = {n: Runs.from_spread(p["spread"]["decode_tok_s"]) for n, p in points.items()}
    a = max(out["fit"]["a_s"], 0.0)
    # TTFT(2000) − a >= 2 × (TTFT(1000) − a), a the fitted overhead, give or take the slack
    # pdscope allows for the noise that three runs' range understates (×2.61 in the lab's
    # sweep in docs/experiments.md).
    _, doubling = ratio_range(ttft[2000], ttft[1000], offset=a)
    assert doubling >= 2 - DOUBLING_SLACK, (doubling, ttft[2000], ttft[1000], a)
    assert out["checks"]["doubling_at_least_doubles_prefill"] is True
    assert out["fit"]["b_s_per_token"] > 0
    # The fit describes the TTFT: its R² is capped by the runs' scatter at each length (0.914
    # on a busy machine), so the curve is judged on what it misses beyond that scatter: at most
    # 5 % of the variance (the former "R² > 0.95"), or a miss the F-test cannot tell from noise.
    fit = out["fit"]
    lof = lack_of_fit([p["spread"]["ttft_s"] for p in out["points"]], fit["r2"],
                      params=3 if fit["kind"] == "quadratic" else 2)
    assert lof.fits(), str(lof)
    # The TTFT grows with the prompt far beyond its fixed part: more than fivefold from 200 to
    # 2,000 tokens (×14.6 in docs/experiments.md; ×9.4 on an AMD EPYC with AVX-512 BF16, whose
    # faster prefill leaves the fixed part a larger share at 200 tokens); the
    # decode rate moves far less. On this lab it drops 16-33 % (measured over repeated runs on two
    # shared cores): a 135M model's KV cache is large beside its weights (23 KB a token against
    # 269 MB) and the CPU attention kernel costs several times its bytes, so the bound is 40 %,
    # not the 30 % the check uses for "barely" (an 8B model on a GPU moves under 5 %).
    _, growth = ratio_range(ttft[2000], ttft[200])
    assert growth > 5, (growth, ttft[2000], ttft[200])
    lowest_change = max(change_range(decode[n], decode[200])[0] for n in (1000, 2000))
    assert lowest_change < 0.4, (lowest_change, decode)
    change = out["checks"]["decode_rate_change"]
    assert out["checks"]["decode_rate_barely_moves"] is (change < 0.3)
    # The lab's geometry and this CPU are known: the roofline's numbers are attached.
    assert out["attention_share_tokens"] > 0
    assert all(p["decode_ceiling_tok_s"] > p["decode_tok_s"] for p in points.values())
