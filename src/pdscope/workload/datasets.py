"""What a load test sends: synthetic prompts with length distributions, shared-prefix groups,
JSONL datasets and ShareGPT files. Seeded: the same seed gives the same requests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscope.errors import Field, InputError
from pdscope.workload.files import parse_json, read_text
from pdscope.workload.prompts import PromptBuilder


@dataclass(frozen=True)
class WorkItem:
    """One request to send: a prompt (completions) or messages (chat), and its output length.
    ``prompt_tokens`` is the expected prompt length where known (an estimate when
    ``prompt_estimated``: no server tokenizer counted it); ``group`` the shared-prefix group it
    belongs to."""

    max_tokens: int
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    prompt_tokens: int | None = None
    group: int | None = None
    prompt_estimated: bool = False


@dataclass(frozen=True)
class Lengths:
    """A length distribution: ``fixed`` N, ``uniform`` between two bounds, or ``normal`` with a
    mean and standard deviation (clipped at 1)."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(1, round(rng.gauss(self.a, self.b)))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_lengths(text: str) -> Lengths:
    """``512`` (fixed), ``uniform:256:1024``, or ``normal:512:128`` (mean, standard deviation)."""
    parts = text.strip().lower().split(":")
    try:
        if len(parts) == 1:
            n = int(parts[0])
            if n < 1:
                raise ValueError
            return Lengths("fixed", n)
        kind, a, b = parts[0], float(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        raise InputError(
            f"bad length {text!r}: use N, uniform:MIN:MAX or normal:MEAN:SD"
        ) from None
    if kind == "uniform" and 1 <= a <= b:
        return Lengths("uniform", a, b)
    if kind == "normal" and a >= 1 and b >= 0:
        return Lengths("normal", a, b)
    raise InputError(f"bad length {text!r}: use N, uniform:MIN:MAX (1 <= MIN <= MAX) or"
                     " normal:MEAN:SD")


async def synthetic(
    n: int, input_len: Lengths, output_len: Lengths, builder: PromptBuilder, seed: int = 0
) -> list[WorkItem]:
    """``n`` requests of varied text, prompt and output lengths drawn from the distributions.
    Every prompt is different (no prefix cache flatters them)."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        want_in, want_out = input_len.draw(rng), output_len.draw(rng)
        prompt = await builder.build(want_in, i)
        items.append(WorkItem(want_out, prompt=prompt.text, prompt_tokens=prompt.tokens,
                              prompt_estimated=not prompt.exact))
    return items


async def shared_prefix(
    n: int,
    groups: int,
    prefix_tokens: int,
    suffix_len: Lengths,
    output_len: Lengths,
    builder: PromptBuilder,
    seed: int = 0,
) -> list[WorkItem]:
    """``n`` requests in ``groups`` groups; inside a group every prompt starts with the same
    system prompt of ``prefix_tokens`` tokens and ends with its own question."""
    if groups < 1:
        raise InputError(Field("prefix_groups"), " must be at least 1")
    rng = random.Random(seed)
    prefixes = [await builder.build(prefix_tokens, 10_000_000 + g) for g in range(groups)]
    items = []
    for i in range(n):
        g = i % groups
        prefix = prefixes[g]
        total = prefix.tokens + suffix_len.draw(rng)
        prompt = await builder.build(total, i, prefix=prefix.text)
        items.append(WorkItem(output_len.draw(rng), prompt=prompt.text,
                              prompt_tokens=prompt.tokens, group=g,
                              prompt_estimated=not prompt.exact))
    return items


def _item_from_record(obj: Any, where: str, default_max_tokens: int) -> WorkItem:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: each line must be a JSON object")
    max_tokens = obj.get("max_tokens", obj.get("output_len", default_max_tokens))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InputError(f"{where}: max_tokens must be a positive integer")
    if isinstance(obj.get("prompt"), str):
        return WorkItem(max_tokens, prompt=obj["prompt"])
    messages = obj.get("messages")
    if isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        return WorkItem(max_tokens, messages=tuple(
            {"role": str(m.get("role", "user")), "content": m["content"]} for m in messages))
    raise InputError(f"{where}: needs \"prompt\" (a string) or \"messages\" (a list of"
                     " {role, content})")


def load_jsonl(path: str | Path, default_max_tokens: int = 128) -> list[WorkItem]:
    """A JSONL file, one request a line: ``{"prompt": ..., "max_tokens": ...}`` or
    ``{"messages": [...], "max_tokens": ...}``."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"cannot read dataset {path}: no such file")
    items = []
    # Lines end at "\n" only: splitlines() would also cut at U+2028 and others, which JSON
    # strings may hold as they are.
    for lineno, line in enumerate(read_text(p, "dataset").split("\n"), start=1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{p}:{lineno}")
        items.append(_item_from_record(obj, f"{p}:{lineno}", default_max_tokens))
    if not items:
        raise InputError(f"{p}: no requests in the file")
    return items


def load_dataset(path: str | Path, fmt: str = "auto") -> list[WorkItem]:
    """A dataset file's requests: ``jsonl``, ``sharegpt``, or ``auto`` (JSONL for a
    ``.jsonl``/``.ndjson`` file, ShareGPT otherwise)."""
    if fmt == "auto":
        fmt = "jsonl" if str(path).endswith((".jsonl", ".ndjson")) else "sharegpt"
    return load_jsonl(path) if fmt == "jsonl" else load_sharegpt(path)


def load_sharegpt(path: str | Path, default_max_tokens: int = 128) -> list[WorkItem]:
    """A ShareGPT-format JSON file: a list of ``{"conversations": [{"from": "human", "value":
    ...}, {"from": "gpt", "value": ...}, ...]}``. Each conversation's first human turn is the
    prompt; its answer's length in words, times 1.3, sets ``max_tokens`` (the length the
    original reply had, as ``vllm bench serve`` does with the reply's token count)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"cannot read dataset {path}: no such file")
    data = parse_json(read_text(p, "dataset"), str(p))
    if not isinstance(data, list):
        raise InputError(f"{p}: a ShareGPT file is a JSON list of conversations")
    items = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)):
            continue
        if first.get("from") not in ("human", "user") or not isinstance(first.get("value"), str):
            continue
        reply_words = len(str(reply.get("value", "")).split())
        max_tokens = max(1, round(reply_words * 1.3)) if reply_words else default_max_tokens
        items.append(WorkItem(max_tokens, prompt=first["value"]))
    if not items:
        raise InputError(f"{p}: no usable conversations (human turn then an answer)")
    return items


def sample(items: Sequence[WorkItem], n: int, seed: int = 0) -> list[WorkItem]:
    """``n`` items from a dataset: shuffled, repeated when the dataset is smaller."""
    rng = random.Random(seed)
    pool = list(items)
    out: list[WorkItem] = []
    while len(out) < n:
        rng.shuffle(pool)
        out.extend(pool[: n - len(out)])
    return out

