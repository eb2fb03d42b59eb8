"""The OpenAI-style SSE stream, read from real recorded transcripts."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from aiohttp import web

from pdscope.client import RecordBuilder, RequestRecord, Target, new_session, stream_request
from pdscope.client.openai import OpenAIStreamParser, build_body, fixed_output_fields
from pdscope.client.sse import SSEDecoder
from tests.unit.test_client_support import app_server, fixture_bytes, replay_route, run

QWEN = fixture_bytes("vllm", "completions_stream_qwen3-4b.sse.txt")
OPEA = fixture_bytes("vllm", "completions_stream_opea_searchqna.txt")


def parse(data: bytes, cuts: list[int], chat: bool = False) -> RequestRecord:
    """Feed ``data`` cut at ``cuts``, each read 1 ms after the one before."""
    b = RecordBuilder(request_id="r", api="openai-chat" if chat else "openai", model="m")
    b.t_send_ns = 0
    parser = OpenAIStreamParser(b, chat)
    bounds = [0, *cuts, len(data)]
    for i, (lo, hi) in enumerate(pairwise(bounds)):
        if hi > lo and not (b.done or b.error):
            parser.feed(data[lo:hi], (i + 1) * 1_000_000)
    if not (b.done or b.error):
        parser.close(len(bounds) * 1_000_000)
    return b.build()


def test_the_vllm_transcript_has_seven_token_chunks_and_its_text() -> None:
    r = parse(QWEN, [])
    assert r.ok
    assert len(r.token_times_ns) == 7
    assert r.output_text == " city in the state of California,"
    assert r.finish_reason == "length"
    assert r.token_count_source == "chunks-estimate"


def test_data_lines_without_blank_lines_between_them_are_still_events() -> None:
    r = parse(OPEA, [])
    assert r.ok
    assert len(r.token_times_ns) == 10  # the 11th chunk has empty text and finish_reason stop
    assert r.output_text == ", with calls for more regulation and transparency."
    assert r.finish_reason == "stop"


@pytest.mark.parametrize(
    ("data", "text", "chunks"),
    [
        (QWEN, " city in the state of California,", 7),
        (OPEA, ", with calls for more regulation and transparency.", 10),
    ],
    ids=["qwen", "opea"],
)
def test_a_stream_cut_at_every_byte_reads_the_same(data: bytes, text: str, chunks: int) -> None:
    # Read off the transcripts: seven chunks " city" ... "," in one; ten with text and an
    # eleventh, empty, in the other.
    for cut in range(1, len(data)):
        r = parse(data, [cut])
        assert r.output_text == text, cut
        assert len(r.token_times_ns) == chunks, cut
        assert r.ok, cut


def test_a_chunk_is_timed_by_the_read_that_completed_it() -> None:
    first_event_end = QWEN.index(b"\n\n") + 2
    r = parse(QWEN, [first_event_end - 5, first_event_end])
    assert r.token_times_ns[0] == 2_000_000  # its last bytes came in the second read


def test_comments_crlf_and_a_multi_line_event_are_understood() -> None:
    d = SSEDecoder()
    events = d.feed(b": ping\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: x\ndata: [DONE]\n\n")
    assert events == ['{"a":\n1}', "[DONE]"]


def chat_stream(*chunks: dict[str, object]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


def test_a_role_only_chat_chunk_is_not_the_first_token() -> None:
    data = chat_stream(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"content": ""}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1,
                                  "prompt_tokens_details": {"cached_tokens": 8}}},
    )
    first = data.index(b"\n\n") + 2
    r = parse(data, [first], chat=True)
    assert r.ttft_s == pytest.approx(0.002)  # the role chunk came at 1 ms
    assert (r.prompt_tokens, r.output_tokens, r.cached_tokens) == (9, 1, 8)
    assert r.token_count_source == "usage"


def test_reasoning_tokens_are_generated_tokens() -> None:
    data = chat_stream({"choices": [{"delta": {"reasoning_content": "hmm"}}]},
                       {"choices": [{"delta": {"content": "ok"}}]})
    r = parse(data, [], chat=True)
    assert r.output_text == "hmmok" and len(r.token_times_ns) == 2


def test_llama_cpp_timings_in_the_last_chunk_give_counts_and_prefill() -> None:
    data = chat_stream(
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [{"delta": {}, "finish_reason": "length"}],
         "timings": {"cache_n": 236, "prompt_n": 1, "prompt_ms": 30.958, "predicted_n": 35,
                     "predicted_ms": 661.064}},
    )
    r = parse(data, [], chat=True)
    assert (r.output_tokens, r.token_count_source) == (35, "server-timings")
    assert (r.prompt_tokens, r.cached_tokens) == (237, 236)
    assert r.prefill_source == "llama.cpp-timings"


def test_per_chunk_usage_says_how_many_tokens_each_chunk_carried() -> None:
    data = chat_stream(
        {"choices": [{"delta": {"role": "assistant"}}], "usage": {"completion_tokens": 0}},
        {"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": 1}},
        {"choices": [{"delta": {"content": "bcd"}}], "usage": {"completion_tokens": 4}},
    )
    r = parse(data, [], chat=True)
    assert r.chunk_tokens == (1, 3)


def test_an_error_event_and_a_non_json_chunk_are_failures() -> None:
    err = parse(chat_stream({"error": {"message": "engine died", "code": 500}}), [])
    assert (err.error_kind, "engine died" in (err.error or "")) == ("stream_broken", True)
    bad = parse(b'data: {"choices":[{"text":"a"}]}\n\ndata: {oops\n\n', [])
    assert bad.error_kind == "bad_chunk" and len(bad.token_times_ns) == 1


def test_a_stream_cut_off_before_done_is_broken() -> None:
    cut = QWEN[: QWEN.index(b"California")]
    r = parse(cut, [])
    assert r.error_kind == "stream_broken"


def test_fixed_output_asks_each_server_in_its_own_words() -> None:
    assert fixed_output_fields("vllm", 64) == {"ignore_eos": True, "min_tokens": 64}
    assert fixed_output_fields("llama.cpp", 64) == {"ignore_eos": True}
    assert fixed_output_fields("llama-cpp-python", 64) == {"min_tokens": 64}
    assert fixed_output_fields("openai", 64) == {}
    body = build_body(Target("http://h:1/v1", "openai-chat", "m", fixed_output=True,
                             server_kind="vllm", extra_body={"temperature": 0}), 64, "hi")
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (body["min_tokens"], body["temperature"], body["stream"]) == (64, 0, True)


@pytest.mark.timeout(30)
def test_the_recorded_vllm_stream_read_over_http_in_small_pieces() -> None:
    pieces = list(range(7, len(OPEA), 97))

    async def main() -> RequestRecord:
        route = replay_route(OPEA, "text/event-stream", pieces)
        async with app_server({("POST", "/v1/completions"): route}) as url, new_session() as s:
            return await stream_request(s, Target(url, "openai", "m"), "Hello", max_tokens=16)

    r = run(main())
    assert r.ok, r.error
    assert r.output_text == ", with calls for more regulation and transparency."
    assert r.connect_s is not None and r.connect_s < 1.0
    assert r.ttft_s is not None and 0 < r.ttft_s < 5


@pytest.mark.timeout(30)
def test_a_server_that_answers_with_one_json_body_did_not_stream() -> None:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "all at once"}]})

    async def main() -> RequestRecord:
        async with app_server({("POST", "/v1/completions"): answer}) as url, new_session() as s:
            return await stream_request(s, Target(url, "openai", "m"), "Hello")

    r = run(main())
    assert r.error_kind == "stream_broken" and "not a stream" in (r.error or "")


def completions_stream(*chunks: object) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


def _choice(text: object, finish: object = None) -> dict[str, object]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


# Completions chunks of every shape the typed path (``_typed_chunk``) takes or hands back
# to the general one: what each reads must not differ.
ODD_CHUNKS: list[tuple[object, ...]] = [
    ({"choices": [_choice(" a")], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
     {"choices": [_choice(" b c", "length")], "usage": {"prompt_tokens": 5,
                                                       "completion_tokens": 3}},
     {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
    ({"choices": [_choice(" a")], "pdscope_sent_ns": 7, "pdscope_due_ns": 5},
     {"choices": [_choice(" b")], "pdscope_sent_ns": -1, "pdscope_due_ns": 2.0}),
    ({"choices": [_choice(" a")], "usage": {"prompt_tokens": 5.0, "completion_tokens": True}},
     {"choices": [_choice(7)], "usage": {"prompt_tokens": 2**70, "completion_tokens": -3}}),
    ({"choices": [_choice(" a")], "usage": {"prompt_tokens": 9, "completion_tokens": 1,
                                            "prompt_tokens_details": {"cached_tokens": 4},
                                            "completion_tokens_details": {
                                                "reasoning_tokens": 1}}},),
    ({"choices": [_choice("<think> a")]}, {"choices": [_choice("b</think> c", 3)]}),
    ({"choices": [_choice(" a")], "timings": {"prompt_n": 9, "prompt_ms": 3.0}},
     {"choices": [_choice(None)]}, {"choices": [1]}, {"choices": "x"}),
    ({"choices": [_choice(" a")]}, {"error": {"message": "boom"}}),
    ({"choices": [_choice(" a")]}, [1, 2]),
]


@pytest.mark.parametrize("chunks", ODD_CHUNKS)
def test_the_typed_path_reads_a_chunk_as_the_general_one(
    chunks: tuple[object, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pdscope.client import openai

    data = completions_stream(*chunks)
    # All in one read, and a read an event (the common read, decoded from its bytes).
    each = [i + 2 for i in range(len(data)) if data.startswith(b"\n\n", i)][:-1]
    for cuts in ([], each):
        typed = parse(data, cuts)
        with monkeypatch.context() as m:
            m.setattr(openai, "_typed_chunk", lambda _data: None)
            general = parse(data, cuts)
        assert typed == general


def test_a_whole_event_that_is_not_utf8_is_a_bad_chunk_either_way() -> None:
    good = completions_stream({"choices": [_choice(" a")]}).split(b"data: [DONE]")[0]
    bad = b'data: {"choices": [{"index": 0, "text": " \xff"}]}\n\n'
    r = parse(good + bad + b"data: [DONE]\n\n", [len(good), len(good) + len(bad)])
    assert r.error_kind == "bad_chunk" and "UTF-8" in (r.error or "")
    assert len(r.token_times_ns) == 1


def test_the_typed_path_takes_a_vllm_chunk_and_hands_back_the_rest() -> None:
    from pdscope.client.openai import _typed_chunk

    plain = {"id": "c", "object": "text_completion", "choices": [_choice(" a", "length")],
             "usage": {"prompt_tokens": 5, "total_tokens": 6, "completion_tokens": 1},
             "pdscope_sent_ns": 7, "pdscope_due_ns": 5}
    c = _typed_chunk(json.dumps(plain))
    assert c is not None and c.usage is not None
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.choices[0].text,
            c.choices[0].finish_reason, c.pdscope_sent_ns, c.pdscope_due_ns) == (
        5, 1, " a", "length", 7, 5)
    for odd in ({**plain, "timings": {}}, {**plain, "error": "x"}, {**plain, "choices": [1]},
                {**plain, "pdscope_sent_ns": -1}, [plain], "not json",
                {**plain, "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                                    "prompt_tokens_details": {"cached_tokens": 4}}}):
        assert _typed_chunk(json.dumps(odd) if odd != "not json" else "{") is None


def test_a_token_sent_with_no_text_counts_with_the_next_chunk() -> None:
    # vLLM holds back the text of a token that ends inside a UTF-8 character and sends the
    # chunk anyway, with an empty text and the running count (continuous usage stats).
    data = completions_stream(
        {"choices": [_choice(" a")], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
        {"choices": [_choice("")], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
        {"choices": [_choice(" \u00e9")], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
        {"choices": [_choice(" b", "length")],
         "usage": {"prompt_tokens": 5, "completion_tokens": 4}},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
    each = [i + 2 for i in range(len(data)) if data.startswith(b"\n\n", i)][:-1]
    for cuts in ([], each):
        r = parse(data, cuts)
        assert r.chunk_tokens == (1, 2, 1) and r.output_tokens == 4
        assert r.output_text == " a \u00e9 b"
