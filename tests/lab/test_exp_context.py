"""pdscope context on the lab's vLLM: decode slows as the context fills."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def test_decode_slows_as_the_context_fills(vllm_server: lab.LabServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "context", vllm_server.url, "--prompt-tokens",
         "100,3000", "--max-tokens", "128", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # 128 tokens in bins of 32 after each of two prompts: four bins a prompt.
    assert len(out["bins"]) == 8
    # Every step reads the whole KV cache: 3,000 more tokens of it make the steps longer.
    assert out["fit"]["beta_s_per_token"] > 0 and out["fit"]["beta_resolved"] is True
    assert out["last"]["decode_tok_s"] < out["first"]["decode_tok_s"]
    # The roofline's slope: SmolLM2 caches 2 x 30 layers x 3 KV heads x 64 x 2 bytes a token.
    assert out["roofline"]["kv_bytes_per_token"] == 23_040
    assert out["roofline"]["beta_predicted_s_per_token"] == pytest.approx(
        23_040 / (out["mem_bandwidth_gb_s"] * 1e9))
    assert out["last"]["decode_ceiling_tok_s"] < out["first"]["decode_ceiling_tok_s"]
