"""What to change, said in the words of the user's server.

The doctor's rules decide *what* to change (an action such as ``smaller_prefill_chunks``); this
module says *how* on the server that was measured: the flag, environment variable or request
option, by its exact name, with the place where that name was checked. It is the only place in
pdscope where a server's tuning flag is written down, as :mod:`pdscope.metrics.families` is for
metric names.

A server that has no knob for an action gets an honest sentence instead of an invented flag
(``setting`` is ``None``), and a server pdscope could not identify (family ``openai``) gets the
names the known servers use, so the user knows what to look for in its documentation.

Where the names were checked (``source`` of each row says which):

* vLLM: the argument parser of the installed vLLM 0.32.0 (``vllm/engine/arg_utils.py``,
  ``AsyncEngineArgs.add_cli_args``: option strings read from the parser), ``vllm/config/cache.py``
  (prefix caching on by default) and ``vllm/platforms/cpu.py`` (``VLLM_CPU_KVCACHE_SPACE``).
* SGLang: ``sgl-project/sglang`` ``docs/advanced_features/server_arguments.md``.
* llama.cpp: ``ggml-org/llama.cpp`` ``tools/server/README.md`` (its flag table is generated
  from ``common/arg.cpp``).
* llama-cpp-python: the installed 0.3.36, ``llama_cpp/server/settings.py`` and the output of
  ``python -m llama_cpp.server --help``; ``llama_cpp/server/app.py`` (one request at a time).
* Ollama: ``ollama/ollama`` ``docs/faq.mdx``, ``envconfig/config.go``, ``api/types.go``,
  ``docs/import.md`` and ``runner/ollamarunner/cache.go``.
* TGI: ``huggingface/text-generation-inference`` ``docs/source/reference/launcher.md`` and
  ``launcher/src/main.rs``.

docs/advice.md has the whole table with the full commits.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS: tuple[str, ...] = (
    "enable_prefix_cache",
    "smaller_prefill_chunks",
    "larger_prefill_chunks",
    "more_concurrent_sequences",
    "more_kv_memory",
    "fp8_kv_cache",
    "shorter_max_context",
    "quantize_weights",
    "keep_model_loaded",
    "add_replicas",
    "shorten_prompt",
    "more_bandwidth",
    "faster_compute",
    "disaggregate",
)

FAMILIES: tuple[str, ...] = ("vllm", "sglang", "llama.cpp", "ollama", "tgi", "openai")

# The families pdscope knows the flags of, with the name a person calls them by.
_KNOWN: dict[str, str] = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llama.cpp": "llama.cpp",
    "ollama": "Ollama",
    "tgi": "TGI",
}


@dataclass(frozen=True)
class Advice:
    """How to carry out one action on one server family.

    ``how`` is one imperative sentence a person can follow. ``setting`` is the bare name of the
    one flag, environment variable or request option that matters (``--max-num-batched-tokens``,
    ``OLLAMA_KV_CACHE_TYPE``, ``num_batch``), without a value; the value, where there is a
    sensible one, is in ``how``. It is ``None`` when the family has no such knob (hardware, a
    model file, a feature the server lacks). ``source`` is where the name was checked, or says
    what was not.
    """

    action: str
    family: str
    how: str
    setting: str | None
    source: str


def family_of(server_kind: str) -> str:
    """The advice family of a detected server kind (:data:`pdscope.client.detect.ServerKind`).

    llama-cpp-python (``python -m llama_cpp.server``) shares the llama.cpp family: same engine,
    same knobs, but other flag names (``--n_ctx``, ``--n_batch``, ``--n_ubatch``,
    ``--n_threads``) and one request at a time. The llama.cpp sentences name its flags in a
    parenthesis where they differ. Anything unknown (a proxy, a hosted API, pdscope's reference
    server) is ``openai``.
    """
    kind = server_kind.strip().lower()
    if kind in ("llama.cpp", "llama-cpp-python"):
        return "llama.cpp"
    return kind if kind in _KNOWN else "openai"


def advice_for(action: str, family: str) -> Advice:
    """How to carry out ``action`` (one of :data:`ACTIONS`) on ``family`` (one of
    :data:`FAMILIES`, see :func:`family_of`). Every pair has an answer; an unknown action or
    family is a programming error (``ValueError``)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown server family {family!r}; known: {', '.join(FAMILIES)}")
    return _TABLE[(action, family)]


