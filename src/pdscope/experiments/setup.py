"""What a measurement is set beside: the model's geometry and the device, found automatically
where the server tells (or where it runs on this machine), else from the user's flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from pdscope.client import ServerInfo
from pdscope.client.session import get_json
from pdscope.errors import PdscopeError
from pdscope.hardware import DeviceSpec, detect_local_device, find_device
from pdscope.model import ModelGeometry, geometry_from_ollama_show, load_model


def resolve_device(device: str | None, server_is_local: bool) -> DeviceSpec | None:
    """``--device`` if given (``local`` measures this machine); a server on this machine is
    measured here by default; otherwise unknown."""
    if device:
        if device.strip().lower() == "local":
            return detect_local_device(probe_cpu=True)
        return find_device(device)
    if server_is_local:
        return detect_local_device(probe_cpu=True)
    return None


def _local_model_path(path: Any) -> Path | None:
    if isinstance(path, str) and path:
        p = Path(path)
        if p.exists():
            return p
    return None


async def resolve_model(
    info: ServerInfo,
    session: aiohttp.ClientSession,
    model_name: str,
    model_config: str | None,
    *,
    server_is_local: bool,
    api_key: str | None = None,
) -> tuple[ModelGeometry | None, str | None]:
    """The served model's geometry and where it came from, or ``(None, reason)``.

    In order: ``--model-config``; Ollama's ``/api/show``; for a server on this machine, the
    model folder vLLM names in ``/v1/models`` (``root``) or the file llama.cpp names in
    ``/props`` (``model_path``); a lab server recorded by ``pdscope lab start``."""
    if model_config:
        return load_model(model_config), model_config
    root = info.base_url
    if info.kind == "ollama":
        show = await get_json(session, root + "/api/show", api_key=api_key, method="POST",
                              payload={"model": model_name})
        if isinstance(show, dict) and isinstance(show.get("model_info"), dict):
            return geometry_from_ollama_show(show, model_name), "ollama /api/show"
        return None, "Ollama's /api/show gave no model_info"
    if not server_is_local:
        return None, "the server is remote: give --model-config"
    candidates: list[Path] = []
    models = await get_json(session, root + "/v1/models", api_key=api_key)
    if isinstance(models, dict):
        for m in models.get("data") or []:
            if isinstance(m, dict) and m.get("id") == model_name:
                p = _local_model_path(m.get("root"))
                if p is not None:
                    candidates.append(p)
    if info.kind == "llama.cpp":
        props = await get_json(session, root + "/props", api_key=api_key)
        if isinstance(props, dict):
            p = _local_model_path(props.get("model_path"))
            if p is not None:
                candidates.append(p)
    from pdscope import lab

    port = int(root.rsplit(":", 1)[1]) if root.count(":") == 2 else None
    for server in lab.recorded():
        if server.port == port and server.alive():
            candidates.append(lab.model_path_for(lab.get_engine(server.engine)))
    for path in candidates:
        try:
            return load_model(path), str(path)
        except PdscopeError:
            continue
    return None, "the model's files are not known: give --model-config"
