"""JSON of streamed chunks, decoded fast: one place for the client's hot path.

Every token of a streamed answer comes as a small JSON object. The standard library's
``json.loads`` costs about 3 µs for a vLLM completions chunk; msgspec's decoder (BSD-3, a
compiled extension with no dependencies: https://jcristharif.com/msgspec/) about 0.9 µs
(``tools/bench_parser.py``). What msgspec refuses and Python's JSON reads — ``NaN`` and
``Infinity``, integers beyond 64 bits, nesting deeper than it goes — is read again by
``json.loads``, so what a chunk decodes to, and what it fails with, is the standard library's.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode


def loads(data: str | bytes) -> Any:
    """``json.loads(data)``, faster. Raises ``ValueError`` (or ``RecursionError``) for what
    is not JSON, as ``json.loads`` does."""
    try:
        return _decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def is_json(data: str) -> bool:
    """``data`` is one whole JSON value."""
    try:
        _decode(data)
    except msgspec.DecodeError:
        try:
            json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            return False
    return True
