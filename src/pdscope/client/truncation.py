"""Prompts cut short: the prompt tokens a server reports against those the client sent.

Ollama cuts a prompt longer than its context (``num_ctx``) without an error and reports the
tokens it kept in ``prompt_eval_count`` (ollama/ollama issues 10368, 17889, 17427); a TTFT
measured on such a prompt is the TTFT of a shorter one, and the model never saw the rest.
llama-server and vLLM refuse instead (an error of kind ``context_exceeded``,
:mod:`pdscope.client.faults`). Only a *shortfall* counts: a chat template, a BOS token or a
default system prompt add tokens to what the server reports, never take any away.

The tolerance is max(4 tokens, 1%) when the client counted the prompt with the server's own
tokenizer (a tokenizer endpoint may count a BOS token the completion does not, or split a
word at the seam of two texts differently), and 30% when it could only estimate the count from
a tokens-a-word ratio (no tokenizer endpoint: Ollama): English text runs from about 1.1 to
1.6 tokens a word by BPE tokenizer, so the ratio's first guess (1.3) is at most about 20% off,
and a prompt cut to ``num_ctx`` is usually cut by far more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdscope.client.record import RequestRecord

TOLERANCE_TOKENS = 4
TOLERANCE_SHARE = 0.01
ESTIMATE_TOLERANCE_SHARE = 0.30


def allowed_shortfall(sent: int, *, estimated: bool = False) -> float:
    """How many fewer prompt tokens than ``sent`` a server may report before the prompt counts
    as cut short."""
    share = ESTIMATE_TOLERANCE_SHARE if estimated else TOLERANCE_SHARE
    return max(TOLERANCE_TOKENS, share * sent)


def is_truncated(sent: int, reported: int, *, estimated: bool = False) -> bool:
    """The server reported fewer prompt tokens than were sent, past the tolerance."""
    return sent - reported > allowed_shortfall(sent, estimated=estimated)


@dataclass(frozen=True)
class TruncationCount:
    """What a set of requests says about prompts cut short: ``checked`` requests had both
    counts (sent and reported), ``truncated`` of them fell short; ``sent_tokens`` and
    ``reported_tokens`` are those of the largest shortfall; ``refused`` requests the server
    turned away as longer than its context (``refusal``: the first one's message)."""

    checked: int = 0
    truncated: int = 0
    sent_tokens: int | None = None
    reported_tokens: int | None = None
    refused: int = 0
    refusal: str | None = None

    def __add__(self, other: TruncationCount) -> TruncationCount:
        worst = self if (self.shortfall or 0) >= (other.shortfall or 0) else other
        return TruncationCount(
            self.checked + other.checked, self.truncated + other.truncated,
            worst.sent_tokens, worst.reported_tokens, self.refused + other.refused,
            self.refusal or other.refusal)

    @property
    def shortfall(self) -> int | None:
        if self.sent_tokens is None or self.reported_tokens is None:
            return None
        return self.sent_tokens - self.reported_tokens


def count_truncation(records: Iterable[RequestRecord]) -> TruncationCount:
    """The :class:`TruncationCount` of ``records`` (failed ones count only as refusals)."""
    checked = truncated = refused = 0
    worst: tuple[int, int] | None = None
    refusal: str | None = None
    for r in records:
        if r.error_kind == "context_exceeded":
            refused += 1
            refusal = refusal or r.error
            continue
        if not r.ok or r.sent_prompt_tokens is None or r.prompt_tokens is None:
            continue
        checked += 1
        if r.truncated:
            truncated += 1
            if worst is None or r.sent_prompt_tokens - r.prompt_tokens > worst[0] - worst[1]:
                worst = (r.sent_prompt_tokens, r.prompt_tokens)
    return TruncationCount(checked, truncated, worst[0] if worst else None,
                           worst[1] if worst else None, refused, refusal)


def truncation_warning(count: TruncationCount, where: str = "") -> str | None:
    """One line for a run with prompts cut short, or ``None``."""
    if not count.truncated:
        return None
    head = f"{where}: " if where else ""
    return (f"{head}{count.truncated} of {count.checked} prompts were cut short by the server"
            f" (sent {count.sent_tokens:,} tokens, it reported {count.reported_tokens:,}): the"
            " model never saw the rest, and their TTFT is that of a shorter prompt; give each"
            " request a longer context (`pdscope doctor` names the setting) or send shorter"
            " prompts")
