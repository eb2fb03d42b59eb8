"""What a metric map is: for each *role* (``ttft``, ``waiting``, ``kv_usage``, ...) the
``/metrics`` names one server family gives it.

Every server names the same facts differently (vLLM's ``num_requests_waiting`` is SGLang's
``num_queue_reqs`` and llama.cpp's ``requests_deferred``), and each renames its own between
versions. A :class:`MetricMap` holds, for each role, a tuple of candidates: the current name
first and then the older names it was renamed from. Readers take the first candidate present.

A role a server does not export has no names, or a reason in ``not_exported``. Consumers report
such a value as missing *with that reason*, never as 0: a llama.cpp server does not have an
empty KV cache, it just does not say how full it is.

Names are written as ``curl /metrics`` prints them (counters with their ``_total``); the snapshot
readers accept a counter with or without it. Each family's map lives in its own module of
:mod:`pdscope.servers`, with the place where its names were checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["histogram", "gauge", "counter", "info"]

# Every role a map may fill, with the Prometheus type its names have.
ROLES: dict[str, Kind] = {
    "ttft": "histogram",  # time to first token, per request
    "itl": "histogram",  # gaps between tokens, one observation per token
    "tpot": "histogram",  # (t_last - t_first) / (n_out - 1), one observation per request
    "e2e": "histogram",  # request latency, observed when a request finishes
    "queue_time": "histogram",  # time a request spent waiting before it was scheduled
    "prefill_time": "histogram",  # per request
    "decode_time": "histogram",  # per request
    "running": "gauge",
    "waiting": "gauge",
    "kv_usage": "gauge",  # fraction of the KV pool in use, 0..1
    "prefix_queries": "counter",  # prompt tokens looked up in the prefix cache
    "prefix_hits": "counter",  # of which found
    "prefix_misses": "counter",  # prompt tokens not found, computed (where queries are not told)
    "prefix_hit_rate": "gauge",  # where a server exports the ratio instead of the counters
    "preemptions": "counter",
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "waiting_by_reason": "gauge",  # labelled ``reason``
    "cache_config_info": "info",  # a gauge at 1 whose labels are the cache settings
    "read_bytes": "counter",  # the server's own estimate of bytes read from memory
    "flops": "counter",  # the server's own estimate of floating-point operations
    "iteration_tokens": "histogram",  # tokens per engine step (prefill chunks + decodes)
    "prefill_seconds": "counter",  # total time spent in prefill (llama.cpp)
    "decode_seconds": "counter",  # total time spent in decode (llama.cpp)
    "engine_steps": "counter",  # number of forward passes (llama.cpp's llama_decode calls)
}


@dataclass(frozen=True)
class MetricMap:
    """The ``/metrics`` names of one server family, role by role.

    ``name`` is the short id used in JSON (``vllm``), ``display`` the name for people (``vLLM``).
    ``prefix`` is what every metric of the family starts with; detection uses it.
    ``engine_label`` names the label that splits one server into engines (vLLM's data-parallel
    ``engine``); values of the other labels are summed. ``replica_labels`` name labels whose
    values are copies of one quantity (each tensor-parallel rank of SGLang can report the same
    queue): readers keep the lowest value of such a label instead of summing.
    ``estimates_flag`` is the server flag that turns on its read-bytes and FLOP estimates.
    ``waiting_for_slot``: a request waits only when every one of a fixed number of slots is busy
    (llama.cpp), so requests waiting say the slots are full whatever the KV cache holds.
    """

    name: str
    display: str
    prefix: str
    ttft: tuple[str, ...] = ()
    itl: tuple[str, ...] = ()
    tpot: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()
    queue_time: tuple[str, ...] = ()
    prefill_time: tuple[str, ...] = ()
    decode_time: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()
    prefix_queries: tuple[str, ...] = ()
    prefix_hits: tuple[str, ...] = ()
    prefix_misses: tuple[str, ...] = ()
    prefix_hit_rate: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    waiting_by_reason: tuple[str, ...] = ()
    cache_config_info: tuple[str, ...] = ()
    read_bytes: tuple[str, ...] = ()
    flops: tuple[str, ...] = ()
    iteration_tokens: tuple[str, ...] = ()
    prefill_seconds: tuple[str, ...] = ()
    decode_seconds: tuple[str, ...] = ()
    engine_steps: tuple[str, ...] = ()
    not_exported: Mapping[str, str] = field(default_factory=dict, hash=False)
    engine_label: str | None = None
    replica_labels: tuple[str, ...] = ()
    model_label: str | None = "model_name"
    estimates_flag: str | None = None
    waiting_for_slot: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.not_exported) - set(ROLES)
        if unknown:
            raise ValueError(f"{self.name}: not_exported names unknown roles {sorted(unknown)}")

    def names(self, role: str) -> tuple[str, ...]:
        """Candidate names for ``role``, current first; empty when the family has none."""
        if role not in ROLES:
            raise KeyError(f"unknown metric role {role!r}; roles are {', '.join(ROLES)}")
        names: tuple[str, ...] = getattr(self, role)
        return names

    def kind(self, role: str) -> Kind:
        """The Prometheus type of ``role``'s names."""
        return ROLES[role]

    def missing_reason(self, role: str) -> str:
        """Why ``role`` has no value when none of its names is in a scrape."""
        if role in self.not_exported:
            return self.not_exported[role]
        names = self.names(role)
        if not names:
            return f"not exported by {self.display}"
        return "metric absent: " + " / ".join(names) + " not in /metrics"
