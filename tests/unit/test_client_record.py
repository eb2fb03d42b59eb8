"""The timing record follows pdscope's definitions, with plain numbers."""

from __future__ import annotations

import pytest

from pdscope.client import RecordBuilder, RequestRecord, raise_for_record
from pdscope.errors import RunError

MS = 1_000_000


def streamed(times_ms: list[float], ks: list[int] | None = None, **kw: object) -> RecordBuilder:
    b = RecordBuilder(request_id="r1", api="openai", model="m")
    b.t_send_ns = 0
    for i, t in enumerate(times_ms):
        b.add_tokens(int(t * MS), f" w{i}", ks[i] if ks else 1)
    for key, value in kw.items():
        setattr(b, key, value)
    return b


def test_ttft_runs_from_send_to_the_first_token_chunk() -> None:
    r = streamed([120, 130, 140]).build()
    assert r.ttft_s == pytest.approx(0.120)
    assert r.e2e_s == pytest.approx(0.140)


def test_a_chunk_with_k_tokens_gives_k_gaps_of_gap_over_k() -> None:
    r = streamed([100, 110, 130], ks=[1, 1, 4]).build()
    assert r.chunk_gaps_s == pytest.approx((0.010, 0.020))
    assert r.itl_s == pytest.approx((0.010, 0.005, 0.005, 0.005, 0.005))


def test_tpot_is_the_span_over_n_out_minus_one_and_decode_rate_its_inverse() -> None:
    r = streamed([100, 110, 120, 130, 140], usage_completion_tokens=5).build()
    assert r.tpot_s == pytest.approx(0.010)
    assert r.decode_tok_s == pytest.approx(100.0)
    assert r.token_count_source == "usage"


def test_without_usage_the_chunks_are_counted_and_flagged_as_an_estimate() -> None:
    r = streamed([100, 110, 120]).build()
    assert (r.output_tokens, r.token_count_source) == (3, "chunks-estimate")


def test_one_token_has_no_tpot() -> None:
    r = streamed([100], usage_completion_tokens=1).build()
    assert r.tpot_s is None and r.decode_tok_s is None


def test_prefill_prefers_ollama_counters_then_llama_cpp_timings_then_ttft() -> None:
    ollama = streamed([200], server_timings={"prompt_eval_count": 26.0,
                                             "prompt_eval_duration": 130079000.0}).build()
    assert ollama.prefill_tok_s == pytest.approx(26 / 130079000 * 1e9)
    assert ollama.prefill_source == "ollama-counters"
    llama = streamed([200], server_timings={"prompt_n": 1.0, "prompt_ms": 30.958,
                                            "cache_n": 236.0}).build()
    assert llama.prefill_tok_s == pytest.approx(1 / 30.958 * 1000)
    assert llama.prefill_source == "llama.cpp-timings"
    assert (llama.prompt_tokens, llama.cached_tokens) == (237, 236)
    ttft = streamed([200], usage_prompt_tokens=1000).build()
    assert ttft.prefill_tok_s == pytest.approx(1000 / 0.200)
    assert ttft.prefill_source == "ttft"


def test_an_ollama_cache_hit_is_not_taken_as_a_prefill_rate() -> None:
    r = streamed([50], usage_prompt_tokens=2000, server_timings={
        "prompt_eval_count": 2000.0, "prompt_eval_duration": 150000.0}).build()
    assert r.prefill_warning is not None and "cached" in r.prefill_warning
    assert r.prefill_source == "ttft"


def test_a_record_survives_a_jsonl_round_trip() -> None:
    b = streamed([100, 110], ks=[1, 2], usage_completion_tokens=3, usage_prompt_tokens=7,
                 server_timings={"prompt_n": 7.0, "prompt_ms": 3.5}, finish_reason="length")
    b.server_sent_ns = [99 * MS, 109 * MS]
    b.server_due_ns = [99 * MS, 109 * MS]
    b.connect_s = 0.0004
    r = b.build()
    line = r.to_json()
    assert "\n" not in line
    back = RequestRecord.from_json(line)
    assert back == r
    assert back.client_lateness_ns == (MS, MS)


def test_a_failed_record_raises_one_line_with_a_hint() -> None:
    b = streamed([])
    b.fail("model_not_found", "http://h/v1/completions: HTTP 404: The model `x`\ndoes not exist.")
    r = b.build()
    assert not r.ok and r.error_kind == "model_not_found"
    with pytest.raises(RunError) as err:
        raise_for_record(r)
    assert "\n" not in str(err.value) and "does not exist" in str(err.value)
    raise_for_record(streamed([1]).build())  # an ok record raises nothing
