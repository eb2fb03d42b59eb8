"""ModelGeometry from GGUF metadata: a ``.gguf`` file, or the same keys as Ollama reports them.

GGUF keys are ``<architecture>.<field>`` (``llama.block_count``,
``llama.attention.head_count_kv``); Ollama's ``/api/show`` returns them under ``model_info``.
The file also gives every tensor's real size, so the weight bytes of a quantized model are the
bytes on disk, block scales included (Q4_1 is 5 bits a weight, not 4).
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdscope.errors import InputError
from pdscope.model.geometry import FULL, SLIDING, ModelGeometry

# GGUF's general.file_type values (llama.cpp's LLAMA_FTYPE_*), for the label.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16", 38: "MXFP4_MOE",
}


def quant_bits(type_name: str) -> float:
    """Bits a weight of a GGML quantization type takes, block scales included
    (``Q4_0`` 4.5, ``Q4_1`` 5, ``Q8_0`` 8.5, ``F16`` 16). Names like ``Q4_K_M`` use their base
    type (``Q4_K``)."""
    import gguf

    name = type_name.strip().upper()
    candidates = [name, name.rsplit("_", 1)[0]]
    for cand in candidates:
        qtype = getattr(gguf.GGMLQuantizationType, cand, None)
        if qtype is not None and qtype in gguf.GGML_QUANT_SIZES:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            return float(size) * 8 / float(block)
    raise InputError(f"unknown GGUF quantization type {type_name!r}")


def _file_type_label(kv: Mapping[str, Any]) -> str | None:
    file_type = kv.get("general.file_type")
    return _FILE_TYPES.get(int(file_type)) if isinstance(file_type, int) else None


def _scalar(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        # Some architectures give per-layer values (e.g. head_count_kv); the largest bounds the
        # KV cache from above.
        numbers = [v for v in value if isinstance(v, (int, float))]
        return max(numbers) if numbers else None
    return value


# Bounds on the counts the metadata gives: what GGUF stores them in (uint32), and for layers a
# number the per-layer loops can go through.
_MOST = 2**32 - 1
_MOST_LAYERS = 100_000


def _count(kv: Mapping[str, Any], key: str, source: str, most: int = _MOST) -> int | None:
    """The integer at ``key`` (the largest of a per-layer list); ``None`` when absent."""
    value = _scalar(kv.get(key))
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= most:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise InputError(
            f"cannot read model metadata from {source}: {key} must be an integer from 0 to"
            f" {most:,}, got {shown}"
        )
    return int(value)


def geometry_from_gguf_kv(
    kv: Mapping[str, Any],
    *,
    source: str,
    parameters: float | None = None,
    weight_bytes: float | None = None,
    active_weight_bytes: float | None = None,
    active_parameters: float | None = None,
    read_parameters: float | None = None,
    expert_parameters: float | None = None,
    expert_weight_bytes: float | None = None,
    quantization: str | None = None,
    tied: bool | None = None,
    assumptions: tuple[str, ...] = (),
) -> ModelGeometry:
    """Build a geometry from GGUF-style keys (a file's metadata, or Ollama's ``model_info``).

    ``active_parameters`` counts the whole active path, the input embedding included;
    ``read_parameters`` is what a decode step reads (``None``: the same)."""
    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"cannot read model metadata from {source}: no general.architecture")
    if not arch.strip() or not arch.isprintable():
        raise InputError(
            f"cannot read model metadata from {source}: general.architecture {arch[:40]!r} is"
            " not a name"
        )

    def get(field: str) -> int | None:
        most = _MOST_LAYERS if field == "block_count" else _MOST
        return _count(kv, f"{arch}.{field}", source, most)

    layers = get("block_count")
    hidden = get("embedding_length")
    heads = get("attention.head_count")
    if not layers or not hidden or not heads:
        missing = [
            k
            for k, v in (
                ("block_count", layers),
                ("embedding_length", hidden),
                ("attention.head_count", heads),
            )
            if not v
        ]
        raise InputError(f"cannot read model metadata from {source}: missing {arch}.{missing[0]}")
    assumed = list(assumptions)
    kv_heads = get("attention.head_count_kv")
    if not kv_heads:
        kv_heads = heads
        assumed.append("KV heads = attention heads (head_count_kv not given)")
    head_dim = get("attention.key_length") or hidden // heads
    if head_dim == 0:
        raise InputError(
            f"cannot read model metadata from {source}: {arch}.embedding_length {hidden} is"
            f" smaller than {arch}.attention.head_count {heads} (and no attention.key_length)"
        )
    vocab = get("vocab_size")
    if vocab is None and isinstance(kv.get("tokenizer.ggml.tokens"), (list, tuple)):
        vocab = len(kv["tokenizer.ggml.tokens"]) or None
    n_experts = get("expert_count")
    top_k = get("expert_used_count")
    window = get("attention.sliding_window")
    kv_lora = get("attention.kv_lora_rank")
    rope_dim = get("rope.dimension_count")
    if n_experts and top_k and top_k > n_experts:
        raise InputError(
            f"cannot read model metadata from {source}: {top_k} experts a token"
            f" ({arch}.expert_used_count), of only {n_experts} ({arch}.expert_count)"
        )

    if parameters is None:
        parameters = kv.get("general.parameter_count")
    if not parameters:
        raise InputError(f"cannot read model metadata from {source}: no parameter count")
    if (
        isinstance(parameters, bool)
        or not isinstance(parameters, (int, float))
        or not 0 < parameters < math.inf
    ):
        raise InputError(
            f"cannot read model metadata from {source}: the parameter count must be a positive"
            f" number, got {parameters!r}"
        )

    label = quantization or _file_type_label(kv) or "F16"
    if weight_bytes is None:
        bpw = quant_bits(label) / 8
        weight_bytes = float(parameters) * bpw
        assumed.append(f"every weight at {label} ({bpw * 8:g} bits); real files mix types")
    if active_parameters is None:
        active_parameters = float(parameters)
        if n_experts and top_k:
            assumed.append("active parameters unknown without the tensor list: total used")
    read = float(active_parameters) if read_parameters is None else float(read_parameters)
    if active_weight_bytes is None:
        active_weight_bytes = weight_bytes * read / float(parameters)

    layer_types: tuple[str, ...] | None = None
    pattern = get("attention.sliding_window_pattern")
    if window and pattern:
        layer_types = tuple(SLIDING if (i + 1) % int(pattern) else FULL for i in range(layers))

    return ModelGeometry(
        name=str(kv.get("general.name") or kv.get("general.basename") or arch),
        parameters=float(parameters),
        active_parameters=float(active_parameters),
        read_parameters=float(read_parameters) if read_parameters is not None else None,
        weight_dtype=label,
        bytes_per_weight=weight_bytes / float(parameters),
        source=source,
        num_layers=int(layers),
        hidden_size=int(hidden),
        num_attention_heads=int(heads),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(get("feed_forward_length") or 0) or None,
        vocab_size=int(vocab) if vocab else None,
        tie_word_embeddings=tied,
        max_context=int(get("context_length") or 0) or None,
        num_experts=int(n_experts) if n_experts and top_k else None,
        experts_per_token=int(top_k) if n_experts and top_k else None,
        kv_lora_rank=int(kv_lora) if kv_lora else None,
        qk_rope_head_dim=int(rope_dim) if kv_lora and rope_dim else None,
        sliding_window=int(window) if window else None,
        layer_types=layer_types,
        weight_bytes=float(weight_bytes),
        active_weight_bytes=float(active_weight_bytes),
        expert_parameters=expert_parameters if n_experts and top_k else None,
        expert_weight_bytes=expert_weight_bytes if n_experts and top_k else None,
        parameters_source="stated" if kv.get("general.parameter_count") else "counted",
        assumptions=tuple(assumed),
    )


def load_gguf(path: str | Path) -> ModelGeometry:
    """Read a ``.gguf`` file's metadata and tensor table (not its weights)."""
    import gguf

    p = Path(path)
    if not p.exists():
        raise InputError(f"cannot read GGUF file at {path}: no such file")
    try:
        _check_lengths(p)
        reader = gguf.GGUFReader(str(p))
    # A truncated or corrupt file: gguf's reader reads past the end (IndexError), meets a
    # duplicate key or an unknown tensor type (KeyError), nests arrays too deep (RecursionError).
    except (ValueError, OSError, IndexError, KeyError, RecursionError) as exc:
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read GGUF file at {p}: {what[:200]}") from None

    kv: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.tokens":
            continue
        try:
            kv[key] = fld.contents()
        except (ValueError, IndexError, TypeError):
            continue

    total_params = 0
    total_bytes = 0
    expert_params = 0
    expert_bytes = 0
    embed_params = 0
    embed_bytes = 0
    has_output = False
    type_bytes: dict[str, int] = {}
    for t in reader.tensors:
        n, b = int(t.n_elements), int(t.n_bytes)
        total_params += n
        total_bytes += b
        type_bytes[t.tensor_type.name] = type_bytes.get(t.tensor_type.name, 0) + b
        if "_exps." in t.name:
            expert_params += n
            expert_bytes += b
        if t.name == "token_embd.weight":
            embed_params, embed_bytes = n, b
        if t.name == "output.weight":
            has_output = True

    arch = kv.get("general.architecture", "")
    n_exp = _count(kv, f"{arch}.expert_count", str(p))
    top_k = _count(kv, f"{arch}.expert_used_count", str(p))
    frac = (top_k / n_exp) if n_exp and top_k and top_k <= n_exp else 1.0
    # Active, as model cards count it: every tensor a token passes through, the input embedding
    # included. Read a step: the input embedding is a lookup unless the output head shares it.
    skip_p, skip_b = (embed_params, embed_bytes) if has_output else (0, 0)
    active_params = total_params - expert_params * (1 - frac)
    read_params = total_params - skip_p - expert_params * (1 - frac)
    active_bytes = total_bytes - skip_b - expert_bytes * (1 - frac)
    main_type = max(type_bytes, key=lambda k: type_bytes[k]) if type_bytes else None
    return geometry_from_gguf_kv(
        kv,
        source=str(p),
        parameters=float(total_params),
        weight_bytes=float(total_bytes),
        active_weight_bytes=float(active_bytes),
        active_parameters=float(active_params),
        read_parameters=float(read_params),
        expert_parameters=float(expert_params) or None,
        expert_weight_bytes=float(expert_bytes) or None,
        quantization=_file_type_label(kv) or main_type,
        tied=not has_output,
    )


