"""The article's arithmetic, made general: what the hardware allows, worked out on paper.

Pure functions over a :class:`~pdscope.model.ModelGeometry` and a
:class:`~pdscope.hardware.DeviceSpec`; no I/O. Units are SI: bytes, seconds, FLOP/s, and the
article's 1 GB = 10**9 bytes.

- Decode reads every weight once a step (and the KV cache of the sequence), so a single stream
  can go no faster than ``bandwidth / bytes read a step``.
- Prefill does about ``2 x parameters`` FLOPs a prompt token (one multiply and one add a weight)
  plus attention, which grows with the square of the prompt, so it can go no faster than
  ``peak FLOP/s / FLOPs a token``.
- A batch of B sequences shares one read of the weights: the step stays bandwidth-bound until
  B tokens' FLOPs take longer than the read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdscope.errors import InputError
from pdscope.hardware import DeviceSpec
from pdscope.model.geometry import FULL, SLIDING, ModelGeometry, dtype_bytes

GB = 1e9

# vLLM's --gpu-memory-utilization default. Source: vLLM engine arguments documentation
# ("gpu_memory_utilization ... default 0.9"; raised to 0.92 in later releases).
DEFAULT_MEM_UTIL = 0.92
# Memory kept back for activations, CUDA graphs and the framework, when sizing the KV pool.
# vLLM measures this by profiling at start-up; 1 GB is a small-model lower bound, so the pool
# figure is an upper bound. Change it with --reserve-gb.
DEFAULT_RESERVE_GB = 1.0


def article_round(x: float) -> int:
    """Round half up, as the article's table does (600 / 16 = 37.5 is shown as 38)."""
    return math.floor(x + 0.5)


# --------------------------------------------------------------------------------------- KV


def kv_layer_shapes(model: ModelGeometry) -> list[tuple[str, int]]:
    """(layer kind, values cached a token) for every layer.

    Standard attention caches a key and a value: ``2 x kv_heads x head_dim``. MLA caches one
    latent of ``kv_lora_rank + qk_rope_head_dim``.
    """
    if not model.has_attention_shape:
        raise InputError(
            f"the KV cache of {model.name} cannot be worked out: the model's layers, KV heads"
            " and head size are unknown (give --model with a config.json or GGUF file)"
        )
    shapes: list[tuple[str, int]] = []
    for kind in model.layer_kinds():
        if model.is_mla:
            assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
            shapes.append((kind, model.kv_lora_rank + model.qk_rope_head_dim))
            continue
        kv_heads, head_dim = model.num_kv_heads, model.head_dim
        if kind == FULL and model.layer_types is not None:
            kv_heads = model.global_kv_heads or kv_heads
            head_dim = model.global_head_dim or head_dim
        assert kv_heads is not None and head_dim is not None
        shapes.append((kind, 2 * kv_heads * head_dim))
    return shapes


def kv_bytes_per_token(model: ModelGeometry, kv_dtype: str = "fp16") -> float:
    """Bytes of KV cache one token adds, in every layer (before any sliding window applies).

    The article's 8B example: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes.
    """
    per_elem = dtype_bytes(kv_dtype)
    return float(sum(values for _, values in kv_layer_shapes(model)) * per_elem)


def kv_bytes_per_request(model: ModelGeometry, context: int, kv_dtype: str = "fp16") -> float:
    """Bytes of KV cache one sequence holds at ``context`` tokens: sliding-window layers keep at
    most the window. This is also what one decode step reads for that sequence."""
    if context < 0:
        raise InputError(f"the context must not be negative, got {context}")
    per_elem = dtype_bytes(kv_dtype)
    total = 0
    for kind, values in kv_layer_shapes(model):
        held = context
        if kind == SLIDING and model.sliding_window:
            held = min(context, model.sliding_window)
        total += values * held
    return float(total * per_elem)


# ----------------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class DecodeCeiling:
    """The fastest a single stream can decode on a device: bandwidth / bytes read a step."""

    device: str
    mem_bandwidth_gb_s: float
    weight_bytes_read: float
    kv_bytes_read: float
    context: int
    tok_s: float

    @property
    def bytes_per_step(self) -> float:
        return self.weight_bytes_read + self.kv_bytes_read

    @property
    def kv_share(self) -> float:
        """Fraction of each step's bytes that is KV cache (grows with the context)."""
        return self.kv_bytes_read / self.bytes_per_step


def decode_ceiling(
    model: ModelGeometry, device: DeviceSpec, context: int = 0, kv_dtype: str = "fp16"
) -> DecodeCeiling:
    """Single-stream decode ceiling at a given context. With ``context=0`` it is the article's
    table: bandwidth divided by the bytes of the weights."""
    weights = model.read_weight_bytes()
    kv = kv_bytes_per_request(model, context, kv_dtype) if context else 0.0
    return DecodeCeiling(
        device=device.name,
        mem_bandwidth_gb_s=device.mem_bandwidth_gb_s,
        weight_bytes_read=weights,
        kv_bytes_read=kv,
        context=context,
        tok_s=device.mem_bandwidth_gb_s * GB / (weights + kv),
    )


