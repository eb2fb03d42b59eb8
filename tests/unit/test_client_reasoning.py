"""A model that thinks before it answers: the thought kept apart from the answer, on captured
streams of real reasoning models (tests/data/fixtures/SOURCES.md, "reasoning/") and on the
reference server, whose reasoning phase is scheduled exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdscope.client import Api, RecordBuilder, RequestRecord, Target, new_session, stream_request
from pdscope.client.ollama import OllamaStreamParser
from pdscope.client.openai import OpenAIStreamParser
from pdscope.client.reasoning import (
    Parts,
    ThinkTags,
    chat_delta_parts,
    ollama_parts,
    reasoning_share,
    usage_reasoning_tokens,
)
from pdscope.client.record import record_series
from pdscope.selftest import ReferenceConfig, serving
from tests.unit.test_client_support import run

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "reasoning"
MS = 1_000_000


def lines_of(name: str) -> list[bytes]:
    return [line + b"\n" for line in (FIXTURES / name).read_bytes().split(b"\n") if line]


def read_sse(name: str) -> RequestRecord:
    """A captured chat stream read one line a millisecond, sent at 0."""
    b = RecordBuilder(request_id="r", api="openai-chat", model="m")
    b.t_send_ns = 0
    parser = OpenAIStreamParser(b, chat=True)
    raw = (FIXTURES / name).read_bytes()
    for i, line in enumerate(raw.splitlines(keepends=True), start=1):
        parser.feed(line if line.strip() else b"\n", i * MS)
    parser.close((raw.count(b"\n") + 2) * MS)
    return b.build()


# ---------------------------------------------------------------------------- captured streams


def test_vllm_s_reasoning_content_is_thought_and_its_content_the_answer() -> None:
    # Read off the transcript: 12 chunks of reasoning_content ("\n" ... ".\n"), then 9 of
    # content ("\n\n" ... "..."), then an empty one with finish_reason.
    r = read_sse("vllm_chat_reasoning_content.sse.txt")
    assert r.ok and r.finish_reason == "stop"
    assert r.n_out == 21 and r.token_count_source == "chunks-estimate"
    assert r.reasoning_tokens == 12 and r.answer_tokens == 9
    # Line 1 is the role chunk, line 2 the first thought, line 14 the first answer ("\n\n").
    assert r.ttft_s == pytest.approx(0.002) and r.ttfo_s == pytest.approx(0.014)
    assert r.thinking_s == pytest.approx(0.012)


def test_a_think_tag_left_in_vllm_s_content_opens_a_thought_that_here_never_closes() -> None:
    # Qwen3-0.6B on vLLM without a reasoning parser: "<think>", "\n", "!" (the author cut the
    # rest of the stream out): all thought, no answer yet, so no TTFO.
    r = read_sse("vllm_chat_think_tags_qwen3-0.6b.sse.txt")
    assert r.ok
    assert r.n_out == 3 and r.reasoning_tokens == 3 and r.answer_tokens == 0
    assert r.ttft_s is not None and r.ttfo_s is None and r.thinking_s is None
    assert r.output_text == "<think>\n!"


def test_ollama_s_thinking_field_is_thought() -> None:
    # qwen3:0.6b on Ollama 0.20.7 with "think": true, its first three lines: content "".
    b = RecordBuilder(request_id="r", api="ollama-chat", model="m")
    b.t_send_ns = 0
    parser = OllamaStreamParser(b, chat=True)
    for i, line in enumerate(lines_of("ollama_chat_thinking_qwen3-0.6b.ndjson"), start=1):
        parser.feed(line, i * MS)
    r = b.build()
    assert r.n_out == 3 and r.reasoning_tokens == 3 and r.output_text == "Okay, the"
    assert r.t_first_token_ns == MS and r.ttfo_s is None


# ---------------------------------------------------------------------------- the splitting


def test_both_spellings_of_the_reasoning_delta_are_thought_and_tool_calls_are_answer() -> None:
    assert chat_delta_parts({"reasoning_content": "a"}) == Parts("a", "")
    assert chat_delta_parts({"reasoning": "a", "content": None}) == Parts("a", "")
    assert chat_delta_parts({"content": "x", "reasoning": "y"}) == Parts("y", "x")
    call = {"tool_calls": [{"function": {"name": "get", "arguments": "{}"}}]}
    assert chat_delta_parts(call) == Parts("", "get{}")
    assert not chat_delta_parts({"role": "assistant", "content": ""})


def test_ollama_s_generate_and_chat_lines() -> None:
    assert ollama_parts({"thinking": "t", "response": ""}, chat=False) == Parts("t", "")
    assert ollama_parts({"message": {"content": "a"}}, chat=True) == Parts("", "a")


def test_the_server_s_own_count_of_reasoning_tokens() -> None:
    # OpenAI's and DeepSeek's usage: completion_tokens_details.reasoning_tokens.
    usage = {"completion_tokens": 92, "completion_tokens_details": {"reasoning_tokens": 81}}
    assert usage_reasoning_tokens(usage) == 81
    assert usage_reasoning_tokens({"completion_tokens": 3}) is None
    assert usage_reasoning_tokens({"completion_tokens_details": {"reasoning_tokens": -1}}) is None


def split_all(chunks: list[str]) -> list[tuple[Parts, bool]]:
    tags = ThinkTags()
    return [tags.split(c) for c in chunks]


def test_think_tags_in_their_own_chunks() -> None:
    out = split_all(["<think>", "\nhmm", "</think>", "\n\nThe", " answer"])
    assert [p for p, _ in out] == [Parts("<think>", ""), Parts("\nhmm", ""),
                                   Parts("</think>", ""), Parts("", "\n\nThe"),
                                   Parts("", " answer")]
    assert not any(retro for _, retro in out)


def test_a_whole_thought_in_one_chunk_and_the_answer_after_it() -> None:
    assert split_all(["<think>a</think>b"])[0] == (Parts("<think>a</think>", "b"), False)


def test_a_close_tag_with_no_open_one_makes_the_earlier_text_thought() -> None:
    # The template opened <think> in the prompt (Qwen3.5, DeepSeek-R1-0528).
    out = split_all(["Okay", ", so", "</think>\n\n", "42"])
    assert out[2] == (Parts("</think>", "\n\n"), True)
    assert out[3] == (Parts("", "42"), False)


def test_text_without_tags_is_all_answer_and_later_tags_are_text() -> None:
    out = split_all(["Hello", " <think>", " no"])
    assert [p for p, _ in out] == [Parts("", "Hello"), Parts("", " <think>"), Parts("", " no")]


def test_a_chunk_with_both_shares_its_tokens_by_length() -> None:
    assert reasoning_share(Parts("abc", "d"), 4) == 3
    assert reasoning_share(Parts("a", "bcdefgh"), 4) == 0
    assert reasoning_share(Parts("abcdefg", "h"), 2) == 1  # one token left to the answer
    assert reasoning_share(Parts("abc", ""), 5) == 5 and reasoning_share(Parts("", "x"), 5) == 0


def test_a_retro_close_reclassifies_the_builder_s_chunks() -> None:
    b = RecordBuilder(request_id="r", api="openai-chat", model="m")
    b.t_send_ns = 0
    parser = OpenAIStreamParser(b, chat=True)
    for i, text in enumerate(["Okay", ", so", "</think>", "\\n\\n42"], start=1):
        parser.event('{"choices":[{"delta":{"content":"' + text + '"}}]}', i * MS)
    r = b.build()
    assert r.reasoning_tokens == 3 and r.answer_tokens == 1
    assert r.ttft_s == pytest.approx(0.001) and r.ttfo_s == pytest.approx(0.004)


def test_a_model_that_does_not_reason_has_ttfo_equal_to_ttft_and_no_reasoning() -> None:
    b = RecordBuilder(request_id="r", api="openai", model="m")
    b.t_send_ns = 0
    for i in range(1, 4):
        b.add_tokens(i * MS, " w")
    r = b.build()
    assert r.reasoning_tokens is None and not r.reasoned
    assert r.ttfo_s == r.ttft_s and r.thinking_s is None
    assert "ttfo" not in record_series([r]) and "reasoning_tokens" not in record_series([r])


def test_a_record_with_reasoning_reads_back_equal() -> None:
    r = read_sse("vllm_chat_reasoning_content.sse.txt")
    assert RequestRecord.from_json(r.to_json()) == r
    assert r.to_dict()["derived"]["thinking_s"] == pytest.approx(0.012)


# ---------------------------------------------------------------------------- the reference server

ITL_S, N_THOUGHT, N_OUT = 0.01, 20, 30
PROMPT = " ".join(f"w{i}" for i in range(100))


def measure(form: str, api: Api) -> RequestRecord:
    config = ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0.0, itl_s=ITL_S,
                             reasoning_tokens=N_THOUGHT, reasoning_form=form)

    async def main() -> RequestRecord:
        async with serving(config) as url, new_session() as session:
            t = Target(url, api, config.model, server_kind="pdscope-reference")
            return await stream_request(session, t, PROMPT, max_tokens=N_OUT)

    return run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("form", "api"), [
    ("reasoning_content", "openai-chat"),
    ("reasoning", "openai-chat"),
    ("think_tags", "openai-chat"),
    ("reasoning_content", "openai"),  # the completions API: always <think> tags
    ("ollama_thinking", "ollama-chat"),
    ("ollama_thinking", "ollama"),
])
def test_the_reference_server_s_thinking_is_counted_and_timed(form: str, api: Api) -> None:
    r = measure(form, api)
    assert r.ok, r.error
    assert r.n_out == N_OUT
    assert (r.reasoning_tokens, r.answer_tokens) == (N_THOUGHT, N_OUT - N_THOUGHT)
    # Thinking ends where the answer's first chunk came: the one after the N_THOUGHT thought
    # chunks (a token a chunk), N_THOUGHT gaps after the first on the server's schedule (200
    # ms). The times are read, not asserted against the schedule: on a busy two-core machine
    # (both test workers, a wheel being built) the server or the client can stall for tens of
    # milliseconds, which moves the gap and says nothing of where thinking ended.
    assert len(r.token_times_ns) == N_OUT
    assert r.t_first_answer_ns == r.token_times_ns[N_THOUGHT]
    assert r.thinking_s == (r.token_times_ns[N_THOUGHT] - r.token_times_ns[0]) / 1e9 > 0
    due = r.server_due_ns  # the schedule, where the server writes it into its chunks
    if due is not None:
        assert (due[N_THOUGHT] - due[0]) / 1e9 == pytest.approx(N_THOUGHT * ITL_S, abs=1e-3)
    assert r.ttfo_s is not None and r.ttft_s is not None and r.ttfo_s > r.ttft_s


def test_a_reasoning_form_the_server_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="reasoning_form"):
        ReferenceConfig(reasoning_form="telepathy")
