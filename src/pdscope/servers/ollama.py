"""Ollama.

Where each fact was checked (ollama/ollama ``docs/api.md``; real example responses in
``tests/data/fixtures/servers/ollama/``):

* Detection: ``GET /api/version`` → ``{"version": ...}``; models from ``GET /api/tags``
  (``models[].name``).
* Its native API (NDJSON, ``/api/generate`` and ``/api/chat``) is the default; it has no way to
  ignore the end-of-sequence token, so a fixed output length is a cap (``num_predict``), and no
  tokenizer endpoint. Timing counters come in each final response.
* The model: ``POST /api/show`` → ``model_info`` (its geometry).
* Settings: ``GET /api/ps`` lists the loaded models (``size``, ``size_vram``, ``context_length``
  in newer releases; docs/api.md@01e52d24bc00, "List Running Models"); the number of parallel
  requests is ``OLLAMA_NUM_PARALLEL``, which no endpoint reports.
* Offload: ``size`` is the loaded model's whole footprint and ``size_vram`` the part in GPU
  memory; the rest runs from system RAM. ``ollama ps`` prints the split as "37%/63% CPU/GPU",
  CPU share = (``size`` - ``size_vram``) / ``size`` (ollama/ollama-python ``examples/ps.py``
  @b23d79d8b5e5). The footprint holds the KV cache and compute buffers beside the weights, so
  its share is taken as the weights'. Ollama places whole layers: the request option
  ``num_gpu`` is the number of layers to put on the GPU (``api/types.go``, ``Runner.NumGPU``;
  ``docs/api.md``'s options example), and raising ``OLLAMA_NUM_PARALLEL`` grows the KV cache
  until layers spill (ollama/ollama issue 11942).
* Flags and variables: ``docs/faq.mdx``, ``envconfig/config.go``, ``api/types.go``,
  ``docs/import.md`` and ``runner/ollamarunner/cache.go``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdscope.servers.advice import Advice, family_advice
from pdscope.servers.family import (
    Answers,
    Detected,
    ServerFamily,
    ServerSettings,
    WeightPlacement,
    int_or_none,
    str_or_none,
)

NO_METRICS = (
    "Ollama has no /metrics endpoint; its per-request counters (prompt_eval_count, "
    "prompt_eval_duration, eval_count, eval_duration in every final response) carry the "
    "prefill and decode timings instead: use `pdscope probe`"
)

_OLLAMA_FAQ = "ollama/ollama docs/faq.mdx@00182b504e9e"
_OLLAMA_ENV = "ollama/ollama envconfig/config.go@4bf0d41c38c7"
_OLLAMA_API = "ollama/ollama api/types.go@00a4cb26ca09 (Runner option `num_batch`, default 512)"

# fmt: off
ADVICE = family_advice("ollama", [
    Advice(
        "enable_prefix_cache", "ollama",
        "Ollama reuses a slot's cached prompt prefix on its own: keep the shared prefix (system "
        "prompt, tools) identical so its tokens match, and with several users set "
        "OLLAMA_MULTIUSER_CACHE=1 so a new request copies the best-matching prefix.",
        "OLLAMA_MULTIUSER_CACHE",
        _OLLAMA_ENV + "; ollama/ollama runner/ollamarunner/cache.go@b42970063d8f "
        "(findLongestCacheSlot / findBestCacheSlot)",
    ),
    Advice(
        "smaller_prefill_chunks", "ollama",
        "Lower num_batch (a request option or `PARAMETER num_batch` in the Modelfile; Ollama "
        "reloads the model to change it) so each step takes fewer prompt tokens; it only "
        "matters when OLLAMA_NUM_PARALLEL lets other streams run beside a prefill.",
        "num_batch", _OLLAMA_API + "; " + _OLLAMA_FAQ,
    ),
    Advice(
        "larger_prefill_chunks", "ollama",
        "Raise num_batch (a request option or `PARAMETER num_batch` in the Modelfile; Ollama "
        "reloads the model to change it) so a prompt needs fewer steps.",
        "num_batch", _OLLAMA_API,
    ),
    Advice(
        "more_concurrent_sequences", "ollama",
        "Set OLLAMA_NUM_PARALLEL above 1 on the server (e.g. 4); each parallel request takes "
        "its own context of KV memory, so the pool grows to OLLAMA_NUM_PARALLEL × the context.",
        "OLLAMA_NUM_PARALLEL", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "more_kv_memory", "ollama",
        "Raise the context Ollama allocates, OLLAMA_CONTEXT_LENGTH on the server or num_ctx in "
        "a request's options: the KV pool is that times OLLAMA_NUM_PARALLEL, and Ollama reloads "
        "the model to change it.",
        "num_ctx", _OLLAMA_FAQ,
    ),
    Advice(
        "fp8_kv_cache", "ollama",
        "Set OLLAMA_KV_CACHE_TYPE=q8_0 with OLLAMA_FLASH_ATTENTION=1 on the server (8 bits, "
        "about half of f16; Ollama has no FP8 cache type, and the setting applies to every "
        "model).",
        "OLLAMA_KV_CACHE_TYPE", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "shorter_max_context", "ollama",
        "Lower num_ctx (a request option, `PARAMETER num_ctx` in the Modelfile, or "
        "OLLAMA_CONTEXT_LENGTH for the server's default) so each request's KV cache stays small.",
        "num_ctx", _OLLAMA_FAQ,
    ),
    Advice(
        "quantize_weights", "ollama",
        "Pull a lower-bit tag of the model (tags are per model; look for a q4_K_M one on its "
        "page) or build one with `ollama create --quantize q4_K_M` from an FP16 model: fewer "
        "bytes a weight is fewer bytes read a token.",
        None, "ollama/ollama docs/import.md@eabad80c6a73 (Quantizing a Model)",
    ),
    Advice(
        "keep_model_loaded", "ollama",
        "Set OLLAMA_KEEP_ALIVE=-1 (or a long duration such as 24h) on the server, or "
        "`keep_alive` in each request, so Ollama does not unload the model 5 minutes after the "
        "last request.",
        "OLLAMA_KEEP_ALIVE", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "add_replicas", "ollama",
        "Run more `ollama serve` instances, each with its own OLLAMA_HOST port and GPU, behind "
        "a load balancer; one server has no replica setting.",
        None, _OLLAMA_FAQ + " (OLLAMA_HOST; no replica setting)",
    ),
    Advice(
        "weights_on_gpu", "ollama",
        "Make every layer fit in GPU memory, then Ollama keeps them there: a smaller quantization "
        "(a q4_K_M tag), a smaller num_ctx (or OLLAMA_CONTEXT_LENGTH), or fewer "
        "OLLAMA_NUM_PARALLEL (each parallel request holds a whole context of KV on the GPU); "
        "num_gpu (a request option or `PARAMETER num_gpu`, layers on the GPU) forces more layers "
        "there, and too many fails to load. `ollama ps` shows the split (PROCESSOR: 100% GPU).",
        "num_gpu",
        "ollama/ollama docs/api.md@01e52d24bc00 (options `num_gpu`; /api/ps `size`, "
        "`size_vram`); api/types.go@00a4cb26ca09 (Runner option `num_gpu`); " + _OLLAMA_FAQ
        + "; ollama/ollama issue 11942 (OLLAMA_NUM_PARALLEL spills layers)",
    ),
    Advice(
        "longer_context", "ollama",
        "Raise num_ctx to at least the prompt plus the answer (a request option "
        "`options.num_ctx`, `PARAMETER num_ctx` in the Modelfile, or OLLAMA_CONTEXT_LENGTH "
        "for the server's default): past it Ollama drops the start of the prompt without an "
        "error and the model never sees it; each parallel request holds a whole num_ctx of "
        "KV memory.",
        "num_ctx", _OLLAMA_FAQ + "; ollama/ollama issues 10368, 17889 and 17427 (prompts cut "
        "to num_ctx without an error; the log says `truncating input prompt`)",
    ),
    Advice(
        "disaggregate", "ollama",
        "Ollama has no prefill/decode disaggregation: lower num_batch instead, or move to vLLM "
        "or SGLang when there are whole GPUs for each phase.",
        None, _OLLAMA_FAQ + " (no such setting)",
    ),
    Advice(
        "limit_thinking", "ollama",
        "Send \"think\": false in the /api/chat or /api/generate request (or run with "
        "--think=false); gpt-oss cannot stop thinking but takes \"think\": \"low\" for a "
        "shorter thought (GET /api/show lists a model's thinking values).",
        "think",
        "ollama/ollama docs/capabilities/thinking.mdx@13422922984b (the `think` field: true, "
        "false, null, or a level from /api/show `thinking.values`; GPT-OSS low/medium/high); "
        "ollama.com/blog/thinking (CLI --think=false)",
    ),
])
# fmt: on


def recognise(answers: Answers) -> Detected | None:
    version = answers.get("/api/version")
    if not isinstance(version, dict) or "version" not in version:
        return None
    return Detected(str_or_none(version.get("version")))


def models_from(data: Any) -> tuple[str, ...]:
    """The model names of ``/api/tags``."""
    if isinstance(data, dict) and isinstance(data.get("models"), list):
        return tuple(
            str(m.get("name") or m.get("model"))
            for m in data["models"]
            if isinstance(m, dict) and (m.get("name") or m.get("model"))
        )
    return ()


def read_settings(answers: Answers, info: Mapping[str, str] | None,
                  flags: Sequence[str]) -> ServerSettings:
    ps = answers.get("/api/ps")
    loaded = ps.get("models") if isinstance(ps, dict) else None
    first = loaded[0] if isinstance(loaded, list) and loaded and isinstance(loaded[0], dict) \
        else {}
    return ServerSettings(
        context_tokens=int_or_none(first.get("context_length")),
        weights=weight_placement(first),
        sources=("/api/ps; OLLAMA_NUM_PARALLEL is not reported by any endpoint",))


def weight_placement(model: Mapping[str, Any]) -> WeightPlacement | None:
    """Where a loaded model of ``/api/ps`` is: ``size_vram`` of its ``size`` in GPU memory.
    ``None`` when either is missing (an older release, nothing loaded)."""
    size, vram = int_or_none(model.get("size")), int_or_none(model.get("size_vram"))
    if not size or vram is None:
        return None
    return WeightPlacement(size_bytes=size, gpu_bytes=vram,
                           source="Ollama /api/ps: size_vram of size")


FAMILY = ServerFamily(
    name="ollama",
    display="Ollama",
    advice=ADVICE,
    probes=("/api/version",),
    recognise=recognise,
    models_path="/api/tags",
    models_from=models_from,
    native_api=True,
    no_metrics_reason=NO_METRICS,
    settings_paths=("/api/ps",),
    read_settings=read_settings,
    model_paths=lambda answers, model: (),
    model_info_path="/api/show",
    scheduling="slots",  # OLLAMA_NUM_PARALLEL slots a loaded model (docs/faq.mdx)
)
