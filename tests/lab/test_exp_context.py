"""pdscope context on the lab's llama-server: decode slows as the context fills.

llama-server rather than vLLM: its decode step is short (the GGUF's 4-bit weights), so the KV
cache's share of it is large enough to read on every CPU. On vLLM (float32 or bfloat16
weights, a ~45 ms step mostly its own overhead) 3,700 more tokens of context add a few ms, and
a CI run on a busy machine read the slope as -1.2e-6 +- 1.2e-6 s a token (2026-12-06); vLLM's
prefill of 3,800 tokens five times also took this test 3.5 minutes on an AMD EPYC with AVX2
only (float32, 170 prompt tokens a second)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def test_decode_slows_as_the_context_fills(llamacpp_server: lab.LabServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "context", llamacpp_server.url, "--prompt-tokens",
         "100,2400", "--max-tokens", "128", "--runs", "3", "--json", "--raw"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # 128 tokens (127 gaps, 0..126) in bins of 32 after each of two prompts, four runs pooled:
    # four bins a prompt, less the start of the answer that the first read brought whole when
    # vLLM's API server was short of CPU (those tokens have no gaps; chunks read at one instant
    # are one write). A block keeps its bin when a quarter of it (8 gaps) was measured, and the
    # bin starts at its first gap and ends at its last. The stream's tokens are the chunks'
    # count: a token whose text is not whole yet (part of a UTF-8 character) comes in a chunk
    # with empty text (vLLM's completion/serving.py sends one while it has token ids). The
    # client counts it with the next chunk (by the running usage); before it did, an answer
    # read 127 chunk tokens (CI, 2026-12-06: 123 gaps where 124 were expected).
    gaps: dict[int, list[int]] = defaultdict(list)
    for q in out["requests"][1:]:  # the first request is the cold one
        times, ks = q["token_times_ns"], q["chunk_tokens"]
        first_write = sum(k for t, k in zip(times, ks, strict=True) if t == times[0])
        assert q["output_tokens"] == 128 and 96 <= sum(ks) <= 128, (q["output_tokens"], sum(ks))
        gaps[q["prompt_tokens"]] += range(first_write - 1, sum(ks) - 1)
    assert sorted(gaps) == [100, 2400]
    for prompt, js in gaps.items():
        blocks = Counter(j // 32 for j in js)
        want = [(min(j for j in js if j // 32 == k), max(j for j in js if j // 32 == k), n)
                for k, n in sorted(blocks.items()) if n >= 8]
        got = [(b["first_position"], b["last_position"], b["samples"])
               for b in out["bins"] if b["prompt_tokens"] == prompt]
        assert got == want and got, prompt
    # Every step reads the whole KV cache: 2,300 more tokens of it make the steps longer (23 KB
    # a token: 53 MB more a step). On llama-server, AMD EPYC with AVX2 only (2026-12-06), with
    # 3,800 tokens and four runs: 31 ms a step after the short prompt, 63-68 ms after the long
    # one, a slope of 9.1e-6 s/token at 26 standard errors; the command took 171 s, most of it
    # the long prompts' prefill. A range 0.62 times as wide and three runs a prompt leave some
    # 14 standard errors, against the 2 the fit asks for. On vLLM, a ~45 ms step mostly its own
    # overhead, the same command read 5.4e-6 and 5.5e-6 at 26 standard errors on one machine
    # and -1.2e-6 +- 1.2e-6 in CI on another.
    assert out["fit"]["beta_s_per_token"] > 0 and out["fit"]["beta_resolved"] is True, (
        out["fit"], [(b["context"], b["itl_median_s"]) for b in out["bins"]])
    assert out["last"]["decode_tok_s"] < out["first"]["decode_tok_s"]
    # The roofline's slope: SmolLM2 caches 2 x 30 layers x 3 KV heads x 64 x 2 bytes a token.
    assert out["roofline"]["kv_bytes_per_token"] == 23_040
    assert out["roofline"]["beta_predicted_s_per_token"] == pytest.approx(
        23_040 / (out["mem_bandwidth_gb_s"] * 1e9))
    assert out["last"]["decode_ceiling_tok_s"] < out["first"]["decode_ceiling_tok_s"]
