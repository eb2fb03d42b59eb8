"""pdscope plan predict / capacity / whatif on a calibration file: the command says what the
library computes, with the JSON keys the issue names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdscope import cli
from pdscope.plan import (
    Calibration,
    FixedLengths,
    SchedulerConfig,
    Slo,
    StepModel,
    max_rate,
    max_users,
    open_loop,
    simulate,
)

MODEL = StepModel(0.012, 0.00045, 0.0005, 2e-6, 1e-9)
SCHEDULER = SchedulerConfig(kv_pool_tokens=60_000)
HARDWARE = {"device_bandwidth_gb_s": 50.0, "device_bf16_tflops": 2.0, "bytes_per_weight": 2.0}


@pytest.fixture
def cal(tmp_path: Path) -> Path:
    Calibration(MODEL, SCHEDULER, {"family": "vllm", **HARDWARE}).save(tmp_path / "cal")
    return tmp_path / "cal"


def pdscope_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code = cli.main([*argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_predict_gives_the_simulators_figures_under_the_named_keys(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pdscope_json(capsys, "plan", "predict", str(cal / "calibration.json"), "--rate", "0.5",
                       "--input-len", "300", "--output-len", "40", "--num-requests", "300",
                       "--seed", "3")
    expected = simulate(open_loop(300, 0.5, FixedLengths(300, 40), seed=3), MODEL,
                        SCHEDULER).summary()
    for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tpot_p50_s",
                "e2e_p50_s", "request_throughput", "output_throughput", "simulated_requests"):
        assert got[key] == pytest.approx(expected[key]), key
    assert got["simulated_requests"] == 300 and got["sim_wall_s"] > 0
    # Far below saturation the server keeps up: it finishes what is offered.
    assert got["request_throughput"] == pytest.approx(0.5, rel=0.15)


def test_set_and_replicas_change_the_simulated_server(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("plan", "predict", str(cal), "--users", "12", "--input-len", "1500",
            "--output-len", "64", "--num-requests", "200")
    base = pdscope_json(capsys, *args)
    small = pdscope_json(capsys, *args, "--set", "max-num-batched-tokens=256")
    two = pdscope_json(capsys, *args, "--replicas", "2")
    assert small["scheduler"]["max_num_batched_tokens"] == 256
    # A 1,500-token prompt in 256-token chunks takes six steps, not one: a later first token,
    # and shorter pauses for the streams decoding beside it.
    assert small["ttft_p50_s"] > base["ttft_p50_s"]
    assert small["itl_p99_s"] < base["itl_p99_s"]
    # Twelve users on two servers: more requests a second.
    assert two["request_throughput"] > 1.3 * base["request_throughput"]


def test_capacity_gives_the_highest_rate_and_the_most_users_that_meet_the_slo(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pdscope_json(capsys, "plan", "capacity", str(cal), "--slo", "ttft:1500,itl:300",
                       "--input-len", "256", "--output-len", "64", "--num-requests", "300")
    slo = Slo(ttft_s=1.5, itl_s=0.3)
    rate = max_rate(MODEL, SCHEDULER, FixedLengths(256, 64), slo, num_requests=300)
    users = max_users(MODEL, SCHEDULER, FixedLengths(256, 64), slo, num_requests=300)
    assert got["max_rate_rps"] == pytest.approx(rate.rate_rps)
    assert got["max_users"] == users.users and got["max_users"] >= 1
    assert got["binding"] in ("ttft", "itl")
    assert slo.met(got["at_max_rate"]) and slo.met(got["at_max_users"])


def test_whatif_sets_each_change_beside_the_calibrated_server(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pdscope_json(capsys, "plan", "whatif", str(cal), "--slo", "ttft:1500,itl:300",
                       "--input-len", "256", "--output-len", "64", "--num-requests", "200",
                       "--devices", "h100-sxm")
    rows = {r["change"]: r for r in got["rows"]}
    base = rows["as calibrated"]
    assert base["extrapolation"] is None and base["users"] >= 1
    # Twice the servers hold at least about twice the users; the roofline's H100 holds more
    # and says that it is an extrapolation.
    assert rows["2 replicas"]["users"] >= 2 * base["users"] - 1
    h100 = rows["on NVIDIA H100 SXM"]
    assert h100["users"] > base["users"] and "extrapolated" in h100["extrapolation"]
    assert rows["token budget 256"]["scheduler"]["max_num_batched_tokens"] == 256
    assert "4-bit weights" in rows and "8-bit weights" in rows
