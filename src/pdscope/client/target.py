"""Where a request goes and how: the server, its API, the model, and the key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlparse

from pdscope.client.fields import RequestFields
from pdscope.errors import InputError
from pdscope.servers import ServerKind

Api = Literal["openai", "openai-chat", "ollama", "ollama-chat"]
APIS: tuple[Api, ...] = ("openai", "openai-chat", "ollama", "ollama-chat")


def root_url(base_url: str) -> str:
    """The server's root: ``http://h:8000/v1/`` and ``http://h:8000`` both give ``http://h:8000``."""
    url = base_url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise InputError(f"not an http(s) URL: {base_url!r} (give e.g. http://127.0.0.1:8000)")
    return url


def is_loopback(url: str) -> bool:
    """The URL names this machine (127.0.0.0/8, ``::1``, ``localhost``)."""
    host = urlparse(url if "://" in url else "http://" + url).hostname or ""
    return host in {"localhost", "127.0.0.1", "::1"} or host.startswith("127.")


def prompt_fields(
    chat: bool, prompt: str | None, messages: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The part of a request body that carries the input, the same on OpenAI's and Ollama's
    APIs: ``messages`` for a chat API (the prompt as one user message when none are given),
    else ``prompt``."""
    if not chat:
        return {"prompt": prompt or ""}
    if messages is None:
        messages = [{"role": "user", "content": prompt or ""}]
    return {"messages": [dict(m) for m in messages]}


@dataclass(frozen=True)
class Target:
    """A server endpoint to measure.

    ``server_kind`` (from :func:`pdscope.client.detect_server`, or ``None``) chooses, through its
    :class:`~pdscope.servers.ServerFamily`, the extra request fields a server accepts: with
    ``fixed_output`` the client asks for exactly ``max_tokens`` tokens where the server has a way
    to (``ignore_eos`` / ``min_tokens``), so decode is measured over a known length.
    ``fields`` are the user's request fields (:class:`RequestFields`: sampling, body fields,
    headers), checked against what the measurement depends on; ``extra_body`` is merged into
    every request body last, to add or override fields (a library caller's, unchecked).

    ``api_key`` is sent as ``Authorization: Bearer``; it is left out of ``repr`` and never
    written into a record or an error message.
    """

    base_url: str
    api: Api = "openai"
    model: str = ""
    api_key: str | None = field(default=None, repr=False)
    extra_body: Mapping[str, Any] | None = None
    fixed_output: bool = False
    server_kind: ServerKind | None = None
    fields: RequestFields = field(default_factory=RequestFields)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise InputError(f"unknown API {self.api!r}: use one of {', '.join(APIS)}")
        self.fields.check_api(self.api)
        object.__setattr__(self, "base_url", root_url(self.base_url))
