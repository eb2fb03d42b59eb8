"""The doctor's rules: evidence in, findings out.

Each rule is a small pure function of the :class:`Evidence`. It returns a :class:`Finding`
that has *fired* (something to change, with the numbers that say so and the advice for this
server), is *clear* (checked, nothing to change), or is *insufficient* (the evidence it needs
is missing: it says which, and does not guess). Every threshold sits in the rule that uses it,
with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pdscope.doctor.evidence import (
    CapacitySearchEvidence,
    Evidence,
    HardwareEvidence,
    InterferenceEvidence,
    PhaseEvidence,
)
from pdscope.errors import Field, Note
from pdscope.experiments.probe import FAR_BELOW_CEILING, NEAR_CEILING
from pdscope.hardware import all_devices
from pdscope.report.fmt import seconds
from pdscope.servers import family

Status = Literal["fired", "clear", "insufficient"]
Severity = Literal["high", "medium", "low", "info"]

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


@dataclass(frozen=True)
class Finding:
    id: str
    status: Status
    severity: Severity
    title: str
    reason: str  # the numbers behind it, in a sentence
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: tuple[str, ...] = ()

    @property
    def fired(self) -> bool:
        return self.status == "fired"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "severity": self.severity,
            "title": self.title,
            "reason": self.reason,
            "evidence": self.evidence,
            "advice": list(self.advice),
        }


def _fired(rid: str, severity: Severity, title: str, reason: str, evidence: dict[str, Any],
           advice: list[str]) -> Finding:
    return Finding(rid, "fired", severity, title, reason, evidence, tuple(advice))


def _clear(rid: str, title: str, reason: str, evidence: dict[str, Any] | None = None) -> Finding:
    return Finding(rid, "clear", "info", title, reason, evidence or {})


def _missing(rid: str, title: str, what: str) -> Finding:
    return Finding(rid, "insufficient", "info", title, f"not enough evidence: {what}")


def _how(ev: Evidence, action: str) -> str:
    return family(ev.server.kind).advise(action).how


def _smaller_budget(ev: Evidence) -> str:
    """Lower the prefill budget: a concrete value when the run knows the server's budget."""
    budgets = [i for i in ev.interference if i.budget_tokens]
    if not budgets:
        return _how(ev, "smaller_prefill_chunks")
    worst = max(budgets, key=lambda i: i.max_gap_during_s or 0.0)
    assert worst.budget_tokens is not None
    smaller = max(256, worst.budget_tokens // 4)
    setting = family(ev.server.kind).advise("smaller_prefill_chunks").setting
    name = f" ({setting} {smaller})" if setting else ""
    return (f"Lower the prefill budget from {worst.budget_tokens:,} to {smaller:,} tokens a"
            f" step{name}: a {worst.inject_tokens:,}-token prompt is then cut into about"
            f" {-(-worst.inject_tokens // smaller)} steps, and running streams get a token"
            " between each, at some cost in TTFT.")


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _least(beaten: bool) -> str:
    """Before a held ceiling that a measurement beat (``roofline.Held``): it is the
    measurement, and the real one is at least that."""
    return "at least " if beaten else ""


def _step_bytes(hw: HardwareEvidence, ph: PhaseEvidence) -> float | None:
    """Bytes a decode step reads, from the specs' ceiling (a held one was raised to the
    measurement, which says nothing about the bytes)."""
    ceiling = ph.spec_decode_ceiling_tok_s or ph.decode_ceiling_tok_s
    return hw.mem_bandwidth_gb_s * 1e9 / ceiling if ceiling else None


# ------------------------------------------------------------------------------ decode


# NEAR_CEILING (0.7) and FAR_BELOW_CEILING (0.3) are the probe's verdict's thresholds: within 70%
# of the bandwidth ceiling the memory bus is the limit; below 30% the stack is.


def _ceiling_at_bits(ev: Evidence, bits: int) -> float | None:
    hw, ph = ev.hardware, ev.phases
    step_bytes = _step_bytes(hw, ph) if hw is not None and ph is not None else None
    if hw is None or ph is None or step_bytes is None:
        return None
    kv_bytes = step_bytes - hw.weight_bytes_read
    weights = hw.weight_bytes_read * (bits / 8) / hw.bytes_per_weight
    return hw.mem_bandwidth_gb_s * 1e9 / (weights + max(kv_bytes, 0.0))


def decode_near_ceiling(ev: Evidence) -> Finding:
    rid, title = "decode-near-ceiling", "Decode is at the memory-bandwidth ceiling"
    ph = ev.phases
    if ph is None or ph.decode_fraction is None or ev.hardware is None:
        return _missing(rid, title, "a probe with a known device and model geometry")
    frac = ph.decode_fraction
    data = {"decode_tok_s": ph.decode_tok_s, "decode_ceiling_tok_s": ph.decode_ceiling_tok_s,
            "fraction": frac, "device": ev.hardware.device}
    if frac < NEAR_CEILING:
        return _clear(rid, title, f"decode runs at {_pct(frac)} of the ceiling, below"
                      f" {_pct(NEAR_CEILING)}", data)
    bits_now = round(ev.hardware.bytes_per_weight * 8)
    gains = []
    for bits in (8, 4):
        if bits < bits_now:
            c = _ceiling_at_bits(ev, bits)
            if c is not None:
                gains.append(f"at {bits} bits the ceiling would be {c:,.0f} tok/s")
                data[f"ceiling_at_{bits}_bits_tok_s"] = c
    advice = [_how(ev, "quantize_weights") + (" (" + "; ".join(gains) + ")." if gains else "")]
    advice.append(_how(ev, "more_bandwidth"))
    return _fired(rid, "high", title,
                  f"decode runs at {ph.decode_tok_s:,.1f} tok/s, {_pct(frac)} of the"
                  f" {_least(ph.decode_ceiling_beaten)}{ph.decode_ceiling_tok_s:,.0f} tok/s"
                  " the memory bus allows on"
                  f" {ev.hardware.device}: the hardware is the limit", data, advice)


def decode_far_below_ceiling(ev: Evidence) -> Finding:
    rid, title = "decode-far-below-ceiling", "Decode is far below the ceiling: the stack limits"
    ph = ev.phases
    if ph is None or ph.decode_fraction is None or ev.hardware is None:
        return _missing(rid, title, "a probe with a known device and model geometry")
    frac = ph.decode_fraction
    data = {"decode_tok_s": ph.decode_tok_s, "decode_ceiling_tok_s": ph.decode_ceiling_tok_s,
            "fraction": frac}
    if frac >= FAR_BELOW_CEILING:
        return _clear(rid, title, f"decode runs at {_pct(frac)} of the ceiling", data)
    per_step_ms = 1000 / ph.decode_tok_s
    floor_ms = 1000 / ph.decode_ceiling_tok_s  # type: ignore[operator]
    advice = [
        f"Each token takes {per_step_ms:.1f} ms where reading the bytes takes {floor_ms:.1f} ms:"
        " the rest is per-step overhead (scheduling, kernel launches, sampling, threads)."
        " A faster memory bus would not help; a leaner serving stack or a larger batch would.",
    ]
    if ev.hardware.parameters < 1e9:
        advice.append("With a model this small, fixed per-step costs dominate; the ceiling"
                      " matters more for models of billions of parameters.")
    return _fired(rid, "medium", title,
                  f"decode runs at {ph.decode_tok_s:,.1f} tok/s, only {_pct(frac)} of the"
                  f" {ph.decode_ceiling_tok_s:,.0f} tok/s ceiling", data, advice)


# ------------------------------------------------------------------------------ prefix cache


def prefix_cache_off(ev: Evidence) -> Finding:
    rid, title = "prefix-cache-off", "A repeated prefix is prefilled every time"
    p = ev.prefix
    if p is None:
        return _missing(rid, title, "the prefix-cache experiment")
    data = {"prefix_tokens": p.prefix_tokens, "warm_ttft_s": p.warm_ttft_s,
            "unique_ttft_s": p.unique_ttft_s, "cold_ttft_s": p.cold_ttft_s,
            "cached_tokens": p.cached_tokens}
    if p.detected:
        return _clear(rid, title, f"the server caches prefixes: a repeated {p.prefix_tokens}-token"
                      f" prefix took {p.warm_ttft_s:.3f} s against {p.unique_ttft_s:.3f} s"
                      " unseen", data)
    # What a cache would save: the prefill of the prefix. From the sweep's fit when there is
    # one (TTFT of the suffix alone), else the prefix's share of the unique prompt.
    if ev.sweep is not None:
        s = ev.sweep
        n = p.suffix_tokens
        expected_warm = s.a_s + s.b_s_per_token * n + (s.c_s_per_token2 or 0.0) * n * n
        how = "the sweep's fit of TTFT for the suffix alone"
    else:
        share = p.prefix_tokens / (p.prefix_tokens + p.suffix_tokens)
        expected_warm = p.unique_ttft_s * (1 - share)
        how = "the prefix's share of the prompt"
    missing = max(0.0, p.unique_ttft_s - expected_warm)
    data["missing_saving_s"] = missing
    return _fired(rid, "high" if missing > 0.2 else "medium", title,
                  f"a repeated {p.prefix_tokens}-token prefix took {p.warm_ttft_s:.3f} s, as long"
                  f" as an unseen prompt ({p.unique_ttft_s:.3f} s): nothing was reused. A prefix"
                  f" cache would save about {missing:.2f} s a request (from {how})",
                  data, [_how(ev, "enable_prefix_cache")])


# ------------------------------------------------------------------------------ prefill


# The prompt's prefill is "most of the TTFT" above half of it.
LONG_PROMPT_SHARE = 0.5


def long_prompt(ev: Evidence) -> Finding:
    rid, title = "long-prompt", "The prompt's length sets the time to first token"
    if ev.sweep is None or ev.phases is None:
        return _missing(rid, title, "the prompt-length sweep and a probe")
    n = ev.phases.prompt_tokens
    share = ev.sweep.prefill_share(n)
    data = {"prompt_tokens": n, "prefill_share_of_ttft": share, "fixed_overhead_s": ev.sweep.a_s,
            "per_token_s": ev.sweep.b_s_per_token, "ttft_s": ev.phases.ttft_s}
    if share < LONG_PROMPT_SHARE:
        return _clear(rid, title, f"at {n} tokens the prompt's prefill is {_pct(share)} of the"
                      f" TTFT; the fixed {ev.sweep.a_s:.3f} s weighs more", data)
    per_k = ev.sweep.b_s_per_token * 1000
    advice = [
        _how(ev, "shorten_prompt") + f" Each 1,000 prompt tokens cost about {per_k:.2f} s here.",
        _how(ev, "enable_prefix_cache"),
        _how(ev, "larger_prefill_chunks"),
    ]
    return _fired(rid, "medium", title,
                  f"at {n} prompt tokens, prefill is {_pct(share)} of the {ev.phases.ttft_s:.3f} s"
                  f" TTFT ({per_k:.2f} s a 1,000 tokens)", data, advice)


# ------------------------------------------------------------------------------ queueing

def _queue_evidence(ev: Evidence) -> tuple[dict[str, Any], str | None]:
    q = ev.queue
    if q is None or q.max_waiting is None:
        return {}, None
    data = {"max_waiting": q.max_waiting, "kv_usage": q.kv_usage_at_max_waiting,
            "waiting_for_capacity": q.waiting_for_capacity, "windows": q.windows}
    return data, q.queueing


def _queue_settled(ev: Evidence, rid: str, title: str) -> Finding | None:
    """What both queueing rules say before they tell capacity from scheduler: no evidence, no
    request waited, or no KV usage to tell by."""
    if ev.queue is None or ev.queue.max_waiting is None:
        return _missing(rid, title, "the server's /metrics under load (waiting requests)")
    data, kind = _queue_evidence(ev)
    if ev.queue.max_waiting == 0:
        return _clear(rid, title, "no request waited in any window", data)
    if kind is None:
        return _missing(rid, title, "KV-cache usage, which this server does not export")
    return None


def _more_slots(ev: Evidence) -> str | None:
    """Twice the slots, with the context that keeps each slot's share, in the family's flags."""
    q = ev.queue
    if q is None or not q.slots or not q.slot_context_tokens:
        return None
    advise = family(ev.server.kind).advise
    slots_flag = advise("more_concurrent_sequences").setting
    ctx_flag = advise("more_kv_memory").setting
    if slots_flag is None or ctx_flag is None:
        return None
    n, ctx = 2 * q.slots, q.slot_context_tokens
    if q.kv_unified:
        pool = (f" and {ctx_flag} stays the pool the slots share (--kv-unified); a slot's"
                f" context can then reach {ctx:,} tokens only while the others leave room")
    else:
        pool = (f" and {ctx_flag} from {q.slots * ctx:,} to {n * ctx:,}, so that each slot"
                f" keeps its {ctx:,} tokens (the context is split between the slots)")
    return (f"Raise {slots_flag} from {q.slots} to {n}{pool}: twice the requests run at once,"
            " each step is longer, so check the ITL p99 again after.")


def queueing_capacity(ev: Evidence) -> Finding:
    rid, title = "queueing-capacity", "Requests wait because the KV pool is full"
    settled = _queue_settled(ev, rid, title)
    if settled is not None:
        return settled
    assert ev.queue is not None  # settled otherwise
    data, kind = _queue_evidence(ev)
    if kind != "capacity" and ev.queue.kv_usage_at_max_waiting is None:
        return _clear(rid, title, "requests waited for a slot, and each slot holds its own"
                      " context: not a full pool", data)
    if kind != "capacity":
        return _clear(rid, title, f"requests waited with the KV pool at"
                      f" {_pct(ev.queue.kv_usage_at_max_waiting or 0)}: not a full pool", data)
    advice = [_how(ev, "more_kv_memory"), _how(ev, "fp8_kv_cache"),
              _how(ev, "shorter_max_context"), _how(ev, "add_replicas")]
    return _fired(rid, "high", title,
                  f"up to {ev.queue.max_waiting:.0f} requests waited while the KV pool was"
                  f" {_pct(ev.queue.kv_usage_at_max_waiting or 0)} full: the server is at"
                  " capacity, not slow", data, advice)


def queueing_scheduler(ev: Evidence) -> Finding:
    rid, title = "queueing-scheduler", "Requests wait with KV memory to spare"
    settled = _queue_settled(ev, rid, title)
    if settled is not None:
        return settled
    assert ev.queue is not None  # settled otherwise
    data, kind = _queue_evidence(ev)
    if kind != "scheduler":
        return _clear(rid, title, "requests waited only with the KV pool near full", data)
    if ev.queue.kv_usage_at_max_waiting is None and ev.queue.slots:
        data |= {"slots": ev.queue.slots, "running": ev.queue.running_at_max_waiting,
                 "slot_context_tokens": ev.queue.slot_context_tokens}
        concrete = _more_slots(ev)
        advice = [concrete] if concrete else []
        advice += [_how(ev, "more_concurrent_sequences"), _how(ev, "add_replicas")]
        busy = ev.queue.running_at_max_waiting
        return _fired(rid, "medium", title,
                      f"up to {ev.queue.max_waiting:.0f} requests waited with"
                      f" {busy if busy is not None else ev.queue.slots:.0f} of"
                      f" {ev.queue.slots} slots busy: {family(ev.server.kind).display} makes a"
                      " request wait only when no slot is free, so the slot count caps the"
                      " requests running at once, not memory", data, advice)
    advice = [_how(ev, "more_concurrent_sequences"), _how(ev, "larger_prefill_chunks"),
              _how(ev, "add_replicas")]
    return _fired(rid, "medium", title,
                  f"up to {ev.queue.max_waiting:.0f} requests waited while the KV pool was only"
                  f" {_pct(ev.queue.kv_usage_at_max_waiting or 0)} full: the scheduler's limits"
                  " (sequences or tokens a step), or the compute, held them back, not memory",
                  data, advice)


def _fewer_sequences(ev: Evidence) -> str:
    setting = family(ev.server.kind).advise("more_concurrent_sequences").setting
    where = f" (lower {setting})" if setting else ""
    return f"Admit fewer requests at once{where}, so those running keep their KV blocks."


def preemption(ev: Evidence) -> Finding:
    rid, title = "preemption", "Running requests were preempted (mid-stream pauses)"
    q = ev.queue
    if q is None or q.preemptions is None:
        return _missing(rid, title, "the server's preemption counter under load")
    data = {"preemptions": q.preemptions}
    if q.preemptions == 0:
        return _clear(rid, title, "no request was preempted", data)
    return _fired(rid, "high", title,
                  f"{q.preemptions:.0f} requests were preempted: their KV was dropped and will be"
                  " recomputed, which users see as a pause in the middle of the answer", data,
                  [_how(ev, "more_kv_memory"), _fewer_sequences(ev), _how(ev, "fp8_kv_cache")])


# ------------------------------------------------------------------------------ interference

# A stall is a gap between two tokens of a running stream at least this many times its usual
# p99, and long enough for a reader to notice.
STALL_FACTOR = 3.0
STALL_NOTICEABLE_S = 0.1


def _stall_ratio(i: InterferenceEvidence) -> float | None:
    if i.max_gap_during_s is None or not i.p99_before_s:
        return None
    return i.max_gap_during_s / i.p99_before_s


def prefill_interference(ev: Evidence) -> Finding:
    rid, title = "prefill-interference", "A long prompt stalls the streams already running"
    if not ev.interference:
        return _missing(rid, title, "the interference experiment")
    runs = [i for i in ev.interference if i.max_gap_during_s is not None]
    if not runs:
        return _missing(rid, title, "a stall measurement (no gap was recorded)")
    worst = max(runs, key=lambda i: i.max_gap_during_s or 0.0)
    ratio = _stall_ratio(worst)
    data: dict[str, Any] = {"inject_tokens": worst.inject_tokens, "streams": worst.streams,
                            "max_gap_s": worst.max_gap_during_s, "p99_before_s": worst.p99_before_s,
                            "p99_during_s": worst.p99_during_s}
    compare = ""
    if len(runs) > 1:
        best = min(runs, key=lambda i: i.max_gap_during_s or 0.0)
        data["runs"] = [{"label": i.label, "budget_tokens": i.budget_tokens,
                         "max_gap_s": i.max_gap_during_s} for i in runs]
        if best is not worst:
            compare = (f" With {best.label or 'the other setting'} the longest stall was"
                       f" {best.max_gap_during_s:.2f} s against {worst.max_gap_during_s:.2f} s"
                       f" with {worst.label or 'this setting'}: the smaller prefill budget did"
                       " better for running streams." if (best.budget_tokens or 0) <
                       (worst.budget_tokens or 1 << 30) else
                       f" With {best.label} the longest stall was {best.max_gap_during_s:.2f} s"
                       f" against {worst.max_gap_during_s:.2f} s with {worst.label}.")
    if (ratio is None or ratio < STALL_FACTOR or
            (worst.max_gap_during_s or 0.0) < STALL_NOTICEABLE_S):
        return _clear(rid, title, f"the longest gap while a {worst.inject_tokens}-token prompt was"
                      f" prefilled was {worst.max_gap_during_s:.2f} s, within {STALL_FACTOR:g}x the"
                      " usual p99" + compare, data)
    advice = [_smaller_budget(ev)]
    return _fired(rid, "medium", title,
                  f"while a {worst.inject_tokens}-token prompt was prefilled, {worst.streams}"
                  f" running streams stopped for up to {worst.max_gap_during_s:.2f} s"
                  f" ({ratio:.0f}x their usual p99 gap of {worst.p99_before_s:.3f} s)." + compare,
                  data, advice)


# ------------------------------------------------------------------------------ context

# KV reads above this share of a decode step's bytes make the context, not the weights, a
# main cost of each token.
KV_SHARE_LARGE = 0.3


def long_context_decode(ev: Evidence) -> Finding:
    rid, title = "long-context-decode", "KV-cache reads are a large share of each decode step"
    ph = ev.phases
    if ph is None or ph.kv_share_of_step is None:
        return _missing(rid, title, "a probe with the model's KV geometry and a device")
    data: dict[str, Any] = {"kv_share_of_step": ph.kv_share_of_step, "context": ph.context}
    if ev.context is not None:
        data["measured_slope_s_per_token"] = ev.context.slope_s_per_token
        data["predicted_slope_s_per_token"] = ev.context.predicted_slope_s_per_token
    if ph.kv_share_of_step < KV_SHARE_LARGE:
        return _clear(rid, title, f"at {ph.context:,} tokens of context, KV is"
                      f" {_pct(ph.kv_share_of_step)} of the bytes a step reads", data)
    return _fired(rid, "medium", title,
                  f"at {ph.context:,} tokens, KV is {_pct(ph.kv_share_of_step)} of the bytes each"
                  " decode step reads: the conversation's length slows every token", data,
                  [_how(ev, "fp8_kv_cache"), _how(ev, "shorter_max_context")])


# ------------------------------------------------------------------------------ load


# p99 ITL this many times the p50 under load: users feel the pauses, not the median.
TAIL_FACTOR = 3.0


def tail_latency_batching(ev: Evidence) -> Finding:
    rid, title = "tail-latency-batching", "Under load, the slowest tokens are far slower than most"
    if ev.load is None or not ev.load.levels:
        return _missing(rid, title, "a load sweep")
    levels = [lv for lv in ev.load.levels if lv.itl_p50_s and lv.itl_p99_s]
    if not levels:
        return _missing(rid, title, "ITL percentiles under load")
    worst = max(levels, key=lambda lv: (lv.itl_p99_s or 0.0) / (lv.itl_p50_s or 1.0))
    p50, p99 = worst.itl_p50_s or 0.0, worst.itl_p99_s or 0.0
    ratio = p99 / p50 if p50 else 0.0
    data = {"concurrency": worst.concurrency, "itl_p50_s": worst.itl_p50_s,
            "itl_p99_s": worst.itl_p99_s, "ratio": ratio,
            "levels": [{"concurrency": lv.concurrency, "itl_p50_s": lv.itl_p50_s,
                        "itl_p99_s": lv.itl_p99_s, "output_throughput": lv.output_throughput}
                       for lv in levels]}
    if ratio < TAIL_FACTOR:
        return _clear(rid, title, f"p99 ITL stays within {TAIL_FACTOR:g}x the p50 up to"
                      f" {max(lv.concurrency for lv in levels)} streams", data)
    return _fired(rid, "medium", title,
                  f"at {worst.concurrency} concurrent streams the p99 gap between tokens is"
                  f" {p99 * 1000:.0f} ms, {ratio:.1f}x the p50 of"
                  f" {p50 * 1000:.0f} ms: throughput rose, and every user waits for"
                  " the slowest part of a shared step", data,
                  [_smaller_budget(ev), _how(ev, "add_replicas")])


# ------------------------------------------------------------------------------ cold start

# A first request this much slower than the warm ones (and by a noticeable margin) paid for
# loading the model or compiling.
COLD_FACTOR = 3.0
COLD_NOTICEABLE_S = 1.0


def cold_start(ev: Evidence) -> Finding:
    rid, title = "cold-start", "The first request pays for loading the model"
    ph = ev.phases
    if ph is None or ph.cold_ttft_s is None:
        return _missing(rid, title, "a probe's cold run")
    data = {"cold_ttft_s": ph.cold_ttft_s, "warm_ttft_s": ph.ttft_s}
    if ph.cold_ttft_s < COLD_FACTOR * ph.ttft_s or ph.cold_ttft_s - ph.ttft_s < COLD_NOTICEABLE_S:
        return _clear(rid, title, f"the first request's TTFT was {ph.cold_ttft_s:.2f} s against"
                      f" {ph.ttft_s:.2f} s warm", data)
    return _fired(rid, "low", title,
                  f"the first request waited {ph.cold_ttft_s:.2f} s for its first token, the next"
                  f" ones {ph.ttft_s:.2f} s", data, [_how(ev, "keep_model_loaded")])


# ------------------------------------------------------------------------------ hardware


def _alternatives(ev: Evidence, key: str, better_than: float) -> list[Any]:
    """Up to three cards of the device table with at least 1.5x the figure: the smallest such
    step, one from the middle, and the largest, so the prediction spans the choice."""
    devices = [d for d in all_devices() if d.kind == "gpu" and getattr(d, key)]
    devices = sorted((d for d in devices if getattr(d, key) >= 1.5 * better_than),
                     key=lambda d: getattr(d, key))
    if len(devices) <= 3:
        return devices
    return [devices[0], devices[len(devices) // 2], devices[-1]]


def gpu_upgrade(ev: Evidence) -> Finding:
    """bigger-gpu-wont-help or faster-gpu-will-help: which phase limits, and what the device
    table predicts for other cards."""
    hw, ph = ev.hardware, ev.phases
    if hw is None or ph is None or ph.decode_ceiling_tok_s is None:
        return _missing("bigger-gpu-wont-help", "What another GPU would change",
                        "a probe with a known device and model geometry")
    step_bytes = _step_bytes(hw, ph) or 1.0
    prefill_share = ev.sweep.prefill_share(ph.prompt_tokens) if ev.sweep else None
    prefill_bound = (ph.prefill_ceiling_tok_s is not None and ph.prefill_tok_s is not None
                     and ph.prefill_tok_s >= 0.5 * ph.prefill_ceiling_tok_s)
    data: dict[str, Any] = {"device": hw.device, "mem_bandwidth_gb_s": hw.mem_bandwidth_gb_s,
                            "peak_tflops": hw.peak_tflops, "decode_fraction": ph.decode_fraction}
    rate, ceiling = ph.prefill_tok_s or 0.0, ph.prefill_ceiling_tok_s or 1.0
    least = _least(ph.prefill_ceiling_beaten)
    if prefill_bound and hw.peak_tflops and prefill_share is not None and prefill_share > 0.5:
        faster = _alternatives(ev, "bf16_tflops", hw.peak_tflops)
        preds = [f"{d.name} ({d.bf16_tflops:,.0f} dense TFLOPS): the prefill part of the TTFT"
                 f" about {seconds(prefill_share * ph.ttft_s * hw.peak_tflops / d.bf16_tflops)}"
                 for d in faster]
        data["predictions"] = preds
        return _fired("faster-gpu-will-help", "low", "A card with more FLOPS would cut the TTFT",
                      f"prefill runs at {rate:,.0f} tok/s, {_pct(ph.prefill_fraction or 0.0)}"
                      f" of the {least}{ceiling:,.0f} tok/s the device's FLOPS allow, and it is"
                      f" {_pct(prefill_share)} of the {ph.ttft_s:.2f} s TTFT: prefill is"
                      " compute-bound",
                      data, [_how(ev, "faster_compute"), *preds])
    frac = ph.decode_fraction or 0.0
    wider = _alternatives(ev, "mem_bandwidth_gb_s", hw.mem_bandwidth_gb_s)
    preds = [f"{d.name} ({d.mem_bandwidth_gb_s:,.0f} GB/s): decode ceiling"
             f" {d.mem_bandwidth_gb_s * 1e9 / step_bytes:,.0f} tok/s" for d in wider]
    data["predictions"] = preds
    if frac >= NEAR_CEILING:
        return _fired("bigger-gpu-wont-help", "low", "More FLOPS will not stream faster",
                      f"decode is at {_pct(frac)} of the bandwidth ceiling: only more bandwidth"
                      " raises it; a card with more compute and the same bandwidth would not",
                      data, [_how(ev, "more_bandwidth"), *preds])
    return _clear("bigger-gpu-wont-help", "More FLOPS will not stream faster",
                  f"decode is at {_pct(frac)} of its ceiling and prefill is not compute-bound:"
                  " the serving stack, not the hardware, is the first thing to change", data)


# ------------------------------------------------------------------------------ disaggregation


def disaggregation(ev: Evidence) -> Finding:
    rid, title = "disaggregation", "Separate prefill and decode workers?"
    interference = [i for i in ev.interference if i.max_gap_during_s is not None]
    data: dict[str, Any] = {"devices": ev.server.devices}
    if not interference:
        return _missing(rid, title, "the interference experiment (how much prefill stalls"
                        " decode)")
    best = min(interference, key=lambda i: i.max_gap_during_s or 0.0)
    data["smallest_stall_s"] = best.max_gap_during_s
    if ev.server.devices <= 1:
        return Finding(rid, "fired", "info", title,
                       f"on {ev.server.devices} device, splitting prefill from decode would set the"
                       " device against itself and turn a pointer into a copy of the KV cache;"
                       f" the smallest stall measured was {best.max_gap_during_s:.2f} s"
                       + (f" (with {best.label})" if best.label else "") +
                       ". Chunked prefill gives nearly the same isolation with one flag", data,
                       (_smaller_budget(ev),))
    ratio = _stall_ratio(best)
    if ratio is not None and ratio >= STALL_FACTOR:
        return _fired(rid, "low", title,
                      f"with {ev.server.devices} devices and stalls of"
                      f" {best.max_gap_during_s:.2f} s that the prefill budget does not remove,"
                      " dedicated prefill and decode workers can pay off under steady traffic",
                      data, [_how(ev, "disaggregate")])
    return _clear(rid, title, "prefill stalls are small: disaggregation has little to win", data)


# ------------------------------------------------------------------------------ capacity

# A scheduler change that holds this many times the users is worth trying first.
WORTH_A_CHANGE = 1.5


def capacity(ev: Evidence) -> Finding:
    """How many users the server holds at the SLO, by the planner calibrated on it, beside what
    the load levels measured, and the scheduler change that would hold more."""
    rid, title = "capacity", "How many users this server holds at your SLO"
    plan = ev.plan
    if plan is None:
        return _missing(rid, title, "a calibration of the planner on this server")
    measured = ev.load.capacity if ev.load is not None else None
    data = {"predicted_users": plan.predicted_users, "measured_users": measured,
            "binding": plan.binding, "best_change": plan.best_change,
            "best_change_users": plan.best_change_users, "slo_ttft_s": plan.slo_ttft_s,
            "slo_itl_s": plan.slo_itl_s, "input_tokens": plan.input_tokens,
            "output_tokens": plan.output_tokens, "fit_error": plan.fit_error,
            "levels": [lv.concurrency for lv in ev.load.levels] if ev.load else []}
    slo = (f"TTFT p99 ≤ {seconds(plan.slo_ttft_s)}, ITL p99 ≤ {seconds(plan.slo_itl_s)}, for"
           f" {plan.input_tokens:,}-token prompts and {plan.output_tokens}-token answers")
    fit = (f" (the step-time model fits this server's calibration within {_pct(plan.fit_error)})"
           if plan.fit_error is not None else "")
    # The what-if's options by name (``slo``, ``input_len``): the CLI names them by its flags.
    how_to = Note("`pdscope plan calibrate URL` then `pdscope plan whatif CAL ", Field("slo"),
                  f" ttft:{plan.slo_ttft_s * 1000:g},itl:{plan.slo_itl_s * 1000:g} ",
                  Field("input_len"), f" {plan.input_tokens} ", Field("output_len"),
                  f" {plan.output_tokens}` sets every change side by side, other GPUs and"
                  " 4-bit weights included")
    searched = ev.capacity_search
    if searched is not None:
        data |= {"searched_users": searched.users, "searched_first_failing":
                 searched.first_failing, "searched_held": searched.held,
                 "searched_levels": searched.levels, "searched_stages": searched.stages,
                 "searched_s": searched.elapsed_s}
    if plan.predicted_users is None:
        return _fired(rid, "high", title, f"{plan.floor or 'one user alone misses the SLO'}"
                      f" ({slo}){fit}{_searched(searched)}", data, [how_to])
    said = (f"the planner predicts {_users(plan.predicted_users)} at your SLO"
            f" ({slo}){fit}")
    if measured is not None:
        said += f"; the load levels measured {_users(measured)} meeting it"
    elif ev.load is not None:
        said += "; none of the load levels measured met it"
    said += _searched(searched)
    advice: list[str] = [how_to]
    severity: Severity = "info"
    if plan.best_change and plan.best_change_users:
        said += f"; with {plan.best_change} it would hold {_users(plan.best_change_users)}"
        if plan.best_change_users >= WORTH_A_CHANGE * plan.predicted_users:
            severity = "medium"
            advice.insert(0, f"Try {plan.best_change}: predicted {plan.best_change_users} users"
                          f" at the SLO instead of {plan.predicted_users}.")
    return Finding(rid, "fired", severity, title, said, data, tuple(advice))


def _searched(s: CapacitySearchEvidence | None) -> str:
    """The --thorough search's answer, as a clause of the capacity finding."""
    if s is None:
        return ""
    if s.users is None:
        return (f"; the search measured {s.levels} levels from the prediction and none met"
                " the SLO")
    above = "" if s.first_failing is None else f", {_users(s.first_failing)} missed it"
    held = {True: ", the bracket held when measured again",
            False: ", but the bracket did not hold when measured again (the load sits at the"
                   " SLO's edge)", None: ""}[s.held]
    return (f"; measured by a search from the prediction: {_users(s.users)} meet it{above}"
            f"{held} ({s.levels} levels, {s.elapsed_s:.0f} s)")


# ------------------------------------------------------------------------------ offload

# Off the GPU from 1% of the weights: `ollama ps` rounds a smaller share to "100% GPU", and 1%
# in dual channel DDR5 (90 GB/s) beside an RTX 4090 (1,008 GB/s) already costs 10% of decode.
OFFLOAD_NOTICEABLE = 0.01


def weights_offloaded(ev: Evidence) -> Finding:
    """Part of the weights in system RAM: each token reads that part at the CPU's bandwidth
    (llama.cpp issue 2641: 11 to 76 tok/s once every layer was on the GPU)."""
    rid, title = "weights-offloaded", "Part of the weights run from system RAM"
    o = ev.offload
    if o is None:
        return _missing(rid, title, "where the server keeps the weights (Ollama's /api/ps"
                        " says; llama.cpp's -ngl and vLLM's --cpu-offload-gb when pdscope"
                        " knows its flags)")
    data: dict[str, Any] = {"on_gpu": o.on_gpu, "off_gpu": o.off_gpu, "source": o.source,
                            "device": o.gpu_device, "cpu_device": o.cpu_device,
                            "cpu_mem_bandwidth_gb_s": o.cpu_mem_bandwidth_gb_s,
                            "decode_ceiling_tok_s": o.decode_ceiling_tok_s,
                            "all_on_gpu_tok_s": o.all_on_gpu_tok_s,
                            "slots": o.slots, "slot_context_tokens": o.slot_context_tokens,
                            "slots_kv_bytes": o.slots_kv_bytes}
    if o.gpu_device is None and o.device_kind not in (None, "gpu"):
        return _clear(rid, title, f"the server runs on a {o.device_kind}: one memory holds"
                      " every weight, and its bandwidth is the ceiling", data)
    if o.off_gpu < OFFLOAD_NOTICEABLE:
        return _clear(rid, title, f"{_pct(o.on_gpu)} of the weights are in GPU memory"
                      f" ({o.source})", data)
    said = f"{_pct(o.off_gpu)} of the weights run from system RAM"
    if o.decode_ceiling_tok_s and o.all_on_gpu_tok_s:
        cpu = f"{o.cpu_device}, {o.cpu_mem_bandwidth_gb_s:,.0f} GB/s" + (
            "" if o.cpu_measured else ", assumed")
        said += (f": the ceiling is {o.decode_ceiling_tok_s:,.0f} tok/s, not"
                 f" {o.all_on_gpu_tok_s:,.0f} (each token reads that share at the CPU's"
                 f" bandwidth, {cpu})")
    else:
        said += ", read at the CPU's bandwidth every token: decode slows several times"
    said += f" ({o.source})"
    advice = [_how(ev, "weights_on_gpu")]
    if o.slots_kv_bytes and o.slots and o.slot_context_tokens:
        advice.append(f"Its {o.slots} parallel slots of {o.slot_context_tokens:,} tokens hold"
                      f" {o.slots_kv_bytes / 1e9:,.1f} GB of KV cache in GPU memory from the"
                      " start: fewer slots or a shorter context leave that room to the"
                      " weights.")
    advice.append(_how(ev, "quantize_weights"))
    return _fired(rid, "high", title, said, data, advice)


# ------------------------------------------------------------------------------ truncation


def prompt_truncated(ev: Evidence) -> Finding:
    """Prompts the server cut short (Ollama past num_ctx: issues 10368, 17889, 17427) or
    refused as longer than a request's context (llama-server's -c over -np, vLLM's
    --max-model-len). The tolerance, max(4 tokens, 1%) of what was sent, is
    :func:`pdscope.client.truncation.allowed_shortfall`'s, with its reason."""
    rid, title = "prompt-truncated", "Prompts are cut short by the server's context"
    t = ev.truncation
    if t is None or (t.checked == 0 and t.refused == 0):
        return _missing(rid, title, "requests whose prompt tokens both pdscope and the server"
                        " counted (the server reports no prompt tokens)")
    data: dict[str, Any] = {"checked": t.checked, "truncated": t.truncated,
                            "sent_tokens": t.sent_tokens, "reported_tokens": t.reported_tokens,
                            "refused": t.refused, "refusal": t.refusal,
                            "context_tokens": t.context_tokens, "slots": t.slots,
                            "kv_unified": t.kv_unified}
    if t.truncated == 0 and t.refused == 0:
        return _clear(rid, title, f"the server reported every prompt whole ({t.checked}"
                      " requests checked)", data)
    limit = (f"a request's context is {t.context_tokens:,} tokens"
             if t.context_tokens else "the server's context per request is shorter")
    if t.context_tokens and t.slots and t.slots > 1 and t.kv_unified is False:
        limit += f" ({t.slots} slots share -c, {t.slots * t.context_tokens:,} tokens)"
    parts = []
    if t.truncated:
        parts.append(f"{t.truncated} of {t.checked} prompts were cut short without an error"
                     f" (sent {t.sent_tokens:,} tokens, the server kept {t.reported_tokens:,}):"
                     " the model never saw the rest, and their TTFT is a shorter prompt's")
    if t.refused:
        parts.append(f"{t.refused} {'request was' if t.refused == 1 else 'requests were'}"
                     f" refused: {t.refusal}")
    said = "; ".join(parts) + f"; {limit}"
    severity: Severity = "high" if t.truncated else "medium"
    return _fired(rid, severity, title, said, data,
                  [_how(ev, "longer_context"), _how(ev, "shorten_prompt")])
# ------------------------------------------------------------------------------ thinking

# Thinking that a person notices before the first word of the answer: half a second (what the
# article calls a slow first token starts there), and more of the wait than the prefill.
THINKING_NOTICEABLE_S = 0.5
# Most of the wait: the first answer token is then a question of how long the model thinks.
THINKING_MOST_OF_WAIT = 0.8


def _secs(x: float) -> str:
    return f"{x:.1f} s" if x >= 1 else f"{x:.2f} s"


def thinking(ev: Evidence) -> Finding:
    """A model that thinks before it answers: the first *answer* token waits for the reasoning
    tokens, and it is not prefill (aibrix issue 1573; GuideLLM issue 737; AIPerf's time to
    first output token)."""
    rid, title = "thinking", "The model thinks before it answers"
    t = ev.thinking
    if t is None:
        return _missing(rid, title, "a probe whose streams say which tokens were reasoning")
    data: dict[str, Any] = {"reasoned": t.reasoned, "runs": t.runs, "ttft_s": t.ttft_s,
                            "ttfo_s": t.ttfo_s, "thinking_s": t.thinking_s,
                            "reasoning_tokens": t.reasoning_tokens,
                            "output_tokens": t.output_tokens, "answered": t.answered}
    if not t.reasoned:
        return _clear(rid, title, "no stream carried reasoning apart from its answer: the first"
                      " token is the answer's, and TTFT is the prefill (a server that hides the"
                      " thought would count it in TTFT)", data)
    advice = [_how(ev, "limit_thinking")]
    prefill = f"prefill {_secs(t.ttft_s)}" if t.ttft_s is not None else "prefill unknown"
    if t.answered == 0:
        return _fired(rid, "high", title,
                      f"{prefill}, then {t.reasoning_tokens or '?'} of {t.output_tokens or '?'}"
                      " output tokens were reasoning: the output cap ended every run before the"
                      " first answer token, so the answer's latency is unknown and longer",
                      data, advice)
    if t.thinking_s is None or t.ttfo_s is None:
        return _missing(rid, title, "the time of the first answer token")
    if t.thinking_s < THINKING_NOTICEABLE_S or (t.ttft_s is not None and t.thinking_s <= t.ttft_s):
        return _clear(rid, title, f"{prefill}, thinking {_secs(t.thinking_s)}: the thought is"
                      f" shorter than {_secs(THINKING_NOTICEABLE_S)} or than the prefill", data)
    share = t.thinking_s / t.ttfo_s if t.ttfo_s > 0 else 1.0
    data["thinking_share_of_ttfo"] = share
    return _fired(rid, "high" if share >= THINKING_MOST_OF_WAIT else "medium", title,
                  f"{prefill}, thinking {_secs(t.thinking_s)}: the first answer token comes"
                  f" {_secs(t.ttfo_s)} after the request (TTFO), {_pct(share)} of it spent on"
                  f" {t.reasoning_tokens or '?'} reasoning tokens, not on the prompt", data,
                  advice)


def _users(n: int) -> str:
    return f"{n} concurrent user{'' if n == 1 else 's'}"


RULES: tuple[Callable[[Evidence], Finding], ...] = (
    decode_near_ceiling,
    decode_far_below_ceiling,
    prefix_cache_off,
    long_prompt,
    queueing_capacity,
    queueing_scheduler,
    preemption,
    prefill_interference,
    long_context_decode,
    tail_latency_batching,
    cold_start,
    gpu_upgrade,
    disaggregation,
    capacity,
    weights_offloaded,
    prompt_truncated,
    thinking,
)


def diagnose(ev: Evidence) -> list[Finding]:
    """Every rule's finding: fired first (most severe first), then clear, then insufficient."""
    findings = [rule(ev) for rule in RULES]
    status_order = {"fired": 0, "clear": 1, "insufficient": 2}
    return sorted(findings, key=lambda f: (status_order[f.status], SEVERITY_ORDER[f.severity]))
