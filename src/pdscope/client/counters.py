"""Ollama's timing counters, and the article's formulas on them.

Each final Ollama response carries ``prompt_eval_count``, ``prompt_eval_duration``,
``eval_count``, ``eval_duration``, ``load_duration`` and ``total_duration`` (durations in
nanoseconds; ollama/ollama ``docs/api.md``). The article's formulas:

* decode rate = ``eval_count / eval_duration * 1e9`` tokens/s;
* prefill rate = ``prompt_eval_count / prompt_eval_duration * 1e9`` tokens/s.

Caution on the second: newer Ollama releases reuse the KV cache of a previous prompt and still
count the reused tokens in ``prompt_eval_count``, while ``prompt_eval_duration`` covers only the
part that was computed. A repeated prompt then shows an absurd prefill rate (millions of
tokens/s, or a few tokens' worth of time for thousands of tokens). :func:`implausible_prefill`
says when a rate looks like that, so a report can set it aside instead of printing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = (
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
    "load_duration",
    "total_duration",
)

# No processor prefills faster than this; above it the duration left out cached tokens.
MAX_PLAUSIBLE_PREFILL_TOK_S = 1e6
# Many prompt tokens "evaluated" in less than this is a cache hit counted as work.
MIN_PLAUSIBLE_PREFILL_NS = 1_000_000
MANY_PROMPT_TOKENS = 64


def counters(obj: Mapping[str, Any]) -> dict[str, float]:
    """The timing counters of a final (``done``) Ollama response, those it has."""
    return {
        key: float(obj[key])
        for key in COUNTERS
        if isinstance(obj.get(key), (int, float)) and not isinstance(obj.get(key), bool)
    }


def decode_rate(c: Mapping[str, float]) -> float | None:
    """``eval_count / eval_duration * 1e9``: output tokens a second of decode."""
    n, dur = c.get("eval_count"), c.get("eval_duration")
    return n / dur * 1e9 if n and dur else None


def prefill_rate(c: Mapping[str, float]) -> float | None:
    """``prompt_eval_count / prompt_eval_duration * 1e9``: prompt tokens a second of prefill.
    See :func:`implausible_prefill` before trusting it on a repeated prompt."""
    n, dur = c.get("prompt_eval_count"), c.get("prompt_eval_duration")
    return n / dur * 1e9 if n and dur else None


def implausible_prefill(c: Mapping[str, float]) -> str | None:
    """Why the prefill rate of these counters cannot be real, or ``None`` if it can.

    Newer Ollama counts cached prompt tokens in ``prompt_eval_count`` but times only the
    uncached part in ``prompt_eval_duration``: a cache hit looks like an impossible rate.
    """
    n, dur = c.get("prompt_eval_count"), c.get("prompt_eval_duration")
    if not n or dur is None:
        return None
    if dur <= 0 or (n >= MANY_PROMPT_TOKENS and dur < MIN_PLAUSIBLE_PREFILL_NS):
        return (
            f"{n:.0f} prompt tokens in {dur / 1e6:.3f} ms: the prompt was mostly cached"
            " (Ollama counts cached tokens in prompt_eval_count but not their time)"
        )
    rate = n / dur * 1e9
    if rate > MAX_PLAUSIBLE_PREFILL_TOK_S:
        return (
            f"prefill rate {rate:,.0f} tok/s is beyond any hardware: the prompt was mostly"
            " cached (Ollama counts cached tokens in prompt_eval_count but not their time)"
        )
    return None
