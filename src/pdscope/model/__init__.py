"""Model geometry from any source the user has at hand."""

from __future__ import annotations

from pathlib import Path

from pdscope.errors import InputError
from pdscope.model.geometry import ModelGeometry, dtype_bytes, from_parameter_count
from pdscope.model.gguf_meta import load_gguf, quant_bits
from pdscope.model.hf_config import geometry_from_hf_config, load_hf_config
from pdscope.model.ollama_show import geometry_from_ollama_show

__all__ = [
    "ModelGeometry",
    "dtype_bytes",
    "from_parameter_count",
    "geometry_from_hf_config",
    "geometry_from_ollama_show",
    "load_gguf",
    "load_hf_config",
    "load_model",
    "quant_bits",
]


def load_model(path: str | Path) -> ModelGeometry:
    """A model from a path: a ``.gguf`` file, a ``config.json``, or a folder holding either."""
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").exists():
            return load_hf_config(p)
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0])
        raise InputError(f"cannot find config.json or a single .gguf file in {p}")
    if not p.exists():
        raise InputError(f"cannot read model at {path}: no such file")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return load_gguf(p)
    return load_hf_config(p)
