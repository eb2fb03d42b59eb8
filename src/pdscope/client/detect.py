"""Which server is this? Its kind, models, version, tokenizer endpoint and metrics.

Each family answers a question the others do not (a 404 elsewhere). The questions, and where
each answer's shape was checked:

* Ollama: ``GET /api/version`` → ``{"version": ...}``, models from ``GET /api/tags``
  (ollama/ollama ``docs/api.md``).
* llama.cpp server: ``GET /props`` → ``default_generation_settings``, ``build_info``, ...
  (ggml-org/llama.cpp ``tools/server/README.md``). Tokenizer ``POST /tokenize``
  ``{"content": ...}`` → ``{"tokens": [...]}``; ``POST /detokenize`` ``{"tokens": [...]}``.
* llama-cpp-python (``python -m llama_cpp.server``): ``POST /extras/tokenize``
  ``{"input": ..., "model": ...}`` → ``{"tokens": [...]}``; ``/extras/tokenize/count`` →
  ``{"count": n}``; ``/extras/detokenize`` ``{"tokens": [...]}`` → ``{"text": ...}``
  (abetlen/llama-cpp-python ``llama_cpp/server/app.py`` and ``types.py``). It has no
  ``/props``, ``/version`` or ``/metrics``.
* vLLM: ``vllm:`` names on ``GET /metrics``, version from ``GET /version``. Tokenizer
  ``POST /tokenize`` ``{"model", "prompt"}`` → ``{"count", "max_model_len", "tokens"}``;
  ``POST /detokenize`` ``{"model", "tokens"}`` → ``{"prompt"}`` (vllm-project/vllm
  ``vllm/entrypoints/openai/protocol.py``, ``TokenizeResponse`` / ``DetokenizeResponse``).
* SGLang: ``GET /get_server_info`` (a deprecated alias of ``/server_info`` in newer releases):
  its server arguments (``model_path``, ``tokenizer_path``, ...) and ``version`` (sgl-project/
  sglang's HTTP server, ``get_server_info``), or ``sglang:`` names on ``/metrics``.
* TGI: ``GET /info`` → ``model_id``, ``version``, ... (huggingface/text-generation-inference;
  not checked against its source here).
* pdscope's reference server (:mod:`pdscope.selftest.server`): kind ``pdscope-reference``, from
  ``GET /version`` → ``{"server": "pdscope-reference", ...}``. It speaks vLLM's tokenizer API.
* Anything else that lists models on ``GET /v1/models`` is ``openai`` (generic).

Models come from ``/v1/models`` (``data[].id``), or ``/api/tags`` for Ollama.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from pdscope.client.record import Api
from pdscope.client.session import connect_reason, get_json, get_text
from pdscope.client.target import Target, root_url
from pdscope.errors import RunError

ServerKind = Literal[
    "ollama",
    "vllm",
    "sglang",
    "tgi",
    "llama.cpp",
    "llama-cpp-python",
    "pdscope-reference",
    "openai",
]

REFERENCE_KIND: ServerKind = "pdscope-reference"

_TOKENIZE: dict[str, str] = {
    "vllm": "/tokenize",
    "pdscope-reference": "/tokenize",
    "llama.cpp": "/tokenize",
    "llama-cpp-python": "/extras/tokenize",
}
_DETOKENIZE: dict[str, str] = {
    "vllm": "/detokenize",
    "llama.cpp": "/detokenize",
    "llama-cpp-python": "/extras/detokenize",
}


@dataclass(frozen=True)
class ServerInfo:
    """What :func:`detect_server` found. ``metrics``: ``/metrics`` answers Prometheus text.
    ``tokenize_endpoint``: the path of its tokenizer, ``None`` when it has none (Ollama)."""

    base_url: str
    kind: ServerKind
    models: tuple[str, ...]
    version: str | None
    api_default: Api
    tokenize_endpoint: str | None
    metrics: bool

    def target(
        self,
        model: str | None = None,
        api: Api | None = None,
        api_key: str | None = None,
        fixed_output: bool = False,
    ) -> Target:
        """A :class:`Target` on this server: its first model and default API unless given."""
        return Target(
            base_url=self.base_url,
            api=api or self.api_default,
            model=model or (self.models[0] if self.models else ""),
            api_key=api_key,
            fixed_output=fixed_output,
            server_kind=self.kind,
        )


def _str(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, int, float)) and value != "" else None


def _openai_models(data: Any) -> tuple[str, ...]:
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return tuple(str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m)
    return ()


def _ollama_models(data: Any) -> tuple[str, ...]:
    if isinstance(data, dict) and isinstance(data.get("models"), list):
        return tuple(
            str(m.get("name") or m.get("model"))
            for m in data["models"]
            if isinstance(m, dict) and (m.get("name") or m.get("model"))
        )
    return ()


def _is_prometheus(text: str | None) -> bool:
    return bool(text) and ("# TYPE " in text or "# HELP " in text)  # type: ignore[operator]


async def detect_server(
    base_url: str,
    session: aiohttp.ClientSession,
    api_key: str | None = None,
    timeout: float = 5.0,
) -> ServerInfo:
    """Ask the server at ``base_url`` what it is. Raises :class:`~pdscope.errors.RunError`
    when nothing answers there."""
    root = root_url(base_url)

    async def ask(path: str) -> Any:
        return await get_json(session, root + path, api_key=api_key, timeout=timeout)

    results = await asyncio.gather(
        ask("/api/version"),
        ask("/props"),
        ask("/version"),
        get_text(session, root + "/metrics", api_key=api_key, timeout=timeout),
        ask("/v1/models"),
        ask("/get_server_info"),
        ask("/info"),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if len(errors) == len(results):
        first = errors[0]
        if isinstance(first, aiohttp.ClientConnectorError):
            raise RunError(f"cannot connect to {root}: {connect_reason(first)}"
                           " (is the server running?)")
        raise RunError(f"no answer from {root}: {type(first).__name__}: {first}")
    for r in errors:
        if not isinstance(r, aiohttp.ClientConnectorError):
            raise r
    api_version, props, version, metrics_text, v1_models, sgl_info, tgi_info = (
        None if isinstance(r, BaseException) else r for r in results
    )
    metrics_ok = _is_prometheus(metrics_text)
    metrics_text = metrics_text or ""
    models = _openai_models(v1_models)
    kind: ServerKind = "openai"
    ver: str | None = None
    if isinstance(version, dict) and version.get("server") == REFERENCE_KIND:
        kind, ver = REFERENCE_KIND, _str(version.get("version"))
    elif isinstance(api_version, dict) and "version" in api_version:
        kind, ver = "ollama", _str(api_version.get("version"))
        tags = await ask("/api/tags")
        models = _ollama_models(tags) or models
    elif isinstance(props, dict) and "default_generation_settings" in props:
        kind, ver = "llama.cpp", _str(props.get("build_info"))
    elif "vllm:" in metrics_text:
        kind = "vllm"
        ver = _str(version.get("version")) if isinstance(version, dict) else None
    elif "sglang:" in metrics_text or (
        isinstance(sgl_info, dict) and ("model_path" in sgl_info or "tokenizer_path" in sgl_info)
    ):
        kind = "sglang"
        if not isinstance(sgl_info, dict):
            sgl_info = await ask("/server_info")
        ver = _str(sgl_info.get("version")) if isinstance(sgl_info, dict) else None
    elif isinstance(tgi_info, dict) and "model_id" in tgi_info:
        kind, ver = "tgi", _str(tgi_info.get("version"))
        models = models or (str(tgi_info["model_id"]),)
    else:
        probe = await get_json(
            session,
            root + "/extras/tokenize",
            api_key=api_key,
            timeout=timeout,
            method="POST",
            payload={"input": "hello"},
        )
        if isinstance(probe, dict) and isinstance(probe.get("tokens"), list):
            kind = "llama-cpp-python"
    return ServerInfo(
        base_url=root,
        kind=kind,
        models=models,
        version=ver,
        api_default="ollama" if kind == "ollama" else "openai",
        tokenize_endpoint=_TOKENIZE.get(kind),
        metrics=metrics_ok,
    )


def _token_ids(tokens: Any) -> list[int] | None:
    if not isinstance(tokens, list):
        return None
    out: list[int] = []
    for t in tokens:
        if isinstance(t, dict):  # llama.cpp with_pieces: {"id": ..., "piece": ...}
            t = t.get("id")
        if not isinstance(t, int) or isinstance(t, bool):
            return None
        out.append(t)
    return out


async def _post(
    info: ServerInfo, session: aiohttp.ClientSession, path: str, payload: dict[str, Any],
    api_key: str | None,
) -> Any:
    try:
        return await get_json(
            session, info.base_url + path, api_key=api_key, method="POST", payload=payload
        )
    except aiohttp.ClientConnectorError as exc:
        raise RunError(f"cannot connect to {info.base_url}: {connect_reason(exc)}") from None


async def tokenize(
    info: ServerInfo,
    session: aiohttp.ClientSession,
    text: str,
    api_key: str | None = None,
    model: str | None = None,
) -> list[int] | None:
    """The server's own token ids for ``text``, special tokens (BOS) included as a completion
    request would have them; ``None`` when the server has no tokenizer endpoint (Ollama)."""
    if info.tokenize_endpoint is None:
        return None
    model = model or (info.models[0] if info.models else None)
    payload: dict[str, Any]
    if info.kind == "llama.cpp":
        payload = {"content": text, "add_special": True}
    elif info.kind == "llama-cpp-python":
        payload = {"input": text, "model": model}
    else:
        payload = {"model": model, "prompt": text}
    data = await _post(info, session, info.tokenize_endpoint, payload, api_key)
    return _token_ids(data.get("tokens")) if isinstance(data, dict) else None


async def detokenize(
    info: ServerInfo,
    session: aiohttp.ClientSession,
    tokens: Sequence[int],
    api_key: str | None = None,
    model: str | None = None,
) -> str | None:
    """The text of ``tokens`` by the server's tokenizer; ``None`` where it has no endpoint."""
    endpoint = _DETOKENIZE.get(info.kind)
    if endpoint is None:
        return None
    model = model or (info.models[0] if info.models else None)
    payload: dict[str, Any] = {"tokens": list(tokens)}
    if info.kind == "vllm":
        payload["model"] = model
    data = await _post(info, session, endpoint, payload, api_key)
    if not isinstance(data, dict):
        return None
    key = {"vllm": "prompt", "llama.cpp": "content", "llama-cpp-python": "text"}[info.kind]
    value = data.get(key)
    return value if isinstance(value, str) else None


