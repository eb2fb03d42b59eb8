"""pdscope bench against the lab's vLLM: the client's TTFT agrees with vLLM's own histogram."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope import lab
from pdscope.metrics import VLLM, bucket_resolution, histogram_delta, quantile, scrape

pytestmark = pytest.mark.lab


def test_bench_ttft_agrees_with_vllms_histogram(vllm_server: lab.LabServer, tmp_path: Path) -> None:
    before = asyncio.run(scrape(vllm_server.url))
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "bench", vllm_server.url, "--num-prompts", "40",
         "--request-rate", "2", "--input-len", "256", "--output-len", "32", "--seed", "5",
         "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    after = asyncio.run(scrape(vllm_server.url))
    s = json.loads(r.stdout)
    assert s["completed"] == 40 and s["failed"] == 0
    assert s["total_input_tokens"] == 40 * 256 and s["total_output_tokens"] == 40 * 32

    names = VLLM.names("ttft")
    hist = histogram_delta(before.histogram(names), after.histogram(names))
    assert hist.count == 40  # the server saw exactly our requests in the window
    for q, key in ((0.5, "median_ttft_ms"), (0.9, "p90_ttft_ms"), (0.99, "p99_ttft_ms")):
        server = quantile(q, hist)
        lo, hi = bucket_resolution(q, hist)
        client = s[key] / 1000
        assert server is not None
        # The client's percentile falls in the bucket that holds the server's, give or take
        # what lies between them: the HTTP round trip and detokenizing, a few milliseconds, and
        # on a saturated 2-core machine the wait of the client and of vLLM's frontend for a core
        # behind the engine, which grows with the queue (CI once read a p99 of 2.68 s against a
        # 1.0-2.5 s bucket: 7% past it). A TTFT counted from the wrong moment or to the wrong
        # token is off by the whole queue or by many steps, far more than this.
        slack = 0.05 + 0.15 * hi
        assert lo - 0.01 <= client <= hi + slack, (q, client, server, lo, hi)
    # bench scraped the same window itself (metrics.jsonl beside requests.jsonl) and says so.
    own = s["server_metrics"]
    assert own["family"] == "vllm" and own["requests_finished"] == 40
    assert own["ttft_p50_s"] == pytest.approx(quantile(0.5, hist), rel=1e-6)
    assert (tmp_path / "metrics.jsonl").exists()
