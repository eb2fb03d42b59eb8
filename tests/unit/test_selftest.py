"""pdscope selftest: the client measured against the reference server's known schedule."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope.load import Stage, StageRun, summarize_stage
from pdscope.load.bench import capacity_warning
from pdscope.selftest.check import run_selftest, saved_capacity


@pytest.mark.timeout(120)
def test_selftest_splits_the_error_into_its_parts() -> None:
    result = asyncio.run(run_selftest((1, 4), itl_s=0.01, ttft_s=0.03, output_tokens=20,
                                      rounds=2, stop_after_failure=False))
    assert [lv.concurrency for lv in result.levels] == [1, 4]
    for lv in result.levels:
        assert lv.failed == 0 and lv.requests == 2 * lv.concurrency  # warm-up round left out
        # One clock on one host: the server never sends before it is due, and the client never
        # receives before the server sent.
        assert lv.server_late_p50_ms >= 0 and lv.client_late_p50_ms >= 0
        assert lv.transit_p50_ms >= 0
        # The reported ITL follows the 10 ms schedule (a token late is one gap long and the
        # next short, so the median holds even on a busy machine).
        assert abs(lv.itl_err_p50_ms) < 1.0
        assert lv.ideal_tok_s == pytest.approx(lv.concurrency * 100)
    data = result.to_json()
    assert data["levels"][0]["sustained"] == result.levels[0].sustained


def test_bench_warns_past_the_selftest_capacity(tmp_path: Path) -> None:
    run = StageRun(Stage(concurrency=64, num_prompts=64), 0, 0.0, max_in_flight=64)
    summary = summarize_stage(run)
    assert capacity_warning(summary, 200) is None
    warning = capacity_warning(summary, 50)
    assert warning is not None and "64 requests were in flight" in warning
    assert capacity_warning(summary, None) is None


def test_the_saved_capacity_is_read_back(tmp_path: Path) -> None:
    env = {**os.environ, "PDSCOPE_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pdscope", "selftest", "--levels", "1,2",
                        "--output-tokens", "10", "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    saved = json.loads((tmp_path / "selftest.json").read_text())
    assert saved["max_sustained_concurrency"] == out["max_sustained_concurrency"]
    os.environ["PDSCOPE_CACHE"], old = str(tmp_path), os.environ.get("PDSCOPE_CACHE")
    try:
        assert saved_capacity() == out["max_sustained_concurrency"]
    finally:
        if old is None:
            del os.environ["PDSCOPE_CACHE"]
        else:
            os.environ["PDSCOPE_CACHE"] = old

