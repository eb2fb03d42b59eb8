"""Where pdscope keeps what it makes once: the lab's converted model and its server records,
the client self-test's saved capacity."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PDSCOPE_CACHE``, else ``$XDG_CACHE_HOME/pdscope``, else ``~/.cache/pdscope``."""
    if os.environ.get("PDSCOPE_CACHE"):
        return Path(os.environ["PDSCOPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdscope"
