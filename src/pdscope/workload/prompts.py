"""Prompts of an exact token length, in varied text.

A measurement of prefill needs a prompt of a known length, and one the server has not seen
before (a prefix cache would otherwise flatter it). The text is made of sentences drawn from a
built-in vocabulary by a seeded generator: varied words, so the tokenizer sees ordinary text
rather than one word repeated, and a different seed gives a different prompt from its first
word on. The length is fitted to the server's own tokenizer where it exposes one (a binary
search over the number of words, then a few short filler words); where it does not, it is
estimated from a tokens-a-word ratio that callers calibrate from the server's reported
``prompt_tokens``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# Words from ordinary technical and everyday prose. Long enough that sentences rarely repeat.
_WORDS = """
the a of to and in that is for on with as by at from it this be are was an or which not have
has but can all more one their will would there been its also other new into some when what
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye
job word business issue side kind head house service friend father power hour game line end
member law car city community name president team minute idea kid body information back parent
face others level office door health person art war history party result change morning reason
research girl guy moment air teacher force education memory bandwidth cache token prompt model
server request queue batch latency throughput decode prefill kernel matrix vector tensor layer
attention weight value key head window context length stream chunk schedule pool block page
memory compute cycle clock core thread process network packet socket buffer channel bus disk
file folder record table index query answer signal noise sample measure median spread ceiling
floor rate speed limit budget cost price market plan design draft review test build release
river mountain forest garden ocean island valley desert bridge tower street market village
coffee bread apple orange lemon honey salt pepper butter cheese rice soup salad dinner lunch
quick slow bright dark warm cold heavy light early late large small long short simple complex
careful honest quiet loud sharp gentle steady rapid modern ancient local global private public
measure compare explain describe reduce increase improve estimate observe record predict verify
carry hold bring send read write open close start finish follow lead move turn wait watch learn
often rarely always never sometimes usually quickly slowly clearly mostly nearly almost already
because although while unless until before after since whether however therefore meanwhile
""".split()

_OPENERS = ("The", "A", "Every", "Some", "This", "Our", "Each", "Most", "That", "Any")
_PUNCT = (".", ".", ".", ".", "?", "!", ";", ",")

CountFn = Callable[[str], Awaitable[int]]

# Typical English prose with a BPE tokenizer: about 1.3 tokens a word. Only a starting point:
# callers replace it with the ratio the server reports.
DEFAULT_TOKENS_PER_WORD = 1.3


def synthetic_text(n_words: int, seed: int) -> str:
    """``n_words`` words of sentence-like text; the same seed gives the same text."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n_words:
        length = rng.randint(6, 18)
        sentence = [rng.choice(_OPENERS)] + [rng.choice(_WORDS) for _ in range(length - 1)]
        sentence[-1] += rng.choice(_PUNCT)
        out.extend(sentence)
    return " ".join(out[:n_words])


@dataclass(frozen=True)
class Prompt:
    """A prompt and what is known of its length. ``tokens`` is the server tokenizer's count
    when ``exact``; otherwise an estimate from ``tokens_per_word``."""

    text: str
    target_tokens: int
    tokens: int
    exact: bool
    method: str  # "server-tokenizer" or "estimate"

    @property
    def error(self) -> int:
        return self.tokens - self.target_tokens


def estimate_prompt(
    n_tokens: int, seed: int, *, prefix: str = "", tokens_per_word: float = DEFAULT_TOKENS_PER_WORD
) -> Prompt:
    """A prompt of about ``n_tokens`` tokens with no tokenizer at hand."""
    words = max(1, round(n_tokens / tokens_per_word) - _word_count(prefix))
    text = _join(prefix, synthetic_text(words, seed))
    return Prompt(text, n_tokens, round(_word_count(text) * tokens_per_word), False, "estimate")


def _word_count(text: str) -> int:
    return len(text.split())


def _join(prefix: str, body: str) -> str:
    if not prefix:
        return body
    if not body:
        return prefix
    return prefix.rstrip() + " " + body


_FILLERS = (" a", " the", " of", " and", " it", " so", " go", ".", ",")


