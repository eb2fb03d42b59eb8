"""ModelGeometry from a Hugging Face ``config.json``.

The parameter count is worked out from the shapes of the weight matrices, because configs
rarely state it. The count covers the language model: a multimodal model's vision or audio tower
is not read when text is decoded and is left out (``assumptions`` says so).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscope.errors import InputError
from pdscope.model.geometry import FULL, SLIDING, ModelGeometry, dtype_bytes

# Keys under which a multimodal config keeps its language model.
_NESTED_TEXT_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")

# Fields some configs leave to the library's defaults. Values are the defaults of the
# transformers configuration classes (transformers 5.x, e.g. Gemma3TextConfig), which is what
# a server loading the config would use.
_MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
}

# Model types whose MLP has two matrices (up, down) rather than three (gate, up, down).
_UNGATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "mpt"}

# Model types whose configs carry a sliding_window that the model does not use unless
# use_sliding_window is true (Qwen2 and its family write the field either way).
_SLIDING_NEEDS_FLAG = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}

# Model types with bias on the q, k and v projections although attention_bias is not written.
_QKV_BIAS = {"qwen2", "qwen2_moe"}

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text", "gemma4_text"}

# Bounds on the counts a config gives: far beyond any model, and small enough that the per-layer
# loops end and the parameter count is a finite float.
_MOST = 2**31 - 1
_MOST_LAYERS = 100_000


def load_hf_config(path: str | Path) -> ModelGeometry:
    """Read ``config.json`` (the file, or a folder holding it) into a :class:`ModelGeometry`."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise InputError(f"cannot read config.json at {path}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read config.json at {p}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"cannot read config.json at {p}: not JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    except RecursionError:
        raise InputError(f"cannot read config.json at {p}: not JSON (nested too deep)") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        reason = str(exc).split(":")[0]
        raise InputError(f"cannot read config.json at {p}: not JSON ({reason})") from None
    if not isinstance(data, dict):
        raise InputError(f"cannot read config.json at {p}: not a model config (not an object)")
    name = p.parent.name if p.name == "config.json" else p.stem
    return geometry_from_hf_config(data, source=str(p), name=name or None)


@dataclass
class _Reader:
    """Looks fields up in the language-model config, then the outer config, then defaults."""

    inner: Mapping[str, Any]
    outer: Mapping[str, Any]
    defaults: Mapping[str, Any]
    where: str
    assumed: list[str]

    def get(self, *names: str) -> Any:
        for name in names:
            for scope in (self.inner, self.outer):
                if scope.get(name) is not None:
                    return scope[name]
        for name in names:
            if name in self.defaults:
                note = f"{name} = {self.defaults[name]} (library default)"
                if note not in self.assumed:
                    self.assumed.append(note)
                return self.defaults[name]
        return None

    def require(self, *names: str, most: int = _MOST) -> int:
        value = self.count(*names, most=most)
        if value is None:
            raise InputError(f"cannot read config.json at {self.where}: missing {names[0]}")
        return value

    def count(self, *names: str, zero: bool = False, most: int = _MOST) -> int | None:
        """An integer field: ``None`` when absent, else a positive integer up to ``most`` (or 0,
        where ``zero``: a field that 0 turns off)."""
        value = self.get(*names)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
            raise InputError(
                f"cannot read config.json at {self.where}: {names[0]} must be a"
                f" {'non-negative' if zero else 'positive'} integer, got {shown}"
            )
        if value > most:
            raise InputError(
                f"cannot read config.json at {self.where}: {names[0]} = {value} is beyond any"
                f" model (at most {most:,})"
            )
        return value