async def resolve_target(
    url: str,
    session: aiohttp.ClientSession,
    *,
    model: str | None = None,
    api: str = "auto",
    api_key: str | None = None,
    fixed_output: bool = True,
) -> tuple[ServerInfo, Target]:
    """Detect the server at ``url``, check that it serves ``model`` (or any model at all), and
    the :class:`Target` every experiment sends to. Raises :class:`RunError` (one line)."""
    info = await detect_server(url, session, api_key=api_key)
    if model and info.models and model not in info.models:
        served = ", ".join(info.models[:8])
        raise RunError(f"model {model!r} is not served at {info.base_url} (it serves:"
                       f" {served}); pass one of those with --model")
    if not model and not info.models:
        raise RunError(f"{info.base_url} lists no models: name one with --model")
    chosen = None if api == "auto" else api
    target = info.target(model=model, api=chosen,  # type: ignore[arg-type]
                         api_key=api_key, fixed_output=fixed_output)
    return info, target


def token_counter(
    info: ServerInfo, session: aiohttp.ClientSession, target: Target
) -> Callable[[str], Awaitable[int]] | None:
    """The server's own tokenizer as a count of tokens, or ``None`` when it has none."""
    if info.tokenize_endpoint is None:
        return None

    async def count(text: str) -> int:
        ids = await tokenize(info, session, text, api_key=target.api_key, model=target.model)
        if ids is None:
            raise RunError(f"{info.base_url}{info.tokenize_endpoint} did not tokenize")
        return len(ids)

    return count
