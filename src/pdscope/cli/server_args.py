"""Flags every command that talks to a server shares: URL, model, API, key, device, and the
fields the user adds to every request (sampling, body fields, headers, Ollama options)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

from pdscope.cli.common import finite
from pdscope.client import APIS
from pdscope.client.fields import RequestFields
from pdscope.errors import InputError


def server_url(text: str) -> str:
    """argparse type: an http(s) URL with a host and, if given, a port from 1 to 65535.
    Checked here so that a typo says "not a URL" at once, before any connection."""
    raw = text.strip()
    hint = "give e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(raw)
        given_port = parts.port  # a port that is no number, or beyond 65535, raises here
        URL(raw)  # what the HTTP client will parse
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} ({exc}; {hint})") from None
    if parts.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r} ({hint})")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} has no host ({hint})")
    if given_port == 0:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r}: the port must be from 1 to"
                                         " 65535")
    return raw


def add_server_args(parser: argparse.ArgumentParser, *, url: str = "required",
                    ceiling: bool = True) -> None:
    """The server flags. ``url``: ``required``, ``optional`` (the command can work without a
    server, e.g. from recorded runs) or ``none`` (the command names its servers itself);
    ``ceiling``: with ``--device`` and ``--model-config``."""
    if url != "none":
        parser.add_argument("url", metavar="URL", type=server_url,
                            nargs="?" if url == "optional" else None,
                            help="the server's base URL, e.g. http://127.0.0.1:8000")
    g = parser.add_argument_group("server")
    g.add_argument("--model", help="the served model name (default: the first it lists)")
    g.add_argument(
        "--api", default="auto", choices=("auto", *APIS),
        help="auto (detected), openai (/v1/completions), openai-chat, ollama, ollama-chat",
    )
    g.add_argument(
        "--api-key", help="sent as a Bearer token; default: $OPENAI_API_KEY. Never printed"
    )
    g.add_argument("--api-key-env", metavar="NAME", help="read the key from this variable")
    add_request_field_args(parser)
    if not ceiling:
        return
    g.add_argument(
        "--device", metavar="D",
        help="device the server runs on (id or name, see `pdscope devices`); default: this"
        " machine, measured, when the server is on this machine",
    )
    g.add_argument(
        "--model-config", metavar="PATH",
        help="the model's config.json or .gguf, for the ceiling (found automatically for Ollama,"
        " a local vLLM or llama.cpp, and the lab)",
    )


_EXAMPLE = '{"chat_template_kwargs": {"enable_thinking": false}}'


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object (``--extra-body``)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): give a JSON object, e.g."
                                         f" '{_EXAMPLE}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object ({{...}}), got a"
                                         f" {_json_kind(value)}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return "number"


def header(text: str) -> tuple[str, str]:
    """argparse type: ``NAME:VALUE``. The value may be a secret: no message names it (nor the
    text, where it has no colon)."""
    name, sep, value = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("give NAME:VALUE, e.g. X-Api-Key:KEY (the value is"
                                         " never printed)")
    name, value = name.strip(), value.strip()
    if not name or not value:
        what = f"{name!r} has no value" if name else "a header needs a name before the colon"
        raise argparse.ArgumentTypeError(f"{what}: give NAME:VALUE")
    return name, value


def option(text: str) -> tuple[str, Any]:
    """argparse type: ``KEY=VALUE`` for Ollama's ``options``; the value is JSON where it parses
    as JSON (``num_ctx=8192`` a number, ``stop=["\n"]`` a list), else the text."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r} (e.g. num_ctx=8192)")
    try:
        value: Any = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        value = raw
    return key, value


def add_request_field_args(parser: argparse.ArgumentParser) -> None:
    """The fields every request carries besides pdscope's own: on every command that sends
    requests, so what a bench measured is what a probe or the doctor measures."""
    g = parser.add_argument_group("request fields (added to every request; recorded with the"
                                  " results, header values redacted)")
    g.add_argument("--extra-body", type=json_object, metavar="JSON",
                   help=f"a JSON object merged into every request body, e.g. '{_EXAMPLE}';"
                   " the fields pdscope sets itself (model, prompt, messages, stream,"
                   " max_tokens, ignore_eos, ...) are refused")
    g.add_argument("--header", type=header, action="append", default=[], metavar="NAME:VALUE",
                   help="an HTTP header on every request (repeatable), e.g. a proxy's auth;"
                   " a secret like the API key: its value is never printed or written")
    g.add_argument("--temperature", type=finite, metavar="T",
                   help="sampling temperature (default: the server's)")
    g.add_argument("--top-p", type=finite, metavar="P",
                   help="nucleus sampling share, above 0 and at most 1 (default: the server's)")
    g.add_argument("--sampling-seed", type=int, metavar="N",
                   help="the server's sampling seed (not --seed, which seeds pdscope's prompts)")
    g.add_argument("--option", type=option, action="append", default=[], metavar="KEY=VALUE",
                   help="one of Ollama's options (repeatable), e.g. num_ctx=8192; Ollama's"
                   " native API only")


def request_fields(args: argparse.Namespace) -> RequestFields:
    """The :class:`~pdscope.client.fields.RequestFields` of the flags (none given: empty)."""
    return RequestFields(
        extra_body=getattr(args, "extra_body", None) or {},
        headers=tuple(getattr(args, "header", None) or ()),
        temperature=getattr(args, "temperature", None),
        top_p=getattr(args, "top_p", None),
        seed=getattr(args, "sampling_seed", None),
        options=tuple(getattr(args, "option", None) or ()),
    )


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~pdscope.client.ClientOptions` fields from the flags: the one place where
    the client flags become library settings."""
    fields = request_fields(args)
    key = api_key(args)
    if fields.has_header("Authorization") and not (args.api_key or args.api_key_env):
        key = None  # a header given on the command line wins over $OPENAI_API_KEY
    return {"api": args.api, "model": args.model, "api_key": key,
            "fixed_output": not getattr(args, "no_fixed_output", False),
            "seed": getattr(args, "seed", None), "request_fields": fields}


def api_key(args: argparse.Namespace) -> str | None:
    if args.api_key:
        return str(args.api_key)
    if args.api_key_env:
        value = os.environ.get(args.api_key_env)
        if value is None:
            raise InputError(f"--api-key-env {args.api_key_env}: that variable is not set")
        return value
    return os.environ.get("OPENAI_API_KEY") or None


def check_ceiling_args(args: argparse.Namespace) -> None:
    """``--device`` and ``--model-config`` are used only after a measurement, to find its
    ceiling: check them before it, so a typo costs nothing."""
    from pdscope.hardware import find_device
    from pdscope.model import load_model

    device = getattr(args, "device", None)
    if device and device.strip().lower() != "local":
        find_device(device)
    path = getattr(args, "model_config", None)
    if path:
        try:
            load_model(path)
        except OSError as exc:
            raise InputError(f"--model-config {path}: cannot read it:"
                             f" {exc.strerror or exc}") from None
