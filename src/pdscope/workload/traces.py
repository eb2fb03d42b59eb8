"""Request traces: when each request came, how long its prompt and answer were, and which
prompts shared a prefix, read from the files the peers replay.

Three formats, each checked against its published sample (copies in
``tests/data/fixtures/traces/``, their sources in ``SOURCES.md`` there):

* **Mooncake** (kvcache-ai/Mooncake, ``FAST25-release/traces/*.jsonl``; the format AIPerf's
  ``mooncake_trace`` and Dynamo's data generator read): one JSON object a line,
  ``timestamp`` in milliseconds since the first request, ``input_length`` and
  ``output_length`` in tokens, and ``hash_ids``, one id per 512-token block of the prompt (the
  last block may be partial). Two requests whose ``hash_ids`` start with the same ids share
  that many blocks of prompt: a prefix a prefix cache can reuse.
* **BurstGPT** (HPMLL/BurstGPT, ``data/BurstGPT_*.csv``): a CSV with the columns
  ``Timestamp`` (seconds from midnight of the first day), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``; columns are found by name (the v2
  release inserts ``Session ID`` and ``Elapsed time``). The BurstGPT README calls rows with 0
  response tokens failures (``BurstGPT_without_fails_*.csv`` leaves them out), and the file
  also has rows of 0 request tokens: a request of no prompt or no answer cannot be replayed,
  so those rows are left out and counted (:attr:`Trace.skipped`).
* **pdscope's JSONL**: ``{"timestamp": S, "input_tokens": N, "output_tokens": M}`` a line,
  the time in seconds.

Times become seconds from the trace's first request (a BurstGPT trace starting at 5 s sends
its first request at once), in time order. ``time_scale`` multiplies them (0.5 replays the
trace twice as fast, at twice its rate) and ``max_duration_s`` keeps the requests due up to
that many seconds after the start.

A line that is not a request of its format is one :class:`InputError` naming the file and the
line: a replay that silently dropped what it did not understand would not be the trace.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pdscope.errors import Field, InputError
from pdscope.workload.datasets import WorkItem
from pdscope.workload.files import parse_json, read_text
from pdscope.workload.prompts import PromptBuilder

# Mooncake's hash block: "the block size is 512" (kvcache-ai/Mooncake FAST25-release/README.md
# and the paper's appendix); its sample lines have ceil(input_length / 512) ids.
BLOCK_TOKENS = 512

FORMATS = ("mooncake", "burstgpt", "jsonl")

# BurstGPT's column names (HPMLL/BurstGPT README, "Schema").
BURSTGPT_TIME, BURSTGPT_IN, BURSTGPT_OUT = "Timestamp", "Request tokens", "Response tokens"

# Prompt seeds: a shared block's text comes from its hash id, a request's own text from its
# place in the trace; the two ranges never meet.
_BLOCK_SEED = 1 << 40
_OWN_SEED = 1 << 41


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace: ``offset_s`` after the trace's first request (time scale
    applied), its prompt and output lengths in tokens, the ids of its prompt's shared blocks
    (Mooncake's ``hash_ids``; empty where the format has none) and the ``line`` of the file it
    came from."""

    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    line: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.offset_s) and self.offset_s >= 0):
            raise InputError(f"a trace request's time must be at least 0 s, got {self.offset_s!r}")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise InputError("a trace request needs at least 1 prompt and 1 output token")


