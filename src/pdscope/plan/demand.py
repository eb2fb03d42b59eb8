"""What the simulated clients send: when each request comes, how long its prompt and its answer
are, and which shared prefix it starts with.

Open loop (:func:`open_loop`): arrival times fixed in advance at a rate, Poisson or gamma with a
burstiness shape — the same schedule ``pdscope bench`` sends
(:func:`pdscope.workload.schedule.arrival_offsets`, with the same seed). Closed loop
(:func:`closed_loop`): N users, each sending its next request a think time after its last one
ended; arrival times then depend on the server, so the simulator fills them in. Request ``k`` is
the ``k``-th sent, in both. A request may also *follow* another one (``Demand.follows``): it is
sent a think time after that one ended, as the turns of a conversation are
(:mod:`pdscope.plan.conversations`).

Lengths come from a :class:`LengthMix`: fixed, drawn from pdscope's length distributions,
log-normal (ShareGPT-like), or sampled from a dataset's items or a bench run folder. A trace
(:func:`from_trace`) brings its own times, lengths and shared prefixes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from pdscope.errors import InputError
from pdscope.workload.datasets import Lengths, WorkItem
from pdscope.workload.schedule import arrival_offsets
from pdscope.workload.traces import Trace, shared_prefixes

# Tokens a word, as pdscope's ShareGPT reader counts a reply (load_sharegpt: words x 1.3).
TOKENS_PER_WORD = 1.3


@dataclass(frozen=True)
class SimRequest:
    """One request: ``arrival_s`` (seconds from the start), ``prompt_tokens`` (prefix
    included), ``output_tokens``, and its shared prefix: ``prefix_group`` (``None``: none) and
    ``prefix_tokens``, the group's prefix length, shorter than the prompt."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None = None
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise InputError(f"a request's arrival must be a time of at least 0 s, got"
                             f" {self.arrival_s!r}")
        _check_request(self.prompt_tokens, self.output_tokens, self.prefix_group,
                       self.prefix_tokens)


def _check_request(prompt: int, output: int, group: int | None, prefix: int) -> None:
    if prompt < 1:
        raise InputError(f"a request's prompt must have at least 1 token, got {prompt}")
    if output < 1:
        raise InputError(f"a request must ask for at least 1 output token, got {output}")
    if group is None:
        if prefix:
            raise InputError("a request without a prefix group has no prefix tokens")
    elif not 0 <= prefix < prompt:
        raise InputError(f"a shared prefix must be shorter than the prompt ({prompt} tokens),"
                         f" got {prefix}")


class LengthMix(Protocol):
    """Where request lengths come from: ``draw(n, seed)`` gives ``n`` prompt and output
    lengths (integer arrays, at least 1), the same for the same seed."""

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class FixedLengths:
    """Every request the same: ``prompt`` tokens in, ``output`` out."""

    prompt: int
    output: int

    def __post_init__(self) -> None:
        _check_request(self.prompt, self.output, None, 0)

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, self.prompt, dtype=np.int64), np.full(n, self.output, dtype=np.int64)


@dataclass(frozen=True)
class DrawnLengths:
    """Lengths drawn from pdscope's distributions (``512``, ``uniform:256:1024``,
    ``normal:512:128``: :func:`pdscope.workload.datasets.parse_lengths`)."""

    prompt: Lengths
    output: Lengths

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        return _draw(self.prompt, n, rng), _draw(self.output, n, rng)


def _draw(lengths: Lengths, n: int, rng: np.random.Generator) -> np.ndarray:
    if lengths.kind == "fixed":
        return np.full(n, int(lengths.a), dtype=np.int64)
    if lengths.kind == "uniform":
        return rng.integers(int(lengths.a), int(lengths.b), endpoint=True, size=n)
    return np.maximum(1, np.rint(rng.normal(lengths.a, lengths.b, size=n))).astype(np.int64)


