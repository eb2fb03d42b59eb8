"""llama.cpp: its own C++ server (``llama-server``) and llama-cpp-python's
(``python -m llama_cpp.server``). Two families, one engine: the same advice (llama-cpp-python's
flag names are given in a parenthesis where they differ), other endpoints.

Where each fact was checked:

* llama-server: ``GET /props`` → ``default_generation_settings``, ``build_info``, ``total_slots``,
  ``model_path`` (ggml-org/llama.cpp ``tools/server/README.md``; an example in
  ``tests/data/fixtures/servers/llama.cpp/``). Tokenizer ``POST /tokenize`` ``{"content": ...}``
  → ``{"tokens": [...]}``; ``POST /detokenize`` ``{"tokens": [...]}`` → ``{"content"}``. A fixed
  output length with ``ignore_eos`` ("Ignore end of stream token and continue generating",
  options of ``/completion``, which ``/v1/*`` also accept). Streams carry ``timings``.
* llama-cpp-python: ``POST /extras/tokenize`` ``{"input": ..., "model": ...}`` →
  ``{"tokens": [...]}``; ``/extras/detokenize`` ``{"tokens": [...]}`` → ``{"text": ...}``
  (abetlen/llama-cpp-python ``llama_cpp/server/app.py`` and ``types.py``). It has no
  ``/props``, ``/version`` or ``/metrics``, sends no usage in streams, takes ``min_tokens``
  (``CreateCompletionRequest``; no ``ignore_eos``, and its pydantic models ignore unknown fields),
  and serves one request at a time (a lock in ``app.py``).
* Metrics (llama-server): every name read from the source the lab builds (llama.cpp 0c1e570,
  vendored in llama-cpp-python 0.3.36's sdist), ``tools/server/server-task.cpp``,
  ``server_task_result_metrics::to_metrics``: counters ``prompt_tokens_total`` (cached tokens
  left out), ``prompt_tokens_cached_total``, ``prompt_seconds_total``,
  ``tokens_predicted_total``, ``tokens_predicted_seconds_total``, ``n_decode_total``,
  ``n_tokens_max``, ``spec_decode_num_*``; gauges ``prompt_tokens_seconds``,
  ``predicted_tokens_seconds``, ``requests_processing`` (busy slots), ``requests_deferred``
  (tasks waiting for a slot), ``n_busy_slots_per_decode``; all behind ``--metrics``. No
  KV-cache gauge (builds before ``tools/server/README.md`` at 00dc8057 exported
  ``llamacpp:kv_cache_usage_ratio``) and no latency histograms. Recorded from the lab under
  ``tests/data/captured/llama-server-0c1e570-*``.
* Settings: ``GET /props`` (``total_slots``, ``default_generation_settings.n_ctx``, a slot's
  context) and ``/slots`` (``n_ctx``, ``is_processing`` a slot), server-context.cpp; defaults
  from ``common/common.h`` and the flags from ``common/arg.cpp`` of the same tree.
* Offload: ``/props`` says nothing of the layers on the GPU in this version (0c1e570; see
  ``tests/data/captured/llama-server-0c1e570-props.json``); the flags do. ``-ngl``,
  ``--gpu-layers``, ``--n-gpu-layers`` N (also ``auto``, the default, which fits what fits,
  and ``all``), ``common/arg.cpp``; llama.cpp counts the output layer as one more
  (``llama_model::n_gpu_layers``, "plus 1 for the output layer", and the start-up line
  "offloaded N/n_layer+1 layers to GPU", ``src/llama-model.cpp``). The share on the GPU is
  read as N / (the model's layers + 1); ``auto`` or no flag is not known. llama-cpp-python's
  ``--n_gpu_layers`` defaults to 0, every layer on the CPU, and -1 is all (its
  ``settings.py``).
* Flags: ``tools/server/README.md`` (its flag table is generated from ``common/arg.cpp``);
  llama-cpp-python 0.3.36 as installed, ``llama_cpp/server/settings.py`` and
  ``python -m llama_cpp.server --help``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdscope.servers.advice import Advice, family_advice
from pdscope.servers.family import (
    Answers,
    Confirm,
    Detected,
    ServerFamily,
    ServerSettings,
    Tokenizer,
    WeightPlacement,
    flag_value,
    int_or_none,
    models_root_paths,
    str_or_none,
)
from pdscope.servers.metric_map import MetricMap

METRICS = MetricMap(
    name="llama.cpp",
    display="llama.cpp",
    prefix="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    # Only builds older than the README at 00dc8057 export this; read it where it is present.
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    # The prompt cache: tokens reused from a slot's last prompt against those computed.
    prefix_hits=("llamacpp:prompt_tokens_cached_total",),
    prefix_misses=("llamacpp:prompt_tokens_total",),
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
    # A task is deferred only when no slot is free (server-context.cpp, process_single_task:
    # "if no slot is available, we defer this task for processing later").
    waiting_for_slot=True,
)

_LLAMA = "ggml-org/llama.cpp tools/server/README.md@00dc8057ab28"
_LCPP = (
    "abetlen/llama-cpp-python llama_cpp/server/settings.py, 0.3.36 as installed "
    "(`python -m llama_cpp.server --help`)"
)
_LCPP_ONE = _LCPP + "; llama_cpp/server/app.py (a lock serves one request at a time)"

# fmt: off
ADVICE = family_advice("llama.cpp", [
    Advice(
        "enable_prefix_cache", "llama.cpp",
        "Keep llama-server's prompt cache on (--cache-prompt, on by default; older builds need "
        '`"cache_prompt": true` in each request) and add --cache-reuse 256 to reuse chunks '
        "after a changed middle (llama-cpp-python already reuses the previous prompt's prefix; "
        "start it with --cache true to keep older prompts in RAM).",
        "--cache-prompt",
        _LLAMA + "; " + _LCPP + " (`cache`, `cache_type`, `cache_size`) and llama_cpp/llama.py "
        "(longest common prefix with the previous prompt)",
    ),
    Advice(
        "smaller_prefill_chunks", "llama.cpp",
        "Lower llama-server's -b/--batch-size (default 2048) and -ub/--ubatch-size (default 512) "
        "so each step takes fewer prompt tokens beside the running streams (llama-cpp-python: "
        "--n_batch and --n_ubatch, but it serves one request at a time, so no stream is "
        "interrupted there).",
        "--batch-size", _LLAMA + "; " + _LCPP_ONE,
    ),
    Advice(
        "larger_prefill_chunks", "llama.cpp",
        "Raise llama-server's -b/--batch-size and -ub/--ubatch-size (ubatch no larger than "
        "batch) so a prompt needs fewer steps (llama-cpp-python: --n_batch and --n_ubatch).",
        "--batch-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "more_concurrent_sequences", "llama.cpp",
        "Start llama-server with more slots, -np/--parallel N, and a -c/--ctx-size large enough "
        "for N contexts (it is split between the slots), or with --kv-unified so that the "
        "slots share one -c pool (llama-cpp-python serves one request at a time: run more "
        "processes instead).",
        "--parallel", _LLAMA + "; " + _LCPP_ONE,
    ),
    Advice(
        "more_kv_memory", "llama.cpp",
        "Start llama-server with a larger -c/--ctx-size: it is the whole KV pool, shared by the "
        "-np slots (llama-cpp-python: --n_ctx).",
        "--ctx-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "fp8_kv_cache", "llama.cpp",
        "Start llama-server with -ctk q8_0 -ctv q8_0 (--cache-type-k, --cache-type-v) and "
        "flash attention on, -fa on, which a quantized V cache needs (llama-cpp-python: "
        "--type_k 8 --type_v 8 --flash_attn true, 8 being GGML_TYPE_Q8_0).",
        "--cache-type-k",
        _LLAMA + "; " + _LCPP + " and llama_cpp/llama_cpp.py (GGML_TYPE_Q8_0 = 8); the "
        "flash-attention requirement from the error 'quantized V cache requires flash_attn' "
        "quoted in run logs, not verified in llama.cpp's source",
    ),
    Advice(
        "shorter_max_context", "llama.cpp",
        "Lower llama-server's -c/--ctx-size, the KV pool its -np slots share, so each slot's "
        "context stays short (llama-cpp-python: --n_ctx).",
        "--ctx-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "quantize_weights", "llama.cpp",
        "Load a lower-bit GGUF of the same model (e.g. Q4_K_M instead of Q8_0 or F16, with "
        "`-hf <repo>:Q4_K_M` or a file made by llama-quantize; the same file works for "
        "llama-cpp-python's --model): fewer bytes a weight is fewer bytes read a token.",
        None, _LLAMA + " (`-hf <user>/<model>[:quant]`); llama-quantize not verified here",
    ),
    Advice(
        "keep_model_loaded", "llama.cpp",
        "llama-server keeps its model loaded while it runs and warms up at start (unless "
        "--no-warmup): send one warm-up request after each restart before taking traffic "
        "(llama-cpp-python also loads the model at start).",
        None, _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "add_replicas", "llama.cpp",
        "Run more llama-server (or llama-cpp-python) processes, one per GPU, behind a load "
        "balancer; one server has no replica setting.",
        None, _LLAMA + " (no replica flag)",
    ),
    Advice(
        "longer_context", "llama.cpp",
        "Give each slot more context: llama-server divides -c/--ctx-size between its "
        "-np/--parallel slots (-c 8192 -np 4 is 2,048 tokens a request), so raise -c to the "
        "slots times the longest prompt plus its answer, use fewer slots, or start it with "
        "--kv-unified so a request may take the whole -c pool (llama-cpp-python: --n_ctx).",
        "--ctx-size", _LLAMA + "; " + _LCPP + "; the lab's llama-server answers a prompt "
        "over a slot's context with HTTP 400 exceed_context_size_error, n_ctx a slot's "
        "(tests/data/captured/llama-server-0c1e570-error-too-long.json)",
    ),
    Advice(
        "weights_on_gpu", "llama.cpp",
        "Start llama-server with -ngl 999 (--n-gpu-layers; `all` in recent builds) so every "
        "layer and the output layer sit in GPU memory; to make them fit, a smaller -c (the KV "
        "of every slot is allocated at start), fewer -np slots, a smaller quantization "
        "(Q4_K_M) or a q8_0 KV cache (-ctk q8_0 -ctv q8_0). llama-cpp-python: --n_gpu_layers "
        "-1 (its default, 0, keeps every layer on the CPU).",
        "--n-gpu-layers",
        "ggml-org/llama.cpp common/arg.cpp and src/llama-model.cpp of the vendored tree 0c1e570 "
        "(-ngl/--gpu-layers/--n-gpu-layers; the output layer counted as one more); " + _LLAMA
        + "; " + _LCPP + " (`n_gpu_layers`, default 0, -1 for all); llama.cpp issue 2641 "
        "(11 to 76 tok/s once every layer was on the GPU)",
    ),
    Advice(
        "disaggregate", "llama.cpp",
        "llama.cpp has no prefill/decode disaggregation: lower -b/--batch-size instead, or move "
        "to vLLM or SGLang when there are whole GPUs for each phase.",
        None, _LLAMA + " (no such flag in the server's table)",
    ),
    Advice(
        "limit_thinking", "llama.cpp",
        "Start llama-server with --reasoning-budget 0 to end the thinking at once, or N to cap "
        "it at N tokens (--reasoning off where the template allows no thinking at all); keep "
        "--reasoning-format deepseek (or auto) so the thought arrives in reasoning_content. "
        "llama-cpp-python has no such flag: pass the model's template switch "
        "(enable_thinking) in the request.",
        "--reasoning-budget",
        _LLAMA + " (--reasoning-budget N: \"-1 for unrestricted, 0 for immediate end, N>0 for "
        "token budget\"; -rea/--reasoning on|off|auto; --reasoning-format none|deepseek|"
        "deepseek-legacy); llama-cpp-python: not verified",
    ),
])
# fmt: on

_PROPS = "/props"


def recognise(answers: Answers) -> Detected | None:
    props = answers.get(_PROPS)
    if not isinstance(props, dict) or "default_generation_settings" not in props:
        return None
    return Detected(str_or_none(props.get("build_info")))


# llama-server's defaults where neither /props nor the flags say (common/common.h of the vendored
# tree, commit 0c1e570: n_batch 2048, n_ubatch 512, cache_prompt true, kv_unified false when
# the slots are given with -np).
DEFAULT_BATCH = 2048
DEFAULT_UBATCH = 512


def read_settings(answers: Answers, info: Mapping[str, str] | None,
                  flags: Sequence[str]) -> ServerSettings:
    """Slots and a slot's context from ``/props`` (``total_slots``,
    ``default_generation_settings.n_ctx``: server-context.cpp, the props handler); the batch,
    micro-batch, prompt cache and unified KV from the server's flags where they are given,
    else llama-server's defaults, said so in ``sources``."""
    props = answers.get(_PROPS)
    props = props if isinstance(props, dict) else {}
    dgs = props.get("default_generation_settings")
    dgs = dgs if isinstance(dgs, dict) else {}
    sources: list[str] = ["/props"] if props else []
    budget = int_or_none(flag_value(flags, "--batch-size", "-b"))
    ubatch = int_or_none(flag_value(flags, "--ubatch-size", "-ub"))
    if budget is None or ubatch is None:
        sources.append(f"llama-server's defaults: -b {DEFAULT_BATCH}, -ub {DEFAULT_UBATCH}")
    unified = _switch(flags, ("--kv-unified", "-kvu"), ("--no-kv-unified", "-no-kvu"))
    cache = _switch(flags, ("--cache-prompt",), ("--no-cache-prompt",))
    slots = int_or_none(props.get("total_slots"))
    slot_ctx = int_or_none(dgs.get("n_ctx"))
    # Split KV (the default with -np N): every slot owns its context, so the pool is their sum;
    # unified (the default when the slots are left to the server), one slot may fill the whole
    # pool, which is then its context. /props does not say which: without the flags, no pool.
    pool = None
    if slots is not None and slot_ctx is not None and unified is not None:
        pool = slot_ctx if unified else slots * slot_ctx
    elif slots is not None and slot_ctx is not None and flag_value(flags, "-np", "--parallel"):
        unified = False
        pool = slots * slot_ctx
    return ServerSettings(
        prefill_budget_tokens=budget if budget is not None else DEFAULT_BATCH,
        budget_label=f"--batch-size {budget}" if budget is not None
        else f"--batch-size {DEFAULT_BATCH} (the default)",
        max_sequences=slots,
        kv_pool_tokens=pool,
        prefix_caching=cache if cache is not None else True,
        context_tokens=slot_ctx,
        kv_unified=unified,
        ubatch_tokens=ubatch if ubatch is not None else DEFAULT_UBATCH,
        weights=gpu_layers(flags),
        sources=tuple(sources))


