"""What went wrong with a request, in words a person can act on.

A failed request is a :class:`~pdscope.client.record.RequestRecord` with ``error_kind`` and a
one-line ``error``; load tests count those. :func:`raise_for_record` turns one into a
:class:`~pdscope.errors.RunError` for commands that make a single request (``probe``).

The model-not-found bodies are the servers' own words:

* vLLM answers 404 ``The model `x` does not exist.`` (vllm-project/vllm
  ``vllm/entrypoints/openai/serving_engine.py``, ``_check_model``, type ``NotFoundError``);
* Ollama answers 404 ``{"error": "model 'x' not found"}`` or ``model "x" not found, try pulling it
  first`` (ollama/ollama ``server/routes.go``, ``GenerateHandler`` and ``handleScheduleError``).
"""

from __future__ import annotations

import json
import re

from pdscope.client.record import ErrorKind, RequestRecord
from pdscope.errors import RunError

_MODEL_NOT_FOUND = re.compile(
    r"model\b.*\b(does not exist|not found)|model_not_found|no such model|unknown model",
    re.IGNORECASE,
)

# What to do about each kind, appended to the one-line message by raise_for_record.
HINTS: dict[str, str] = {
    "connect": "is the server running, and is the URL right?",
    "auth": "give the server's key with --api-key or OPENAI_API_KEY",
    "model_not_found": "name one of the models the server lists (pdscope detect URL)",
    "http_429": "the server is rate-limiting: lower the request rate or concurrency",
    "timeout_connect": "the host did not accept a connection in time",
    "timeout_first_token": "the server may be overloaded or the prompt too long; raise the"
    " first-token timeout to wait longer",
    "timeout_between_tokens": "the server stopped sending tokens mid-stream",
    "timeout_total": "the request ran past the total timeout",
    "stream_broken": "the server closed the stream before its end marker",
    "bad_chunk": "the server sent a chunk that is not JSON: is this the right API kind?",
}


def server_message(body: str, limit: int = 300) -> str:
    """The error message inside a server's error body, on one line.

    Understands OpenAI's ``{"error": {"message": ...}}``, Ollama's ``{"error": "..."}``, FastAPI's
    ``{"detail": ...}`` and vLLM's older flat ``{"message": ...}``; else the text itself.
    """
    text = body.strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
        elif isinstance(err, str) and err:
            text = err
        elif data.get("detail"):
            text = str(data["detail"])
        elif data.get("message"):
            text = str(data["message"])
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_status(status: int, body: str) -> ErrorKind:
    """The error kind of an HTTP error status and its body."""
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        if _MODEL_NOT_FOUND.search(server_message(body, limit=1000)):
            return "model_not_found"
        return "http_4xx"
    return "http_5xx"


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced: a server may echo what it got."""
    if secret and secret in text:
        return text.replace(secret, "***")
    return text


def raise_for_record(record: RequestRecord) -> None:
    """Raise a :class:`RunError` with a one-line message if ``record`` failed; else nothing."""
    if record.ok:
        return
    message = record.error or "the request failed"
    hint = HINTS.get(record.error_kind or "")
    raise RunError(f"{message} ({hint})" if hint else message)
