"""Recorded conversations to replay: the user turns of each, in order.

Two forms, one conversation a line (JSONL) or a JSON list of them:

* OpenAI ``messages``: ``{"messages": [{"role": "user"|"assistant"|"system", "content": ...}]}``;
* ShareGPT multi-turn: ``{"conversations": [{"from": "human"|"gpt", "value": ...}]}``, the form
  of ShareGPT_V3_unfiltered_cleaned_split.json, as used by vLLM's
  benchmarks/benchmark_dataset.py.

Only the user turns are kept: the server's real answers replace the recorded assistant ones.
A bad line is one :class:`InputError` naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdscope.errors import InputError
from pdscope.workload.files import parse_json, read_text

USER_ROLES = {"user", "human"}
ANSWER_ROLES = {"assistant", "gpt", "chatgpt", "bard", "bing", "model", "system", "tool"}


def user_turns(item: Any) -> tuple[str, ...]:
    """The user messages of one conversation, in order; raises ``ValueError`` with the cause."""
    if not isinstance(item, Mapping):
        raise ValueError("a conversation is a JSON object")
    if "messages" in item:
        turns, role_key, text_key = item["messages"], "role", "content"
    elif "conversations" in item:
        turns, role_key, text_key = item["conversations"], "from", "value"
    else:
        raise ValueError('no "messages" or "conversations" list')
    if not isinstance(turns, list):
        raise ValueError("the turns are not a list")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or not isinstance(turn.get(role_key), str):
            raise ValueError(f"turn {i + 1} has no {role_key!r}")
        text = turn.get(text_key)
        if not isinstance(text, str):
            raise ValueError(f"turn {i + 1} has no text {text_key!r}")
        role = turn[role_key].lower()
        if role in USER_ROLES:
            out.append(text)
        elif role not in ANSWER_ROLES:
            raise ValueError(f"turn {i + 1}: unknown role {turn[role_key]!r}")
    if not out:
        raise ValueError("no user turn")
    return tuple(out)


def read_conversations(path: str | Path) -> list[tuple[str, ...]]:
    """Every conversation's user turns; ``InputError`` on the first bad line."""
    p = Path(path)
    text = read_text(p, "conversations")
    if text.lstrip().startswith("["):
        items = parse_json(text, str(p))
        if not isinstance(items, list):
            raise InputError(f"{p}: not a JSON list of conversations")
        out = []
        for i, item in enumerate(items):
            try:
                out.append(user_turns(item))
            except ValueError as exc:
                raise InputError(f"{p}: conversation {i + 1}: {exc}") from None
        return out
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(user_turns(parse_json(line, f"{p}:{n}")))
        except ValueError as exc:
            raise InputError(f"{p}:{n}: {exc}") from None
    if not out:
        raise InputError(f"{p}: no conversation")
    return out