# Bytes a value of each GGUF scalar type takes (gguf.GGUFValueType: UINT8 = 0 ... FLOAT64 = 12;
# STRING = 8 and ARRAY = 9 have lengths).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Unknown(Exception):
    """A value type this check does not know: gguf's reader will say what is wrong."""


def _check_lengths(p: Path) -> None:
    """Raise ``InputError`` when a length in the metadata points past the end of the file.

    gguf's reader trusts them: an array of numbers that claims more items than the file holds
    is read on past its end, one empty item at a time, and a corrupt count (2**60) never ends.
    Walking the lengths first takes a few hundredths of a second; what else is wrong with a
    file is left to the reader.
    """
    with p.open("rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # an empty file, or one that cannot be mapped
            return
    with data:
        size = len(data)
        if size < 24 or data[:4] != b"GGUF":
            return
        order = "<" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF else ">"

        def past_end(what: str) -> InputError:
            return InputError(
                f"cannot read GGUF file at {p}: {what} runs past the end of the file"
                f" ({size:,} bytes): truncated or corrupt"
            )

        def skip(off: int, vtype: int, what: str) -> int:
            """The offset after a value of type ``vtype`` at ``off``."""
            if vtype in _SCALAR_BYTES:
                end = off + _SCALAR_BYTES[vtype]
            elif vtype == _STRING:
                if off + 8 > size:
                    raise past_end(what)
                end = off + 8 + struct.unpack_from(order + "Q", data, off)[0]
            elif vtype == _ARRAY:
                if off + 12 > size:
                    raise past_end(what)
                itype, n = struct.unpack_from(order + "IQ", data, off)
                off += 12
                least = _SCALAR_BYTES.get(itype, 8 if itype == _STRING else 12)
                if n * least > size - off:
                    raise past_end(f"{what} ({n:,} items)")
                if itype in _SCALAR_BYTES:
                    return off + n * least
                for _ in range(n):
                    off = skip(off, itype, what)
                end = off
            else:
                raise _Unknown
            if end > size:
                raise past_end(what)
            return end

        def name_at(off: int, what: str) -> tuple[str, int]:
            """The string at ``off`` (cut to 80 bytes) and the offset after it."""
            end = skip(off, _STRING, what)
            return bytes(data[off + 8 : min(end, off + 88)]).decode("utf-8", "replace"), end

        # A count past the real one reads the tensor table or the weights as more entries: the
        # second entry read from zeros repeats the first one's (empty) name, which the reader
        # rejects too, but only after reading them all.
        n_tensors, n_kv = struct.unpack_from(order + "QQ", data, 8)
        off = 24
        keys: set[str] = set()
        try:
            for i in range(n_kv):
                key, off = name_at(off, f"metadata field {i + 1} of {n_kv:,}")
                if key in keys:
                    raise InputError(f"cannot read GGUF file at {p}: metadata key {key!r} appears"
                                     f" twice (field {i + 1} of {n_kv:,}): corrupt")
                keys.add(key)
                if off + 4 > size:
                    raise past_end(key)
                off = skip(off + 4, struct.unpack_from(order + "I", data, off)[0], key)
        except _Unknown:
            return
        names: set[str] = set()
        for i in range(n_tensors):
            name, off = name_at(off, f"tensor {i + 1} of {n_tensors:,}")
            if name in names:
                raise InputError(f"cannot read GGUF file at {p}: tensor name {name!r} appears"
                                 f" twice (tensor {i + 1} of {n_tensors:,}): corrupt")
            names.add(name)
            if off + 4 > size:
                raise past_end(f"tensor {name!r}")
            off += 4 + 8 * struct.unpack_from(order + "I", data, off)[0] + 4 + 8
            if off > size:
                raise past_end(f"tensor {name!r}")
