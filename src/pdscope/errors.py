"""Errors a person can act on.

Every expected failure is a :class:`PdscopeError`: the CLI prints its message on one
line, prefixed with ``pdscope:``, and exits with its ``exit_code`` (2 for bad input, 1 for
a run that failed). Anything else is a bug and keeps its traceback.

A message is in library words: a config's fields by their names (``runs must be at least 1``).
Where it names a field it holds a :class:`Field` among its parts, so an interface can call the
field its own way without reading the text back: the CLI names the flag a person typed
(``--runs must be at least 1``), through its one table of fields and flags. A note, hint or
verdict that names a field is a :class:`Note`: text to a library caller, its fields kept for
the CLI the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Field:
    """The name of a config's field inside an error message."""

    name: str

    def __str__(self) -> str:
        return self.name


Part: TypeAlias = "str | Field"


class Note(str):
    """A sentence in library words that names fields: a note, a hint, an assumption, a verdict.

    It is the ``str`` of its parts (each :class:`Field` by its name: ``give device``), so a
    library caller reads it as text; :attr:`parts` keeps the fields, so an interface calls
    them its own way (the CLI: ``give --device``) without reading the text back. A part that
    is itself a :class:`Note` (or a :class:`PdscopeError`) gives its parts, so a note built
    from another keeps its fields. Text joined to a note with ``+`` or an f-string is a plain
    ``str``: build a longer note with ``Note(...)``."""

    parts: tuple[Part, ...]

    def __new__(cls, *parts: Part | PdscopeError) -> Note:
        flat = flatten(parts)
        note = super().__new__(cls, "".join(map(str, flat)))
        note.parts = flat
        return note

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the note names, in order."""
        return tuple(p.name for p in self.parts if isinstance(p, Field))

    def naming(self, name: Callable[[str], str]) -> str:
        """The note with each field called ``name(field)``."""
        return _named(self.parts, name)


def flatten(parts: Iterable[Part | PdscopeError]) -> tuple[Part, ...]:
    """``parts`` with every :class:`Note` and :class:`PdscopeError` among them opened into its
    own parts (plain ``str`` kept as it is)."""
    out: list[Part] = []
    for p in parts:
        if isinstance(p, (Note, PdscopeError)):
            out += p.parts
        elif isinstance(p, Field):
            out.append(p)
        else:
            out.append(str(p))
    return tuple(out)


def _named(parts: Iterable[Part], name: Callable[[str], str]) -> str:
    return "".join(name(p.name) if isinstance(p, Field) else p for p in parts)


class PdscopeError(Exception):
    """A failure with a message fit for the user. ``exit_code`` is what the CLI returns.

    The message is its parts joined: text, and a :class:`Field` wherever it names a field
    (``InputError(Field("runs"), " must be at least 1")``); a :class:`Note` or another error
    among the parts gives its own parts, so an error that wraps another keeps its fields."""

    exit_code = 1

    def __init__(self, *parts: Part | PdscopeError) -> None:
        flat = flatten(parts)
        super().__init__("".join(map(str, flat)))
        self.parts = flat

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the message names, in order."""
        return tuple(p.name for p in self.parts if isinstance(p, Field))

    def naming(self, name: Callable[[str], str]) -> str:
        """The message with each field called ``name(field)``."""
        return _named(self.parts, name)


class InputError(PdscopeError):
    """Bad input from the user: a missing file, a config that is not one, a bad flag value."""

    exit_code = 2


class RunError(PdscopeError):
    """A measurement or a server that failed: the server is down, a stream broke off."""

    exit_code = 1


def worded(data: Any, name: Callable[[str], str]) -> Any:
    """JSON-like ``data`` (dicts, lists, tuples, scalars) with every :class:`Note` in it
    called its fields ``name(field)``: how an interface writes a result in its own words (the
    CLI, its flags) without reading any text back. Tuples come back as lists, as JSON has
    them; a plain ``str`` and everything else as it is."""
    if isinstance(data, Note):
        return data.naming(name)
    if isinstance(data, dict):
        return {k: worded(v, name) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [worded(v, name) for v in data]
    return data
