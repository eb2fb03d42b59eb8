"""SGLang (``python -m sglang.launch_server``).

Where each fact was checked:

* Detection: ``sglang:`` names on ``GET /metrics``, or ``GET /get_server_info`` (a deprecated
  alias of ``/server_info`` in newer releases), whose answer is the server's arguments
  (``model_path``, ``tokenizer_path``, ...) and ``version`` (sgl-project/sglang's HTTP server,
  ``get_server_info``).
* Settings: the same answer's ``chunked_prefill_size``, ``max_running_requests``,
  ``max_total_tokens`` (``max_total_num_tokens`` where the scheduler reports it), ``page_size``,
  ``disable_radix_cache``, ``context_length`` (``python/sglang/srt/server_args.py``; the names in
  ``docs/backend/server_arguments.md``).
* Streams: as vLLM's, ``ignore_eos`` and ``min_tokens`` for a fixed output length;
  ``cached_tokens`` in usage only with ``--enable-cache-report``.
* Metrics: ``python/sglang/srt/metrics/collector.py`` (commit 00ae9c15) and
  ``docs/references/production_metrics.md``, whose example still shows the older
  ``sglang:time_per_output_token_seconds``.
* Flags: ``docs/advanced_features/server_arguments.md`` (commit 004813e1dd46).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdscope.servers.advice import Advice, family_advice
from pdscope.servers.family import (
    METRICS_PATH,
    Answers,
    Detected,
    ServerFamily,
    ServerSettings,
    flag_value,
    int_or_none,
    str_or_none,
)
from pdscope.servers.metric_map import MetricMap

METRICS = MetricMap(
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

_SGLANG = "sgl-project/sglang docs/advanced_features/server_arguments.md@004813e1dd46"

# fmt: off
ADVICE = family_advice("sglang", [
    Advice(
        "enable_prefix_cache", "sglang",
        "Keep SGLang's RadixAttention prefix cache on: it is on by default, so drop "
        "--disable-radix-cache if the server was started with it, and keep the shared prefix "
        "identical at the start of every prompt.",
        "--disable-radix-cache", _SGLANG,
    ),
    Advice(
        "smaller_prefill_chunks", "sglang",
        "Lower SGLang's --chunked-prefill-size (e.g. to 2048; -1 turns chunking off) so a long "
        "prompt is prefilled in smaller pieces, and try --enable-mixed-chunk so decode steps "
        "share a batch with each piece.",
        "--chunked-prefill-size", _SGLANG,
    ),
    Advice(
        "larger_prefill_chunks", "sglang",
        "Raise SGLang's --chunked-prefill-size (and --max-prefill-tokens if it caps the batch) "
        "so a long prompt needs fewer steps, at the cost of longer pauses for running streams.",
        "--chunked-prefill-size", _SGLANG,
    ),
    Advice(
        "more_concurrent_sequences", "sglang",
        "Raise SGLang's --max-running-requests so more requests decode in one batch; it only "
        "helps while the KV pool (sglang:token_usage) has room.",
        "--max-running-requests", _SGLANG,
    ),
    Advice(
        "more_kv_memory", "sglang",
        "Raise SGLang's --mem-fraction-static (weights plus KV pool, as a fraction of GPU "
        "memory) while memory is left over; lower it again on out-of-memory errors.",
        "--mem-fraction-static", _SGLANG,
    ),
    Advice(
        "fp8_kv_cache", "sglang",
        "Start SGLang with --kv-cache-dtype fp8_e5m2 (or fp8_e4m3) to halve each KV element "
        "against 16 bits.",
        "--kv-cache-dtype", _SGLANG,
    ),
    Advice(
        "shorter_max_context", "sglang",
        "Cap the context with SGLang's --context-length so no single request can claim most of "
        "the KV pool.",
        "--context-length", _SGLANG,
    ),
    Advice(
        "quantize_weights", "sglang",
        "Start SGLang with --quantization fp8 on a 16-bit checkpoint, or load a pre-quantized "
        "(FP8, AWQ, GPTQ) checkpoint without the flag: fewer bytes a weight is fewer bytes read "
        "a token.",
        "--quantization", _SGLANG,
    ),
    Advice(
        "keep_model_loaded", "sglang",
        "SGLang keeps the model loaded while the process runs and warms up before serving "
        "(unless --skip-server-warmup): send one warm-up request after each restart before "
        "taking traffic.",
        None, _SGLANG,
    ),
    Advice(
        "add_replicas", "sglang",
        "Start SGLang with --dp-size N (alias of --data-parallel-size), or run more servers "
        "behind the SGLang router or a load balancer.",
        "--dp-size", _SGLANG,
    ),
    Advice(
        "longer_context", "sglang",
        "Start SGLang with a larger --context-length (by default the model's own, from its "
        "config.json).",
        "--context-length", _SGLANG,
    ),
    Advice(
        "weights_on_gpu", "sglang",
        "Start SGLang without --cpu-offload-gb (0, the default), so no weight is read from CPU "
        "memory; make the model fit instead with --quantization fp8 or a pre-quantized "
        "checkpoint, a lower --context-length, or more GPUs with --tp-size.",
        "--cpu-offload-gb", _SGLANG + " (Offloading: --cpu-offload-gb, GB of RAM reserved for "
        "CPU offloading, default 0)",
    ),
    Advice(
        "disaggregate", "sglang",
        "Only with whole GPUs to spare for each phase, run one SGLang server with "
        "--disaggregation-mode prefill and one with --disaggregation-mode decode, joined by a "
        "transfer backend (--disaggregation-transfer-backend); on one GPU, lower "
        "--chunked-prefill-size instead.",
        "--disaggregation-mode", _SGLANG,
    ),
    Advice(
        "limit_thinking", "sglang",
        "Turn the thinking off per request with chat_template_kwargs {\"enable_thinking\": "
        "false} (Qwen3; DeepSeek-V3.1/V3.2 take `thinking` instead), or serve the model's "
        "non-thinking variant (a Qwen3 -Thinking model always thinks); start SGLang with "
        "--reasoning-parser so the thought arrives apart from the answer.",
        "chat_template_kwargs",
        "sgl-project/sglang docs/advanced_features/separate_reasoning (Qwen3 \"supports "
        "enable_thinking parameter\"; DeepSeek-V3 \"thinking parameter (NOTE: not "
        "enable_thinking)\"; Qwen3-Thinking \"always thinks\"; --reasoning-parser)",
    ),
])
# fmt: on

_INFO_PATHS = ("/get_server_info", "/server_info")


def _server_info(answers: Answers) -> dict[str, Any] | None:
    for path in _INFO_PATHS:
        info = answers.get(path)
        if isinstance(info, dict) and ("model_path" in info or "tokenizer_path" in info):
            return info
    return None


def recognise(answers: Answers) -> Detected | None:
    metrics = answers.get(METRICS_PATH)
    info = _server_info(answers)
    if info is None and not (isinstance(metrics, str) and "sglang:" in metrics):
        return None
    return Detected(str_or_none(info.get("version")) if info else None)


def fixed_output(max_tokens: int) -> dict[str, Any]:
    return {"ignore_eos": True, "min_tokens": max_tokens}


def read_settings(answers: Answers, info_labels: Mapping[str, str] | None,
                  flags: Sequence[str]) -> ServerSettings:
    info = _server_info(answers) or {}
    budget = int_or_none(flag_value(flags, "--chunked-prefill-size"))
    label = f"--chunked-prefill-size {budget}" if budget is not None else ""
    if budget is None:
        budget = int_or_none(info.get("chunked_prefill_size"))
        label = (f"chunked_prefill_size {budget} (from /get_server_info)" if budget is not None
                 else "the server's default budget")
    internal = info.get("internal_states")
    pool = int_or_none(info.get("max_total_num_tokens") or info.get("max_total_tokens"))
    if pool is None and isinstance(internal, list) and internal and isinstance(internal[0], dict):
        pool = int_or_none(internal[0].get("max_total_num_tokens"))
    radix_off = info.get("disable_radix_cache")
    return ServerSettings(
        prefill_budget_tokens=budget, budget_label=label,
        max_sequences=int_or_none(info.get("max_running_requests")),
        kv_pool_tokens=pool, block_size=int_or_none(info.get("page_size")),
        prefix_caching=(not radix_off) if isinstance(radix_off, bool) else None,
        context_tokens=int_or_none(info.get("context_length")),
        sources=("/get_server_info",) if info else ())


FAMILY = ServerFamily(
    name="sglang",
    display="SGLang",
    advice=ADVICE,
    probes=_INFO_PATHS,
    recognise=recognise,
    fixed_output=fixed_output,
    cached_tokens_flag="--enable-cache-report",
    metric_map=METRICS,
    settings_paths=_INFO_PATHS,
    read_settings=read_settings,
)
