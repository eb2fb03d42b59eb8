"""pdscope plan predict / capacity / whatif on a calibration file: the command says what the
library computes, with the JSON keys the issue names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdscope import cli
from pdscope.plan import (
    SLO,
    CalibratedServer,
    Calibration,
    Disaggregation,
    FixedLengths,
    HardwareFigures,
    SchedulerConfig,
    StepModel,
    max_rate,
    max_users,
    open_loop,
    simulate,
)

MODEL = StepModel(0.012, 0.00045, 0.0005, 2e-6, 1e-9)
SCHEDULER = SchedulerConfig(kv_pool_tokens=60_000)
HARDWARE = HardwareFigures(device_bandwidth_gb_s=50.0, device_bf16_tflops=2.0,
                           bytes_per_weight=2.0, kv_bytes_per_token=23_040.0)


@pytest.fixture
def cal(tmp_path: Path) -> Path:
    Calibration(MODEL, SCHEDULER, CalibratedServer(family="vllm", hardware=HARDWARE)).save(
        tmp_path / "cal")
    return tmp_path / "cal"


@pytest.fixture
def cal_without_geometry(tmp_path: Path) -> Path:
    """A calibration made before it recorded the KV bytes a token (or without the model)."""
    Calibration(MODEL, SCHEDULER, CalibratedServer(family="vllm")).save(tmp_path / "bare")
    return tmp_path / "bare"


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
    slo = SLO(ttft_s=1.5, itl_s=0.3)
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


def test_predict_disaggregated_gives_the_simulators_figures(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("plan", "predict", str(cal), "--rate", "0.6", "--input-len", "1500",
            "--output-len", "64", "--num-requests", "200")
    got = pdscope_json(capsys, *args, "--disaggregate", "1:3", "--kv-link-gb-s", "10")
    split = Disaggregation(1, 3, link_gb_s=10.0, kv_bytes_per_token=23_040.0)
    expected = simulate(open_loop(200, 0.6, FixedLengths(1500, 64)), MODEL, SCHEDULER,
                        disaggregation=split).summary()
    for key in ("ttft_p99_s", "itl_p99_s", "e2e_p50_s", "kv_transfer_p50_s"):
        assert got[key] == pytest.approx(expected[key]), key
    assert got["disaggregation"] == split.to_json() and got["disaggregation"]["devices"] == 4
    # 1,500 tokens x 23,040 bytes / 10 GB/s: 3.5 ms on the link, when it is free.
    assert got["kv_transfer_p50_s"] == pytest.approx(1500 * 23_040 / 10e9)
    # A prompt's step no longer lands among the decode steps.
    together = pdscope_json(capsys, *args)
    assert got["itl_p99_s"] < together["itl_p99_s"]
    # The KV bytes a token can be given where the calibration does not say them.
    bytes_given = pdscope_json(capsys, *args, "--disaggregate", "1:3", "--kv-link-gb-s", "10",
                               "--kv-bytes-per-token", "46080")
    assert bytes_given["kv_transfer_p50_s"] == pytest.approx(2 * got["kv_transfer_p50_s"])


def test_capacity_disaggregated_searches_the_split(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pdscope_json(capsys, "plan", "capacity", str(cal), "--slo", "ttft:3000,itl:100",
                       "--input-len", "1500", "--output-len", "64", "--num-requests", "200",
                       "--disaggregate", "1:1")
    split = Disaggregation(1, 1, kv_bytes_per_token=23_040.0)
    slo = SLO(ttft_s=3.0, itl_s=0.1)
    users = max_users(MODEL, SCHEDULER, FixedLengths(1500, 64), slo, num_requests=200,
                      disaggregation=split)
    assert got["max_users"] == users.users and got["disaggregation"]["link_gb_s"] == 25.0
    assert slo.met(got["at_max_rate"]) and slo.met(got["at_max_users"])


def test_whatif_rows_of_a_split_say_their_devices(
    cal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pdscope_json(capsys, "plan", "whatif", str(cal), "--slo", "ttft:3000,itl:100",
                       "--input-len", "1500", "--output-len", "64", "--num-requests", "100",
                       "--devices", "", "--kv-link-gb-s", "50")
    rows = {r["change"]: r for r in got["rows"]}
    one = rows["1P:1D disaggregated, KV over 50 GB/s (2 devices)"]
    three = rows["1P:3D disaggregated, KV over 50 GB/s (4 devices)"]
    assert (one["devices"], three["devices"], rows["2 replicas"]["devices"]) == (2, 4, 2)
    assert one["disaggregation"]["link_gb_s"] == 50.0 and one["extrapolation"] is None
    # Without the prompts' steps among its decodes, a split meets the ITL objective with
    # more users than the server as calibrated.
    assert one["users"] > rows["as calibrated"]["users"]


# Bad input to the new flags: one line on stderr, exit 2 (the pattern of test_bad_inputs.py).
BAD = [
    (("predict", "--rate", "1", "--disaggregate", "1x3"), "not P:D"),
    (("predict", "--rate", "1", "--disaggregate", "0:1"), "not P:D"),
    (("predict", "--rate", "1", "--disaggregate", "2:"), "not P:D"),
    (("predict", "--rate", "1", "--disaggregate", "one:two"), "not P:D"),
    (("predict", "--rate", "1", "--disaggregate", "1:1", "--kv-link-gb-s", "0"), "above 0"),
    (("predict", "--rate", "1", "--disaggregate", "1:1", "--kv-link-gb-s", "-25"), "above 0"),
    (("predict", "--rate", "1", "--disaggregate", "1:1", "--kv-link-gb-s", "inf"), "finite"),
    (("predict", "--rate", "1", "--disaggregate", "1:1", "--kv-bytes-per-token", "0"),
     "above 0"),
    (("predict", "--rate", "1", "--kv-link-gb-s", "25"), "add --disaggregate"),
    (("predict", "--rate", "1", "--disaggregate", "1:1", "--replicas", "2"),
     "exclude each other"),
    (("capacity", "--slo", "ttft:500", "--disaggregate", "3"), "not P:D"),
    (("whatif", "--slo", "ttft:500", "--kv-link-gb-s", "0"), "above 0"),
]


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("pdscope: warning:")]
    assert len(lines) == 1 and lines[0].startswith("pdscope: "), err
    assert code == 2, f"exit {code}, not 2: {lines[0]}"
    return lines[0]


@pytest.mark.parametrize(("argv", "needle"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_split_flag_is_one_line_and_exit_2(
    cal: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], needle: str
) -> None:
    line = one_error_line(capsys, ["plan", argv[0], str(cal), *argv[1:]])
    assert needle.lower() in line.lower(), line


def test_a_split_without_the_kv_bytes_asks_for_them(
    cal_without_geometry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(capsys, ["plan", "predict", str(cal_without_geometry), "--rate", "1",
                                   "--disaggregate", "1:1"])
    assert "--kv-bytes-per-token" in line


@pytest.mark.parametrize("what", ["empty", "file", "calibration", "missing"])
def test_calibrating_from_what_is_not_a_run_is_one_line_and_exit_2(
    cal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("not a run")
    folder = {"empty": tmp_path / "empty", "file": tmp_path / "file", "calibration": cal,
              "missing": tmp_path / "nowhere"}[what]
    line = one_error_line(capsys, ["plan", "calibrate", "--from", str(folder), "--out",
                                   str(tmp_path / "out")])
    assert "not a readable bench run folder" in line
    assert not (tmp_path / "out").exists()


def test_calibrate_takes_a_url_or_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    assert "--from" in one_error_line(capsys, ["plan", "calibrate", "--out", str(tmp_path)])
    line = one_error_line(capsys, ["plan", "calibrate", "http://127.0.0.1:9", "--from",
                                   str(tmp_path)])
    assert "not both" in line