# ----------------------------------------------------------------------------- sources

_VLLM = (
    "vllm-project/vllm vllm/engine/arg_utils.py, vLLM 0.32.0 as installed "
    "(option strings read from AsyncEngineArgs.add_cli_args)"
)
_VLLM_PREFIX = _VLLM + "; vllm/config/cache.py (enable_prefix_caching defaults to True)"
_VLLM_KV = _VLLM + "; vllm/platforms/cpu.py (VLLM_CPU_KVCACHE_SPACE, GiB, a legacy setting)"
_SGLANG = "sgl-project/sglang docs/advanced_features/server_arguments.md@004813e1dd46"
_LLAMA = "ggml-org/llama.cpp tools/server/README.md@00dc8057ab28"
_LCPP = (
    "abetlen/llama-cpp-python llama_cpp/server/settings.py, 0.3.36 as installed "
    "(`python -m llama_cpp.server --help`)"
)
_LCPP_ONE = _LCPP + "; llama_cpp/server/app.py (a lock serves one request at a time)"
_OLLAMA_FAQ = "ollama/ollama docs/faq.mdx@00182b504e9e"
_OLLAMA_ENV = "ollama/ollama envconfig/config.go@4bf0d41c38c7"
_OLLAMA_API = "ollama/ollama api/types.go@00a4cb26ca09 (Runner option `num_batch`, default 512)"
_TGI = "huggingface/text-generation-inference docs/source/reference/launcher.md@575af7e67210"
_ARTICLE = (
    "pdscope's article 'Prefill frente a decode: por qué el token uno tarda', section "
    "'Qué cambiar cuando el valor no es bueno' (no server setting involved)"
)

# --------------------------------------------------------------------------- the table

