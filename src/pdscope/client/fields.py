"""The request fields a user adds to every request: sampling settings, server-specific body
fields, and headers (an auth header behind a proxy).

Where each goes (checked against each API's own reference):

* OpenAI-compatible APIs take ``temperature``, ``top_p`` and ``seed`` at the top of the body
  (OpenAI's API reference, "Create completion"; vLLM's ``CompletionRequest`` and
  ``ChatCompletionRequest`` in ``vllm/entrypoints/openai/protocol.py`` accept all three).
* Ollama's native API takes them in ``options`` (``ModelOptions`` in Ollama's
  ``docs/openapi.yaml``: ``seed``, ``temperature``, ``top_k``, ``top_p``, ``num_predict``, ...),
  and so does every other :attr:`RequestFields.options` entry.
* ``extra_body`` is merged last into the top of the body (an ``options`` object in it joins
  Ollama's ``options``): ``{"chat_template_kwargs": {"enable_thinking": false}}`` turns off a
  Qwen3 model's thinking on vLLM and SGLang.

What pdscope's measurement depends on is refused, never merged: the model, the input, the
stream and its usage, the output length and the fields that fix it (``ignore_eos``,
``min_tokens``, ...: :func:`pdscope.servers.fixed_output_fields`), and the headers that frame
the request. A header's value is a secret like the API key: it is left out of ``repr``, and
:meth:`RequestFields.to_json` (what a run folder records) writes ``<redacted>`` for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdscope.errors import Field, InputError
from pdscope.servers import FAMILIES

REDACTED = "<redacted>"

# The body fields the client sets itself (or that change what it reads back: ``n`` > 1 sends
# several answers in one stream, of which the client reads the first).
_CLIENT_FIELDS = frozenset({"model", "prompt", "messages", "stream", "stream_options",
                            "max_tokens", "max_completion_tokens", "n", "best_of"})
# Ollama's cap on the output: the client's max_tokens (pdscope.client.ollama).
_CLIENT_OPTIONS = frozenset({"num_predict"})
# Headers that frame the request: the client's JSON body and its streamed answer.
_CLIENT_HEADERS = frozenset({"content-type", "content-length", "accept", "accept-encoding",
                             "transfer-encoding", "host", "connection"})
# RFC 9110 section 5.6.2: a field name is a token.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _fixed_output_keys() -> frozenset[str]:
    """Every field a server family is sent to fix the output length."""
    return frozenset(k for fam in FAMILIES for k in fam.fixed_output(1))


REFUSED_FIELDS = _CLIENT_FIELDS | _fixed_output_keys()


def _canonical(value: Any, what: Field) -> Any:
    """``value`` as plain JSON (a deep copy): the body must serialise, and no caller's dict
    may change a frozen config afterwards."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InputError(what, f" is not plain JSON ({exc})") from None


