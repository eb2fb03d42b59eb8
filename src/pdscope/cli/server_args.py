"""Flags every command that talks to a server shares: URL, model, API, key, device."""

from __future__ import annotations

import argparse
import os

from pdscope.client import APIS
from pdscope.errors import InputError


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
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


def api_key(args: argparse.Namespace) -> str | None:
    if args.api_key:
        return str(args.api_key)
    if args.api_key_env:
        value = os.environ.get(args.api_key_env)
        if value is None:
            raise InputError(f"--api-key-env {args.api_key_env}: that variable is not set")
        return value
    return os.environ.get("OPENAI_API_KEY") or None