# One row a (action, family): the action, the family, the sentence, the setting, the source.
# fmt: off
_ROWS: list[Advice] = [
    # -- enable_prefix_cache
    Advice(
        "enable_prefix_cache", "vllm",
        "Start vLLM with --enable-prefix-caching (on by default in the V1 engine, e.g. 0.32; "
        "check `vllm serve --help` and that nobody passed --no-enable-prefix-caching), and keep "
        "the shared prefix byte-identical at the start of every prompt.",
        "--enable-prefix-caching", _VLLM_PREFIX,
    ),
    Advice(
        "enable_prefix_cache", "sglang",
        "Keep SGLang's RadixAttention prefix cache on: it is on by default, so drop "
        "--disable-radix-cache if the server was started with it, and keep the shared prefix "
        "identical at the start of every prompt.",
        "--disable-radix-cache", _SGLANG,
    ),
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
        "enable_prefix_cache", "ollama",
        "Ollama reuses a slot's cached prompt prefix on its own: keep the shared prefix (system "
        "prompt, tools) identical so its tokens match, and with several users set "
        "OLLAMA_MULTIUSER_CACHE=1 so a new request copies the best-matching prefix.",
        "OLLAMA_MULTIUSER_CACHE",
        _OLLAMA_ENV + "; ollama/ollama runner/ollamarunner/cache.go@b42970063d8f "
        "(findLongestCacheSlot / findBestCacheSlot)",
    ),
    Advice(
        "enable_prefix_cache", "tgi",
        "Leave TGI v3's prefix cache on: do not set PREFIX_CACHING=0 (the launcher turns it off "
        "by itself for vision and seq2seq models, LoRA adapters and paged attention), and use "
        "sticky sessions when several replicas share one endpoint.",
        "PREFIX_CACHING",
        "huggingface/text-generation-inference launcher/src/main.rs@009c4e0b945b "
        "(resolve_attention: env PREFIX_CACHING, default true); "
        "docs/source/conceptual/chunking.md@8936a0379d37 (sticky sessions)",
    ),
    # -- smaller_prefill_chunks
    Advice(
        "smaller_prefill_chunks", "vllm",
        "Lower vLLM's --max-num-batched-tokens (e.g. to 2048; chunked prefill, "
        "--enable-chunked-prefill, is on by default in V1) so a long prompt interrupts running "
        "streams for less time each step, at some cost in TTFT.",
        "--max-num-batched-tokens", _VLLM,
    ),
    Advice(
        "smaller_prefill_chunks", "sglang",
        "Lower SGLang's --chunked-prefill-size (e.g. to 2048; -1 turns chunking off) so a long "
        "prompt is prefilled in smaller pieces, and try --enable-mixed-chunk so decode steps "
        "share a batch with each piece.",
        "--chunked-prefill-size", _SGLANG,
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
        "smaller_prefill_chunks", "ollama",
        "Lower num_batch (a request option or `PARAMETER num_batch` in the Modelfile; Ollama "
        "reloads the model to change it) so each step takes fewer prompt tokens; it only "
        "matters when OLLAMA_NUM_PARALLEL lets other streams run beside a prefill.",
        "num_batch", _OLLAMA_API + "; " + _OLLAMA_FAQ,
    ),
    Advice(
        "smaller_prefill_chunks", "tgi",
        "Lower TGI's --max-batch-prefill-tokens, the prefill token budget of one step, so "
        "running streams wait less behind a long prompt.",
        "--max-batch-prefill-tokens",
        _TGI + "; not verified: how TGI v3 chunks a prompt against this budget",
    ),
    # -- larger_prefill_chunks
    Advice(
        "larger_prefill_chunks", "vllm",
        "Raise vLLM's --max-num-batched-tokens (e.g. to 8192 or more) so more prompt tokens fit "
        "in one step and TTFT drops, at the cost of longer pauses for running streams (ITL).",
        "--max-num-batched-tokens", _VLLM,
    ),
    Advice(
        "larger_prefill_chunks", "sglang",
        "Raise SGLang's --chunked-prefill-size (and --max-prefill-tokens if it caps the batch) "
        "so a long prompt needs fewer steps, at the cost of longer pauses for running streams.",
        "--chunked-prefill-size", _SGLANG,
    ),
    Advice(
        "larger_prefill_chunks", "llama.cpp",
        "Raise llama-server's -b/--batch-size and -ub/--ubatch-size (ubatch no larger than "
        "batch) so a prompt needs fewer steps (llama-cpp-python: --n_batch and --n_ubatch).",
        "--batch-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "larger_prefill_chunks", "ollama",
        "Raise num_batch (a request option or `PARAMETER num_batch` in the Modelfile; Ollama "
        "reloads the model to change it) so a prompt needs fewer steps.",
        "num_batch", _OLLAMA_API,
    ),
    Advice(
        "larger_prefill_chunks", "tgi",
        "Raise TGI's --max-batch-prefill-tokens so more prompt tokens fit in one prefill step, "
        "at the cost of longer pauses for running streams.",
        "--max-batch-prefill-tokens", _TGI,
    ),
    # -- more_concurrent_sequences
    Advice(
        "more_concurrent_sequences", "vllm",
        "Raise vLLM's --max-num-seqs so more requests decode in one batch; it only helps while "
        "the KV pool has room (vllm:kv_cache_usage_perc well below 1).",
        "--max-num-seqs", _VLLM,
    ),
    Advice(
        "more_concurrent_sequences", "sglang",
        "Raise SGLang's --max-running-requests so more requests decode in one batch; it only "
        "helps while the KV pool (sglang:token_usage) has room.",
        "--max-running-requests", _SGLANG,
    ),
    Advice(
        "more_concurrent_sequences", "llama.cpp",
        "Start llama-server with more slots, -np/--parallel N, and a -c/--ctx-size large enough "
        "for N contexts (llama-cpp-python serves one request at a time: run more processes "
        "instead).",
        "--parallel", _LLAMA + "; " + _LCPP_ONE,
    ),
    Advice(
        "more_concurrent_sequences", "ollama",
        "Set OLLAMA_NUM_PARALLEL above 1 on the server (e.g. 4); each parallel request takes "
        "its own context of KV memory, so the pool grows to OLLAMA_NUM_PARALLEL × the context.",
        "OLLAMA_NUM_PARALLEL", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "more_concurrent_sequences", "tgi",
        "Raise TGI's --max-batch-total-tokens, the token budget of a running batch, if it was "
        "set below what memory allows, and --max-concurrent-requests (default 128) if clients "
        "are refused.",
        "--max-batch-total-tokens", _TGI,
    ),
    # -- more_kv_memory
    Advice(
        "more_kv_memory", "vllm",
        "Raise vLLM's --gpu-memory-utilization, or size the KV pool directly with "
        "--kv-cache-memory-bytes (the way on the CPU backend too, where VLLM_CPU_KVCACHE_SPACE, "
        "in GiB, is the older setting), so the pool holds more tokens.",
        "--gpu-memory-utilization", _VLLM_KV,
    ),
    Advice(
        "more_kv_memory", "sglang",
        "Raise SGLang's --mem-fraction-static (weights plus KV pool, as a fraction of GPU "
        "memory) while memory is left over; lower it again on out-of-memory errors.",
        "--mem-fraction-static", _SGLANG,
    ),
    Advice(
        "more_kv_memory", "llama.cpp",
        "Start llama-server with a larger -c/--ctx-size: it is the whole KV pool, shared by the "
        "-np slots (llama-cpp-python: --n_ctx).",
        "--ctx-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "more_kv_memory", "ollama",
        "Raise the context Ollama allocates, OLLAMA_CONTEXT_LENGTH on the server or num_ctx in "
        "a request's options: the KV pool is that times OLLAMA_NUM_PARALLEL, and Ollama reloads "
        "the model to change it.",
        "num_ctx", _OLLAMA_FAQ,
    ),
    Advice(
        "more_kv_memory", "tgi",
        "Raise TGI's --cuda-memory-fraction if it was set below 1.0 (the default) and "
        "--max-batch-total-tokens if it was set by hand; otherwise TGI already gives the KV "
        "pool what the weights leave.",
        "--cuda-memory-fraction", _TGI,
    ),
    # -- fp8_kv_cache
    Advice(
        "fp8_kv_cache", "vllm",
        "Start vLLM with --kv-cache-dtype fp8 to halve each KV element against 16 bits (the GPU "
        "and attention backend must support it; check the model's accuracy after).",
        "--kv-cache-dtype", _VLLM,
    ),
    Advice(
        "fp8_kv_cache", "sglang",
        "Start SGLang with --kv-cache-dtype fp8_e5m2 (or fp8_e4m3) to halve each KV element "
        "against 16 bits.",
        "--kv-cache-dtype", _SGLANG,
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
        "fp8_kv_cache", "ollama",
        "Set OLLAMA_KV_CACHE_TYPE=q8_0 with OLLAMA_FLASH_ATTENTION=1 on the server (8 bits, "
        "about half of f16; Ollama has no FP8 cache type, and the setting applies to every "
        "model).",
        "OLLAMA_KV_CACHE_TYPE", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "fp8_kv_cache", "tgi",
        "Start TGI with --kv-cache-dtype fp8_e5m2 (or fp8_e4m3fn; CUDA only) to halve each KV "
        "element against 16 bits.",
        "--kv-cache-dtype", _TGI,
    ),
    # -- shorter_max_context
    Advice(
        "shorter_max_context", "vllm",
        "Cap the context with vLLM's --max-model-len so no single request can claim most of "
        "the KV pool.",
        "--max-model-len", _VLLM,
    ),
    Advice(
        "shorter_max_context", "sglang",
        "Cap the context with SGLang's --context-length so no single request can claim most of "
        "the KV pool.",
        "--context-length", _SGLANG,
    ),
    Advice(
        "shorter_max_context", "llama.cpp",
        "Lower llama-server's -c/--ctx-size, the KV pool its -np slots share, so each slot's "
        "context stays short (llama-cpp-python: --n_ctx).",
        "--ctx-size", _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "shorter_max_context", "ollama",
        "Lower num_ctx (a request option, `PARAMETER num_ctx` in the Modelfile, or "
        "OLLAMA_CONTEXT_LENGTH for the server's default) so each request's KV cache stays small.",
        "num_ctx", _OLLAMA_FAQ,
    ),
    Advice(
        "shorter_max_context", "tgi",
        "Lower TGI's --max-total-tokens (prompt plus generated tokens of one request) and "
        "--max-input-tokens with it.",
        "--max-total-tokens", _TGI,
    ),
    # -- quantize_weights
    Advice(
        "quantize_weights", "vllm",
        "Serve a pre-quantized checkpoint (AWQ, GPTQ or FP8; vLLM reads the method from its "
        "config) or start vLLM with --quantization fp8 on a GPU that supports it: fewer bytes "
        "a weight is fewer bytes read a token.",
        "--quantization", _VLLM + " and vllm/model_executor/layers/quantization/__init__.py "
        "(`fp8`)",
    ),
    Advice(
        "quantize_weights", "sglang",
        "Start SGLang with --quantization fp8 on a 16-bit checkpoint, or load a pre-quantized "
        "(FP8, AWQ, GPTQ) checkpoint without the flag: fewer bytes a weight is fewer bytes read "
        "a token.",
        "--quantization", _SGLANG,
    ),
    Advice(
        "quantize_weights", "llama.cpp",
        "Load a lower-bit GGUF of the same model (e.g. Q4_K_M instead of Q8_0 or F16, with "
        "`-hf <repo>:Q4_K_M` or a file made by llama-quantize; the same file works for "
        "llama-cpp-python's --model): fewer bytes a weight is fewer bytes read a token.",
        None, _LLAMA + " (`-hf <user>/<model>[:quant]`); llama-quantize not verified here",
    ),
    Advice(
        "quantize_weights", "ollama",
        "Pull a lower-bit tag of the model (tags are per model; look for a q4_K_M one on its "
        "page) or build one with `ollama create --quantize q4_K_M` from an FP16 model: fewer "
        "bytes a weight is fewer bytes read a token.",
        None, "ollama/ollama docs/import.md@eabad80c6a73 (Quantizing a Model)",
    ),
    Advice(
        "quantize_weights", "tgi",
        "Start TGI with --quantize (fp8 on H100 and newer, eetq for 8 bits on any model, or "
        "awq/gptq for a pre-quantized checkpoint, which TGI detects without the flag).",
        "--quantize", _TGI,
    ),
    # -- keep_model_loaded
    Advice(
        "keep_model_loaded", "vllm",
        "vLLM keeps the model loaded while the process runs, so the cold start is the first "
        "request after each start (graph capture, compilation): send one warm-up request "
        "before taking traffic.",
        None, _VLLM + " (no unload setting)",
    ),
    Advice(
        "keep_model_loaded", "sglang",
        "SGLang keeps the model loaded while the process runs and warms up before serving "
        "(unless --skip-server-warmup): send one warm-up request after each restart before "
        "taking traffic.",
        None, _SGLANG,
    ),
    Advice(
        "keep_model_loaded", "llama.cpp",
        "llama-server keeps its model loaded while it runs and warms up at start (unless "
        "--no-warmup): send one warm-up request after each restart before taking traffic "
        "(llama-cpp-python also loads the model at start).",
        None, _LLAMA + "; " + _LCPP,
    ),
    Advice(
        "keep_model_loaded", "ollama",
        "Set OLLAMA_KEEP_ALIVE=-1 (or a long duration such as 24h) on the server, or "
        "`keep_alive` in each request, so Ollama does not unload the model 5 minutes after the "
        "last request.",
        "OLLAMA_KEEP_ALIVE", _OLLAMA_FAQ + "; " + _OLLAMA_ENV,
    ),
    Advice(
        "keep_model_loaded", "tgi",
        "TGI keeps the model loaded while it runs: send one warm-up request after each restart "
        "before taking traffic.",
        None, _TGI + " (no unload setting)",
    ),
    # -- add_replicas
    Advice(
        "add_replicas", "vllm",
        "Start vLLM with --data-parallel-size N (-dp) to run N engine copies on N GPUs behind "
        "one endpoint, or run more servers behind a load balancer.",
        "--data-parallel-size", _VLLM,
    ),
    Advice(
        "add_replicas", "sglang",
        "Start SGLang with --dp-size N (alias of --data-parallel-size), or run more servers "
        "behind the SGLang router or a load balancer.",
        "--dp-size", _SGLANG,
    ),
    Advice(
        "add_replicas", "llama.cpp",
        "Run more llama-server (or llama-cpp-python) processes, one per GPU, behind a load "
        "balancer; one server has no replica setting.",
        None, _LLAMA + " (no replica flag)",
    ),
    Advice(
        "add_replicas", "ollama",
        "Run more `ollama serve` instances, each with its own OLLAMA_HOST port and GPU, behind "
        "a load balancer; one server has no replica setting.",
        None, _OLLAMA_FAQ + " (OLLAMA_HOST; no replica setting)",
    ),
    Advice(
        "add_replicas", "tgi",
        "Run more TGI instances behind a load balancer, with sticky sessions so each user's "
        "prefix cache keeps hitting.",
        None, _TGI + " (no replica flag); docs/source/conceptual/chunking.md@8936a0379d37",
    ),
    # -- disaggregate
    Advice(
        "disaggregate", "vllm",
        "Only with whole GPUs to spare for each phase, run separate prefill and decode vLLM "
        "instances joined by --kv-transfer-config with a KV connector (experimental); on one "
        "GPU, lower --max-num-batched-tokens instead.",
        "--kv-transfer-config", _VLLM,
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
        "disaggregate", "llama.cpp",
        "llama.cpp has no prefill/decode disaggregation: lower -b/--batch-size instead, or move "
        "to vLLM or SGLang when there are whole GPUs for each phase.",
        None, _LLAMA + " (no such flag in the server's table)",
    ),
    Advice(
        "disaggregate", "ollama",
        "Ollama has no prefill/decode disaggregation: lower num_batch instead, or move to vLLM "
        "or SGLang when there are whole GPUs for each phase.",
        None, _OLLAMA_FAQ + " (no such setting)",
    ),
    Advice(
        "disaggregate", "tgi",
        "TGI's launcher has no prefill/decode disaggregation: lower --max-batch-prefill-tokens "
        "instead, or move to vLLM or SGLang when there are whole GPUs for each phase.",
        None, _TGI + " (no such flag)",
    ),
]
# fmt: on

