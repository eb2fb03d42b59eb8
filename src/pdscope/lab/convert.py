"""Convert the bundled GGUF to a Hugging Face folder that vLLM can load.

vLLM loads safetensors, not this GGUF. transformers can read the GGUF (dequantizing it), but
refuses to save a model it loaded that way, so the weights are copied into a plain
``LlamaForCausalLM`` of the same config and saved with the tokenizer. Run as a subprocess
(``python -m pdscope.lab.convert GGUF OUT``): it imports torch, which the rest of pdscope does
not need.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def convert(gguf: Path, out: Path, dtype_name: str = "bfloat16") -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    plain: Any = LlamaForCausalLM(LlamaConfig.from_dict(config))
    plain = plain.to(dtype)
    result = plain.load_state_dict(loaded.state_dict(), strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise SystemExit(f"weights did not match: {result}")
    tmp = out.with_name(out.name + ".partial")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4])