@dataclass(frozen=True)
class Trace:
    """A trace's requests in time order, from ``path`` in ``format``; ``block_tokens`` the
    tokens a hash id stands for; ``skipped`` the rows left out (BurstGPT's failures) and how
    the times were scaled and cut (``time_scale``, ``max_duration_s``)."""

    entries: tuple[TraceEntry, ...]
    path: str
    format: str
    block_tokens: int = BLOCK_TOKENS
    skipped: int = 0
    time_scale: float = 1.0
    max_duration_s: float | None = None

    def __post_init__(self) -> None:
        if not self.entries:
            raise InputError(f"{self.path}: no requests in the trace")
        if self.format not in FORMATS:
            raise InputError(f"unknown trace format {self.format!r}: one of {', '.join(FORMATS)}")

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def offsets(self) -> tuple[float, ...]:
        """Each request's send time, seconds from the start."""
        return tuple(e.offset_s for e in self.entries)

    @property
    def span_s(self) -> float:
        return self.entries[-1].offset_s

    @property
    def mean_rate(self) -> float:
        """Requests a second over the trace's span (``inf`` when all come at once)."""
        span = self.span_s
        return (len(self) - 1) / span if span > 0 else math.inf

    @property
    def has_prefixes(self) -> bool:
        return any(e.hash_ids for e in self.entries)

    def replayed(self, time_scale: float = 1.0, max_duration_s: float | None = None,
                 max_requests: int | None = None) -> Trace:
        """The trace with its times multiplied by ``time_scale``, cut to the requests due within
        ``max_duration_s`` of the start and to the first ``max_requests``."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise InputError(Field("time_scale"), f" must be a positive number, got {time_scale!r}")
        if max_duration_s is not None and not max_duration_s > 0:
            raise InputError(Field("max_duration_s"),
                             f" must be a positive number of seconds, got {max_duration_s!r}")
        if max_requests is not None and max_requests < 1:
            raise InputError(Field("num_prompts"), f" must be at least 1, got {max_requests}")
        out = [replace(e, offset_s=e.offset_s * time_scale) for e in self.entries]
        if max_duration_s is not None:
            out = [e for e in out if e.offset_s <= max_duration_s]
        if max_requests is not None:
            out = out[:max_requests]
        return replace(self, entries=tuple(out), time_scale=self.time_scale * time_scale,
                       max_duration_s=max_duration_s if max_duration_s is not None
                       else self.max_duration_s)

    def describe(self) -> str:
        scale = f", time x{self.time_scale:g}" if self.time_scale != 1 else ""
        cut = f", first {self.max_duration_s:g} s" if self.max_duration_s is not None else ""
        skipped = f", {self.skipped} rows left out" if self.skipped else ""
        return (f"trace {self.path} ({self.format}, {len(self)} requests over"
                f" {self.span_s:.4g} s{scale}{cut}{skipped})")


def detect_format(path: str | Path) -> str:
    """``burstgpt`` for a ``.csv`` file; else, from its first non-blank line, ``mooncake`` (an
    ``input_length``) or ``jsonl`` (an ``input_tokens``)."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        return "burstgpt"
    for lineno, line in enumerate(read_text(p, "trace").split("\n"), start=1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{p}:{lineno}")
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
        if isinstance(obj, dict) and "input_tokens" in obj:
            return "jsonl"
        raise InputError(f"{p}:{lineno}: not a trace line of a known format (Mooncake's"
                         " input_length, or pdscope's input_tokens); name it with the format")
    raise InputError(f"{p}: no requests in the trace")


def read_trace(path: str | Path, fmt: str = "auto") -> Trace:
    """The trace in ``path``, in ``fmt`` (``auto``: :func:`detect_format`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"cannot read trace {path}: no such file")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt == "mooncake":
        rows, skipped = list(_mooncake(p)), 0
    elif fmt == "jsonl":
        rows, skipped = list(_pdscope_jsonl(p)), 0
    elif fmt == "burstgpt":
        rows, skipped = _burstgpt(p)
    else:
        raise InputError(f"unknown trace format {fmt!r}: auto or one of {', '.join(FORMATS)}")
    if not rows:
        raise InputError(f"{p}: no requests in the trace")
    rows.sort(key=lambda r: r.offset_s)  # stable: ties keep the file's order
    t0 = rows[0].offset_s
    entries = tuple(replace(r, offset_s=r.offset_s - t0) for r in rows)
    return Trace(entries, str(p), fmt, skipped=skipped)


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {key} must be a whole number of tokens, got {value!r}")
    if value < 1:
        raise InputError(f"{where}: {key} must be at least 1, got {value}")
    return value


def _time(obj: dict[str, Any], key: str, where: str, unit: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise InputError(f"{where}: {key} must be a time of at least 0 {unit}, got {value!r}")
    return float(value)


def _lines(p: Path) -> Iterable[tuple[int, str, dict[str, Any]]]:
    # Lines end at "\n" only (as the dataset reader): JSON strings may hold U+2028 as it is.
    for lineno, line in enumerate(read_text(p, "trace").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        obj = parse_json(line, where)
        if not isinstance(obj, dict):
            raise InputError(f"{where}: each line must be a JSON object")
        yield lineno, where, obj


def _mooncake(p: Path) -> Iterable[TraceEntry]:
    for lineno, where, obj in _lines(p):
        t_ms = _time(obj, "timestamp", where, "ms")
        n_in = _count(obj, "input_length", where)
        n_out = _count(obj, "output_length", where)
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise InputError(f"{where}: hash_ids must be a list of whole numbers")
        yield TraceEntry(t_ms / 1000.0, n_in, n_out, tuple(ids), lineno)


def _pdscope_jsonl(p: Path) -> Iterable[TraceEntry]:
    for lineno, where, obj in _lines(p):
        yield TraceEntry(_time(obj, "timestamp", where, "s"),
                         _count(obj, "input_tokens", where), _count(obj, "output_tokens", where),
                         line=lineno)


def _csv_count(value: str | None, column: str, where: str) -> int:
    try:
        n = float(value or "")
    except ValueError:
        raise InputError(f"{where}: {column} must be a whole number, got {value!r}") from None
    if not (math.isfinite(n) and n >= 0 and n == int(n)):
        raise InputError(f"{where}: {column} must be a whole number of at least 0, got {value!r}")
    return int(n)


def _burstgpt(p: Path) -> tuple[list[TraceEntry], int]:
    reader = csv.DictReader(read_text(p, "trace").split("\n"))
    try:
        return _burstgpt_rows(p, reader)
    except csv.Error as exc:  # a field past the csv module's limit, a stray quote
        raise InputError(f"{p}:{reader.line_num}: not CSV ({exc})") from None


def _burstgpt_rows(p: Path, reader: csv.DictReader[str]) -> tuple[list[TraceEntry], int]:
    header = reader.fieldnames or []
    missing = [c for c in (BURSTGPT_TIME, BURSTGPT_IN, BURSTGPT_OUT) if c not in header]
    if missing:
        raise InputError(f"{p}:1: BurstGPT's CSV needs the columns {BURSTGPT_TIME},"
                         f" {BURSTGPT_IN} and {BURSTGPT_OUT}; missing {', '.join(missing)}")
    rows: list[TraceEntry] = []
    skipped = 0
    for row in reader:
        where = f"{p}:{reader.line_num}"
        if None in row or any(row.get(c) is None for c in header):
            raise InputError(f"{where}: {len(header)} columns expected (as the header)")
        try:
            t = float(row[BURSTGPT_TIME])
        except ValueError:
            raise InputError(f"{where}: {BURSTGPT_TIME} must be a number of seconds, got"
                             f" {row[BURSTGPT_TIME]!r}") from None
        if not (math.isfinite(t) and t >= 0):
            raise InputError(f"{where}: {BURSTGPT_TIME} must be at least 0 s, got {t!r}")
        n_in = _csv_count(row[BURSTGPT_IN], BURSTGPT_IN, where)
        n_out = _csv_count(row[BURSTGPT_OUT], BURSTGPT_OUT, where)
        if n_in == 0 or n_out == 0:  # a failed request in BurstGPT's own words: not replayable
            skipped += 1
            continue
        rows.append(TraceEntry(t, n_in, n_out, line=reader.line_num))
    return rows, skipped


# ------------------------------------------------------------------------- shared prefixes

@dataclass(frozen=True)
class SharedBlocks:
    """A request's longest prefix shared with another request of the trace: ``group`` numbers
    the distinct shared prefixes (from 0; ``None``: it shares none) and ``tokens`` is its
    length (whole blocks, shorter than the prompt)."""

    group: int | None
    tokens: int


def shared_prefixes(entries: Sequence[TraceEntry],
                    block_tokens: int = BLOCK_TOKENS) -> list[SharedBlocks]:
    """Each request's longest run of leading hash blocks that another request also starts with
    (a trie of the ``hash_ids`` chains: a block is shared as far as the chains agree)."""
    children: dict[tuple[int, int], int] = {}
    visits: list[int] = []
    paths: list[list[int]] = []
    for e in entries:
        node, path = -1, []
        for h in e.hash_ids[:_blocks(e, block_tokens)]:
            key = (node, h)
            if key not in children:
                children[key] = len(visits)
                visits.append(0)
            node = children[key]
            visits[node] += 1
            path.append(node)
        paths.append(path)
    groups: dict[int, int] = {}
    out = []
    for e, path in zip(entries, paths, strict=True):
        depth = 0
        while depth < len(path) and visits[path[depth]] >= 2:
            depth += 1
        tokens = min(depth * block_tokens, e.input_tokens - 1)
        if depth == 0 or tokens < 1:
            out.append(SharedBlocks(None, 0))
            continue
        group = groups.setdefault(path[depth - 1], len(groups))
        out.append(SharedBlocks(group, tokens))
    return out


def _blocks(entry: TraceEntry, block_tokens: int) -> int:
    """The blocks its prompt fills, the last one maybe partial."""
    return -(-entry.input_tokens // block_tokens)


# ------------------------------------------------------------------------- prompts

async def trace_items(trace: Trace, builder: PromptBuilder) -> list[WorkItem]:
    """One request a trace entry, with its prompt and output lengths. A prompt is its blocks of
    ``block_tokens`` tokens joined by spaces (the last one the rest of its length): a block
    with a hash id is the same text in every prompt that has that id at that place, so prompts
    that share leading ids share a byte-identical prefix a prefix cache can reuse; a block past
    the ids (or in a format without them) is the request's own text. ``prompt_tokens`` adds up
    the blocks' counts (a tokenizer may merge across a block's edge: the server's usage says)."""
    shared: dict[tuple[int, int], tuple[str, int]] = {}
    items = []
    for i, e in enumerate(trace.entries):
        parts, tokens = [], 0
        for j in range(_blocks(e, trace.block_tokens)):
            length = min(trace.block_tokens, e.input_tokens - j * trace.block_tokens)
            if j < len(e.hash_ids):
                key = (e.hash_ids[j], length)
                if key not in shared:
                    # The same seed for one id at any length: a partial block is the start of
                    # the whole one, so a shared id shares its text as far as both go.
                    p = await builder.build(length, _BLOCK_SEED + e.hash_ids[j])
                    shared[key] = (p.text, p.tokens)
                text, n = shared[key]
            else:
                p = await builder.build(length, _OWN_SEED + i * 1_000_003 + j)
                text, n = p.text, p.tokens
            parts.append(text)
            tokens += n
        items.append(WorkItem(e.output_tokens, prompt=" ".join(parts), prompt_tokens=tokens))
    return items
