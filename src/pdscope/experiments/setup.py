"""What a measurement is set beside: the model's geometry and the device, found automatically
where the server tells (or where it runs on this machine), else from the user's flags; and the
server's own settings, as far as it tells them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from pdscope import lab
from pdscope.client import ServerInfo
from pdscope.client.session import get_json
from pdscope.errors import Field, Note, PdscopeError
from pdscope.hardware import DeviceSpec, detect_local_device, find_device, prefill_shapes
from pdscope.metrics import scrape
from pdscope.model import ModelGeometry, geometry_from_ollama_show, load_model
from pdscope.servers import ServerSettings
from pdscope.servers.family import MODELS_PATH


def resolve_device(
    device: str | None, server_is_local: bool, model: ModelGeometry | None = None
) -> DeviceSpec | None:
    """``--device`` if given (``local`` measures this machine); a server on this machine is
    measured here by default; otherwise unknown. A CPU's FLOPS are measured on the shapes of
    ``model``'s prefill step where it is known (tokens x hidden by hidden x hidden and x
    intermediate), as the server multiplies."""
    shapes = prefill_shapes(model.hidden_size if model else None,
                            model.intermediate_size if model else None)
    if device:
        if device.strip().lower() == "local":
            return detect_local_device(probe_cpu=True, matmul_shapes=shapes)
        return find_device(device)
    if server_is_local:
        return detect_local_device(probe_cpu=True, matmul_shapes=shapes)
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

    In order: ``--model-config``; what the server describes (Ollama's ``/api/show``); for a
    server on this machine, the model files it names (vLLM's ``root`` in ``/v1/models``,
    llama.cpp's ``model_path`` in ``/props``); a lab server recorded by ``pdscope lab start``."""
    if model_config:
        return load_model(model_config), model_config
    root = info.base_url
    family = info.family
    if family.model_info_path is not None:
        show = await get_json(session, root + family.model_info_path, api_key=api_key,
                              method="POST", payload={"model": model_name})
        if isinstance(show, dict) and isinstance(show.get("model_info"), dict):
            return (geometry_from_ollama_show(show, model_name),
                    f"{family.name} {family.model_info_path}")
        return None, f"{family.display}'s {family.model_info_path} gave no model_info"
    if not server_is_local:
        return None, Note("the server is remote: give ", Field("model_config"))
    answers: dict[str, Any] = {}
    for endpoint in (MODELS_PATH, *family.settings_paths):
        answers[endpoint] = await get_json(session, root + endpoint, api_key=api_key)
    candidates: list[Path] = [
        p for p in map(_local_model_path, family.model_paths(answers, model_name)) if p is not None
    ]
    port = int(root.rsplit(":", 1)[1]) if root.count(":") == 2 else None
    for server in lab.recorded():
        if server.port == port and server.alive():
            candidates.append(lab.model_path_for(lab.get_engine(server.engine)))
    for path in candidates:
        try:
            return load_model(path), str(path)
        except PdscopeError:
            continue
    return None, Note("the model's files are not known: give ", Field("model_config"))


async def read_settings(
    info: ServerInfo,
    session: aiohttp.ClientSession,
    flags: Sequence[str] = (),
    api_key: str | None = None,
) -> ServerSettings:
    """What the server says of its scheduling settings (its family's settings endpoints, and the
    labels of its ``cache_config_info`` gauge on ``/metrics``), with its command-line ``flags``
    where pdscope knows them (a lab server records them)."""
    family = info.family
    answers: dict[str, Any] = {}
    for path in family.settings_paths:
        answers[path] = await get_json(session, info.base_url + path, api_key=api_key)
    labels = None
    names = family.metric_map.names("cache_config_info") if family.metric_map else ()
    if info.metrics and names:
        try:
            labels = (await scrape(info.base_url, session)).info(names)
        except PdscopeError:
            labels = None
    return family.read_settings(answers, labels, flags)


def lab_flags(url: str) -> tuple[str, ...]:
    """The engine flags a running lab server at ``url`` was started with, the lab's own
    included (``()`` otherwise)."""
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for server in lab.recorded():
        if str(server.port) == port and server.alive():
            return tuple(lab.ENGINES[server.engine].flags(server.extra_args))
    return ()
