"""ModelGeometry from an Ollama ``/api/show`` response.

Ollama reports the GGUF metadata of the model under ``model_info`` (with the tokenizer arrays
left empty unless ``verbose``), and the quantization under ``details.quantization_level``.
Source: Ollama's API documentation, ``docs/api.md``, "Show Model Information".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdscope.errors import InputError
from pdscope.model.geometry import ModelGeometry
from pdscope.model.gguf_meta import geometry_from_gguf_kv


def geometry_from_ollama_show(response: Mapping[str, Any], model: str = "") -> ModelGeometry:
    """Build a geometry from the JSON of ``POST /api/show``."""
    info = response.get("model_info")
    if not isinstance(info, Mapping):
        raise InputError("the Ollama /api/show response has no model_info")
    details = response.get("details") if isinstance(response.get("details"), Mapping) else {}
    assert isinstance(details, Mapping)
    quant = details.get("quantization_level") or None
    geometry = geometry_from_gguf_kv(
        info,
        source=f"ollama /api/show {model}".strip(),
        quantization=str(quant) if quant else None,
        assumptions=("the input embedding is counted as read: Ollama does not say if it is tied",),
    )
    return geometry
