"""pdscope interference on the lab's vLLM (default budget: 2,048 tokens a step) and llama-server
(4 slots, -b 2048)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def test_a_long_prompt_stalls_the_decoding_streams(vllm_server: lab.LabServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "interference", vllm_server.url, "--streams", "4",
         "--inject-tokens", "1800", "--stream-tokens", "192", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["inject_tokens"] == 1800
    assert out["before"]["gaps"] > 0 and out["after"]["gaps"] > 0
    # The longest gap while the prompt was prefilled beats the p99 of the gaps before it ...
    assert out["during"]["max_gap_s"] > out["before"]["itl_p99_s"]
    assert out["stalled"] is True
    # ... and, with 1,800 + 4 tokens inside one 2,048-token step, is most of that prefill.
    assert out["stall_share_of_inject_ttft"] > 0.5


def test_a_long_prompt_stalls_llama_server_s_busy_slots(llamacpp_server: lab.LabServer) -> None:
    # llama-server batches every busy slot's next token with up to -b (2,048) prompt tokens in
    # one llama_decode call (server-context.cpp, update_slots): a 1,000-token prompt landing on
    # two decoding slots is one long step for both.
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "interference", llamacpp_server.url, "--streams", "2",
         "--inject-tokens", "1000", "--stream-tokens", "64", "--settle-tokens", "8", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stalled"] is True
    assert out["during"]["max_gap_s"] > 3 * out["before"]["itl_p99_s"], out
