"""Prompts of an exact token length, in varied text."""

from __future__ import annotations

import asyncio
import re

from pdscope.workload import PromptBuilder, estimate_prompt, prompt_of_length, synthetic_text


async def count_pieces(text: str) -> int:
    """A real (if simple) tokenizer: words and punctuation marks, each one token."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def test_synthetic_text_is_varied_and_seeded() -> None:
    a = synthetic_text(500, seed=1)
    assert a == synthetic_text(500, seed=1)
    assert a != synthetic_text(500, seed=2)
    words = a.split()
    assert len(words) == 500
    # Not one word repeated: many distinct words, none dominating.
    assert len(set(words)) > 150
    assert max(words.count(w) for w in set(words)) < 0.1 * len(words)


def test_a_prompt_fitted_to_a_tokenizer_has_exactly_the_asked_length() -> None:
    for n in (1, 7, 200, 2000):
        p = asyncio.run(prompt_of_length(n, count_pieces, seed=n))
        assert p.exact and p.tokens == n
        assert asyncio.run(count_pieces(p.text)) == n


def test_different_seeds_give_different_prompts_of_the_same_length() -> None:
    a = asyncio.run(prompt_of_length(300, count_pieces, seed=1))
    b = asyncio.run(prompt_of_length(300, count_pieces, seed=2))
    assert a.tokens == b.tokens == 300
    assert a.text.split()[:20] != b.text.split()[:20]


def test_a_shared_prefix_is_kept_whole() -> None:
    prefix = synthetic_text(100, seed=99)
    p = asyncio.run(prompt_of_length(400, count_pieces, seed=5, prefix=prefix))
    assert p.text.startswith(prefix) and p.tokens == 400


def test_without_a_tokenizer_the_estimate_uses_the_calibrated_ratio() -> None:
    b = PromptBuilder(count=None)
    p = asyncio.run(b.build(1000, 0))
    assert not p.exact and p.method == "estimate"
    # The server reported 1.5 tokens a word for that text: the next estimate follows it.
    b.calibrate(p, round(len(p.text.split()) * 1.5))
    q = asyncio.run(b.build(1000, 1))
    assert abs(len(q.text.split()) * 1.5 - 1000) <= 2


def test_estimate_prompt_reports_its_guess() -> None:
    p = estimate_prompt(650, seed=3, tokens_per_word=1.3)
    assert abs(p.tokens - 650) <= 2 and p.error == p.tokens - 650


def test_a_fitted_prompt_takes_few_tokenizer_calls() -> None:
    # Every call is a request to the server's /tokenize: a load test of 4,000 prompts made 7 to
    # 10 a prompt by binary search. With the ratio of the first prompt, the search steps by the
    # tokens still missing and tops up in one call: most prompts take at most 3.
    calls = 0

    async def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return await count_pieces(text)

    for n in (128, 1000):
        b = PromptBuilder(counting, base_seed=3)
        per: list[int] = []
        for i in range(20):
            calls = 0
            p = asyncio.run(b.build(n, i))
            assert p.exact and p.tokens == n
            per.append(calls)
        assert sorted(per[1:])[len(per) // 2] <= 3, (n, per)
        assert max(per) <= 8, (n, per)