# llama.cpp counts the output layer beside the model's n_layer (src/llama-model.cpp).
OUTPUT_LAYER = 1


def gpu_layers(flags: Sequence[str]) -> WeightPlacement | None:
    """The layers llama-server was asked to keep on the GPU (``-ngl N``, ``all``); ``None``
    without the flag or with ``auto`` (the default: it fits what fits, and says so only in its
    start-up log)."""
    value = flag_value(flags, "-ngl", "--gpu-layers", "--n-gpu-layers")
    if value is None or value.strip() == "auto":
        return None
    source = f"the server's flags: -ngl {value}"
    if value.strip() == "all":
        return WeightPlacement(all_layers=True, source=source)
    n = int_or_none(value)
    if n is None:
        return None
    if n < 0:  # -1 is auto, -2 and below all (common/common.h)
        return WeightPlacement(all_layers=True, source=source) if n <= -2 else None
    return WeightPlacement(gpu_layers=n, extra_layers=OUTPUT_LAYER, source=source)


def _switch(flags: Sequence[str], on: Sequence[str], off: Sequence[str]) -> bool | None:
    """The last of a boolean flag's spellings among ``flags``: ``True`` for an ``on`` one,
    ``False`` for an ``off`` one, ``None`` when none is given (llama.cpp's parser: last wins)."""
    found: bool | None = None
    for flag in flags:
        if flag in on:
            found = True
        elif flag in off:
            found = False
    return found