@dataclass(frozen=True)
class RequestFields:
    """What a user adds to every request body and its headers. ``extra_body``: a JSON object
    merged into the body; ``headers``: ``(name, value)`` pairs (values never shown);
    ``temperature``, ``top_p``, ``seed``: sampling settings, ``None`` to leave the server's
    default; ``options``: ``(key, value)`` pairs for Ollama's ``options``. Each is checked when
    built; a field the measurement depends on is refused with the reason."""

    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.extra_body, Mapping):
            raise InputError(Field("extra_body"), " must be a JSON object, got"
                             f" {type(self.extra_body).__name__}")
        body = _canonical(dict(self.extra_body), Field("extra_body"))
        for key in sorted(body):
            if key in REFUSED_FIELDS:
                raise InputError(Field("extra_body"), f" cannot set {key!r}: pdscope sets it"
                                 " itself, and its measurement depends on it")
        nested = body.get("options")
        if isinstance(nested, Mapping):
            for key in sorted(nested):
                if key in _CLIENT_OPTIONS:
                    raise InputError(Field("extra_body"), f" cannot set options.{key}: it is"
                                     " the output length pdscope asks for")
        object.__setattr__(self, "extra_body", body)
        seen: set[str] = set()
        for name, value in self.headers:
            self._check_header(name, value, seen)
        if self.temperature is not None:
            t = self.temperature
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not (
                    math.isfinite(t) and t >= 0):
                raise InputError(Field("temperature"), f" must be a number of at least 0,"
                                 f" got {t!r}")
        if self.top_p is not None:
            p = self.top_p
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
                raise InputError(Field("top_p"), f" must be above 0 and at most 1, got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise InputError(Field("sampling_seed"), f" must be a whole number, got"
                             f" {self.seed!r}")
        keys: set[str] = set()
        for key, value in self.options:
            if not isinstance(key, str) or not key.strip():
                raise InputError(Field("options"), f": an option needs a name, got {key!r}")
            if key in _CLIENT_OPTIONS:
                raise InputError(Field("options"), f" cannot set {key}: it is the output"
                                 " length pdscope asks for")
            if key in keys:
                raise InputError(Field("options"), f" names {key} twice")
            keys.add(key)
            _canonical(value, Field("options"))

    def __hash__(self) -> int:  # a frozen config's field: hashable though it holds a dict
        return hash((json.dumps(self.extra_body, sort_keys=True), self.headers,
                     self.temperature, self.top_p, self.seed,
                     json.dumps(dict(self.options), sort_keys=True)))

    @staticmethod
    def _check_header(name: str, value: str, seen: set[str]) -> None:
        # The value is never named: it may be a secret.
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise InputError(Field("headers"), f": {name!r} is not a header name")
        if not isinstance(value, str) or not value.strip():
            raise InputError(Field("headers"), f": {name} has no value")
        if any(c in value for c in "\r\n\0"):
            raise InputError(Field("headers"), f": the value of {name} holds a line break")
        lower = name.lower()
        if lower in _CLIENT_HEADERS:
            raise InputError(Field("headers"), f" cannot set {name}: pdscope sets it for the"
                             " streamed request it reads")
        if lower in seen:
            raise InputError(Field("headers"), f" names {name} twice")
        seen.add(lower)

    @property
    def empty(self) -> bool:
        return not (self.extra_body or self.headers or self.options) and (
            self.temperature is None and self.top_p is None and self.seed is None)

    def header_map(self) -> dict[str, str]:
        """The headers to send, by name."""
        return dict(self.headers)

    def has_header(self, name: str) -> bool:
        return any(n.lower() == name.lower() for n, _ in self.headers)

    def secrets(self) -> tuple[str, ...]:
        """The header values: never to appear in what pdscope prints or writes."""
        return tuple(v for _, v in self.headers)

    def sampling(self) -> dict[str, Any]:
        """``temperature``, ``top_p`` and ``seed`` where given."""
        out: dict[str, Any] = {}
        for name in ("temperature", "top_p", "seed"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def openai_body(self) -> dict[str, Any]:
        """The fields to merge into an OpenAI-compatible body. ``options`` are Ollama's and
        are refused by :meth:`check_api` before a request is built."""
        return {**self.sampling(), **self.extra_body}

    def ollama_options(self) -> dict[str, Any]:
        """Ollama's ``options`` of these fields: the sampling settings, then :attr:`options`."""
        return {**self.sampling(), **dict(self.options)}

    def check_api(self, api: str) -> None:
        """Ollama's ``options`` go to Ollama's native API only: on another, refused."""
        if self.options and not api.startswith("ollama"):
            raise InputError("Ollama's options (", Field("options"), ") go to its native API"
                             f" only; the API is {api}: put an OpenAI-compatible server's"
                             " fields in ", Field("extra_body"))

    def to_json(self) -> dict[str, Any]:
        """What a run records: every field, each header's value ``<redacted>``."""
        return {"extra_body": dict(self.extra_body),
                "headers": {name: REDACTED for name, _ in self.headers},
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "options": dict(self.options)}

    @classmethod
    def from_json(cls, d: Any) -> RequestFields:
        """The fields as :meth:`to_json` wrote them (header values stay redacted)."""
        if not isinstance(d, Mapping):
            raise InputError("request fields are not a JSON object")
        headers = d.get("headers") or {}
        options = d.get("options") or {}
        if not isinstance(headers, Mapping) or not isinstance(options, Mapping):
            raise InputError("request fields: headers and options must be JSON objects")
        return cls(extra_body=d.get("extra_body") or {},
                   headers=tuple((str(k), str(v)) for k, v in headers.items()),
                   temperature=d.get("temperature"), top_p=d.get("top_p"), seed=d.get("seed"),
                   options=tuple(options.items()))


def redact_all(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, "***")
    return text


__all__ = ["REDACTED", "REFUSED_FIELDS", "RequestFields", "redact_all"]
