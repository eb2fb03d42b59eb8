"""The checks a config makes of its fields when it is built, in library words.

Pure and without imports beyond :mod:`pdscope.errors`, so that any layer can check its inputs
(the planner's scheduler as much as a load run) without loading what a higher layer loads.
"""

from __future__ import annotations

from pdscope.errors import Field, InputError


def at_least(value: float, low: float, what: str) -> None:
    """``what`` must be a finite number of at least ``low``. ``what`` is a field's name (an
    identifier, named in the error as a :class:`~pdscope.errors.Field`) or a few words."""
    name: str | Field = Field(what) if what.isidentifier() else what
    if not (isinstance(value, (int, float)) and value == value and abs(value) != float("inf")):
        raise InputError(name, f" must be a finite number, got {value!r}")
    if value < low:
        raise InputError(name, f" must be at least {low:g}, got {value:g}")
