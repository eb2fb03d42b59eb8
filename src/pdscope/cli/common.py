"""Pieces every command shares: parsing helpers, JSON output, one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

from rich.console import Console


def _width() -> int | None:
    """Piped output (a file, a README) gets 120 columns rather than rich's 80, unless COLUMNS
    says otherwise; a terminal keeps its own width."""
    if sys.stdout.isatty():
        return None
    try:
        return int(os.environ.get("COLUMNS", "120"))
    except ValueError:
        return 120


console = Console(highlight=False, width=_width())
err_console = Console(stderr=True, highlight=False)


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, prefixed like every other error."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print_error(f"{where}{message} (see --help)")
        sys.exit(2)


T = TypeVar("T")


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on uvloop when it is installed (less client overhead at hundreds of
    streams), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def print_error(message: str) -> None:
    print(f"pdscope: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"pdscope: warning: {message}", file=sys.stderr)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=_json_default, allow_nan=False))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def command_parser(
    sub: argparse._SubParsersAction, name: str, summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with worked examples."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + examples.strip("\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """A count as people write it: ``8e9``, ``8B``, ``135M``, ``70.6b``, ``8000000000``."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (try 8e9 or 8B)")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1.0)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(float(text)) if re.fullmatch(r"\s*\d+(\.0*)?(e\d+)?\s*", text) else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value
