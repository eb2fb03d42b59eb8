"""pdscope watch against a local server that answers the lab's captured /metrics texts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pdscope.cli import main
from pdscope.metrics import FULL_POOL_KV_USAGE
from tests.unit.test_metrics_captured import Response, closed_port, serving, text

LOAD = [text("at-rest"), text("load-05s"), text("load-10s"), text("load-15s"), text("after-load")]


def watch_json(
    capsys: pytest.CaptureFixture[str], url: str, *args: str
) -> tuple[int, list[dict], str]:
    code = main(["watch", url, "--json", "--interval", "0.05", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_json_windows_follow_the_load(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(LOAD) as base:
        code, windows, err = watch_json(capsys, base + "/v1", "--count", "4")
    assert code == 0, err
    assert len(windows) == 4
    assert all(w["family"] == "vllm" for w in windows)
    assert all(w["url"] == base + "/metrics" for w in windows)
    assert [w["num_requests_waiting"] for w in windows] == [20, 15, 11, 0]
    assert [w["num_requests_running"] for w in windows] == [4, 9, 13, 0]
    assert [w["queueing"] for w in windows] == ["scheduler", "scheduler", "scheduler", "none"]
    first = windows[0]
    assert first["kv_cache_usage"] == pytest.approx(0.06327, abs=1e-5)
    # 3 first tokens in (1, 5] s: p50 2.5 + 2.5 * 0.5 / 2 (test_metrics_captured.py).
    assert first["ttft_p50_s"] == pytest.approx(3.125)
    assert first["resolution"]["ttft_p50_s"] == [2.5, 5.0]
    assert first["preemptions"] == 0
    for w in windows:
        assert w["end_wall"] > w["start_wall"]
        # The window's length on the monotonic clock is its length on the wall clock: about one
        # 0.05 s tick (a slow scrape on a busy machine stretches one; none lasts a second).
        assert w["duration_s"] == pytest.approx(w["end_wall"] - w["start_wall"], abs=0.01)
        assert 0 < w["duration_s"] < 1
        for key, value in w.items():
            if value is None:
                assert w["missing"][key], key  # every null has its reason
        assert set(w["missing"]) == {k for k, v in w.items() if v is None}
    # The capture has no estimates: bandwidth is unknown with a reason, not 0.
    assert first["achieved_bandwidth_gb_s"] is None
    assert "--enable-mfu-metrics" in first["missing"]["achieved_bandwidth_gb_s"]


def test_once_prints_one_window_with_bucket_resolution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving([text("at-rest"), text("after-load")]) as base:
        code = main(["watch", base, "--once", "--interval", "0.05"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"vLLM {base}/metrics  window ")
    def line(label: str) -> str:
        return next(row for row in out.splitlines() if row.startswith(label + " "))

    # The whole load: TTFT p50 10 + 10 * 4 / 7 = 15.7 s, p99 39.5 s, ITL p50 128 ms.
    assert "15.7 s (bucket 10–20 s)" in line("TTFT p50")
    assert "39.5 s (bucket 20–40 s)" in line("TTFT p99")
    assert "128 ms (bucket 100–150 ms)" in line("ITL p50")
    assert "2.37 s (bucket 1–2.5 s)" in line("ITL p99")
    assert "0.0%" in line("prefix-cache hits")
    assert line("queueing").split()[1] == "none"
    assert line("waiting").split()[1] == "0"
    assert all(row == row.rstrip() for row in out.splitlines())
    assert "the five names: vllm:num_requests_running, vllm:num_requests_waiting, " in out
    assert out.count("window ") == 1


def test_missing_values_show_their_reason_never_zero(capsys: pytest.CaptureFixture[str]) -> None:
    # Two scrapes with nothing in between: no first token, no token, no step.
    with serving([text("at-rest")]) as base:
        code = main(["watch", base, "--once", "--interval", "0.05"])
    out, _ = capsys.readouterr()
    assert code == 0
    ttft = next(line for line in out.splitlines() if line.startswith("TTFT p50"))
    assert "—" in ttft and "no request got its first token in this window" in ttft
    assert "0 ms" not in ttft


def test_a_restart_between_scrapes_gives_no_negative_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # After the load, then the fresh server's at-rest text: every counter went down.
    with serving([text("after-load"), text("at-rest")]) as base:
        code, windows, err = watch_json(capsys, base, "--count", "1")
    assert code == 0, err
    (w,) = windows
    assert w["reset"] is True
    # The restarted server's own counts are the window (the at-rest text): 21 prompt and 48
    # generated tokens, 3 requests finished, 69 tokens in 48 steps, 0 hits in 21 lookups.
    assert w["prompt_tokens_per_s"] == pytest.approx(21 / w["duration_s"])
    assert w["generation_tokens_per_s"] == pytest.approx(48 / w["duration_s"])
    assert w["requests_finished"] == 3
    assert w["mean_iteration_tokens"] == pytest.approx(69 / 48)
    assert w["prefix_cache_hit_rate"] == 0.0
    assert w["preemptions"] == 0
    # Its 3 first tokens: one up to 20 ms, one in (20, 40] ms, one in (40, 60] ms. p50: rank 1.5
    # in (0.02, 0.04], which holds the 2nd: 0.02 + 0.02 * 0.5 / 1.
    assert w["ttft_p50_s"] == pytest.approx(0.03)


def test_the_queueing_rule_is_the_kv_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    # The under-load text with the pool made full: the same 20 waiting become capacity-bound.
    full = text("load-05s").replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.06327372764786798',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="smollm2"}} {FULL_POOL_KV_USAGE}',
    )
    assert full != text("load-05s")
    with serving([text("at-rest"), full]) as base:
        code, windows, _ = watch_json(capsys, base, "--count", "1")
    assert code == 0
    assert windows[0]["queueing"] == "capacity"


@pytest.mark.parametrize(
    ("answer", "routes", "expected"),
    [
        (
            [(404, '{"detail":"Not Found"}', "application/json")],
            {},
            "has no /metrics endpoint (404)",
        ),
        (
            [(404, "404 page not found", "text/plain")],
            {"/api/version": (200, '{"version":"0.5.1"}', "application/json")},
            "is an Ollama server (version 0.5.1). Ollama has no /metrics endpoint",
        ),
        (
            [(200, "<html><body>Welcome</body></html>", "text/html")],
            {},
            "did not return Prometheus text",
        ),
        ([(500, "boom", "text/plain")], {}, "answered HTTP 500: boom"),
        (
            ["# TYPE up gauge\nup 1\n"],
            {},
            "serves Prometheus text, but none of the metrics of vLLM, SGLang, llama.cpp or TGI",
        ),
    ],
)
def test_a_server_without_usable_metrics_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
    answer: list,
    routes: dict,
    expected: str,
) -> None:
    with serving(answer, routes) as base:
        code = main(["watch", base, "--once", "--interval", "0.05"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith("pdscope: ") and expected in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_refused_connection_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["watch", f"http://127.0.0.1:{closed_port()}", "--once"])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("pdscope: cannot reach http://127.0.0.1:") and err.count("\n") == 1


def test_bad_input_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch"]) == 2
    assert "give the server's URL" in capsys.readouterr().err
    assert main(["watch", "http://h", "--once", "--count", "3"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["watch", "http://h", "--interval", "0"])
    assert caught.value.code == 2


def test_a_model_or_engine_the_server_lacks_is_bad_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(LOAD) as base:
        assert main(["watch", base, "--once", "--model", "llama"]) == 2
        assert "--model 'llama': the server's model_name values are smollm2" in (
            capsys.readouterr().err
        )
        assert main(["watch", base, "--once", "--engine", "3"]) == 2
        assert "engine values are 0" in capsys.readouterr().err
    with serving(LOAD) as base:
        code, windows, _ = watch_json(capsys, base, "--count", "1", "--model", "smollm2",
                                      "--engine", "0")
    assert code == 0 and windows[0]["num_requests_waiting"] == 20


def test_scrape_failures_mid_watch_are_retried(capsys: pytest.CaptureFixture[str]) -> None:
    # One failed scrape between two good ones: a warning, and the window spans the gap.
    answers: list[str | Response] = [
        text("at-rest"), (503, "restarting", "text/plain"), text("load-05s")
    ]
    with serving(answers) as base:
        code, windows, err = watch_json(capsys, base, "--count", "1")
    assert code == 0
    assert "warning" in err and "HTTP 503" in err and "trying again for up to 300 s" in err
    assert "answers again after" in err
    assert windows[0]["num_requests_waiting"] == 20
    assert windows[0]["duration_s"] >= 0.1  # two intervals: the failed tick is inside


def test_watch_gives_up_after_its_patience(capsys: pytest.CaptureFixture[str]) -> None:
    # A server that answers once, then fails every scrape: after --patience seconds of
    # failures in a row, one line and exit 1 (a failed run), not a wait without end.
    with serving([text("at-rest"), (503, "down", "text/plain")]) as base:
        t0 = time.monotonic()
        code = main(["watch", base, "--json", "--interval", "0.05", "--patience", "0.3"])
        elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    last = err.splitlines()[-1]
    assert last.startswith("pdscope: scrapes failed for ") and "in a row" in last
    assert "HTTP 503" in last
    assert err.count("trying again") == 1  # one warning an outage, not one a scrape
    assert 0.3 <= elapsed < 30


def test_ctrl_c_ends_a_live_watch_with_status_0() -> None:
    with serving(LOAD) as base:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pdscope", "watch", base, "--interval", "0.2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "120"},
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first window's header: it is running
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert first.startswith("vLLM ")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--grafana-dashboard" in out and "--once" in out
