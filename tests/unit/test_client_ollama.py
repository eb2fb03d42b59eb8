"""Ollama's native API on its documented example responses, and the article's formulas."""

from __future__ import annotations

import json

import pytest

from pdscope.client import (
    RecordBuilder,
    RequestRecord,
    Target,
    decode_rate,
    implausible_prefill,
    new_session,
    prefill_rate,
    stream_request,
)
from pdscope.client.ollama import OllamaStreamParser, build_body, counters
from tests.unit.test_client_support import app_server, fixture_bytes, replay_route, run

STREAM = fixture_bytes("ollama", "generate_stream.ndjson")


def final(name: str) -> dict[str, float]:
    return counters(json.loads(fixture_bytes("ollama", name)))


def test_decode_rate_is_eval_count_over_eval_duration() -> None:
    c = final("generate_stream_final.json")
    assert decode_rate(c) == 259 / 4232710000 * 1e9
    assert round(decode_rate(c) or 0, 2) == 61.19


def test_prefill_rate_is_prompt_eval_count_over_prompt_eval_duration() -> None:
    c = final("generate_stream_final.json")
    assert prefill_rate(c) == 26 / 130079000 * 1e9
    assert round(prefill_rate(c) or 0, 2) == 199.88


@pytest.mark.parametrize(
    ("name", "decode", "prefill"),
    [
        ("chat_stream_final.json", 282 / 4535599000 * 1e9, 26 / 342546000 * 1e9),
        ("generate_response_nonstream.json", 290 / 4709213000 * 1e9, 26 / 325953000 * 1e9),
        ("chat_response_nonstream.json", 298 / 4799921000 * 1e9, 26 / 383809000 * 1e9),
        ("generate_response_usage.json", 18 / 52479709 * 1e9, 11 / 13074791 * 1e9),
    ],
)
def test_every_documented_response_gives_the_formula_rates(
    name: str, decode: float, prefill: float
) -> None:
    c = final(name)
    assert (decode_rate(c), prefill_rate(c)) == (decode, prefill)
    assert implausible_prefill(c) is None


def test_a_response_without_counters_has_no_rates() -> None:
    c = final("generate_response_nonstream_short.json")
    assert c == {} and decode_rate(c) is None and prefill_rate(c) is None


def test_a_cache_hit_counted_as_prompt_work_is_flagged() -> None:
    hit = {"prompt_eval_count": 4000.0, "prompt_eval_duration": 400_000.0}
    assert "cached" in (implausible_prefill(hit) or "")
    fast = {"prompt_eval_count": 40.0, "prompt_eval_duration": 20_000.0}  # 2e6 tok/s
    assert "beyond any hardware" in (implausible_prefill(fast) or "")


def parse(data: bytes, chat: bool = False) -> RequestRecord:
    b = RecordBuilder(request_id="r", api="ollama-chat" if chat else "ollama", model="m")
    b.t_send_ns = 0
    parser = OllamaStreamParser(b, chat)
    for i, line in enumerate(data.splitlines(keepends=True)):
        parser.feed(line, (i + 1) * 1_000_000)
    if not (b.done or b.error):
        parser.close(10**9)
    return b.build()


def test_the_documented_stream_has_seven_tokens_the_last_on_the_done_line() -> None:
    r = parse(STREAM)
    assert r.ok
    assert r.output_text == "That's a fantastic question!"
    assert len(r.token_times_ns) == 7
    assert r.finish_reason == "stop"
    assert r.token_count_source == "chunks-estimate"  # this example has no counters


def test_the_final_line_counters_are_the_record_token_counts() -> None:
    lines = [json.loads(fixture_bytes("ollama", "generate_stream_chunk.json")),
             json.loads(fixture_bytes("ollama", "generate_stream_final.json"))]
    r = parse(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    assert (r.prompt_tokens, r.output_tokens, r.token_count_source) == (26, 259,
                                                                       "ollama-counters")
    assert r.prefill_tok_s == 26 / 130079000 * 1e9
    assert r.prefill_source == "ollama-counters"
    assert r.server_timings is not None and r.server_timings["load_duration"] == 6338219291


def test_chat_lines_carry_message_content() -> None:
    done = json.loads(fixture_bytes("ollama", "chat_stream_final.json"))
    lines = [{"message": {"role": "assistant", "content": "Hi"}, "done": False}, done]
    r = parse(b"".join(json.dumps(x).encode() + b"\n" for x in lines), chat=True)
    assert r.output_text == "Hi" and r.output_tokens == 282


def test_an_error_line_a_bad_line_and_a_missing_done_are_failures() -> None:
    assert parse(b'{"response":"a","done":false}\n{"error":"out of memory"}\n').error_kind == \
        "stream_broken"
    assert parse(b'{"response":"a","done":false}\nnot json\n').error_kind == "bad_chunk"
    assert parse(STREAM.rsplit(b"\n", 2)[0]).error_kind == "stream_broken"


def test_num_predict_caps_the_output() -> None:
    body = build_body(Target("http://h:11434", "ollama", "llama3.2",
                             extra_body={"options": {"temperature": 0}}), 32, "Why?")
    assert body == {"model": "llama3.2", "stream": True, "prompt": "Why?",
                    "options": {"num_predict": 32, "temperature": 0}}


@pytest.mark.timeout(30)
def test_the_documented_stream_read_over_http() -> None:
    async def main() -> RequestRecord:
        route = replay_route(STREAM, "application/x-ndjson", pieces=[30, 95, 200, 401])
        async with app_server({("POST", "/api/generate"): route}) as url, new_session() as s:
            return await stream_request(s, Target(url, "ollama", "gemma4"),
                                        "Why is the sky blue?", max_tokens=32)

    r = run(main())
    assert r.ok, r.error
    assert r.output_text == "That's a fantastic question!"
    assert r.finish_reason == "stop"
