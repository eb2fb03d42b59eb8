"""The llama.cpp family against what the lab's real ``llama-server`` answered.

Every answer here was recorded from llama-server (llama.cpp 0c1e570, the tree vendored in
llama-cpp-python 0.3.36's sdist, built by tools/install-lab.sh), started as the lab starts it: 4
slots, ``--ctx-size 16384`` (4,096 tokens a slot), ``--metrics --slots``
(``tests/data/captured/README.md``; ``tools/capture_metrics.py --engine llamacpp`` makes them).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdscope.client import ServerInfo, Target, detect_server, new_session, stream_request
from pdscope.metrics import detect_metric_map, make_window, parse_metrics, window_record
from pdscope.servers import LLAMACPP_METRICS, family
from pdscope.servers.llamacpp import DEFAULT_BATCH, DEFAULT_UBATCH
from tests.conftest import DATA
from tests.unit.test_client_support import app_server, json_route, replay_route, run
from tests.unit.test_client_support import text_route as text

CAPTURED = DATA / "captured"
PREFIX = "llama-server-0c1e570"


def captured(suffix: str) -> str:
    return (CAPTURED / f"{PREFIX}-{suffix}").read_text()


def captured_json(suffix: str) -> Any:
    return json.loads(captured(suffix))


PROPS = captured_json("props.json")


def test_the_captures_are_what_capture_metrics_says() -> None:
    meta = json.loads((CAPTURED / "captures.json").read_text())["llama-server"]
    files = {c["file"]: c for c in meta["captures"]}
    assert all(c["status"] == 200 for name, c in files.items() if "error" not in name)
    assert files[f"{PREFIX}-error-too-long.json"]["status"] == 400
    assert meta["load"]["users"] > PROPS["total_slots"]  # more users than slots


def test_detected_by_its_props_with_its_build() -> None:
    routes = {("GET", "/props"): json_route(PROPS),
              ("GET", "/health"): json_route(captured_json("health.json")),
              ("GET", "/metrics"): text(captured("metrics-at-rest.txt"))}

    async def main() -> ServerInfo:
        async with app_server(routes) as url, new_session() as session:
            return await detect_server(url + "/v1", session)

    info = run(main())
    assert info.kind == "llama.cpp"
    assert info.version == PROPS["build_info"] == "b1-0c1e570"


def test_every_name_of_the_metric_map_is_exported_but_the_kv_gauge_of_older_builds() -> None:
    snap = parse_metrics(captured("metrics-at-rest.txt"), t=0.0, wall=0.0)
    assert detect_metric_map(snap.names) is LLAMACPP_METRICS
    for role in ("running", "waiting", "prompt_tokens", "generation_tokens", "prefill_seconds",
                 "decode_seconds", "engine_steps"):
        for name in LLAMACPP_METRICS.names(role):
            assert name in snap.names, (role, name)
    assert not set(LLAMACPP_METRICS.names("kv_usage")) & set(snap.names)
    assert LLAMACPP_METRICS.missing_reason("kv_usage")


def test_under_load_every_slot_is_busy_and_the_rest_are_deferred() -> None:
    before = parse_metrics(captured("metrics-after-one.txt"), t=0.0, wall=0.0)
    load = parse_metrics(captured("metrics-load.txt"), t=2.55, wall=2.55)
    record = window_record(make_window(before, load, LLAMACPP_METRICS))
    assert record["num_requests_running"] == PROPS["total_slots"] == 4
    assert record["num_requests_waiting"] > 0
    # /slots says the same: all four slots process, each with a quarter of the context.
    slots = captured_json("slots-load.json")
    assert [s["is_processing"] for s in slots] == [True] * 4
    assert {s["n_ctx"] for s in slots} == {4096}


def test_after_the_load_the_counters_add_up() -> None:
    meta = json.loads((CAPTURED / "captures.json").read_text())["llama-server"]
    users, out = meta["load"]["users"], meta["load"]["max_tokens"]
    before = parse_metrics(captured("metrics-after-one.txt"), t=0.0, wall=0.0)
    after = parse_metrics(captured("metrics-after-load.txt"), t=30.0, wall=30.0)
    record = window_record(make_window(before, after, LLAMACPP_METRICS))
    assert record["num_requests_running"] == 0 and record["num_requests_waiting"] == 0
    # ignore_eos: every load request generated exactly max_tokens tokens.
    names = LLAMACPP_METRICS.names("generation_tokens")
    gen = (after.counter(names) or 0) - (before.counter(names) or 0)
    assert gen == users * out


def test_settings_from_props_and_the_flags() -> None:
    llama = family("llama.cpp")
    plain = llama.read_settings({"/props": PROPS}, None, ())
    assert (plain.max_sequences, plain.context_tokens) == (4, 4096)
    # The defaults, said to be defaults; without the flags the KV layout is not known.
    assert (plain.prefill_budget_tokens, plain.ubatch_tokens) == (DEFAULT_BATCH, DEFAULT_UBATCH)
    assert any("default" in s for s in plain.sources)
    assert plain.kv_unified is None and plain.kv_pool_tokens is None
    assert plain.prefix_caching is True
    split = llama.read_settings({"/props": PROPS}, None,
                                ("-np", "4", "-c", "16384", "-b", "512", "-ub", "256"))
    assert (split.kv_unified, split.kv_pool_tokens) == (False, 4 * 4096)
    assert (split.prefill_budget_tokens, split.ubatch_tokens) == (512, 256)
    assert split.budget_label == "--batch-size 512"
    unified = llama.read_settings({"/props": PROPS}, None, ("--kv-unified", "--no-cache-prompt"))
    assert (unified.kv_unified, unified.kv_pool_tokens, unified.prefix_caching) == (True, 4096,
                                                                                    False)


@pytest.mark.timeout(30)
def test_the_recorded_stream_gives_the_server_s_prefill_rate() -> None:
    stream = captured("stream.txt").encode()
    last = [json.loads(line[6:]) for line in captured("stream.txt").splitlines()
            if line.startswith("data: {")][-1]
    timings = last["timings"]

    async def main() -> Any:
        route = replay_route(stream, "text/event-stream", list(range(11, len(stream), 131)))
        async with app_server({("POST", "/v1/completions"): route}) as url, new_session() as s:
            return await stream_request(s, Target(url, "openai", "smollm2"), "x", max_tokens=16)

    r = run(main())
    assert r.ok, r.error
    assert r.prefill_source == "llama.cpp-timings"
    assert r.prefill_tok_s == pytest.approx(timings["prompt_n"] / timings["prompt_ms"] * 1000)
    assert r.output_tokens == 16 and r.token_count_source == "usage"


def test_a_prompt_past_a_slot_s_context_is_a_400_that_says_both_sizes() -> None:
    error = captured_json("error-too-long.json")["error"]
    assert error["type"] == "exceed_context_size_error" and error["code"] == 400
    assert error["n_ctx"] == PROPS["default_generation_settings"]["n_ctx"]
    assert error["n_prompt_tokens"] > error["n_ctx"]


def test_the_prompt_cache_hit_rate_is_cached_against_computed_tokens() -> None:
    before = parse_metrics(captured("metrics-after-one.txt"), t=0.0, wall=0.0)
    after = parse_metrics(captured("metrics-after-load.txt"), t=30.0, wall=30.0)
    window = make_window(before, after, LLAMACPP_METRICS)

    def delta(name: str) -> float:
        return (after.counter((name,)) or 0) - (before.counter((name,)) or 0)

    cached = delta("llamacpp:prompt_tokens_cached_total")
    computed = delta("llamacpp:prompt_tokens_total")  # "excluding cached tokens"
    assert computed > 0
    assert window.prefix_cache_hit_rate == pytest.approx(cached / (cached + computed))