def model_paths(answers: Answers, model: str) -> tuple[str, ...]:
    props = answers.get(_PROPS)
    own = props.get("model_path") if isinstance(props, dict) else None
    return models_root_paths(answers, model) + ((own,) if isinstance(own, str) and own else ())


LLAMA_CPP = ServerFamily(
    name="llama.cpp",
    display="llama.cpp",
    advice=ADVICE,
    probes=(_PROPS,),
    recognise=recognise,
    fixed_output=lambda max_tokens: {"ignore_eos": True},
    tokenizer=Tokenizer(
        tokenize_path="/tokenize",
        tokenize_body=lambda text, model: {"content": text, "add_special": True},
        detokenize_path="/detokenize",
        detokenize_body=lambda ids, model: {"tokens": list(ids)},
        text_key="content",
    ),
    metric_map=METRICS,
    settings_paths=(_PROPS,),
    read_settings=read_settings,
    model_paths=model_paths,
    scheduling="slots",  # --parallel slots (tools/server/README.md)
)

_EXTRAS_TOKENIZE = "/extras/tokenize"


def recognise_python(answers: Answers) -> Detected | None:
    answer = answers.get(_EXTRAS_TOKENIZE)
    if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
        return Detected()
    return None


def read_settings_python(answers: Answers, info: Mapping[str, str] | None,
                         flags: Sequence[str]) -> ServerSettings:
    budget = int_or_none(flag_value(flags, "--n_batch"))
    return ServerSettings(
        prefill_budget_tokens=budget,
        budget_label=f"--n_batch {budget}" if budget is not None
        else "the server's default budget",
        max_sequences=1, context_tokens=int_or_none(flag_value(flags, "--n_ctx")),
        weights=gpu_layers_python(flags),
        sources=("one request at a time (llama_cpp/server/app.py)",))


