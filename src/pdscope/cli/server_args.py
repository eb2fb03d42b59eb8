"""Flags every command that talks to a server shares: URL, model, API, key, device."""

from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

from pdscope.client import APIS
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


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~pdscope.client.ClientOptions` fields from the flags: the one place where
    the client flags become library settings."""
    return {"api": args.api, "model": args.model, "api_key": api_key(args),
            "fixed_output": not getattr(args, "no_fixed_output", False),
            "seed": getattr(args, "seed", None)}


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
