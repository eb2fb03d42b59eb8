"""Reasoning ("thinking") apart from the answer, wherever each API streams it.

A reasoning model (Qwen3, DeepSeek-R1, gpt-oss) generates tokens of thought before its first
token of answer. They are generated tokens, so the first of them ends the prefill (TTFT); the
user waits for the first *answer* token (TTFO, AIPerf's "time to first output token",
``time_to_first_output_token``: ai-dynamo/aiperf
``src/aiperf/metrics/types/time_to_first_output_token_metric.py``, where a chunk that carries
answer text counts as output even if it also carries reasoning, and so do tool-call deltas).
Where each server puts the thought:

* OpenAI-style chat deltas, ``reasoning_content`` (DeepSeek's API; vLLM with
  ``--reasoning-parser`` up to 0.10, docs ``features/reasoning_outputs``; llama-server with
  ``--reasoning-format deepseek``, ggml-org/llama.cpp ``tools/server/README.md`` @ 00dc805) or
  ``reasoning`` (vLLM from 0.11: "reasoning used to be called reasoning_content", the same
  docs page at v0.11.2; OpenRouter). Either may come with ``content`` in one chunk.
* Ollama's ``message.thinking`` (``/api/chat``) and ``thinking`` (``/api/generate``), beside
  ``message.content`` / ``response`` (ollama/ollama ``docs/capabilities/thinking.mdx``).
* ``<think>`` … ``</think>`` left in the content, when the server does not parse reasoning
  (vLLM without ``--reasoning-parser``, llama-server ``--reasoning-format none``).
  :class:`ThinkTags` splits it. Newer templates open ``<think>`` in the *prompt* (Qwen3.5,
  DeepSeek-R1-0528: vLLM ``reasoning/qwen3_reasoning_parser.py``; SGLang's
  ``separate_reasoning`` docs), so the content starts in the thought and only ``</think>``
  shows: the text before a first ``</think>`` with no ``<think>`` before it was thought too,
  and :meth:`ThinkTags.split` says so (``retro``). A tag split across two chunks is not seen
  (both tags are single tokens in these models' vocabularies, and arrive whole).

The count of reasoning tokens: the server's ``usage.completion_tokens_details.reasoning_tokens``
when it sends one (OpenAI's API; DeepSeek's), else the tokens of the chunks that carried
thought (a chunk with both is shared by the length of each text).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


@dataclass(frozen=True)
class Parts:
    """One chunk's generated text: ``reasoning`` (thought) and ``answer`` (content, tool-call
    text)."""

    reasoning: str = ""
    answer: str = ""

    @property
    def text(self) -> str:
        return self.reasoning + self.answer

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.answer)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def chat_delta_parts(delta: Mapping[str, Any]) -> Parts:
    """An OpenAI-style chat ``delta``: ``reasoning_content`` and ``reasoning`` are thought
    (a server sends one of the two; both are read); ``content`` and tool-call names and
    arguments are answer."""
    reasoning = _str(delta.get("reasoning_content")) + _str(delta.get("reasoning"))
    answer = _str(delta.get("content"))
    calls = delta.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            answer += str(fn.get("name") or "") + str(fn.get("arguments") or "")
    return Parts(reasoning, answer)


def ollama_parts(line: Mapping[str, Any], chat: bool) -> Parts:
    """One line of an Ollama stream: ``message.thinking`` / ``message.content`` (chat) or
    ``thinking`` / ``response`` (generate)."""
    if chat:
        message = line.get("message")
        message = message if isinstance(message, dict) else {}
        return Parts(_str(message.get("thinking")), _str(message.get("content")))
    return Parts(_str(line.get("thinking")), _str(line.get("response")))


def usage_reasoning_tokens(usage: Mapping[str, Any]) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``, when the server counts them."""
    details = usage.get("completion_tokens_details")
    if not isinstance(details, dict):
        return None
    n = details.get("reasoning_tokens")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return None
    return n


class ThinkTags:
    """Splits answer text that may hold ``<think>`` … ``</think>`` into thought and answer,
    chunk by chunk, for one stream. Once a thought has closed, the rest is answer."""

    def __init__(self) -> None:
        self._inside = False  # between <think> and </think>
        self._closed = False  # a thought has ended: no more tags are looked for
        self._emitted = False  # answer text was given out (earlier chunks counted as answer)
        self._spoken = False  # answer text that is not whitespace was given out

    def answer_only(self, text: str) -> bool:
        """``True`` when this chunk's text is all answer and holds no tag: what :meth:`split`
        would return as ``Parts("", text)`` with no ``retro``, its state kept as ``split``
        keeps it, at less cost (most chunks of most streams). ``False``: call ``split``."""
        if self._closed:
            self._emitted = self._emitted or bool(text)
            return True
        if self._inside or ("<" in text and (OPEN_TAG in text or CLOSE_TAG in text)):
            return False
        self._emitted = self._emitted or bool(text)
        self._spoken = self._spoken or bool(text.strip())
        return True

    def split(self, text: str) -> tuple[Parts, bool]:
        """This chunk's text as thought and answer; ``retro`` is ``True`` when this chunk shows
        that the text given out as answer before it was thought too (a ``</think>`` with no
        ``<think>`` before it, or a ``<think>`` after nothing but whitespace)."""
        if self._closed:
            self._emitted = self._emitted or bool(text)
            return Parts("", text), False
        if self._inside:
            end = text.find(CLOSE_TAG)
            if end < 0:
                return Parts(text, ""), False
            self._inside, self._closed = False, True
            cut = end + len(CLOSE_TAG)
            return Parts(text[:cut], text[cut:]), False
        start, end = text.find(OPEN_TAG), text.find(CLOSE_TAG)
        if end >= 0 and (start < 0 or end < start):
            # The template opened the thought in the prompt: all so far was thought.
            cut = end + len(CLOSE_TAG)
            retro, self._closed = self._emitted, True
            return Parts(text[:cut], text[cut:]), retro
        if start >= 0 and not self._spoken and not text[:start].strip():
            retro, self._inside = self._emitted, True
            rest = text[start + len(OPEN_TAG):]
            close = rest.find(CLOSE_TAG)
            if close < 0:
                return Parts(text, ""), retro
            self._inside, self._closed = False, True
            cut = start + len(OPEN_TAG) + close + len(CLOSE_TAG)
            return Parts(text[:cut], text[cut:]), retro
        self._emitted = self._emitted or bool(text)
        self._spoken = self._spoken or bool(text.strip())
        return Parts("", text), False


def reasoning_share(parts: Parts, k: int) -> int:
    """The tokens of a chunk of ``k`` that were thought: all, none, or (a chunk with both)
    ``k`` shared by the length of each text, at least one token left to the answer."""
    if not parts.reasoning:
        return 0
    if not parts.answer:
        return k
    share = round(k * len(parts.reasoning) / (len(parts.reasoning) + len(parts.answer)))
    return max(0, min(k - 1, share))
