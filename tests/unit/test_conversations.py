"""bench --conversations against the reference server: the history grows by each turn's user
message and the server's real answer, think time is kept, the per-turn table is shown; and the
recorded conversations' reader."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from pdscope.errors import InputError
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.workload.conversations import read_conversations

FAST = dict(ttft_base_s=0.02, ttft_per_token_s=0.0, itl_s=0.005)
USER, OUT, THINK = 40, 16, 0.3


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(**FAST)) as url:  # type: ignore[arg-type]
        yield url


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdscope", "bench", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
def test_three_turns_grow_by_the_user_message_and_the_real_answer(reference: str,
                                                                 tmp_path: Path) -> None:
    r = bench(reference, "--conversations", "2", "--turns", "3", "--think-s", str(THINK),
              "--user-len", str(USER), "--output-len", str(OUT), "--api", "openai-chat",
              "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert json.loads((tmp_path / "conversations.json").read_text()) == data
    assert [t["turn"] for t in data["per_turn"]] == [1, 2, 3]
    for c in (0, 1):
        turns = sorted((x for x in data["records"] if x["conversation"] == c),
                       key=lambda x: x["turn"])
        assert len(turns) == 3
        for prev, cur in pairwise(turns):
            assert prev["answer"], "the server's real answer"
            assert prev["output_tokens"] >= 1
            # The prompt holds the previous prompt, its answer and the new user message.
            assert cur["prompt_tokens"] >= prev["prompt_tokens"] + USER + prev["output_tokens"] - 2
            assert cur["sent_s"] - prev["ended_s"] >= THINK * 0.95


@pytest.mark.timeout(60)
def test_the_human_output_has_a_per_turn_table(reference: str, tmp_path: Path) -> None:
    r = bench(reference, "--conversations", "1", "--turns", "2", "--user-len", "20",
              "--output-len", "8", "--api", "openai-chat", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "per turn" in r.stdout and "TTFT p50" in r.stdout and "prompt tok" in r.stdout


@pytest.mark.timeout(60)
def test_a_recorded_conversation_is_replayed_with_the_real_answers(reference: str,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hello there " * 10},
                                 {"role": "assistant", "content": "RECORDED ANSWER"},
                                 {"role": "user", "content": "and then " * 10}]}) + "\n"
        + json.dumps({"conversations": [{"from": "human", "value": "tell me " * 8},
                                        {"from": "gpt", "value": "RECORDED"},
                                        {"from": "human", "value": "more " * 8},
                                        {"from": "gpt", "value": "RECORDED"},
                                        {"from": "human", "value": "again " * 8}]}) + "\n")
    r = bench(reference, "--conversations", "2", "--dataset", str(path), "--output-len", "8",
              "--api", "openai-chat", "--out", str(tmp_path / "run"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    turns = {c: [x for x in data["records"] if x["conversation"] == c] for c in (0, 1)}
    assert len(turns[0]) == 2 and len(turns[1]) == 3
    assert all("RECORDED" not in x["answer"] for x in data["records"])


def test_bad_conversation_lines_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                    + '{"conversations": [{"from": "human"}]}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: turn 1 has no"):
        read_conversations(path)
    path.write_text("not json\n")
    with pytest.raises(InputError, match=r"bad.jsonl:1: not JSON"):
        read_conversations(path)
    path.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    with pytest.raises(InputError, match="no user turn"):
        read_conversations(path)