def peak_flops(model: ModelGeometry, device: DeviceSpec) -> float | None:
    """Dense FLOP/s the device offers for this model's arithmetic: fp8 tensor cores for fp8
    weights where the device has them, bf16/fp16 otherwise (4-bit weights are widened to
    16 bits to multiply). ``None`` when the device table has no figure."""
    if model.bytes_per_weight <= 1.0 + 1e-9 and model.bytes_per_weight > 0.6 and device.fp8_tflops:
        return device.fp8_tflops * 1e12
    if device.bf16_tflops:
        return device.bf16_tflops * 1e12
    return None


def decode_flops_per_token(model: ModelGeometry, context: int) -> float:
    """FLOPs to decode one token at ``context``: 2 a weight read (``parameters_read_per_token``:
    the input embedding is a lookup, not a product), plus attention over the context (QK and
    AV, 2 FLOPs a multiply-add, for every query head)."""
    flops = 2.0 * model.parameters_read_per_token
    if model.num_attention_heads and model.head_dim and context:
        for kind in model.layer_kinds():
            held = context
            if kind == SLIDING and model.sliding_window:
                held = min(context, model.sliding_window)
            flops += 4.0 * model.num_attention_heads * model.head_dim * held
    return flops


@dataclass(frozen=True)
class BatchedDecode:
    """B sequences decoding together: one read of the weights serves them all."""

    batch: int
    context: int
    step_s: float
    memory_s: float
    compute_s: float | None
    tok_s: float
    per_sequence_tok_s: float
    bound: str  # "memory" or "compute"


def _weight_bytes_for_batch(model: ModelGeometry, batch: int) -> float:
    """Weights one step reads for ``batch`` sequences. A dense model reads them once; a mixture
    of experts reads the experts any sequence is routed to, on average
    ``E x (1 - (1 - k/E)^B)`` of E (routing taken as uniform)."""
    single = model.read_weight_bytes()
    if not model.is_moe:
        return single
    assert model.num_experts and model.experts_per_token
    share = model.experts_per_token / model.num_experts
    touched = 1.0 - (1.0 - share) ** batch
    return single + model.all_expert_bytes() * (touched - share)


def batched_decode(
    model: ModelGeometry,
    device: DeviceSpec,
    batch: int,
    context: int = 0,
    kv_dtype: str = "fp16",
) -> BatchedDecode:
    """Throughput of ``batch`` sequences at ``context`` tokens each. The step takes the longer
    of reading (weights once + every sequence's KV) and computing (every sequence's FLOPs)."""
    if batch < 1:
        raise InputError(f"the batch must be at least 1, got {batch}")
    kv = kv_bytes_per_request(model, context, kv_dtype) if context else 0.0
    read = _weight_bytes_for_batch(model, batch) + batch * kv
    memory_s = read / (device.mem_bandwidth_gb_s * GB)
    peak = peak_flops(model, device)
    compute_s = batch * decode_flops_per_token(model, context) / peak if peak else None
    step = max(memory_s, compute_s or 0.0)
    return BatchedDecode(
        batch=batch,
        context=context,
        step_s=step,
        memory_s=memory_s,
        compute_s=compute_s,
        tok_s=batch / step,
        per_sequence_tok_s=1.0 / step,
        bound="compute" if compute_s is not None and compute_s > memory_s else "memory",
    )


def compute_bound_batch(
    model: ModelGeometry, device: DeviceSpec, context: int = 0, kv_dtype: str = "fp16"
) -> int | None:
    """The smallest batch at which a decode step becomes compute-bound; ``None`` when the
    device has no FLOPS figure or the step never turns (KV reads grow as fast as FLOPs)."""
    if peak_flops(model, device) is None:
        return None
    lo, hi = 1, 1
    while batched_decode(model, device, hi, context, kv_dtype).bound == "memory":
        hi *= 2
        if hi > 1 << 20:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if batched_decode(model, device, mid, context, kv_dtype).bound == "memory":
            lo = mid + 1
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------- prefill


