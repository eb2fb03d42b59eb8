"""Hugging Face Text Generation Inference (TGI).

* Detection: ``GET /info`` → ``model_id``, ``version``, ... (huggingface/text-generation-inference;
  not checked against its source here). Its model is ``model_id`` where ``/v1/models`` is empty.
* Streams: no fixed output length is asked for (a strict server rejects unknown fields).
* Metrics: ``docs/source/reference/metrics.md``.
* Flags: ``docs/source/reference/launcher.md`` (commit 575af7e67210) and ``launcher/src/main.rs``.
"""

from __future__ import annotations

from pdscope.servers.advice import Advice, family_advice
from pdscope.servers.family import Answers, Detected, ServerFamily, str_or_none
from pdscope.servers.metric_map import MetricMap

METRICS = MetricMap(
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

_TGI = "huggingface/text-generation-inference docs/source/reference/launcher.md@575af7e67210"

# fmt: off
ADVICE = family_advice("tgi", [
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
    Advice(
        "smaller_prefill_chunks", "tgi",
        "Lower TGI's --max-batch-prefill-tokens, the prefill token budget of one step, so "
        "running streams wait less behind a long prompt.",
        "--max-batch-prefill-tokens",
        _TGI + "; not verified: how TGI v3 chunks a prompt against this budget",
    ),
    Advice(
        "larger_prefill_chunks", "tgi",
        "Raise TGI's --max-batch-prefill-tokens so more prompt tokens fit in one prefill step, "
        "at the cost of longer pauses for running streams.",
        "--max-batch-prefill-tokens", _TGI,
    ),
    Advice(
        "more_concurrent_sequences", "tgi",
        "Raise TGI's --max-batch-total-tokens, the token budget of a running batch, if it was "
        "set below what memory allows, and --max-concurrent-requests (default 128) if clients "
        "are refused.",
        "--max-batch-total-tokens", _TGI,
    ),
    Advice(
        "more_kv_memory", "tgi",
        "Raise TGI's --cuda-memory-fraction if it was set below 1.0 (the default) and "
        "--max-batch-total-tokens if it was set by hand; otherwise TGI already gives the KV "
        "pool what the weights leave.",
        "--cuda-memory-fraction", _TGI,
    ),
    Advice(
        "fp8_kv_cache", "tgi",
        "Start TGI with --kv-cache-dtype fp8_e5m2 (or fp8_e4m3fn; CUDA only) to halve each KV "
        "element against 16 bits.",
        "--kv-cache-dtype", _TGI,
    ),
    Advice(
        "shorter_max_context", "tgi",
        "Lower TGI's --max-total-tokens (prompt plus generated tokens of one request) and "
        "--max-input-tokens with it.",
        "--max-total-tokens", _TGI,
    ),
    Advice(
        "quantize_weights", "tgi",
        "Start TGI with --quantize (fp8 on H100 and newer, eetq for 8 bits on any model, or "
        "awq/gptq for a pre-quantized checkpoint, which TGI detects without the flag).",
        "--quantize", _TGI,
    ),
    Advice(
        "keep_model_loaded", "tgi",
        "TGI keeps the model loaded while it runs: send one warm-up request after each restart "
        "before taking traffic.",
        None, _TGI + " (no unload setting)",
    ),
    Advice(
        "add_replicas", "tgi",
        "Run more TGI instances behind a load balancer, with sticky sessions so each user's "
        "prefix cache keeps hitting.",
        None, _TGI + " (no replica flag); docs/source/conceptual/chunking.md@8936a0379d37",
    ),
    Advice(
        "longer_context", "tgi",
        "Raise TGI's --max-input-tokens (the longest prompt) and --max-total-tokens (prompt "
        "plus generated tokens) with it.",
        "--max-input-tokens", _TGI,
    ),
    Advice(
        "weights_on_gpu", "tgi",
        "TGI keeps the whole model in GPU memory (its launcher has no CPU weight offload): if "
        "the model does not fit, start it with --quantize (eetq, fp8, or a pre-quantized "
        "checkpoint) or shard it over more GPUs with --num-shard.",
        None, _TGI + " (no weight-offload option among the launcher's arguments)",
    ),
    Advice(
        "disaggregate", "tgi",
        "TGI's launcher has no prefill/decode disaggregation: lower --max-batch-prefill-tokens "
        "instead, or move to vLLM or SGLang when there are whole GPUs for each phase.",
        None, _TGI + " (no such flag)",
    ),
    Advice(
        "limit_thinking", "tgi",
        "TGI has no setting for a model's thinking: serve the model's non-thinking variant, "
        "or use the model's own switch in the prompt where its template has one.",
        None, _TGI + " (no reasoning option among the launcher's flags)",
    ),
])
# fmt: on


def recognise(answers: Answers) -> Detected | None:
    info = answers.get("/info")
    if not isinstance(info, dict) or "model_id" not in info:
        return None
    return Detected(str_or_none(info.get("version")), (str(info["model_id"]),))


FAMILY = ServerFamily(
    name="tgi",
    display="TGI",
    advice=ADVICE,
    probes=("/info",),
    recognise=recognise,
    metric_map=METRICS,
)
