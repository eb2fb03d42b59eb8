"""Windows over two scrapes: percentiles as Prometheus reads them, and never a made-up 0."""

from __future__ import annotations

import json
import math

import pytest

from pdscope.metrics import (
    VLLM,
    Histogram,
    bucket_resolution,
    counter_delta,
    counter_rate,
    histogram_delta,
    make_window,
    parse_metrics,
    quantile,
    to_json,
)
from pdscope.metrics.window import Window

INF = math.inf

# 10 observations: 2 up to 0.1 s, 4 more up to 0.5 s, 3 more up to 1 s, 1 above.
TEN = Histogram(buckets=((0.1, 2), (0.5, 6), (1.0, 9), (INF, 10)), count=10, sum=5.0)


def test_quantile_interpolates_inside_the_bucket() -> None:
    # rank 5 lies in (0.1, 0.5], which holds observations 3 to 6: 0.1 + 0.4 * 3 / 4.
    assert quantile(0.5, TEN) == pytest.approx(0.4)
    assert bucket_resolution(0.5, TEN) == (0.1, 0.5)
    # rank 9 is the last observation of (0.5, 1]: its upper bound.
    assert quantile(0.9, TEN) == pytest.approx(1.0)


def test_the_first_bucket_starts_at_zero() -> None:
    # rank 1 in (0, 0.1], which holds 2: 0 + 0.1 * 1 / 2.
    assert quantile(0.1, TEN) == pytest.approx(0.05)
    assert bucket_resolution(0.1, TEN) == (0.0, 0.1)


def test_a_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    # rank 9.5 is past the 9 observations of the finite buckets.
    assert quantile(0.95, TEN) == 1.0
    assert bucket_resolution(0.95, TEN) == (1.0, INF)


def test_a_first_bucket_at_or_below_zero_returns_its_bound() -> None:
    # The example of ClickHouse's quantilePrometheusHistogram, which mirrors PromQL: 0.35.
    hist = Histogram(buckets=((0.0, 6), (0.5, 11), (1.0, 14), (INF, 19)), count=19)
    assert quantile(0.5, hist) == pytest.approx(0.35)
    assert quantile(0.2, hist) == 0.0
    assert bucket_resolution(0.2, hist) == (-INF, 0.0)


def test_an_empty_histogram_has_no_quantile() -> None:
    empty = Histogram(buckets=((0.1, 0), (0.5, 0), (INF, 0)), count=0, sum=0.0)
    assert quantile(0.5, empty) is None
    assert empty.mean is None
    with pytest.raises(ValueError):
        bucket_resolution(0.5, empty)
    only_inf = Histogram(buckets=((INF, 4),), count=4, sum=2.0)
    assert quantile(0.5, only_inf) is None
    assert quantile(0.5, None) is None
    with pytest.raises(ValueError):
        quantile(1.5, TEN)


def test_histogram_delta_subtracts_bucket_by_bucket() -> None:
    later = Histogram(buckets=((0.1, 5), (0.5, 10), (1.0, 15), (INF, 20)), count=20, sum=12.5)
    window = histogram_delta(TEN, later)
    assert window.buckets == ((0.1, 3), (0.5, 4), (1.0, 6), (INF, 10))
    assert window.count == 10
    assert window.sum == pytest.approx(7.5)
    assert not window.reset
    # rank 5 in (0.5, 1], which holds window observations 5 and 6: 0.5 + 0.5 * 1 / 2.
    assert quantile(0.5, window) == pytest.approx(0.75)


def test_a_histogram_that_shrank_is_a_restart() -> None:
    restarted = Histogram(buckets=((0.1, 1), (0.5, 1), (1.0, 2), (INF, 3)), count=3, sum=1.0)
    window = histogram_delta(TEN, restarted)
    assert window.reset
    # A restarted server counts from 0: its own counts are the window, never TEN subtracted.
    assert window.buckets == ((0.1, 1), (0.5, 1), (1.0, 2), (INF, 3))
    assert (window.count, window.sum) == (3, 1.0)
    # rank 1.5 in (0.5, 1], which holds observation 2 alone: 0.5 + 0.5 * 0.5 / 1.
    assert quantile(0.5, window) == pytest.approx(0.75)
    rebucketed = Histogram(buckets=((0.2, 5), (INF, 12)), count=12)
    assert histogram_delta(TEN, rebucketed).reset


def test_counters_never_go_negative() -> None:
    assert counter_rate(100, 160, 10) == pytest.approx(6.0)
    assert counter_delta(100, 30) == (30, True)
    assert counter_rate(100, 30, 10) == pytest.approx(3.0)
    assert counter_delta(None, 30) == (30, False)
    assert counter_delta(30, None) == (None, False)
    with pytest.raises(ValueError):
        counter_rate(1, 2, 0)