# Actions that are the same sentence on every server: no setting, the article says why.
_NEUTRAL: dict[str, str] = {
    "shorten_prompt": (
        "Shorten the prompt: prefill cost grows with its tokens, and the system prompt is "
        "prefilled on every request unless a prefix cache holds it."
    ),
    "more_bandwidth": (
        "Move decode to a device with more memory bandwidth (published GB/s), or read fewer "
        "bytes a token with quantized weights: no server setting raises the decode ceiling."
    ),
    "faster_compute": (
        "Move prefill to a device with more compute (dense FP16/BF16 TFLOPS): prefill is "
        "bound by compute, so a faster card shortens TTFT on long prompts, and no server "
        "setting adds compute."
    ),
}

# What the knob of an action is, for a server pdscope could not identify.
_WHAT: dict[str, str] = {
    "enable_prefix_cache": "prefix caching and its on/off switch",
    "smaller_prefill_chunks": "a lower prefill token budget a step (chunked prefill)",
    "larger_prefill_chunks": "a higher prefill token budget a step (chunked prefill)",
    "more_concurrent_sequences": "a higher limit on the requests running at once",
    "more_kv_memory": "more memory for the KV cache",
    "fp8_kv_cache": "an 8-bit KV cache type",
    "shorter_max_context": "a lower maximum context length",
    "quantize_weights": "a quantized model (fewer bytes a weight)",
    "add_replicas": "data parallelism (several engine copies behind one endpoint)",
    "disaggregate": "prefill/decode disaggregation (separate prefill and decode workers)",
}