@dataclass(frozen=True)
class LogNormalLengths:
    """Log-normal lengths around a median, clipped: the long-tailed shape of chat datasets.

    The defaults are ShareGPT-like: prompts around 200 tokens and answers around 250 with a
    heavy tail (sigma 1.0 and 0.8 in log space), clipped to [4, 2048] and [1, 1024]."""

    prompt_median: float = 200.0
    output_median: float = 250.0
    prompt_sigma: float = 1.0
    output_sigma: float = 0.8
    prompt_range: tuple[int, int] = (4, 2048)
    output_range: tuple[int, int] = (1, 1024)

    def __post_init__(self) -> None:
        for what, median, sigma, (lo, hi) in (
                ("prompt", self.prompt_median, self.prompt_sigma, self.prompt_range),
                ("output", self.output_median, self.output_sigma, self.output_range)):
            if not (median >= 1 and sigma >= 0 and 1 <= lo <= hi):
                raise InputError(f"log-normal {what} lengths need a median of at least 1, a"
                                 f" sigma of at least 0 and a range 1 <= min <= max")

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        p = rng.lognormal(math.log(self.prompt_median), self.prompt_sigma, size=n)
        o = rng.lognormal(math.log(self.output_median), self.output_sigma, size=n)
        return (np.clip(np.rint(p), *self.prompt_range).astype(np.int64),
                np.clip(np.rint(o), *self.output_range).astype(np.int64))


@dataclass(frozen=True)
class SampledLengths:
    """(prompt, output) pairs sampled with replacement from a dataset or a bench run;
    ``source`` says where they came from."""

    pairs: tuple[tuple[int, int], ...]
    source: str = "given pairs"

    def __post_init__(self) -> None:
        if not self.pairs:
            raise InputError(f"no request lengths in {self.source}")
        for p, o in self.pairs:
            _check_request(p, o, None, 0)

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        arr = np.asarray(self.pairs, dtype=np.int64)
        idx = np.random.default_rng(seed).integers(0, len(arr), size=n)
        return arr[idx, 0], arr[idx, 1]

    @classmethod
    def from_items(cls, items: Sequence[WorkItem], source: str = "the dataset") -> SampledLengths:
        """A dataset's requests (:func:`~pdscope.workload.datasets.load_jsonl`,
        ``load_sharegpt``): the prompt's token count where the item has one, else its words
        times 1.3 (as pdscope's ShareGPT reader counts a reply); the output is ``max_tokens``."""
        pairs = []
        for item in items:
            prompt = item.prompt_tokens
            if prompt is None:
                text = item.prompt if item.prompt is not None else " ".join(
                    m["content"] for m in item.messages or ())
                prompt = max(1, round(len(text.split()) * TOKENS_PER_WORD))
            pairs.append((int(prompt), int(item.max_tokens)))
        return cls(tuple(pairs), source)

    @classmethod
    def from_run(cls, path: str | Path) -> SampledLengths:
        """The lengths of a ``pdscope bench`` run folder's requests that completed (warm-up
        requests left out), as the server counted them."""
        from pdscope.load.results import read_run  # a run folder: loaded only to read one

        run = read_run(path)
        pairs = []
        for r in run.requests:
            if not r.record.ok or r.warmup:
                continue
            p, o = r.record.prompt_tokens, r.record.output_tokens
            if isinstance(p, int) and isinstance(o, int) and p >= 1 and o >= 1:
                pairs.append((p, o))
        if not pairs:
            raise InputError(f"{path}: no completed request with its prompt and output token"
                             " counts")
        return cls(tuple(pairs), f"the run folder {path}")


@dataclass(frozen=True)
class SharedPrefix:
    """A share of requests (``fraction``) that start with one of ``groups`` system prompts of
    ``prefix_tokens`` tokens each; their drawn prompt length comes after it."""

    fraction: float
    groups: int = 1
    prefix_tokens: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise InputError(f"the shared-prefix fraction must be between 0 and 1, got"
                             f" {self.fraction!r}")
        if self.groups < 1:
            raise InputError(f"prefix groups must be at least 1, got {self.groups}")
        if self.prefix_tokens < 1:
            raise InputError(f"the shared prefix must have at least 1 token, got"
                             f" {self.prefix_tokens}")


