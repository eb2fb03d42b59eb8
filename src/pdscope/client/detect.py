"""Which server is this? Its kind, models, version, tokenizer endpoint and metrics.

Each server family (:mod:`pdscope.servers`) lists the GET paths whose answers recognise it; they
are all asked at once, with ``/metrics`` and ``/v1/models``, and the families read the answers in
their detection order (the most specific first). A family that needs a POST to be recognised
(llama-cpp-python) is asked only when no GET answer was recognised. Anything else that answers
is ``openai`` (generic). What each family's answers look like, and where that was checked, is in
its module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from pdscope.client.fields import RequestFields
from pdscope.client.session import connect_reason, get_json, get_text
from pdscope.client.target import Api, Target, root_url
from pdscope.errors import Field, RunError
from pdscope.servers import FAMILIES, GENERIC, Answers, Detected, ServerFamily, ServerKind, family
from pdscope.servers.family import METRICS_PATH, MODELS_PATH


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

    @property
    def family(self) -> ServerFamily:
        """Everything pdscope knows about this kind of server."""
        return family(self.kind)

    def target(
        self,
        model: str | None = None,
        api: Api | None = None,
        api_key: str | None = None,
        fixed_output: bool = False,
        fields: RequestFields | None = None,
    ) -> Target:
        """A :class:`Target` on this server: its first model and default API unless given."""
        return Target(
            base_url=self.base_url,
            api=api or self.api_default,
            model=model or (self.models[0] if self.models else ""),
            api_key=api_key,
            fixed_output=fixed_output,
            server_kind=self.kind,
            fields=fields or RequestFields(),
        )


def _openai_models(data: Any) -> tuple[str, ...]:
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return tuple(str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m)
    return ()


def _is_prometheus(text: Any) -> bool:
    return isinstance(text, str) and ("# TYPE " in text or "# HELP " in text)


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

    paths = list(dict.fromkeys([MODELS_PATH, *(p for f in FAMILIES for p in f.probes)]))
    results = await asyncio.gather(
        get_text(session, root + METRICS_PATH, api_key=api_key, timeout=timeout),
        *(ask(p) for p in paths),
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
    answers: dict[str, Any] = {
        path: r for path, r in zip([METRICS_PATH, *paths], results, strict=True)
        if r is not None and not isinstance(r, BaseException)
    }
    found, detected = _recognise(answers)
    if found is None:
        for candidate in FAMILIES:
            if candidate.confirm is not None:
                answers[candidate.confirm.path] = await get_json(
                    session, root + candidate.confirm.path, api_key=api_key, timeout=timeout,
                    method="POST", payload=dict(candidate.confirm.payload))
        found, detected = _recognise(answers, confirmed=True)
    assert found is not None and detected is not None  # the generic family takes anything
    listed: tuple[str, ...] = ()
    if found.models_path and found.models_from:
        listed = found.models_from(await ask(found.models_path))
    return ServerInfo(
        base_url=root,
        kind=found.name,
        models=listed or _openai_models(answers.get(MODELS_PATH)) or detected.models,
        version=detected.version,
        api_default=found.api_default,
        tokenize_endpoint=found.tokenizer.tokenize_path if found.tokenizer else None,
        metrics=_is_prometheus(answers.get(METRICS_PATH)),
    )


def _recognise(answers: Answers, confirmed: bool = False
               ) -> tuple[ServerFamily | None, Detected | None]:
    """The first family that recognises the answers. The generic family, which takes anything,
    only once the families that need a POST (``confirm``) have been asked."""
    for candidate in FAMILIES:
        if candidate is GENERIC and not confirmed:
            continue
        detected = candidate.recognise(answers)
        if detected is not None:
            return candidate, detected
    return None, None


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


# Seconds a tokenizer call may take. Not a detection probe (5 s): every prompt is built with
# it, and a server busy with 16 streams on two cores was seen to answer one after more than 5 s.
TOKENIZE_TIMEOUT_S = 30.0


async def _post(
    info: ServerInfo, session: aiohttp.ClientSession, path: str, payload: dict[str, Any],
    api_key: str | None,
) -> Any:
    try:
        return await get_json(
            session, info.base_url + path, api_key=api_key, method="POST", payload=payload,
            timeout=TOKENIZE_TIMEOUT_S,
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
    tokenizer = info.family.tokenizer
    if tokenizer is None:
        return None
    model = model or (info.models[0] if info.models else None)
    data = await _post(info, session, tokenizer.tokenize_path,
                       tokenizer.tokenize_body(text, model), api_key)
    return _token_ids(data.get("tokens")) if isinstance(data, dict) else None


async def detokenize(
    info: ServerInfo,
    session: aiohttp.ClientSession,
    tokens: Sequence[int],
    api_key: str | None = None,
    model: str | None = None,
) -> str | None:
    """The text of ``tokens`` by the server's tokenizer; ``None`` where it has no endpoint."""
    tokenizer = info.family.tokenizer
    if tokenizer is None or tokenizer.detokenize_path is None \
            or tokenizer.detokenize_body is None:
        return None
    model = model or (info.models[0] if info.models else None)
    data = await _post(info, session, tokenizer.detokenize_path,
                       tokenizer.detokenize_body(tokens, model), api_key)
    value = data.get(tokenizer.text_key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def choose_target(
    info: ServerInfo,
    *,
    model: str | None = None,
    api: str = "auto",
    api_key: str | None = None,
    fixed_output: bool = True,
    fields: RequestFields | None = None,
) -> Target:
    """The :class:`Target` on a detected server, after checking that it serves ``model`` (or
    any model at all), with the user's request ``fields``. Raises :class:`RunError` (one
    line), :class:`InputError` for Ollama ``options`` on another API."""
    if model and info.models and model not in info.models:
        served = ", ".join(info.models[:8])
        raise RunError(f"model {model!r} is not served at {info.base_url} (it serves:"
                       f" {served}); pass one of those as the ", Field("model"))
    if not model and not info.models:
        raise RunError(f"{info.base_url} lists no models: name one as the ", Field("model"))
    chosen = None if api == "auto" else api
    return info.target(model=model, api=chosen,  # type: ignore[arg-type]
                       api_key=api_key, fixed_output=fixed_output, fields=fields)


async def resolve_target(
    url: str,
    session: aiohttp.ClientSession,
    *,
    model: str | None = None,
    api: str = "auto",
    api_key: str | None = None,
    fixed_output: bool = True,
) -> tuple[ServerInfo, Target]:
    """Detect the server at ``url`` and choose the :class:`Target` every request goes to."""
    info = await detect_server(url, session, api_key=api_key)
    return info, choose_target(info, model=model, api=api, api_key=api_key,
                               fixed_output=fixed_output)


def token_counter(
    info: ServerInfo, session: aiohttp.ClientSession, target: Target
) -> Callable[[str], Awaitable[int]] | None:
    """The server's own tokenizer as a count of tokens, or ``None`` when it has none."""
    if info.family.tokenizer is None:
        return None

    async def count(text: str) -> int:
        ids = await tokenize(info, session, text, api_key=target.api_key, model=target.model)
        if ids is None:
            raise RunError(f"{info.base_url}{info.tokenize_endpoint} did not tokenize (an error,"
                           f" or no answer in {TOKENIZE_TIMEOUT_S:g} s)")
        return len(ids)

    return count