def _attention_pairs(n: int, window: int | None) -> float:
    """Query-key pairs in causal attention over n tokens (query i sees i+1 keys, at most the
    window)."""
    if window is None or n <= window:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def prefill_flops(model: ModelGeometry, prompt_tokens: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a prefill of ``prompt_tokens``.

    Linear: 2 x the parameters read a token (``parameters_read_per_token``). Attention: for
    each layer and query head, QK and AV each cost 2 x head_dim FLOPs a query-key pair; causal
    attention has n(n+1)/2 pairs. This is the quadratic part that starts to matter at long
    contexts.
    """
    linear = 2.0 * model.parameters_read_per_token * prompt_tokens
    attention = 0.0
    if model.num_attention_heads and model.head_dim:
        for kind in model.layer_kinds():
            window = model.sliding_window if kind == SLIDING else None
            pairs = _attention_pairs(prompt_tokens, window)
            attention += 4.0 * model.num_attention_heads * model.head_dim * pairs
    return linear, attention


@dataclass(frozen=True)
class PrefillCeiling:
    """The fastest a prompt of ``prompt_tokens`` can be read on a device."""

    device: str
    prompt_tokens: int
    peak_tflops: float | None
    linear_s: float | None
    attention_s: float | None
    weight_read_s: float
    ttft_s: float | None
    tok_s: float | None
    bound: str | None  # "compute" or "memory"


def prefill_ceiling(
    model: ModelGeometry, device: DeviceSpec, prompt_tokens: int = 1000
) -> PrefillCeiling:
    """Prefill ceiling and the TTFT it implies: compute time at peak dense FLOP/s, and never
    less than one read of the weights (a short prompt is memory-bound like decode)."""
    if prompt_tokens < 1:
        raise InputError(f"the prompt must have at least 1 token, got {prompt_tokens}")
    weight_read_s = model.read_weight_bytes() / (device.mem_bandwidth_gb_s * GB)
    peak = peak_flops(model, device)
    if peak is None:
        return PrefillCeiling(
            device.name, prompt_tokens, None, None, None, weight_read_s, None, None, None
        )
    linear, attention = prefill_flops(model, prompt_tokens)
    compute_s = (linear + attention) / peak
    ttft = max(compute_s, weight_read_s)
    return PrefillCeiling(
        device=device.name,
        prompt_tokens=prompt_tokens,
        peak_tflops=peak / 1e12,
        linear_s=linear / peak,
        attention_s=attention / peak,
        weight_read_s=weight_read_s,
        ttft_s=ttft,
        tok_s=prompt_tokens / ttft,
        bound="compute" if compute_s >= weight_read_s else "memory",
    )


def attention_share_tokens(model: ModelGeometry, share: float = 0.1) -> int | None:
    """Prompt length at which attention reaches ``share`` of prefill FLOPs: where the quadratic
    term starts to matter."""
    if not model.num_attention_heads or not model.head_dim:
        return None
    n = 1
    while n < 1 << 24:
        linear, attention = prefill_flops(model, n)
        if attention >= share * (linear + attention):
            break
        n *= 2
    else:
        return None
    lo, hi = n // 2, n
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        linear, attention = prefill_flops(model, mid)
        if attention >= share * (linear + attention):
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------------- KV pool


@dataclass(frozen=True)
class KVPool:
    """The KV cache a server can hold: memory x utilisation - weights - reserve."""

    device: str
    memory_gb: float
    mem_util: float
    reserve_gb: float
    weight_bytes: float
    pool_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_request: float
    context: int
    max_tokens: int
    max_concurrent_sequences: int


def kv_pool(
    model: ModelGeometry,
    device: DeviceSpec,
    context: int,
    *,
    mem_util: float = DEFAULT_MEM_UTIL,
    reserve_gb: float = DEFAULT_RESERVE_GB,
    kv_dtype: str = "fp16",
) -> KVPool:
    """Pool capacity in tokens and in sequences of ``context`` tokens. A negative pool (the
    weights do not fit) gives zero capacity; callers say so."""
    if device.memory_gb is None:
        raise InputError(f"the device table has no memory size for {device.name}")
    if not 0 < mem_util <= 1:
        raise InputError(f"--mem-util must be in (0, 1], got {mem_util}")
    weights = model.total_weight_bytes()
    pool = device.memory_gb * GB * mem_util - weights - reserve_gb * GB
    per_token = kv_bytes_per_token(model, kv_dtype)
    per_request = kv_bytes_per_request(model, max(context, 1), kv_dtype)
    usable = max(pool, 0.0)
    return KVPool(
        device=device.name,
        memory_gb=device.memory_gb,
        mem_util=mem_util,
        reserve_gb=reserve_gb,
        weight_bytes=weights,
        pool_bytes=pool,
        kv_bytes_per_token=per_token,
        kv_bytes_per_request=per_request,
        context=context,
        max_tokens=int(usable // per_token),
        max_concurrent_sequences=int(usable // per_request),
    )


# ---------------------------------------------------------------------------------- what-if


@dataclass(frozen=True)
class QuantizationWhatIf:
    bits: int
    weight_bytes: float
    decode_ceiling_tok_s: float
    speedup: float


def quantization_whatif(
    model: ModelGeometry, device: DeviceSpec, bits: tuple[int, ...] = (16, 8, 4), context: int = 0
) -> list[QuantizationWhatIf]:
    """The same model stored at other precisions: fewer bytes a token, a higher ceiling.
    ``speedup`` is against the model as given."""
    base = decode_ceiling(model, device, context).tok_s
    out = []
    for b in bits:
        m = model.with_dtype({16: "fp16", 8: "fp8", 4: "int4"}.get(b, "fp16"))
        c = decode_ceiling(m, device, context)
        out.append(QuantizationWhatIf(b, m.read_weight_bytes(), c.tok_s, c.tok_s / base))
    return out
