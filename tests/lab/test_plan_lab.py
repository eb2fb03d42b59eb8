"""The planner on the lab's vLLM: calibrated in minutes, it predicts two loads it never saw,
each then run for real with pdscope bench (docs/planner.md has the full table)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope import lab
from pdscope.plan import FixedLengths, load_calibration
from pdscope.plan.capacity import saturation_rate

pytestmark = pytest.mark.lab

# Loose bounds, as factors either way: two short runs on a shared 2-core machine, whose speed
# changes between the calibration and the runs it predicts, and within a run. Here, the same
# test three times: at 45% of saturation the first read a lone request's token gaps at 56 ms
# against 34 ms a minute before (every prediction low, the ITL p50 by half), the second every
# prediction high (the TTFT p99 by 2.1 times); the third, at 25%, saw the token gaps of every
# stream go from 36 ms to 72 ms three seconds into the run and stay there fifteen seconds (every
# figure measured about twice its prediction, the TTFT p99 2.6 times; nothing else ran). In CI,
# at 60%, a TTFT p50 of 388 ms against 187 predicted. docs/planner.md measures the goal (10% on
# the p50s, 20% on the p99s, medians over eight loads). These catch a planner that has gone
# wrong beyond what the machine's speed does: the geometric mean of all eight ratios, which the
# drift moved to 0.76, 1.28 and 0.56 in those runs, within SCALE_FACTOR (a unit slip, a step
# model several times off); each ratio within FIGURE_FACTOR (a policy that no longer queues
# puts the p99 TTFT off by the whole queue).
SCALE_FACTOR = 2.2
FIGURE_FACTOR = 3.5
FIGURES = ("ttft_p50_s", "itl_p50_s", "ttft_p99_s", "itl_p99_s")
PROMPTS = 24


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
    # The second load is under half the saturation rate: at 60% a CI machine slower than this
    # one read a TTFT p50 of 388 ms against 187 predicted. Near saturation the queue multiplies
    # any slowing of the steps (the client shares the two cores with the server, more so as the
    # rate grows), and docs/planner.md measures the planner optimistic there (-43% at 80%).
    # 24 requests a load: an open-loop load lasts its requests over its rate, and at 30 the two
    # took 163 s of this test's 237 on an AMD EPYC with AVX2 only (2026-12-06). The prediction
    # replays the same arrivals, so a p99 of fewer requests is read on both sides alike.
    said: dict[str, tuple[float, float]] = {}
    for share, seed in ((0.25, 3), (0.45, 4)):
        run = tmp_path / f"run-{share}"
        pdscope("bench", vllm_server.url, "--request-rate", f"{share * saturation:.4f}",
                "--num-prompts", str(PROMPTS), "--input-len", "256", "--output-len", "64", "--seed",
                str(seed), "--out", str(run), "--no-metrics")
        got = pdscope("plan", "predict", str(tmp_path / "cal"), "--replay", str(run))
        measured = got["measured"]
        assert got["simulated_requests"] == PROMPTS
        for key in FIGURES:
            said[f"{share} {key}"] = (got[key], measured[key])
    ratios = {key: predicted / real for key, (predicted, real) in said.items()}
    scale = math.exp(statistics.fmean(math.log(r) for r in ratios.values()))
    assert 1 / SCALE_FACTOR < scale < SCALE_FACTOR, (scale, said)
    for key, ratio in ratios.items():
        assert 1 / FIGURE_FACTOR < ratio < FIGURE_FACTOR, (key, said)
