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
- A model split between GPU memory and system RAM (offload) reads each share at its own
  memory's speed: a token takes bytes on the GPU / GPU bandwidth + bytes on the CPU / CPU
  bandwidth, so a small share in slow RAM costs more than the large share in fast memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdscope.errors import Field, InputError
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
            " and head size are unknown (give its config.json or GGUF file)"
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


def lm_head_parameters(model: ModelGeometry) -> float:
    """Parameters of the output head (vocabulary x hidden size), 0 when the geometry does not
    give both. Tied or not, the head is counted once in ``parameters_read_per_token``."""
    if not model.vocab_size or not model.hidden_size:
        return 0.0
    return float(model.vocab_size * model.hidden_size)


def prefill_flops(model: ModelGeometry, prompt_tokens: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a prefill of ``prompt_tokens``.

    Linear: 2 x the parameters read a token (``parameters_read_per_token``) for every prompt
    token, except the output head, which a prefill computes for the last token only: only its
    logits are sampled (vLLM's model runner takes ``hidden_states[logits_indices]`` before
    ``compute_logits``, ``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner inherits;
    llama-server asks for the logits of a batch's last prompt token only). On a small model the
    head is a large part of the weights (SmolLM2-135M's 49,152 x 576 is 21% of them), so
    counting it for every token put the README's lab prefill at 114% of its ceiling. Attention:
    for each layer and query head, QK and AV each cost 2 x head_dim FLOPs a query-key pair;
    causal attention has n(n+1)/2 pairs. This is the quadratic part that starts to matter at
    long contexts.
    """
    head = min(lm_head_parameters(model), model.parameters_read_per_token)
    body = model.parameters_read_per_token - head
    linear = 2.0 * body * prompt_tokens + 2.0 * head * min(prompt_tokens, 1)
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


# ------------------------------------------------------------------- a measurement held


@dataclass(frozen=True)
class Held:
    """A measurement set beside its limit, as every output prints the pair: ``share`` is never
    above 1.

    A ``ceiling`` (a rate: tok/s, GB/s) may not be beaten by a measurement, and a ``floor`` (a
    time: the TTFT floor) may not be undercut. When one is (``beaten``), the limit the specs
    gave (``spec_limit``) was wrong, not the measurement: the limit is then the measured value
    itself (``limit``, printed as "at least" it for a ceiling, "at most" for a floor) and
    ``warning`` says which spec was low and why it can be. Build one with :func:`hold`.
    """

    measured: float
    spec_limit: float
    limit: float
    share: float
    beaten: bool
    kind: str  # "ceiling" or "floor"
    what: str  # the figure in words: "prefill rate", "decode rate", "TTFT"
    unit: str
    spec: str  # where the limit came from, in words
    why: str  # why that spec can be low

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise InputError(f"a held share is between 0 and 1, got {self.share}")

    @property
    def ceiling(self) -> float:
        """The limit as printed (the measured value where the specs' was beaten)."""
        return self.limit

    @property
    def mark(self) -> str:
        """The words before the limit: "at least " for a beaten ceiling, "at most " for an
        undercut floor, else nothing."""
        if not self.beaten:
            return ""
        return "at least " if self.kind == "ceiling" else "at most "

    @property
    def warning(self) -> str | None:
        """One sentence naming the spec that was low, and why; ``None`` when it held."""
        if not self.beaten:
            return None
        verb = "above its ceiling" if self.kind == "ceiling" else "below its floor"
        return (f"the measured {self.what}, {_figure(self.measured, self.unit)}, is {verb} of"
                f" {_figure(self.spec_limit, self.unit)} from {self.spec}: {self.why}; the"
                f" {self.kind} is taken as {self.mark}the measured value")

    def to_json(self) -> dict[str, object]:
        return {"measured": self.measured, "limit": self.limit, "spec_limit": self.spec_limit,
                "share": self.share, "beaten": self.beaten, "kind": self.kind,
                "warning": self.warning}


def _figure(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x * 1000:,.1f} ms" if x < 1 else f"{x:,.2f} s"
    return f"{x:,.1f} {unit}"


# A measurement within this of its limit is taken as at it, not past it: the rounding of a
# median and of a spec, not a wrong spec.
HELD_TOLERANCE = 1e-9


def hold(measured: float, limit: float, *, what: str, unit: str, spec: str, why: str,
         kind: str = "ceiling") -> Held:
    """``measured`` beside ``limit``: a ``ceiling`` it should not exceed, or a ``floor`` it
    should not undercut. ``spec`` and ``why`` are the words of the warning when it does."""
    if kind not in ("ceiling", "floor"):
        raise InputError(f"a limit is a ceiling or a floor, got {kind!r}")
    if not limit > 0 or measured < 0:
        raise InputError(f"a held limit is positive and a measurement not negative, got"
                         f" {measured} against {limit}")
    if kind == "ceiling":
        beaten = measured > limit * (1 + HELD_TOLERANCE)
        held = max(limit, measured)
        share = min(1.0, measured / held)
    else:
        beaten = measured < limit * (1 - HELD_TOLERANCE)
        held = min(limit, measured)
        share = min(1.0, held / measured) if measured > 0 else 1.0
    return Held(measured=measured, spec_limit=limit, limit=held, share=share, beaten=beaten,
                kind=kind, what=what, unit=unit, spec=spec, why=why)


def bandwidth_spec(device: str, gb_s: float, measured: bool) -> tuple[str, str]:
    """(spec, why) for a ceiling that comes from a memory bandwidth: a decode ceiling."""
    if measured:
        return (f"{device}'s {gb_s:,.1f} GB/s, measured by pdscope's copy/triad probe",
                "the probe read memory slower than the server's kernels do (the machine was"
                " busy while it ran, or the server's weights sit partly in cache)")
    return (f"{device}'s {gb_s:,.0f} GB/s in the device table",
            "the server reads fewer bytes a token than the model's geometry says (weights"
            " stored in fewer bits than assumed), or it runs on another device than the one"
            " named")


def flops_spec(device: str, tflops: float, measured: bool) -> tuple[str, str]:
    """(spec, why) for a ceiling that comes from a FLOPS figure: a prefill ceiling."""
    if measured:
        return (f"{device}'s {tflops:,.2f} TFLOPS, measured by pdscope's matmul probes",
                "the server computes faster than the probes did (other kernels, another dtype"
                " or more threads than the probe's matmuls, or a busy machine while they ran)")
    return (f"{device}'s {tflops:,.0f} dense TFLOPS in the device table",
            "the model computes fewer FLOPs a token than its geometry says, or the server runs"
            " on another device than the one named")


def hold_rate(measured: float, ceiling_tok_s: float, *, phase: str, device: str,
              measured_device: bool, mem_bandwidth_gb_s: float,
              peak_tflops: float | None) -> Held:
    """A measured decode (``phase="decode"``, bandwidth-bound) or prefill (``"prefill"``,
    compute-bound) rate beside its ceiling, with the spec it came from in the warning."""
    if phase == "decode":
        spec, why = bandwidth_spec(device, mem_bandwidth_gb_s, measured_device)
    elif peak_tflops is not None:
        spec, why = flops_spec(device, peak_tflops, measured_device)
    else:
        spec, why = bandwidth_spec(device, mem_bandwidth_gb_s, measured_device)
    return hold(measured, ceiling_tok_s, what=f"{phase} rate", unit="tok/s", spec=spec, why=why)


def hold_ttft(measured_s: float, floor_s: float, *, device: str, measured_device: bool,
              peak_tflops: float | None, mem_bandwidth_gb_s: float) -> Held:
    """A measured TTFT beside the prefill floor: the floor may not be above it."""
    if peak_tflops is not None:
        spec, why = flops_spec(device, peak_tflops, measured_device)
    else:
        spec, why = bandwidth_spec(device, mem_bandwidth_gb_s, measured_device)
    return hold(measured_s, floor_s, what="TTFT", unit="s", spec=spec, why=why, kind="floor")


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
        raise InputError(Field("mem_util"), f" must be in (0, 1], got {mem_util}")
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


# ---------------------------------------------------------------------------------- offload


def _check_share(on_gpu: float) -> None:
    if not 0.0 <= on_gpu <= 1.0:
        raise InputError(Field("on_gpu"), f" must be between 0 and 1 (the share of the weights"
                         f" in GPU memory), got {on_gpu}")


@dataclass(frozen=True)
class SplitDecode:
    """Single-stream decode of a model whose weights are split between two memories.

    Each step reads the ``on_gpu`` share of the weights (and of the KV cache: a layer's cache
    lives beside its weights, as llama.cpp keeps it) at the GPU's bandwidth, and the rest at
    the CPU's, one after the other: ``gpu_s + cpu_s`` a token. ``all_on_gpu_tok_s`` is the
    same model wholly in GPU memory, the ceiling the offload costs."""

    gpu_device: str
    cpu_device: str
    on_gpu: float
    gpu_bytes: float
    cpu_bytes: float
    gpu_s: float
    cpu_s: float
    context: int
    tok_s: float
    all_on_gpu_tok_s: float

    @property
    def off_gpu(self) -> float:
        """Share of the weights read from system RAM."""
        return 1.0 - self.on_gpu

    @property
    def slowdown(self) -> float:
        """How many times slower than with every weight on the GPU."""
        return self.all_on_gpu_tok_s / self.tok_s


def split_decode_ceiling(
    model: ModelGeometry,
    gpu: DeviceSpec,
    cpu: DeviceSpec,
    on_gpu: float,
    context: int = 0,
    kv_dtype: str = "fp16",
) -> SplitDecode:
    """The decode ceiling with ``on_gpu`` (0 to 1) of the weights in ``gpu``'s memory and the
    rest in ``cpu``'s: ``1 / (bytes on GPU / GPU bandwidth + bytes on CPU / CPU bandwidth)``.
    With ``on_gpu=1`` it is :func:`decode_ceiling` on ``gpu``; with 0, on ``cpu``."""
    _check_share(on_gpu)
    read = model.read_weight_bytes()
    if context:
        read += kv_bytes_per_request(model, context, kv_dtype)
    gpu_bytes, cpu_bytes = read * on_gpu, read * (1.0 - on_gpu)
    gpu_s = gpu_bytes / (gpu.mem_bandwidth_gb_s * GB)
    cpu_s = cpu_bytes / (cpu.mem_bandwidth_gb_s * GB)
    return SplitDecode(
        gpu_device=gpu.name,
        cpu_device=cpu.name,
        on_gpu=on_gpu,
        gpu_bytes=gpu_bytes,
        cpu_bytes=cpu_bytes,
        gpu_s=gpu_s,
        cpu_s=cpu_s,
        context=context,
        tok_s=1.0 / (gpu_s + cpu_s),
        all_on_gpu_tok_s=gpu.mem_bandwidth_gb_s * GB / read,
    )


@dataclass(frozen=True)
class SplitPrefill:
    """Prefill of a split model: each device computes its layers' share of the FLOPs at its
    own peak, and never faster than one read of each share of the weights. ``None`` figures:
    a device has no FLOPS figure (the device table's memory-only CPU rows; measure the CPU
    with ``local``)."""

    gpu_device: str
    cpu_device: str
    on_gpu: float
    prompt_tokens: int
    gpu_s: float | None
    cpu_s: float | None
    weight_read_s: float
    ttft_s: float | None
    tok_s: float | None
    all_on_gpu_tok_s: float | None


def split_prefill_ceiling(
    model: ModelGeometry,
    gpu: DeviceSpec,
    cpu: DeviceSpec,
    on_gpu: float,
    prompt_tokens: int = 1000,
) -> SplitPrefill:
    """The prefill ceiling with ``on_gpu`` of the model on ``gpu`` and the rest on ``cpu``:
    FLOPs on the GPU / its peak + FLOPs on the CPU / its peak (the layers run one after the
    other), at least the split read of the weights. Engines that copy CPU-held weights to the
    GPU for a long prompt (llama.cpp's op offload) are bound by that copy instead, which this
    ceiling does not model."""
    _check_share(on_gpu)
    if prompt_tokens < 1:
        raise InputError(f"the prompt must have at least 1 token, got {prompt_tokens}")
    weights = model.read_weight_bytes()
    weight_read_s = (weights * on_gpu / (gpu.mem_bandwidth_gb_s * GB)
                     + weights * (1.0 - on_gpu) / (cpu.mem_bandwidth_gb_s * GB))
    linear, attention = prefill_flops(model, prompt_tokens)
    flops = linear + attention
    gpu_peak, cpu_peak = peak_flops(model, gpu), peak_flops(model, cpu)
    gpu_s = flops * on_gpu / gpu_peak if gpu_peak else None
    cpu_s = flops * (1.0 - on_gpu) / cpu_peak if cpu_peak else None
    if on_gpu == 1.0 and gpu_s is not None:
        cpu_s = 0.0
    if on_gpu == 0.0 and cpu_s is not None:
        gpu_s = 0.0
    ttft = (max(gpu_s + cpu_s, weight_read_s)
            if gpu_s is not None and cpu_s is not None else None)
    all_on_gpu = prefill_ceiling(model, gpu, prompt_tokens).tok_s
    return SplitPrefill(
        gpu_device=gpu.name,
        cpu_device=cpu.name,
        on_gpu=on_gpu,
        prompt_tokens=prompt_tokens,
        gpu_s=gpu_s,
        cpu_s=cpu_s,
        weight_read_s=weight_read_s,
        ttft_s=ttft,
        tok_s=prompt_tokens / ttft if ttft else None,
        all_on_gpu_tok_s=all_on_gpu,
    )


# ---------------------------------------------------------------------------------- slots


@dataclass(frozen=True)
class SlotsFit:
    """What parallel slots cost in memory, and whether the weights still fit beside them.

    Ollama and llama-server give every parallel slot its own context of KV cache
    (``slots x context``) and allocate it on the GPU first; what is left holds the weights,
    and the layers that do not fit run from system RAM (Ollama issue 11942:
    ``OLLAMA_NUM_PARALLEL`` raised until layers spilled). ``on_gpu`` is the share of the
    weights that fits: 1 when all do."""

    device: str
    slots: int
    context_per_slot: int
    kv_bytes: float
    weight_bytes: float
    usable_bytes: float  # memory x utilisation - reserve
    on_gpu: float

    @property
    def weights_spill(self) -> bool:
        return self.on_gpu < 1.0


def kv_bytes_for_slots(
    model: ModelGeometry, slots: int, context_per_slot: int, kv_dtype: str = "fp16"
) -> float:
    """KV bytes of ``slots`` parallel slots of ``context_per_slot`` tokens each, allocated
    whole at start (llama-server's ``-c`` is split between its ``-np`` slots; Ollama allocates
    ``num_ctx`` for each of ``OLLAMA_NUM_PARALLEL``)."""
    if slots < 1:
        raise InputError(Field("slots"), f" must be at least 1, got {slots}")
    return slots * kv_bytes_per_request(model, context_per_slot, kv_dtype)


def slots_fit(
    model: ModelGeometry,
    device: DeviceSpec,
    slots: int,
    context_per_slot: int,
    *,
    mem_util: float = DEFAULT_MEM_UTIL,
    reserve_gb: float = DEFAULT_RESERVE_GB,
    kv_dtype: str = "fp16",
) -> SlotsFit:
    """The KV cache of ``slots`` x ``context_per_slot`` on ``device``, and the share of the
    weights that still fits in what is left of its memory."""
    if device.memory_gb is None:
        raise InputError(f"the device table has no memory size for {device.name}")
    if not 0 < mem_util <= 1:
        raise InputError(Field("mem_util"), f" must be in (0, 1], got {mem_util}")
    kv = kv_bytes_for_slots(model, slots, context_per_slot, kv_dtype)
    weights = model.total_weight_bytes()
    usable = device.memory_gb * GB * mem_util - reserve_gb * GB
    room = max(usable - kv, 0.0)
    return SlotsFit(
        device=device.name,
        slots=slots,
        context_per_slot=context_per_slot,
        kv_bytes=kv,
        weight_bytes=weights,
        usable_bytes=usable,
        on_gpu=min(1.0, room / weights) if weights > 0 else 1.0,
    )
