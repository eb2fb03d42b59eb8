"""Reading the user's workload files (datasets, traces, conversations): their text and their
JSON, each failure one line naming the file (and the line, where the caller gives it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdscope.errors import InputError


def read_text(p: Path, what: str) -> str:
    """The file's text; ``what`` names it in the error (``dataset``, ``trace``, ...)."""
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {p}: {exc.strerror or exc}") from None


def parse_json(text: str, where: str) -> Any:
    """``json.loads``, or one line saying where the text is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({exc.msg}, line {exc.lineno})"
                         if "\n" in text.strip() else f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: not JSON (nested too deep)") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError(f"{where}: not JSON ({str(exc).split(':')[0]})") from None
