"""Conversations: a closed loop within each conversation, open-loop arrival of conversations.

Each turn sends the history so far (the previous user messages and the server's real answers)
plus a new user message, and the answer joins the history; ``think_s`` seconds pass between a
turn's end and the next turn's send. Conversations start at the bench's open-loop arrival times
(``workload.schedule.arrival_offsets`` at ``request_rate``).

Per turn: TTFT (p50, p90), prompt tokens, and the part of the prompt the server's prefix cache
served where the server says it (``RequestRecord.cached_tokens``: llama-server's
``timings.cache_n``, the OpenAI usage's ``prompt_tokens_details.cached_tokens``). vLLM's
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` counters are read from ``/metrics``
before and after the run for the run's hit share. ``prefix_reuse=False`` gives every request a
fresh ``cache_salt`` (vLLM's field that isolates prefix-cache entries), so nothing is reused.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdscope import stats
from pdscope.client.connection import Connection, connect
from pdscope.client.options import ClientOptions
from pdscope.client.request import stream_request
from pdscope.errors import Field, InputError, PdscopeError
from pdscope.metrics import scrape
from pdscope.servers import detect_metric_map
from pdscope.workload.schedule import arrival_offsets

# The run folder's file: the result's JSON (ConversationResult.to_json).
CONVERSATIONS_FILE = "conversations.json"


@dataclass(frozen=True)
class ConversationConfig(ClientOptions):
    conversations: int = 1
    turns: int = 3
    think_s: float = 0.0
    user_len: int = 64
    output_len: int = 32
    request_rate: float = float("inf")
    prefix_reuse: bool = True
    # Recorded conversations' user turns (workload.conversations); empty: synthetic ones.
    dialogues: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("conversations", "turns", "user_len", "output_len"):
            if getattr(self, name) < 1:
                raise InputError(Field(name), f" must be at least 1, got {getattr(self, name)}")
        if not self.think_s >= 0 or self.think_s == float("inf"):
            raise InputError(Field("think_s"), f" must be from 0 to a finite number, got"
                                               f" {self.think_s:g}")
        if not self.request_rate > 0:
            raise InputError(Field("request_rate"), " must be positive")


@dataclass(frozen=True)
class TurnRecord:
    conversation: int
    turn: int  # from 1
    sent_s: float  # since the run's start
    ended_s: float
    ttft_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    output_tokens: int
    answer: str
    error: str | None


@dataclass(frozen=True)
class TurnSummary:
    turn: int
    n: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    prompt_tokens_p50: float | None
    cached_share: float | None  # cached / prompt tokens, where the server said it


@dataclass(frozen=True)
class ConversationResult:
    config: dict[str, Any]
    records: tuple[TurnRecord, ...]
    per_turn: tuple[TurnSummary, ...]
    server_cache_share: float | None  # vLLM's /metrics hits / queries over the run
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The one place a conversation run becomes JSON."""
        return {"experiment": "conversations", "config": self.config,
                "per_turn": [asdict(t) for t in self.per_turn],
                "server_cache_share": self.server_cache_share,
                "notes": list(self.notes),
                "records": [asdict(r) for r in self.records]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ConversationResult:
        """The result :meth:`to_json` wrote (a run folder's ``conversations.json``)."""
        return cls(config=dict(d["config"]),
                   records=tuple(TurnRecord(**r) for r in d["records"]),
                   per_turn=tuple(TurnSummary(**t) for t in d["per_turn"]),
                   server_cache_share=d.get("server_cache_share"),
                   notes=tuple(d.get("notes", ())))


def read_conversation_run(path: str | Path) -> ConversationResult:
    """A ``bench --conversations`` run: its folder or the ``conversations.json`` in it."""
    file = Path(path)
    if file.is_dir():
        file = file / CONVERSATIONS_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("experiment") != "conversations":
            raise ValueError("not the result of a conversations run")
        return ConversationResult.from_json(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"{path} is not a readable conversations run: {why}") from None


def is_conversation_run(path: str | Path) -> bool:
    """``path`` is a ``bench --conversations`` run folder (or its result file)."""
    p = Path(path)
    return (p / CONVERSATIONS_FILE).is_file() or p.name == CONVERSATIONS_FILE


def summarize(records: tuple[TurnRecord, ...]) -> tuple[TurnSummary, ...]:
    out = []
    for turn in sorted({r.turn for r in records}):
        rs = [r for r in records if r.turn == turn and r.error is None]
        ttfts = [r.ttft_s for r in rs if r.ttft_s is not None]
        prompts = [r.prompt_tokens for r in rs if r.prompt_tokens is not None]
        said = [r for r in rs if r.cached_tokens is not None and r.prompt_tokens]
        share = (sum(r.cached_tokens or 0 for r in said) / sum(r.prompt_tokens or 0 for r in said)
                 if said else None)
        out.append(TurnSummary(
            turn, len(rs),
            stats.percentile(ttfts, 50) if ttfts else None,
            stats.percentile(ttfts, 90) if ttfts else None,
            stats.percentile(prompts, 50) if prompts else None, share))
    return tuple(out)


async def _counters(conn: Connection) -> tuple[float, float] | None:
    """The server's prefix-cache queries and hits (tokens) so far, by its family's metric
    names (servers/: vLLM's ``prefix_cache_queries``/``_hits``); None where it exports none."""
    if not conn.info.metrics:
        return None
    try:
        snap = await scrape(conn.info.base_url, conn.session)
    except PdscopeError:
        return None
    family = detect_metric_map(snap.names)
    if family is None:
        return None
    queries = snap.counter(family.names("prefix_queries"))
    hits = snap.counter(family.names("prefix_hits"))
    return None if queries is None or hits is None else (queries, hits)


async def run_conversations(url: str, config: ConversationConfig, *,
                            progress: Callable[[str, int, int], None] | None = None,
                            ) -> ConversationResult:
    """Every conversation of ``config`` against the server at ``url``; ``progress`` is told
    the turns done of all there are after each turn."""
    async with connect(url, config) as conn:
        if not conn.chat:
            raise InputError("conversations need a chat API (the target is"
                             f" {conn.target.api!r}): set ", Field("api"),
                             " to openai-chat or ollama-chat")
        n = len(config.dialogues) if config.dialogues else config.conversations
        offsets = arrival_offsets(n, config.request_rate, seed=config.seed or 0)
        total = (sum(len(d) for d in config.dialogues) if config.dialogues
                 else n * config.turns)
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress("turns", done, total)
        before = await _counters(conn)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(
            _one(conn, config, i, off, t0, tick) for i, off in enumerate(offsets)))
        after = await _counters(conn)
    records = tuple(r for rs in results for r in rs)
    share = None
    if before is not None and after is not None and after[0] > before[0]:
        share = (after[1] - before[1]) / (after[0] - before[0])
    return ConversationResult(config=_config_json(config), records=records,
                              per_turn=summarize(records), server_cache_share=share,
                              notes=tuple(conn.notes))