def geometry_from_hf_config(
    config: Mapping[str, Any], source: str = "config.json", name: str | None = None
) -> ModelGeometry:
    """Build a :class:`ModelGeometry` from a parsed ``config.json``."""
    inner: Mapping[str, Any] = config
    for key in _NESTED_TEXT_KEYS:
        if isinstance(config.get(key), Mapping):
            inner = config[key]
            break
    markers = ("model_type", "num_hidden_layers", "n_layer", "num_layers")
    if not any(k in inner or k in config for k in markers):
        raise InputError(
            f"cannot read config.json at {source}: not a model config"
            " (no model_type or num_hidden_layers)"
        )
    model_type = str(inner.get("model_type") or config.get("model_type") or "")
    assumed: list[str] = []
    if inner is not config:
        towers = [k for k in ("vision_config", "audio_config") if config.get(k)]
        if towers:
            assumed.append(
                f"counted the language model only ({', '.join(towers)} left out:"
                " not read when decoding text)"
            )
    r = _Reader(inner, config, _MODEL_TYPE_DEFAULTS.get(model_type, {}), source, assumed)

    layers = r.require("num_hidden_layers", "n_layer", "num_layers", most=_MOST_LAYERS)
    hidden = r.require("hidden_size", "n_embd", "d_model")
    heads = r.require("num_attention_heads", "n_head")
    kv_heads = r.count("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    if kv_heads is None:
        kv_heads = heads
        assumed.append("num_key_value_heads = num_attention_heads (no GQA field: MHA)")
    head_dim = r.count("head_dim")
    if head_dim is None:
        head_dim = hidden // heads
        if head_dim == 0:
            raise InputError(
                f"cannot read config.json at {source}: hidden_size {hidden} is smaller than"
                f" num_attention_heads {heads} (and no head_dim)"
            )
    vocab = r.require("vocab_size")
    intermediate = (
        r.count("intermediate_size", "ffn_hidden_size", "n_inner", zero=True) or 4 * hidden
    )
    tied = r.get("tie_word_embeddings")
    if tied is None:
        tied = model_type in _TIED_BY_DEFAULT
        assumed.append(f"tie_word_embeddings = {tied} (not in config)")
    max_ctx = r.count("max_position_embeddings", "n_positions", "max_sequence_length", zero=True)

    # Sliding window and which layers use it.
    window: int | None = None
    if model_type not in _SLIDING_NEEDS_FLAG or r.get("use_sliding_window"):
        window = r.count("sliding_window", zero=True)
    layer_types: tuple[str, ...] | None = None
    raw_types = r.get("layer_types")
    if isinstance(raw_types, list) and window:
        layer_types = tuple(SLIDING if "sliding" in str(t) else FULL for t in raw_types)
        if len(layer_types) != layers:
            raise InputError(
                f"cannot read config.json at {source}: layer_types has {len(layer_types)}"
                f" entries for {layers} layers"
            )
    elif window and (pattern := r.count("sliding_window_pattern", zero=True)):
        layer_types = tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers))
    if window and layer_types is not None and SLIDING not in layer_types:
        window = None
        layer_types = None

    global_kv = r.count("num_global_key_value_heads", zero=True)
    global_hd = r.count("global_head_dim", zero=True)
    k_eq_v = bool(r.get("attention_k_eq_v"))

    # MLA (DeepSeek V2/V3, Kimi): a compressed latent is cached instead of keys and values.
    kv_lora = r.count("kv_lora_rank", zero=True)
    rope_dim = r.count("qk_rope_head_dim", zero=True)

    # Mixture of experts.
    n_experts = r.count(
        "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", zero=True
    ) or 0
    top_k = r.count(
        "num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_top_k", zero=True
    ) or 0
    moe = top_k > 0 and n_experts > 1
    if moe and top_k > n_experts:
        raise InputError(
            f"cannot read config.json at {source}: {top_k} experts a token, of only"
            f" {n_experts} experts"
        )
    expert_inter = r.count("moe_intermediate_size", zero=True) or intermediate
    shared_inter = 0
    if moe:
        if r.count("shared_expert_intermediate_size", zero=True):
            shared_inter = r.require("shared_expert_intermediate_size")
        elif r.count("n_shared_experts", zero=True):
            shared_inter = r.require("n_shared_experts") * expert_inter

    mlp_mats = 2 if model_type in _UNGATED_MLP else 3
    qkv_bias = bool(r.get("attention_bias")) or model_type in _QKV_BIAS

    # Attention weights, per layer.
    def attention_params(kind: str) -> int:
        if kv_lora:
            nope = r.count("qk_nope_head_dim", zero=True) or head_dim
            rope = rope_dim or 0
            v_dim = r.count("v_head_dim", zero=True) or head_dim
            q_rank = r.count("q_lora_rank", zero=True)
            q = (
                hidden * q_rank + q_rank * heads * (nope + rope)
                if q_rank
                else hidden * heads * (nope + rope)
            )
            kv_a = hidden * (kv_lora + rope)
            kv_b = kv_lora * heads * (nope + v_dim)
            return int(q + kv_a + kv_b + heads * v_dim * hidden + kv_lora)
        hd, kvh = head_dim, kv_heads
        if kind == FULL and layer_types is not None:
            hd, kvh = global_hd or head_dim, global_kv or kv_heads
        n_kv_proj = 1 if (k_eq_v and kind == FULL) else 2
        weights = hidden * heads * hd + n_kv_proj * hidden * kvh * hd + heads * hd * hidden
        bias = (heads * hd + n_kv_proj * kvh * hd) if qkv_bias else 0
        if r.get("attention_bias"):
            bias += hidden
        return weights + bias

    kinds = layer_types or ((SLIDING if window else FULL),) * layers
    attn_total = sum(attention_params(k) for k in kinds)

    # MLP / experts, per layer.
    first_dense = r.count("first_k_dense_replace", zero=True) or 0
    dense_alongside = bool(r.get("enable_moe_block"))  # Gemma 4: a dense MLP beside the experts
    dense_total = 0
    expert_total = 0
    expert_active = 0
    for i in range(layers):
        if not moe or i < first_dense:
            dense_total += mlp_mats * hidden * intermediate
            continue
        one_expert = mlp_mats * hidden * expert_inter
        expert_total += n_experts * one_expert
        expert_active += top_k * one_expert
        dense_total += hidden * n_experts  # router
        dense_total += mlp_mats * hidden * shared_inter
        if dense_alongside:
            dense_total += mlp_mats * hidden * intermediate

    norms = 2 * hidden * layers + hidden
    embed = vocab * hidden
    head = 0 if tied else vocab * hidden
    total = embed + head + attn_total + dense_total + expert_total + norms
    # Active, as model cards count it: the whole path a token takes, the input embedding included.
    active = embed + head + attn_total + dense_total + expert_active + norms
    # What one decode step reads: the input embedding is a lookup of one row (unless tied to the
    # head, which reads it whole). The roofline's figure.
    read = (embed if tied else 0) + head + attn_total + dense_total + expert_active + norms

    # Precision of the stored weights.
    dtype = str(r.get("torch_dtype", "dtype") or "")
    if not dtype:
        dtype = "bfloat16"
        assumed.append("weights in bf16 (no torch_dtype in config)")
    bpw = dtype_bytes(dtype)
    weight_bytes: float | None = None
    active_bytes: float | None = None
    expert_bytes: float | None = None
    quant = r.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits") or quant.get("w_bit")
        if bits and (isinstance(bits, bool) or not isinstance(bits, (int, float))
                     or not 1 <= bits <= 64):
            raise InputError(
                f"cannot read config.json at {source}: quantization_config bits must be a number"
                f" of bits from 1 to 64, got {bits!r}"
            )
        if method == "mxfp4":
            # gpt-oss: the experts are MXFP4, everything else stays at the config's dtype.
            q = dtype_bytes("mxfp4")
            weight_bytes = (total - expert_total) * bpw + expert_total * q
            active_bytes = (read - expert_active) * bpw + expert_active * q
            expert_bytes = expert_total * q
            dtype = f"mxfp4 experts + {dtype}"
        elif method in {"fp8", "fbgemm_fp8", "compressed-tensors"} and not bits:
            bpw, dtype = 1.0, "fp8"
        elif bits:
            bpw, dtype = float(bits) / 8, f"int{bits} ({method or 'quantized'})"
    if weight_bytes is not None:
        bpw = weight_bytes / total

    return ModelGeometry(
        name=name or model_type or "model",
        parameters=float(total),
        active_parameters=float(active),
        read_parameters=float(read),
        weight_dtype=dtype,
        bytes_per_weight=bpw,
        source=source,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(intermediate),
        vocab_size=vocab,
        tie_word_embeddings=bool(tied),
        max_context=int(max_ctx) if max_ctx else None,
        num_experts=int(n_experts) if moe else None,
        experts_per_token=int(top_k) if moe else None,
        kv_lora_rank=int(kv_lora) if kv_lora else None,
        qk_rope_head_dim=int(rope_dim) if kv_lora and rope_dim is not None else None,
        sliding_window=int(window) if window else None,
        layer_types=layer_types,
        global_kv_heads=int(global_kv) if global_kv and layer_types else None,
        global_head_dim=int(global_hd) if global_hd and layer_types else None,
        weight_bytes=weight_bytes,
        active_weight_bytes=active_bytes,
        expert_parameters=float(expert_total) if moe else None,
        expert_weight_bytes=expert_bytes,
        parameters_source="computed from config",
        assumptions=tuple(assumed),
    )
