"""pdscope context against the reference server, whose ITL does not depend on the context: the
slope must come out flat. And the roofline's slope, worked out by hand."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from pdscope.experiments import CeilingInputs, ContextConfig, run_context
from pdscope.experiments.context import context_bins
from pdscope.hardware import find_device
from pdscope.model import load_model
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from tests.conftest import MODEL_CONFIGS

SCHEDULE = ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0.00002, itl_s=0.02)


def test_a_flat_itl_gives_a_flat_slope_and_the_roofline_gives_its_own() -> None:
    config = ContextConfig(prompt_tokens=(100, 3000), max_tokens=64, bin_tokens=16, seed=1)
    with run_in_subprocess(SCHEDULE) as url:
        result = asyncio.run(run_context(url, config))
    bins = result.bins
    assert len(bins) == 8  # 63 gaps a request: four bins of 16 (the last of 15)
    assert bins[0].context == pytest.approx(100 + 7.5 + 1)
    assert all(b.decode_tok_s == pytest.approx(50, rel=0.05) for b in bins)
    fit = result.fit
    assert fit is not None
    alpha, beta = fit.coef
    assert alpha == pytest.approx(0.02, rel=0.05)
    # Over the 3,000 tokens measured the line moves less than 3 % of a step.
    assert abs(beta) * 3000 < 0.03 * alpha
    slowdown = result.slowdown
    assert slowdown is not None and abs(slowdown) < 0.05
    assert result.slope_predicted is None  # no model, no device: no roofline

    # Set beside Llama-3.1-8B on an H100: one more token of context adds 131,072 bytes to
    # every step's read, at 3,350 GB/s.
    model = load_model(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
    device = find_device("h100-sxm")
    placed = replace(result, ceiling=CeilingInputs(device, model, "test"))
    assert placed.slope_predicted == pytest.approx(131_072 / 3350e9)
    out = placed.to_json()
    assert out["roofline"]["kv_bytes_per_token"] == 131_072
    first = out["first"]
    # Llama-3.1-8B reads 7,504,928,768 weights a decode step: per layer attention 2 x 4096^2 +
    # 2 x 4096 x 1024 = 41,943,040 and MLP 3 x 4096 x 14336 = 176,160,768, norms 2 x 4096:
    # 218,112,000 x 32 layers = 6,979,584,000; plus the final norm 4,096, the untied LM head
    # 128,256 x 4096 = 525,336,576, and one embedding row 4,096. At 2 bytes: 15,009,857,536 B.
    # The first bin stands at context 108.5, rounded (to even) to 108 tokens of 131,072 B:
    # 14,155,776 B more. 3,350e9 / 15,024,013,312 = 222.98 tok/s.
    assert first["decode_ceiling_tok_s"] == pytest.approx(
        3350e9 / (15_009_857_536 + 131_072 * 108))
    decode_chart = next(c for c in out["charts"] if c["id"] == "context-decode")
    ceiling = next(s for s in decode_chart["series"] if s["name"].startswith("decode ceiling"))
    assert len(ceiling["x"]) == len(bins) and ceiling["y"][0] > ceiling["y"][-1]


def test_context_asks_for_two_bins_at_least() -> None:
    r = subprocess.run([sys.executable, "-m", "pdscope", "context", "http://127.0.0.1:9",
                        "--max-tokens", "40"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--max-tokens must be at least two bins (64 tokens)" in r.stderr


def test_context_json_from_the_command() -> None:
    with run_in_subprocess(SCHEDULE) as url:
        r = subprocess.run(
            [sys.executable, "-m", "pdscope", "context", url, "--prompt-tokens", "50",
             "--max-tokens", "64", "--bin-tokens", "16", "--device", "h100-sxm", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["experiment"] == "context" and len(out["bins"]) == 4
    assert out["output_tokens"] == [64]
    assert {c["id"] for c in out["charts"]} == {"context-decode", "context-itl"}


def test_a_bin_of_bursty_gaps_keeps_its_step_time() -> None:
    # Tokens delivered four at a time, 40 ms apart: three gaps in four are 0, so the median
    # is 0; the bin's step time is still the mean, 10 ms.
    gaps = tuple([0.0, 0.0, 0.0, 0.04] * 8)
    [b] = context_bins([(100, gaps, 0)], bin_tokens=32)
    assert b.itl_median_s == pytest.approx(0.01)
    assert b.samples == 32
