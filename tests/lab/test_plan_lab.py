"""The planner on the lab's vLLM: calibrated in minutes, it predicts two loads it never saw,
each then run for real with pdscope bench (docs/planner.md has the full table)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope import lab
from pdscope.plan import FixedLengths, load_calibration
from pdscope.plan.capacity import saturation_rate

pytestmark = pytest.mark.lab

# Loose bounds, as factors either way: two short runs on a shared 2-core machine, whose speed
# can change between the calibration and the runs it predicts (CI once read an ITL p50 46% above
# the prediction's basis, with every other figure in bounds). docs/planner.md measures the goal
# (10% on the p50s, 20% on the p99s, medians over eight loads); these catch a planner that has
# gone wrong — a step counted twice (a factor of 2 on every step), a policy that no longer
# queues (p99 TTFT off by the whole queue) — not a few percent.
P50_FACTOR = 1.7
P99_FACTOR = 2.5


def pdscope(*args: str, timeout: float = 600) -> dict:
    r = subprocess.run([sys.executable, "-m", "pdscope", *args, "--json"], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_calibrated_planner_predicts_two_held_out_loads(
    vllm_server: lab.LabServer, tmp_path: Path
) -> None:
    cal = pdscope("plan", "calibrate", vllm_server.url, "--out", str(tmp_path / "cal"), "--runs",
                  "1")
    assert (tmp_path / "cal" / "calibration.json").is_file()
    assert cal["duration_s"] < 180  # the issue: under three minutes on the lab
    assert cal["scheduler"]["policy"] == "budget"
    # The lab's flags are read from the server: nothing about its budget is assumed.
    assert not any("token budget" in a for a in cal["assumptions"])
    model = cal["step_model"]
    assert model["base_s"] > 0 and model["per_prompt_token_s"] > 0
    assert all(err < 0.25 for err in cal["fit_error_by_part"].values()), cal["fit_error_by_part"]

    calibration = load_calibration(tmp_path / "cal")
    saturation = saturation_rate(calibration.step_model, calibration.scheduler,
                                 FixedLengths(256, 64), num_requests=1000)
    assert saturation is not None
    for share, seed in ((0.25, 3), (0.6, 4)):
        run = tmp_path / f"run-{share}"
        pdscope("bench", vllm_server.url, "--request-rate", f"{share * saturation:.4f}",
                "--num-prompts", "30", "--input-len", "256", "--output-len", "64", "--seed",
                str(seed), "--out", str(run), "--no-metrics")
        got = pdscope("plan", "predict", str(tmp_path / "cal"), "--replay", str(run))
        measured = got["measured"]
        assert got["simulated_requests"] == 30
        for key, factor in (("ttft_p50_s", P50_FACTOR), ("itl_p50_s", P50_FACTOR),
                            ("ttft_p99_s", P99_FACTOR), ("itl_p99_s", P99_FACTOR)):
            ratio = got[key] / measured[key]
            assert 1 / factor < ratio < factor, (share, key, got[key], measured[key])
