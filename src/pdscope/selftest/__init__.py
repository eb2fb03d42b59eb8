"""The client's self-test: a reference server with a known schedule, to measure the measurer.

See :mod:`pdscope.selftest.server`. Its names are loaded on first use, so that
``python -m pdscope.selftest.server`` does not import the module twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdscope.selftest.server import (
        FAULTS,
        ReferenceConfig,
        ReferenceServer,
        run_in_subprocess,
        serving,
    )

__all__ = ["FAULTS", "ReferenceConfig", "ReferenceServer", "run_in_subprocess", "serving"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("pdscope.selftest.server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