def gpu_layers_python(flags: Sequence[str]) -> WeightPlacement | None:
    """llama-cpp-python's ``--n_gpu_layers`` (default 0: every layer on the CPU; -1: all),
    when its command line is known; ``None`` when it is not."""
    if not flags:
        return None
    value = flag_value(flags, "--n_gpu_layers")
    n = int_or_none(value) if value is not None else 0
    source = (f"the server's flags: --n_gpu_layers {value}" if value is not None
              else "llama-cpp-python's default --n_gpu_layers 0")
    if n is None:
        return None
    if n < 0:
        return WeightPlacement(all_layers=True, source=source)
    return WeightPlacement(gpu_layers=n, extra_layers=OUTPUT_LAYER, source=source)


def _fixed_python(max_tokens: int) -> dict[str, Any]:
    return {"min_tokens": max_tokens}


LLAMA_CPP_PYTHON = ServerFamily(
    name="llama-cpp-python",
    display="llama-cpp-python",
    advice=ADVICE,
    advice_family="llama.cpp",
    recognise=recognise_python,
    confirm=Confirm(_EXTRAS_TOKENIZE, {"input": "hello"}),
    fixed_output=_fixed_python,
    tokenizer=Tokenizer(
        tokenize_path=_EXTRAS_TOKENIZE,
        tokenize_body=lambda text, model: {"input": text, "model": model},
        detokenize_path="/extras/detokenize",
        detokenize_body=lambda ids, model: {"tokens": list(ids)},
        text_key="text",
    ),
    serial=True,
    scheduling="slots",  # one slot: one request at a time
    no_metrics_reason="llama-cpp-python has no /metrics endpoint",
    read_settings=read_settings_python,
)
