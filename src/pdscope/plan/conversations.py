"""Conversations in the planner: multi-turn chats whose every turn sends the whole history, and
the figures a prediction gives for each turn.

The demand is what ``pdscope bench --conversations`` sends (:mod:`pdscope.load.conversations`):
conversations arrive open loop at ``request_rate`` (the bench's schedule for the same seed; an
infinite rate: all at 0 s); inside one, turn ``t`` is sent ``think_s`` after turn ``t - 1``'s
answer ended, with the history so far (every earlier user message and answer) and a new user
message of ``user_len`` tokens, and asks for ``output_len`` tokens. Its prompt is

    t * user_len + (t - 1) * output_len + (2t - 1) * template_tokens

where ``template_tokens`` is what the chat template adds around a message (roles, separators;
0 by default, as the bench counts nothing of its own: the server counts the prompt).

The prefix cache is what makes turn ``t`` cheap or dear. A conversation is one prefix group whose
cached prefix grows every turn: turn ``t`` starts with turn ``t - 1``'s prompt and answer, whose
KV cache, ``prompt + output - 1`` tokens (the last sampled token is never computed), the server
may still hold. vLLM caches every full block of a request as it is computed, the answer's
blocks too, and a finished request's blocks stay findable until the pool reuses them
(``KVCacheManager.allocate_slots`` and ``cache_blocks`` in ``vllm/v1/core/kv_cache_manager.py``);
the planner's budget engine makes them the group's evictable prefix, evicted least recently
used first like any other. llama-server keeps each slot's last prompt and answer and gives a new
task the idle slot whose cached tokens share the longest prefix with its prompt, above
``slot_prompt_similarity`` (``get_available_slot`` in ``tools/server/server-context.cpp``): the
slot engine gives turn ``t`` the slot that served turn ``t - 1`` when it is idle and no other
conversation took it since.

Assumed: the next turn's prompt starts with exactly the previous turn's tokens (the answer's
text tokenizes back to the tokens generated, and the template renders the history the same way
each turn), and every answer is ``output_len`` tokens long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pdscope import stats
from pdscope.checks import at_least
from pdscope.errors import Field, InputError
from pdscope.plan.demand import Demand
from pdscope.plan.simulate import SimResult
from pdscope.workload.schedule import arrival_offsets

if TYPE_CHECKING:
    from pdscope.load.conversations import ConversationResult, TurnRecord


@dataclass(frozen=True)
class Conversations:
    """``conversations`` chats of ``turns`` turns each (the fields are ``pdscope bench
    --conversations``'s, by the same names): ``user_len`` tokens a new user message,
    ``output_len`` tokens an answer, ``think_s`` seconds from an answer to the next turn,
    ``request_rate`` conversations starting a second (``inf``: all at once), ``seed`` for their
    arrival times; ``template_tokens`` the chat template adds around each message."""

    conversations: int
    turns: int = 3
    user_len: int = 64
    output_len: int = 32
    think_s: float = 0.0
    request_rate: float = math.inf
    template_tokens: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "user_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(Field(name), f" must be a whole number, got {value!r}")
            at_least(value, 1, name)
        at_least(self.think_s, 0, "think_s")
        at_least(self.template_tokens, 0, "template_tokens")
        if not self.request_rate > 0:
            raise InputError(Field("request_rate"), f" must be positive, got {self.request_rate!r}")

    def prompt_tokens(self, turn: int) -> int:
        """Turn ``turn``'s prompt (from 1): the history and the new message, each message with
        the template's tokens."""
        return (turn * self.user_len + (turn - 1) * self.output_len
                + (2 * turn - 1) * self.template_tokens)

    def demand(self) -> Demand:
        """The requests, conversation by conversation and turn by turn within one (request
        ``c * turns + t - 1`` is conversation ``c``'s turn ``t``): first turns at their
        arrival times, each later turn following the one before it in the conversation's prefix
        group, with that turn's KV cache as its prefix."""
        n, k = self.conversations, self.turns
        starts = arrival_offsets(n, self.request_rate, seed=self.seed)
        prompt = [self.prompt_tokens(t) for t in range(1, k + 1)]
        prefix = [0] + [prompt[t - 1] + self.output_len - 1 for t in range(1, k)]
        index = np.arange(n * k)
        turn = index % k
        arrival = np.full(n * k, math.nan)
        arrival[turn == 0] = starts
        rate = ("all at once" if math.isinf(self.request_rate)
                else f"{self.request_rate:.4g} a second")
        return Demand(
            prompt_tokens=np.array(prompt * n, dtype=np.int64),
            output_tokens=np.full(n * k, self.output_len, dtype=np.int64),
            prefix_group=index // k,
            prefix_tokens=np.array(prefix * n, dtype=np.int64),
            arrival_s=arrival,
            think_s=float(self.think_s),
            follows=np.where(turn == 0, -1, index - 1),
            label=f"{n} conversations of {k} turns ({self.user_len} tokens a message,"
                  f" {self.output_len} an answer, think {self.think_s:g} s), arriving {rate}",
        )


def replayed(run: ConversationResult) -> Demand:
    """The conversations a ``bench --conversations`` run held, as the server counted them:
    each conversation's first turn at its send time (seconds from the run's first), each later
    turn ``think_s`` (the run's) after the one before it, every turn with the prompt and output
    tokens the server reported, its prefix the turn before's prompt and answer less one token.
    A conversation ends at its first turn that failed or has no token counts."""
    by_chat: dict[int, list[TurnRecord]] = {}
    for r in sorted(run.records, key=lambda r: (r.conversation, r.turn)):
        by_chat.setdefault(r.conversation, []).append(r)
    rows: list[list[TurnRecord]] = []
    for records in by_chat.values():
        turns: list[TurnRecord] = []
        for r in records:
            if (r.error is not None or not r.prompt_tokens or r.output_tokens < 1
                    or r.turn != len(turns) + 1):
                break
            turns.append(r)
        if turns:
            rows.append(turns)
    if not rows:
        raise InputError("the conversations run has no turn that completed with its token"
                         " counts")
    t0 = min(turns[0].sent_s for turns in rows)
    prompt: list[int] = []
    output: list[int] = []
    group: list[int] = []
    prefix: list[int] = []
    arrival: list[float] = []
    follows: list[int] = []
    for c, turns in enumerate(rows):
        for k, r in enumerate(turns):
            p = int(r.prompt_tokens or 0)
            if k == 0:
                prefix.append(0)
                arrival.append(r.sent_s - t0)
                follows.append(-1)
            else:
                before = turns[k - 1]
                kv = int(before.prompt_tokens or 0) + before.output_tokens - 1
                prefix.append(max(0, min(kv, p - 1)))
                arrival.append(math.nan)
                follows.append(len(prompt) - 1)
            prompt.append(p)
            output.append(r.output_tokens)
            group.append(c)
    think = float(run.config.get("think_s") or 0.0)
    return Demand(
        prompt_tokens=np.array(prompt, dtype=np.int64),
        output_tokens=np.array(output, dtype=np.int64),
        prefix_group=np.array(group, dtype=np.int64),
        prefix_tokens=np.array(prefix, dtype=np.int64),
        arrival_s=np.array(arrival, dtype=float), think_s=think,
        follows=np.array(follows, dtype=np.int64),
        label=f"replay of {len(rows)} conversations ({len(prompt)} turns, think {think:g} s)")


@dataclass(frozen=True)
class TurnFigures:
    """One turn index across the conversations, as ``bench --conversations`` reports it
    (:class:`pdscope.load.conversations.TurnSummary`, the same names) with the TTFT's p99:
    ``n`` turns that finished, their TTFT percentiles (seconds), prompt tokens' median and the
    share of the prompt tokens the prefix cache served."""

    turn: int
    n: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    prompt_tokens_p50: float | None
    cached_share: float | None


def turns_of(follows: np.ndarray) -> np.ndarray:
    """Each request's turn (from 1): one more than the request it follows."""
    turn = np.ones(len(follows), dtype=np.int64)
    for i, r in enumerate(follows.tolist()):
        if r >= 0:
            turn[i] = turn[r] + 1
    return turn


def per_turn(result: SimResult) -> tuple[TurnFigures, ...]:
    """The prediction's figures by turn index (empty for a demand without conversations)."""
    if result.follows is None:
        return ()
    turn = turns_of(result.follows)
    done = ~np.isnan(result.finish_s)
    out = []
    for t in range(1, int(turn.max()) + 1):
        these = (turn == t) & done
        ttft = (result.first_token_s[these] - result.arrival_s[these]).tolist()
        prompt = result.prompt_tokens[these]
        cached = None
        if result.cached_tokens is not None and len(prompt):
            cached = float(result.cached_tokens[these].sum() / prompt.sum())
        out.append(TurnFigures(
            t, int(these.sum()), stats.percentile(ttft, 50), stats.percentile(ttft, 90),
            stats.percentile(ttft, 99), stats.percentile(prompt.tolist(), 50), cached))
    return tuple(out)