def vllm_text(
    *,
    running: tuple[int, int],
    waiting: tuple[int, int],
    kv: tuple[float, float],
    prompt: tuple[int, int],
    generated: tuple[int, int],
    queries: int,
    hits: int,
    preempted: int,
    ttft: tuple[tuple[int, int, int, int], tuple[int, int, int, int]],
    e2e: tuple[int, int, int, int],
    steps: tuple[int, int],
    read_bytes: float,
) -> str:
    """A two-engine vLLM exposition; ``ttft`` gives each engine's cumulative counts for
    le 0.1, 0.5, 1.0 and +Inf, ``e2e`` engine 0's for le 1.0, 2.5, 5.0 and +Inf."""
    lines = []

    def series(name: str, kind: str, values: tuple[float, float]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        for engine, value in enumerate(values):
            lines.append(f'{name}{{engine="{engine}",model_name="m"}} {value}')

    series("vllm:num_requests_running", "gauge", running)
    series("vllm:num_requests_waiting", "gauge", waiting)
    lines.append("# TYPE vllm:num_requests_waiting_by_reason gauge")
    for engine, value in enumerate(waiting):
        lines.append(
            f'vllm:num_requests_waiting_by_reason{{engine="{engine}",model_name="m",'
            f'reason="capacity"}} {value}'
        )
    series("vllm:kv_cache_usage_perc", "gauge", kv)
    series("vllm:prompt_tokens_total", "counter", prompt)
    series("vllm:generation_tokens_total", "counter", generated)
    series("vllm:prefix_cache_queries_total", "counter", (queries, 0))
    series("vllm:prefix_cache_hits_total", "counter", (hits, 0))
    series("vllm:num_preemptions_total", "counter", (preempted, 0))
    series("vllm:estimated_read_bytes_per_gpu_total", "counter", (read_bytes, 0))
    lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
    for engine, counts in enumerate(ttft):
        for le, count in zip(("0.1", "0.5", "1.0", "+Inf"), counts, strict=True):
            lines.append(
                f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",le="{le}",'
                f'model_name="m"}} {count}'
            )
        lines.append(
            f'vllm:time_to_first_token_seconds_count{{engine="{engine}",model_name="m"}} '
            f"{counts[-1]}"
        )
    lines.append("# TYPE vllm:e2e_request_latency_seconds histogram")
    for le, count in zip(("1.0", "2.5", "5.0", "+Inf"), e2e, strict=True):
        lines.append(
            f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} '
            f"{count}"
        )
    lines.append(f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {e2e[-1]}')
    lines.append("# TYPE vllm:iteration_tokens_total histogram")
    count, total = steps
    lines.append(
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {count}'
    )
    lines.append(f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {count}')
    lines.append(f'vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {total}')
    return "\n".join(lines) + "\n"


BEFORE = vllm_text(
    running=(1, 1),
    waiting=(0, 0),
    kv=(0.2, 0.3),
    prompt=(1000, 500),
    generated=(200, 100),
    queries=1000,
    hits=100,
    preempted=1,
    ttft=((1, 2, 2, 2), (0, 0, 0, 0)),
    e2e=(0, 0, 0, 0),
    steps=(100, 5000),
    read_bytes=0,
)
AFTER = vllm_text(
    running=(3, 2),
    waiting=(0, 4),
    kv=(0.5, 0.95),
    prompt=(3000, 1500),
    generated=(700, 350),
    queries=3000,
    hits=600,
    preempted=3,
    ttft=((3, 6, 7, 8), (0, 2, 3, 4)),
    e2e=(1, 3, 4, 4),
    steps=(150, 9000),
    read_bytes=2e10,
)


def window(before: str = BEFORE, after: str = AFTER, **kw: str) -> Window:
    return make_window(parse_metrics(before, t=100.0), parse_metrics(after, t=110.0), VLLM, **kw)


def test_a_vllm_window_worked_by_hand() -> None:
    w = window()
    assert w.family == "vllm"
    assert w.duration_s == 10.0
    assert w.num_requests_running == 5  # 3 + 2 engines
    assert w.num_requests_waiting == 4
    assert w.kv_cache_usage == pytest.approx(0.95)  # the fuller engine, not 1.45
    assert w.waiting_capacity == 4
    # TTFT in the window, both engines: le 0.1: 2, 0.5: 6, 1.0: 8, +Inf: 10.
    # p50: rank 5 in (0.1, 0.5], observations 3 to 6: 0.1 + 0.4 * 3 / 4.
    assert w.ttft_p50_s == pytest.approx(0.4)
    # p99: rank 9.9 is past the 8 finite observations: the highest finite bound.
    assert w.ttft_p99_s == 1.0
    # E2E: 4 finished; p50 rank 2 in (1, 2.5], observations 2 and 3: 1 + 1.5 * 1 / 2.
    assert w.requests_finished == 4
    assert w.e2e_p50_s == pytest.approx(1.75)
    assert w.prefix_cache_hit_rate == pytest.approx(500 / 2000)
    assert w.preemptions == 2
    assert w.prompt_tokens_per_s == pytest.approx(3000 / 10)
    assert w.generation_tokens_per_s == pytest.approx(750 / 10)
    assert w.read_bytes_per_s == pytest.approx(2e9)
    assert w.mean_iteration_tokens == pytest.approx(4000 / 50)
    assert not w.reset
    # No ITL histogram in this text: None with a reason, for exactly those fields.
    assert w.itl_p50_s is None and w.itl_p99_s is None
    assert set(w.missing) == {"itl_p50_s", "itl_p99_s"}
    assert w.missing["itl_p50_s"].startswith("metric absent: vllm:inter_token_latency_seconds")
    assert w.resolution["ttft_p50_s"] == (0.1, 0.5)


def test_a_window_can_be_split_by_engine() -> None:
    w = window(engine="1")
    assert w.num_requests_running == 2
    assert w.kv_cache_usage == pytest.approx(0.95)
    # Engine 1's TTFT window: le 0.1: 0, 0.5: 2, 1.0: 3, +Inf: 4; rank 2 closes (0.1, 0.5].
    assert w.ttft_p50_s == pytest.approx(0.5)
    assert w.prompt_tokens_per_s == pytest.approx(1000 / 10)
    # Engine 1 has no e2e series here: the count falls back to its first tokens.
    assert w.requests_finished == 4
    assert w.e2e_p50_s is None
    assert "e2e_p50_s" in w.missing


def test_a_window_with_nothing_finished_says_so_instead_of_zero() -> None:
    w = window(before=AFTER, after=AFTER)
    assert w.requests_finished == 0
    assert w.ttft_p50_s is None
    assert w.missing["ttft_p50_s"] == "no request got its first token in this window"
    assert w.missing["e2e_p50_s"] == "no request finished in this window"
    assert w.prefix_cache_hit_rate is None
    assert "no prompt token was looked up" in w.missing["prefix_cache_hit_rate"]
    assert w.prompt_tokens_per_s == 0.0  # a counter that did not move is a true 0


def test_a_restart_between_scrapes_is_flagged_and_never_negative() -> None:
    restarted = vllm_text(
        running=(1, 0),
        waiting=(0, 0),
        kv=(0.1, 0.0),
        prompt=(50, 20),
        generated=(10, 0),
        queries=40,
        hits=0,
        preempted=0,
        ttft=((1, 1, 1, 1), (0, 0, 0, 0)),
        e2e=(0, 0, 0, 0),
        steps=(5, 80),
        read_bytes=1e9,
    )
    w = window(before=AFTER, after=restarted)
    assert w.reset
    assert w.prompt_tokens_per_s == pytest.approx(70 / 10)
    assert w.generation_tokens_per_s == pytest.approx(10 / 10)
    assert w.preemptions == 0
    assert w.ttft_p50_s == pytest.approx(0.05)  # the one restarted observation, in (0, 0.1]
    # p99: rank 0.99 of that one observation in (0, 0.1]: 0.1 * 0.99 / 1.
    assert w.ttft_p99_s == pytest.approx(0.099)
    # Every rate is the restarted server's own count over the 10 s, none negative:
    # 80 tokens in 5 steps, 1e9 bytes read, 0 hits in 40 looked-up tokens.
    assert w.mean_iteration_tokens == pytest.approx(80 / 5)
    assert w.read_bytes_per_s == pytest.approx(1e9 / 10)
    assert w.prefix_cache_hit_rate == 0.0
    assert w.kv_cache_usage == pytest.approx(0.1)
    assert w.requests_finished == 0 and w.e2e_p50_s is None


def test_vllm_read_bytes_left_at_zero_are_not_zero_bandwidth() -> None:
    idle_estimates = AFTER.replace(
        'vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="m"} 20000000000.0',
        'vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="m"} 0',
    )
    assert idle_estimates != AFTER
    w = window(after=idle_estimates)
    assert w.read_bytes_per_s is None
    assert "--enable-mfu-metrics" in w.missing["read_bytes_per_s"]


def test_json_has_exactly_the_window_fields() -> None:
    out = to_json(window())
    assert list(out) == [
        "family",
        "duration_s",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage",
        "ttft_p50_s",
        "ttft_p99_s",
        "itl_p50_s",
        "itl_p99_s",
        "e2e_p50_s",
        "requests_finished",
        "prefix_cache_hit_rate",
        "preemptions",
        "prompt_tokens_per_s",
        "generation_tokens_per_s",
        "waiting_capacity",
        "read_bytes_per_s",
        "mean_iteration_tokens",
        "reset",
        "missing",
        "start_wall",
        "end_wall",
        "resolution",
    ]
    # Each quantile with its bucket; the TTFT p99 fell in +Inf, whose upper bound is null.
    assert out["resolution"] == {
        "ttft_p50_s": [0.1, 0.5],
        "ttft_p99_s": [1.0, None],
        "e2e_p50_s": [1.0, 2.5],
    }
    json.dumps(out, allow_nan=False)
    # No ITL histogram under either of vLLM's names: each null with the reason, word for word.
    absent = (
        "metric absent: vllm:inter_token_latency_seconds / vllm:time_per_output_token_seconds"
        " not in /metrics"
    )
    assert out["missing"] == {"itl_p50_s": absent, "itl_p99_s": absent}
