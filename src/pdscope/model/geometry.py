"""The shape of a model, as far as the roofline needs it.

A :class:`ModelGeometry` is built from a Hugging Face ``config.json``, GGUF metadata, an Ollama
``/api/show`` response, or a bare parameter count. The roofline reads only this object, so every
source of a model ends up in the same place and every formula is tested once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pdscope.errors import InputError

# Bytes a weight takes in memory, by the names people give the formats. 4-bit formats without
# a known block layout count as 0.5; the GGUF reader replaces this with the file's real bytes.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "float32": 4.0,
    "f32": 4.0,
    "fp16": 2.0,
    "float16": 2.0,
    "f16": 2.0,
    "half": 2.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp8": 1.0,
    "float8": 1.0,
    "float8_e4m3fn": 1.0,
    "e4m3": 1.0,
    "int8": 1.0,
    "q8": 1.0,
    "int4": 0.5,
    "q4": 0.5,
    "fp4": 0.5,
    "nvfp4": 0.5,
    "4bit": 0.5,
    "awq": 0.5,
    "gptq": 0.5,
    # OCP microscaling fp4: 32 four-bit values share one 8-bit scale, 4.25 bits a weight.
    "mxfp4": 4.25 / 8,
}

FULL = "full_attention"
SLIDING = "sliding_attention"


def dtype_bytes(dtype: str) -> float:
    """Bytes per element for a dtype name (``fp16``, ``bf16``, ``fp8``, ``int4``, ...)."""
    key = dtype.strip().lower().replace("-", "").replace("_", "")
    for name, size in DTYPE_BYTES.items():
        if name.replace("_", "") == key:
            return size
    known = ", ".join(sorted({"fp32", "fp16", "bf16", "fp8", "int8", "int4", "mxfp4"}))
    raise InputError(f"unknown dtype {dtype!r}: use one of {known}")


@dataclass(frozen=True)
class ModelGeometry:
    """What the roofline needs to know about a model.

    ``parameters`` is the total count. ``active_parameters`` counts the whole path a token takes,
    as Qwen's and Mistral's model cards count "active" parameters: for a mixture of experts only
    the experts it is routed to, and the input embedding table whole (a dense model's active
    count is its total). ``parameters_read_per_token`` is what a decode step reads, which is what
    the roofline uses: the same, less the input embedding table when it is not tied to the
    output head (a lookup reads one row of it, not the table). It is given by ``read_parameters``
    (``None``: the same as ``active_parameters``, as for a model known only by its counts).

    Attention layers are described per layer by ``layer_types`` (``full_attention`` or
    ``sliding_attention``); ``global_kv_heads`` and ``global_head_dim`` override the KV shape of
    full-attention layers where a model gives them a different one (Gemma 4). MLA models
    (DeepSeek) cache ``kv_lora_rank + qk_rope_head_dim`` values a layer and token instead of keys
    and values.

    Fields that the source did not give are ``None``; ``assumptions`` lists every default that
    was filled in, in words, so a report can show it.
    """

    name: str
    parameters: float
    active_parameters: float
    weight_dtype: str
    bytes_per_weight: float
    source: str
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    max_context: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    global_kv_heads: int | None = None
    global_head_dim: int | None = None
    weight_bytes: float | None = None
    active_weight_bytes: float | None = None
    expert_parameters: float | None = None
    expert_weight_bytes: float | None = None
    parameters_source: str = "stated"
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    read_parameters: float | None = None

    def __post_init__(self) -> None:
        if not self.parameters > 0:
            raise InputError(f"the parameter count must be positive, got {self.parameters:g}")
        if not self.bytes_per_weight > 0:
            raise InputError(f"bytes per weight must be positive, got {self.bytes_per_weight:g}")
        if self.read_parameters is not None and not (
            0 < self.read_parameters <= self.active_parameters
        ):
            raise InputError(
                f"the parameters read a token must be positive and at most the active"
                f" parameters ({self.active_parameters:g}), got {self.read_parameters:g}"
            )

    @property
    def parameters_read_per_token(self) -> float:
        """Parameters one decode step reads for one sequence: the active parameters less the
        input embedding table where it is not tied to the output head. The roofline's figure."""
        if self.read_parameters is not None:
            return self.read_parameters
        return self.active_parameters

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.experts_per_token)

    @property
    def is_mla(self) -> bool:
        return bool(self.kv_lora_rank)

    @property
    def has_attention_shape(self) -> bool:
        """True when the KV cache can be worked out (layers, KV heads and head size known)."""
        if self.num_layers is None:
            return False
        if self.is_mla:
            return self.qk_rope_head_dim is not None
        return self.num_kv_heads is not None and self.head_dim is not None

    def total_weight_bytes(self) -> float:
        """Bytes the weights take in memory."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        return self.parameters * self.bytes_per_weight

    def read_weight_bytes(self) -> float:
        """Bytes of weights one decode step reads for a single sequence."""
        if self.active_weight_bytes is not None:
            return self.active_weight_bytes
        return self.parameters_read_per_token * self.bytes_per_weight

    def all_expert_bytes(self) -> float:
        """Bytes of all routed experts (0 for a dense model)."""
        if not self.is_moe or not self.expert_parameters:
            return 0.0
        if self.expert_weight_bytes is not None:
            return self.expert_weight_bytes
        return self.expert_parameters * self.bytes_per_weight

    def layer_kinds(self) -> tuple[str, ...]:
        """One entry a layer: ``full_attention`` or ``sliding_attention``."""
        if self.layer_types is not None:
            return self.layer_types
        n = self.num_layers or 0
        kind = SLIDING if self.sliding_window else FULL
        return (kind,) * n

    def with_dtype(self, dtype: str) -> ModelGeometry:
        """The same model stored at another precision (a what-if, or ``--dtype``)."""
        size = dtype_bytes(dtype)
        return replace(
            self,
            weight_dtype=dtype,
            bytes_per_weight=size,
            weight_bytes=None,
            active_weight_bytes=None,
            expert_weight_bytes=None,
        )


def from_parameter_count(
    parameters: float,
    dtype: str = "fp16",
    *,
    active_parameters: float | None = None,
    name: str | None = None,
) -> ModelGeometry:
    """A model known only by its size (``--params 8e9 --dtype fp16``): enough for the decode and
    prefill ceilings, not for the KV cache."""
    if not parameters > 0:
        raise InputError(f"the parameter count must be positive, got {parameters:g}")
    if active_parameters is not None and not 0 < active_parameters <= parameters:
        raise InputError(
            f"active parameters must be positive and at most the total ({parameters:g}),"
            f" got {active_parameters:g}"
        )
    return ModelGeometry(
        name=name or f"{parameters / 1e9:g}B",
        parameters=float(parameters),
        active_parameters=float(active_parameters or parameters),
        weight_dtype=dtype,
        bytes_per_weight=dtype_bytes(dtype),
        source="parameter count",
    )
