"""pdscope probe against the real lab servers: the article's "see it in one minute"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdscope import lab
from pdscope.model import load_model

pytestmark = pytest.mark.lab


def probe(url: str, *args: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "probe", url, "--json", *args],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_ten_times_longer_prompt_raises_ttft_not_the_decode_rate(
    vllm_server: lab.LabServer,
) -> None:
    short = probe(vllm_server.url, "--prompt-tokens", "200", "--max-tokens", "64", "--runs", "3")
    long = probe(vllm_server.url, "--prompt-tokens", "2000", "--max-tokens", "64", "--runs", "3")
    for result, asked in ((short, 200), (long, 2000)):
        assert abs(result["prompt_tokens"] - asked) <= 0.01 * asked
        assert result["token_count_source"] == "usage"
        assert result["output_tokens"] == 64  # ignore_eos: decode runs as long as asked
    # The article: the TTFT grows a lot; the streaming speed after it barely changes.
    assert long["ttft_s"] >= 2 * short["ttft_s"]
    assert abs(long["decode_tok_s"] - short["decode_tok_s"]) < 0.3 * short["decode_tok_s"]


def test_the_lab_probe_is_set_beside_the_measured_cpu_and_the_real_weights(
    vllm_server: lab.LabServer,
) -> None:
    out = probe(vllm_server.url, "--prompt-tokens", "300", "--max-tokens", "32", "--runs", "2")
    assert out["server"] == "vllm" and out["device_measured"] is True
    model = load_model(lab.model_path_for(lab.get_engine("vllm")))
    assert out["weight_bytes_read_per_token"] == model.read_weight_bytes()
    # The fraction is the measured decode rate over bandwidth / (weights + KV at the context).
    assert out["decode_fraction_of_ceiling"] == pytest.approx(
        out["decode_tok_s"] / out["decode_ceiling_tok_s"]
    )
    assert 0 < out["decode_fraction_of_ceiling"] < 1.5
    assert out["verdict"].startswith("Decode runs at")


def test_llamacpp_without_usage_counts_tokens_with_its_tokenizer(
    llamacpp_server: lab.LabServer,
) -> None:
    out = probe(llamacpp_server.url, "--prompt-tokens", "200", "--max-tokens", "32",
                "--runs", "2")
    assert out["server"] == "llama-cpp-python"
    assert out["token_count_source"] == "server-tokenizer"
    assert out["prompt_tokens"] == 200
    assert 0 < out["output_tokens"] <= 40
    assert out["decode_tok_s"] > 0 and out["ttft_s"] > 0
    # It serves the GGUF: the ceiling reads the file's real (quantized) bytes.
    assert out["model_source"].endswith(".gguf")
    assert out["weight_bytes_read_per_token"] < 0.8 * 134.5e6 * 2


def test_probe_terminal_output_says_where_counts_came_from(
    llamacpp_server: lab.LabServer,
) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "probe", llamacpp_server.url, "--runs", "1",
         "--prompt-tokens", "100", "--max-tokens", "16"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "counted from: server-tokenizer" in r.stdout
    assert "of ceiling" in r.stdout
