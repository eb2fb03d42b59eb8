"""What a window of server metrics says, one small rule at a time.

Each rule reads a :class:`~pdscope.metrics.window.Window` and nothing else, keeps its threshold
next to it with the reason for the number, and says in one line what its value means. A value
the server does not export stays unknown, with the window's reason; it is never read as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdscope import roofline
from pdscope.errors import InputError
from pdscope.metrics.window import Window
from pdscope.servers import metric_map_named

Queueing = Literal["none", "capacity", "scheduler"]
Level = Literal["ok", "warn", "unknown"]

# KV-cache usage from which waiting requests are taken to wait for KV blocks. The article:
# vllm:num_requests_waiting rising while vllm:kv_cache_usage_perc sits near 1 is the exact
# signature of a full pool. The lab (DESIGN.md) saw both sides: 30 waiting at usage 0.05 is
# queueing that is not KV pressure; 4 waiting at 0.93 is a full pool. 0.9 sits between them with
# room for the blocks vLLM keeps free for running sequences.
FULL_POOL_KV_USAGE = 0.9

# Any preemption is worth a warning: the preempted request's stream pauses mid-answer while its
# cache is recomputed (the article), and vLLM preempts only when the pool ran out.
PREEMPTIONS_WARN_AT = 1


def classify_queueing(window: Window) -> Queueing | None:
    """Why requests wait: ``none``, ``capacity`` (the KV pool is full), ``scheduler`` (it is not).

    ``capacity`` when requests wait and KV usage is at least :data:`FULL_POOL_KV_USAGE`;
    ``scheduler`` when they wait with KV usage below it: the pool has room and the scheduler's
    own limits (max-num-seqs, the token budget of a step, slots) hold them back. ``None`` when
    the server does not export its queue, or when requests wait and it does not export KV usage
    (unless requests wait only for a slot, as in llama.cpp: ``scheduler``).

    vLLM's ``num_requests_waiting_by_reason{reason="capacity"}`` does not decide this: its help
    text defines it as "waiting for scheduling capacity", which includes the step's token budget
    and max-num-seqs, and the vLLM-CPU lab text counts 22 such requests at KV usage 0.42. The
    window keeps it as ``waiting_capacity`` for display only.
    """
    waiting = window.num_requests_waiting
    if waiting is None:
        return None
    if waiting <= 0:
        return "none"
    kv = window.kv_cache_usage
    if kv is None:
        # llama.cpp: a request waits only when every slot is busy, and each slot holds its own
        # context, so waiting is the slot count's limit, whatever the cache holds.
        return "scheduler" if waits_for_slot(window) else None
    return "capacity" if kv >= FULL_POOL_KV_USAGE else "scheduler"


def waits_for_slot(window: Window) -> bool:
    """Whether the window's server makes a request wait only when all its slots are busy
    (:attr:`~pdscope.servers.MetricMap.waiting_for_slot`: llama.cpp)."""
    try:
        return metric_map_named(window.family).waiting_for_slot
    except InputError:
        return False


def achieved_bandwidth_gb_s(window: Window) -> float | None:
    """Memory bandwidth the server estimates it used, in GB/s (10^9 bytes), per GPU.

    From vLLM's ``estimated_read_bytes_per_gpu`` counter; ``None`` where it is not exported or
    not filled (see ``window.missing["read_bytes_per_s"]``).
    """
    if window.read_bytes_per_s is None:
        return None
    return window.read_bytes_per_s / 1e9


@dataclass(frozen=True)
class Signal:
    """One line of the dashboard: a value, whether it needs attention, and what it means."""

    id: str
    value: float | str | None
    level: Level
    meaning: str


def _unknown(signal_id: str, window: Window, field: str) -> Signal:
    reason = window.missing.get(field, "not known")
    return Signal(signal_id, None, "unknown", reason)


def queueing_signal(window: Window) -> Signal:
    """Whether requests wait, and for what."""
    kind = classify_queueing(window)
    waiting = window.num_requests_waiting
    kv = window.kv_cache_usage
    if kind is None:
        if waiting is None:
            return _unknown("queueing", window, "num_requests_waiting")
        return Signal(
            "queueing",
            None,
            "unknown",
            f"{waiting:g} requests wait; KV-cache usage is not exported, so whether the pool "
            "is full cannot be told",
        )
    if kind == "none":
        return Signal("queueing", kind, "ok", "no request is waiting")
    assert waiting is not None
    if kv is None:  # a server of slots (classify_queueing)
        return Signal(
            "queueing",
            kind,
            "warn",
            f"{waiting:g} requests wait for a slot: every slot is busy; the slot count holds "
            "them back",
        )
    if kind == "capacity":
        return Signal(
            "queueing",
            kind,
            "warn",
            f"{waiting:g} requests wait with KV-cache usage {kv:.2f} "
            f"(>= {FULL_POOL_KV_USAGE}): the KV pool is full; they wait for blocks",
        )
    return Signal(
        "queueing",
        kind,
        "warn",
        f"{waiting:g} requests wait with KV-cache usage {kv:.2f} (< {FULL_POOL_KV_USAGE}): "
        "the pool has room; the scheduler's limits hold them back",
    )


def prefix_cache_signal(window: Window) -> Signal:
    """Share of prompt tokens served from the prefix cache (informational)."""
    rate = window.prefix_cache_hit_rate
    if rate is None:
        return _unknown("prefix_cache_hit_rate", window, "prefix_cache_hit_rate")
    return Signal(
        "prefix_cache_hit_rate",
        rate,
        "ok",
        f"{rate:.1%} of the prompt tokens looked up were found in the prefix cache and skipped "
        "prefill",
    )


def preemption_signal(window: Window) -> Signal:
    """Requests preempted in the window."""
    count = window.preemptions
    if count is None:
        return _unknown("preemptions", window, "preemptions")
    if count >= PREEMPTIONS_WARN_AT:
        return Signal(
            "preemptions",
            count,
            "warn",
            f"{count:g} requests were preempted: the KV pool ran out mid-decode and their "
            "streams paused while the cache was recomputed",
        )
    return Signal("preemptions", count, "ok", "no request was preempted")


def iteration_tokens_signal(window: Window) -> Signal:
    """Mean tokens one engine step processed (informational)."""
    mean = window.mean_iteration_tokens
    if mean is None:
        return _unknown("mean_iteration_tokens", window, "mean_iteration_tokens")
    return Signal(
        "mean_iteration_tokens",
        mean,
        "ok",
        f"one engine step processed {mean:.1f} tokens on average: one per decoding sequence "
        "plus the prompt chunks being prefilled",
    )


def bandwidth_signal(window: Window, ceiling_gb_s: float | None = None) -> Signal:
    """Memory bandwidth the server estimates it achieved (informational), set beside the
    device's published bandwidth ``ceiling_gb_s`` when it is given."""
    gb_s = achieved_bandwidth_gb_s(window)
    if gb_s is None:
        return _unknown("achieved_bandwidth_gb_s", window, "read_bytes_per_s")
    if ceiling_gb_s:
        held = roofline.hold(
            gb_s, ceiling_gb_s, what="bandwidth the server estimates", unit="GB/s",
            spec=f"the device's {ceiling_gb_s:,.0f} GB/s",
            why="the server's own estimate counts bytes that came from cache rather than memory,"
            " or the device named is not the one the server runs on")
        meaning = (
            f"the server estimates it read {gb_s:.1f} GB/s per GPU, {held.share:.0%} "
            f"of the device's {held.mark}{held.limit:,.0f} GB/s: decode can go no faster than"
            " that line"
        )
        if held.warning is not None:
            meaning += f" (warning: {held.warning})"
    else:
        meaning = (
            f"the server estimates it read {gb_s:.1f} GB/s per GPU; decode is bound by "
            "the device's memory bandwidth"
        )
    return Signal("achieved_bandwidth_gb_s", gb_s, "ok", meaning)


def signals(window: Window, *, ceiling_gb_s: float | None = None) -> list[Signal]:
    """The dashboard's signals, in display order. ``ceiling_gb_s``: the device's memory
    bandwidth, set beside the achieved bandwidth."""
    return [
        queueing_signal(window),
        prefix_cache_signal(window),
        preemption_signal(window),
        iteration_tokens_signal(window),
        bandwidth_signal(window, ceiling_gb_s),
    ]