_OPENAI_SOURCE = "family-neutral: the names of the known families, each checked where its row says"


def _openai(action: str, table: dict[tuple[str, str], Advice]) -> Advice:
    if action == "keep_model_loaded":
        how = (
            "If the server unloads idle models, find its keep-alive setting (Ollama calls it "
            "OLLAMA_KEEP_ALIVE); otherwise send one warm-up request after each start before "
            "taking traffic."
        )
        return Advice(action, "openai", how, None, _OPENAI_SOURCE)
    names = [
        f"{display} `{table[(action, fam)].setting}`"
        for fam, display in _KNOWN.items()
        if table[(action, fam)].setting is not None
    ]
    how = (
        f"pdscope could not tell which server this is, so look in its documentation for "
        f"{_WHAT[action]} ({'; '.join(names)}); a hosted API does not let you change it."
    )
    return Advice(action, "openai", how, None, _OPENAI_SOURCE)


def _build() -> dict[tuple[str, str], Advice]:
    table = {(a.action, a.family): a for a in _ROWS}
    for action, how in _NEUTRAL.items():
        for family in FAMILIES:
            table[(action, family)] = Advice(action, family, how, None, _ARTICLE)
    for action in ACTIONS:
        if action not in _NEUTRAL:
            table[(action, "openai")] = _openai(action, table)
    return table


_TABLE: dict[tuple[str, str], Advice] = _build()