def _config_json(config: ConversationConfig) -> dict[str, Any]:
    out = config.to_json()
    out.update(conversations=config.conversations, turns=config.turns, think_s=config.think_s,
               user_len=config.user_len, output_len=config.output_len,
               request_rate=config.request_rate if config.request_rate != float("inf") else "inf",
               prefix_reuse=config.prefix_reuse, recorded=len(config.dialogues))
    return out


async def _one(conn: Connection, config: ConversationConfig, index: int, offset: float,
               t0: float, tick: Callable[[], None]) -> list[TurnRecord]:
    await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
    history: list[dict[str, str]] = []
    out: list[TurnRecord] = []
    recorded = config.dialogues[index] if config.dialogues else None
    n_turns = len(recorded) if recorded else config.turns
    for turn in range(n_turns):
        if turn and config.think_s:
            await asyncio.sleep(config.think_s)
        if recorded:
            text = recorded[turn]
        else:
            text = (await conn.prompt(config.user_len, index * 1000 + turn)).text
        history.append({"role": "user", "content": text})
        extra = None if config.prefix_reuse else {"cache_salt": uuid.uuid4().hex}
        sent = time.perf_counter() - t0
        rec = await stream_request(conn.session, conn.target, messages=list(history),
                                   max_tokens=config.output_len,
                                   timeouts=config.timeouts, extra=extra)
        ended = time.perf_counter() - t0
        tick()
        out.append(TurnRecord(index, turn + 1, sent, ended, rec.ttft_s, rec.prompt_tokens,
                              rec.cached_tokens, rec.n_out, rec.output_text if rec.ok else "",
                              None if rec.ok else (rec.error or "failed")))
        if not rec.ok:
            break
        history.append({"role": "assistant", "content": rec.output_text})
    return out