@dataclass(frozen=True, eq=False)
class Demand:
    """Requests, in the order they are sent: lengths and prefixes (integer arrays; group -1 for
    none), and either ``arrival_s`` (open loop) or ``users`` with ``think_s`` (closed loop).

    ``follows`` (with ``arrival_s``): per request, the earlier request it follows (-1: none). A
    follower is sent ``think_s`` after the request it follows ended, and its entry of
    ``arrival_s`` is ``nan`` until then; a request that follows none comes at its
    ``arrival_s``. A follower in the prefix group of the request it follows continues that
    request's sequence: when the request leaves the server, its KV cache (prompt and answer)
    becomes the group's cached prefix."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_tokens: np.ndarray
    arrival_s: np.ndarray | None = None
    users: int | None = None
    think_s: float = 0.0
    label: str = field(default="")
    start_s: np.ndarray | None = None  # closed loop: each user's first send (default 0 s)
    follows: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if n < 1:
            raise InputError("the demand needs at least one request")
        if any(len(a) != n for a in (self.output_tokens, self.prefix_group, self.prefix_tokens)):
            raise InputError("the demand's arrays must have one entry a request")
        if (self.arrival_s is None) == (self.users is None):
            raise InputError("a demand is open loop (arrival times) or closed loop (users),"
                             " one of the two")
        if self.follows is not None:
            if self.arrival_s is None or len(self.follows) != n:
                raise InputError("requests that follow others need one entry a request and"
                                 " arrival times for the rest")
            if np.any(self.follows < -1) or np.any(self.follows >= np.arange(n)):
                raise InputError("a request can follow only a request sent before it")
        if self.arrival_s is not None:
            if len(self.arrival_s) != n:
                raise InputError("the demand needs one arrival time a request")
            known = self.arrival_s if self.follows is None else self.arrival_s[self.follows < 0]
            if not np.all(np.isfinite(known)) or np.any(known < 0):
                raise InputError("arrival times must be finite and at least 0 s")
        if self.users is not None and self.users < 1:
            raise InputError(f"a closed loop needs at least 1 user, got {self.users}")
        if self.start_s is not None and (
                self.users is None or len(self.start_s) != self.users
                or not np.all(np.isfinite(self.start_s)) or np.any(self.start_s < 0)):
            raise InputError("a closed loop's start times are one finite time of at least 0 s"
                             " a user")
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise InputError(f"the think time must be at least 0 s, got {self.think_s!r}")
        if np.any(self.prompt_tokens < 1) or np.any(self.output_tokens < 1):
            raise InputError("every request needs at least 1 prompt and 1 output token")
        grouped = self.prefix_group >= 0
        if np.any(self.prefix_tokens[~grouped] != 0) or np.any(self.prefix_tokens < 0) or \
                np.any(self.prefix_tokens[grouped] >= self.prompt_tokens[grouped]):
            raise InputError("a shared prefix must be shorter than its prompt, and only a"
                             " request in a prefix group has one")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def closed(self) -> bool:
        return self.users is not None

    def requests(self) -> list[SimRequest]:
        """The open-loop demand as requests (a closed loop's arrivals are not known yet)."""
        if self.arrival_s is None:
            raise InputError("a closed loop's arrival times are known only after simulating")
        if self.follows is not None and np.any(self.follows >= 0):
            raise InputError("a follower's arrival time is known only after simulating")
        return [SimRequest(float(a), int(p), int(o), None if g < 0 else int(g), int(k))
                for a, p, o, g, k in zip(self.arrival_s, self.prompt_tokens, self.output_tokens,
                                         self.prefix_group, self.prefix_tokens, strict=True)]

    @classmethod
    def from_requests(cls, requests: Sequence[SimRequest], label: str = "") -> Demand:
        """An open loop of the given requests, in arrival order (ties keep their order)."""
        if not requests:
            raise InputError("the demand needs at least one request")
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        rs = [requests[i] for i in order]
        return cls(
            prompt_tokens=np.array([r.prompt_tokens for r in rs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in rs], dtype=np.int64),
            prefix_group=np.array([-1 if r.prefix_group is None else r.prefix_group
                                   for r in rs], dtype=np.int64),
            prefix_tokens=np.array([r.prefix_tokens for r in rs], dtype=np.int64),
            arrival_s=np.array([r.arrival_s for r in rs], dtype=float), label=label,
        )


def replay(path: str | Path, stage: str | None = None) -> Demand:
    """The requests a ``bench`` run folder sent, as they reached the server: each completed
    request at its send time (seconds from the first), with its prompt and output token
    counts; its shared prefix where the run had prefix groups (request ``i`` in group
    ``i mod groups``, as ``bench`` builds them). ``stage``: one stage of a sweep (default:
    the only one)."""
    from pdscope.load.results import read_run  # a run folder: loaded only to read one

    run = read_run(path)
    stages = sorted({r.stage for r in run.requests})
    if stage is None:
        if len(stages) > 1:
            raise InputError(f"{path} has stages {', '.join(stages)}: name one")
        stage = stages[0] if stages else None
    rows = []
    for r in run.requests:
        rec = r.record
        if (r.stage == stage and not r.warmup and rec.error_kind is None
                and rec.t_send_ns is not None and rec.prompt_tokens and rec.output_tokens):
            rows.append((r.index, rec.t_send_ns, rec.prompt_tokens, rec.output_tokens))
    if not rows:
        raise InputError(f"{path}: no completed request with its send time and token counts")
    groups = run.meta.prefix_groups or 0
    prefix = run.meta.prefix_tokens or 0
    t0 = min(send for _, send, _, _ in rows)
    requests = []
    for index, send, prompt, output in rows:
        grouped = groups > 0 and 0 < prefix < prompt
        requests.append(SimRequest((send - t0) / 1e9, prompt, output,
                                   index % groups if grouped else None, prefix if grouped else 0))
    return Demand.from_requests(requests, label=f"replay of {path}")


def _lengths(n: int, lengths: LengthMix, seed: int, shared: SharedPrefix | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    prompt, output = lengths.draw(n, seed)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    group = np.full(n, -1, dtype=np.int64)
    prefix = np.zeros(n, dtype=np.int64)
    if shared is not None and shared.fraction > 0:
        rng = np.random.default_rng([seed, 1])
        member = rng.random(n) < shared.fraction
        group[member] = rng.integers(0, shared.groups, size=int(member.sum()))
        prefix[member] = shared.prefix_tokens
        prompt = prompt + prefix  # the drawn length is what comes after the prefix
    return prompt, output, group, prefix


def open_loop(n: int, rate: float, lengths: LengthMix, *, burstiness: float = 1.0,
              seed: int = 0, shared_prefix: SharedPrefix | None = None) -> Demand:
    """``n`` requests arriving at ``rate`` a second: gaps drawn from a gamma distribution of
    shape ``burstiness`` (1: Poisson), the first at 0 s — ``pdscope bench``'s schedule."""
    if n < 1:
        raise InputError(f"the demand needs at least 1 request, got {n}")
    if not (math.isfinite(rate) and rate > 0):
        raise InputError(f"the request rate must be a positive number, got {rate!r}")
    arrivals = np.asarray(arrival_offsets(n, rate, burstiness=burstiness, seed=seed), dtype=float)
    prompt, output, group, prefix = _lengths(n, lengths, seed, shared_prefix)
    return Demand(prompt, output, group, prefix, arrival_s=arrivals,
                  label=f"open loop, {rate:.4g} req/s")


def closed_loop(n: int, users: int, lengths: LengthMix, *, think_s: float = 0.0,
                seed: int = 0, shared_prefix: SharedPrefix | None = None,
                stagger_s: float = 0.0) -> Demand:
    """``users`` users sending ``n`` requests in all: each sends its first request at a time
    drawn uniformly from ``[0, stagger_s)`` (all at 0 s by default) and its next one
    ``think_s`` after its last one ended.

    A simulated server has no noise: users that start together with equal lengths stay in step
    for ever, their prompts all prefilled in the same steps, which no real server keeps up.
    A stagger of about one request's time breaks that lockstep."""
    if n < 1:
        raise InputError(f"the demand needs at least 1 request, got {n}")
    if users < 1:
        raise InputError(f"a closed loop needs at least 1 user, got {users}")
    if not (math.isfinite(stagger_s) and stagger_s >= 0):
        raise InputError(f"the stagger must be a time of at least 0 s, got {stagger_s!r}")
    prompt, output, group, prefix = _lengths(n, lengths, seed, shared_prefix)
    start = None
    if stagger_s > 0:
        start = np.sort(np.random.default_rng([seed, 2]).uniform(0, stagger_s, size=users))
    return Demand(prompt, output, group, prefix, users=users, think_s=think_s,
                  label=f"closed loop, {users} users", start_s=start)


def from_trace(trace: Trace) -> Demand:
    """A trace's requests (:func:`pdscope.workload.traces.read_trace`) at its times, with its
    lengths; a request whose leading hash blocks another request also starts with is in a
    prefix group of that many blocks' tokens (:func:`~pdscope.workload.traces.shared_prefixes`).

    The simulator knows one prefix a group: a request is put in the group of its longest
    shared chain, so one that shares 12 blocks with a neighbour and 1 with everyone is counted
    as sharing the 12 (a chain of Mooncake's conversation trace)."""
    shared = shared_prefixes(trace.entries, trace.block_tokens)
    requests = [SimRequest(e.offset_s, e.input_tokens, e.output_tokens, s.group, s.tokens)
                for e, s in zip(trace.entries, shared, strict=True)]
    return Demand.from_requests(requests, label=trace.describe())
