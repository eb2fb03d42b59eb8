"""Errors a person can act on.

Every expected failure is a :class:`PdscopeError`: the CLI prints its message on one
line, prefixed with ``pdscope:``, and exits with its ``exit_code`` (2 for bad input, 1 for
a run that failed). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PdscopeError(Exception):
    """A failure with a message fit for the user. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class InputError(PdscopeError):
    """Bad input from the user: a missing file, a config that is not one, a bad flag value."""

    exit_code = 2


class RunError(PdscopeError):
    """A measurement or a server that failed: the server is down, a stream broke off."""

    exit_code = 1