async def prompt_of_length(
    n_tokens: int,
    count: CountFn,
    seed: int,
    *,
    prefix: str = "",
    tokens_per_word: float | None = None,
) -> Prompt:
    """A prompt the server's tokenizer counts as exactly ``n_tokens`` tokens (or as close as
    it gets: ``Prompt.tokens`` says). ``prefix`` (a shared system prompt, say) is kept whole
    at the start. ``tokens_per_word``, when known from an earlier prompt, makes the first
    guess close.

    Each tokenizer call is a request to the server (its ``/tokenize``), so the search takes
    as few as it can: from a guess, it steps by the tokens still missing at the words'
    measured ratio (a secant step; halving the bracket when a step would leave it), then
    tops up with short filler words, all of the shortfall at once before one at a time. On a
    BPE-like count that is 3 to 4 calls a prompt, where a binary search over the words took
    7 at 128 tokens and 10 at 1,000."""
    if n_tokens < 1:
        raise ValueError("a prompt needs at least one token")
    base = await count(prefix) if prefix else 0
    if base >= n_tokens:
        return Prompt(prefix, n_tokens, base, base == n_tokens, "server-tokenizer")
    # Enough words for the target at any sane tokens-a-word ratio.
    pool = synthetic_text(max(8, 2 * (n_tokens - base) + 8), seed).split()
    counted = {0: base}  # words taken from the pool -> the tokenizer's count

    async def at(k: int) -> int:
        if k not in counted:
            counted[k] = await count(_join(prefix, " ".join(pool[:k])))
        return counted[k]

    # Invariant: at(lo) <= n_tokens < at(hi), where hi = len(pool) + 1 means "not yet seen".
    lo, hi = 0, len(pool) + 1
    k = round((n_tokens - base) / (tokens_per_word or DEFAULT_TOKENS_PER_WORD))
    while hi - lo > 1:
        if not lo < k < hi:
            k = (lo + hi) // 2
        c = await at(k)
        if c == n_tokens:
            lo = k
            break
        if c < n_tokens:
            lo = k
        else:
            hi = k
        ratio = (c - base) / k if c > base else DEFAULT_TOKENS_PER_WORD
        step = (n_tokens - c) / ratio
        k += math.ceil(step) if step > 0 else math.floor(step)
    text, c = _join(prefix, " ".join(pool[:lo])), counted[lo]
    # Top up with short words, each usually one token, until the count is exact: the whole
    # shortfall in one call first, then one word at a time.
    rng = random.Random(seed)
    if 1 < n_tokens - c <= 64:
        candidate = text + "".join(rng.choice(_FILLERS) for _ in range(n_tokens - c))
        cand_count = await count(candidate)
        if cand_count <= n_tokens:
            text, c = candidate, cand_count
    for _ in range(64):
        if c == n_tokens:
            break
        filler = rng.choice(_FILLERS)
        candidate = text + filler
        cand_count = await count(candidate)
        if cand_count <= n_tokens:
            text, c = candidate, cand_count
    return Prompt(text, n_tokens, c, c == n_tokens, "server-tokenizer")


class PromptBuilder:
    """Prompts of given lengths, unique by seed, fitted with a tokenizer when there is one and
    estimated otherwise; the estimate's ratio is updated from what the server reports."""

    def __init__(self, count: CountFn | None = None, base_seed: int = 0) -> None:
        self.count = count
        self.base_seed = base_seed
        self.tokens_per_word = DEFAULT_TOKENS_PER_WORD
        self._fitted_ratio: float | None = None

    def calibrate(self, prompt: Prompt, reported_tokens: int) -> None:
        """Use the server's ``prompt_tokens`` for an estimated prompt to refine the ratio."""
        words = _word_count(prompt.text)
        if words and reported_tokens > 0 and not prompt.exact:
            self.tokens_per_word = reported_tokens / words

    async def build(self, n_tokens: int, index: int, *, prefix: str = "") -> Prompt:
        seed = self.base_seed * 1_000_003 + index
        if self.count is not None:
            prompt = await prompt_of_length(n_tokens, self.count, seed, prefix=prefix,
                                            tokens_per_word=self._fitted_ratio)
            if prompt.exact and not prefix:
                self._fitted_ratio = prompt.tokens / max(1, _word_count(prompt.text))
            return prompt
        return estimate_prompt(n_tokens, seed, prefix=prefix, tokens_per_word=self.tokens_per_word)
