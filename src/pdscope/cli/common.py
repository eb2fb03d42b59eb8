"""Pieces every command shares: parsing helpers, JSON output, one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from rich.console import Console

from pdscope.errors import InputError, Note, PdscopeError, worded
from pdscope.load.results import rescue_dir
from pdscope.slo import METRICS, SLO, parse_slo


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


def print_json(data: Any, flags: dict[str, str] | None = None) -> None:
    """``data`` as JSON, each field a note names called by its flag (:func:`flagged`)."""
    print(json.dumps(flagged(data, flags), indent=2, default=_json_default, allow_nan=False))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_json"):
        return flagged(obj.to_json())
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

# The largest count or number of seconds a flag takes: far beyond any real run, and small
# enough that no arithmetic on it overflows (a float holds every whole number up to 2**53).
MAX_COUNT = 1_000_000_000
MAX_SECONDS = 1_000_000_000.0
MAX_PARAMETERS = 1e15


def finite(text: str) -> float:
    """A float that is a number: ``inf``, ``nan`` and what overflows (``1e999``) are not."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _whole(text: str) -> int:
    """A whole number as people write it: ``5``, ``1e3``, ``2.0``; never ``1.5`` or ``inf``."""
    stripped = text.strip()
    if re.fullmatch(r"[-+]?\d{1,30}", stripped):
        return int(stripped)
    try:
        value = float(stripped)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite whole number, got {text}")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def int_in(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """argparse type: a whole number from ``low`` to ``high``; the message says the range."""

    def parse(text: str) -> int:
        value = _whole(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {text}")
        return value

    parse.__name__ = "whole number"
    return parse


def float_in(low: float, high: float = MAX_SECONDS, *, above: bool = False,
             ) -> Callable[[str], float]:
    """argparse type: a finite number from ``low`` (or ``above`` it) to ``high``."""

    def parse(text: str) -> float:
        value = finite(text)
        if (value <= low if above else value < low) or value > high:
            span = (f"above {_g(low)} and at most {_g(high)}" if above
                    else f"from {_g(low)} to {_g(high)}")
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _g(x: float) -> str:
    """``1,000,000`` rather than ``1e+06``."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def parse_count(text: str) -> float:
    """A count as people write it: ``8e9``, ``8B``, ``135M``, ``70.6b``, ``8000000000``."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (try 8e9 or 8B)")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1.0)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    if not value <= MAX_PARAMETERS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_PARAMETERS:g} (a thousand times the largest model), got {text}")
    return value


def positive_int(text: str) -> int:
    """A whole number from 1 to :data:`MAX_COUNT`."""
    return int_in(1)(text)


def non_negative_int(text: str) -> int:
    """A whole number from 0 to :data:`MAX_COUNT`."""
    return int_in(0)(text)


def positive_float(text: str) -> float:
    """A finite number above 0, at most :data:`MAX_SECONDS`."""
    return float_in(0, above=True)(text)


def non_negative_float(text: str) -> float:
    """A finite number from 0 to :data:`MAX_SECONDS`."""
    return float_in(0)(text)


def fraction(text: str) -> float:
    """A share above 0, at most 1 (``--mem-util``)."""
    value = finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def share(text: str) -> float:
    """A share from 0 to 1, both included (``--max-failed``, ``--fault-rate``)."""
    value = finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port)."""
    return int_in(0, 65535)(text)


# ------------------------------------------------------------------------- where results go


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def check_out_file(path: str | Path, flag: str = "--out") -> Path:
    """Before anything is measured: ``path`` can be written as a file. Its folder must exist
    (a file's folder is never created: a mistyped folder fails here, at once), it must not be
    a folder, and a write there must work. Leaves no file behind that was not there."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {path}: that is a folder; give a file name in it")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(f"{flag} {path}: {_blocker(folder)} {what} (pdscope creates the"
                         " folder of an --out DIR, never the folder of an --out FILE)")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write a file there: {_reason(exc)}") from None
    if not existed:
        with contextlib.suppress(OSError):
            p.unlink()
    return p


def _blocker(folder: Path) -> Path:
    """The first part of ``folder`` that is missing or is a file."""
    for part in reversed((folder, *folder.parents)):
        if not part.is_dir():
            return part
    return folder


@contextlib.contextmanager
def out_folder(path: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Create the folder ``path`` (and its parents) before anything is measured, or fail at
    once with one line; the run then goes on inside the ``with``. Folders made here are
    removed again when the run fails before writing anything into them."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag} {path}: a file of that name exists; give a folder")
    made = [q for q in (p, *p.parents) if not q.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"{flag} {path}: cannot create that folder:"
                         f" {_blocker(p)} is a file") from None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot create that folder: {_reason(exc)}") from None
    try:
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as exc:
        _remove_empty(made)
        raise InputError(f"{flag} {path}: cannot write in that folder: {_reason(exc)}") from None
    try:
        yield p
    except BaseException:
        _remove_empty(made)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this run made, deepest first, while they are empty."""
    for q in folders:
        try:
            q.rmdir()
        except OSError:
            return


def write_result(path: str | Path, text: str, what: str = "the result") -> Path:
    """Write ``text`` to ``path``; when that fails (the disk filled, the folder went away),
    write it to the rescue folder (:func:`pdscope.load.results.rescue_dir`), else the current
    folder, and say where in a warning. A result is never dropped: as a last resort it goes
    to stdout."""
    p = Path(path)
    try:
        p.write_text(text, encoding="utf-8")
        return p
    except OSError as exc:
        reason = _reason(exc)
    for folder in (rescue_dir(), Path.cwd()):
        target = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{p.name or 'result.json'}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError:
            continue
        warn(f"could not write {what} to {path} ({reason}); wrote it to {target} instead")
        return target
    warn(f"could not write {what} to {path} ({reason}) nor to {rescue_dir()}: it follows on"
         " stdout")
    print(text)
    return p


C = TypeVar("C")

# The flags whose names are not their field's with ``--`` and dashes (``prompt_tokens`` is
# ``--prompt-tokens``): the one place where the CLI names a library field its own way.
FLAGS: dict[str, str] = {
    "drain_s": "--drain",
    "duration_s": "--duration",
    "ramp_s": "--ramp",
    "ray_address": "--ray",
    "link_gb_s": "--kv-link-gb-s",
    "fraction": "--shared-prefix",
    "headers": "--header",  # the request fields (client/fields.py)
    "options": "--option",
}


def flag_of(field: str, flags: dict[str, str] | None = None) -> str:
    """The flag a person types for the library field ``field``: ``flags[field]`` (a command's
    own name for it), :data:`FLAGS`, or the field's name with ``--`` and dashes."""
    return (flags or {}).get(field) or FLAGS.get(field) or "--" + field.replace("_", "-")


def in_flags(said: PdscopeError | str, flags: dict[str, str] | None = None) -> str:
    """An error's message, or a note (:class:`~pdscope.errors.Note`), with every field it
    names called by its flag; any other text as it is."""
    if isinstance(said, (PdscopeError, Note)):
        return said.naming(lambda field: flag_of(field, flags))
    return said


def flagged(data: Any, flags: dict[str, str] | None = None) -> Any:
    """JSON-like data (a result's ``to_json()``) with every note in it in flags, as
    :func:`in_flags`: what the CLI prints or writes says what a person types."""
    return worded(data, lambda field: flag_of(field, flags))


def make_config(factory: Callable[..., C], flags: dict[str, str] | None = None,
                **fields: Any) -> C:
    """Build a library config from flag values. A config checks itself in library words
    (``runs must be at least 1``); the fields its error names become the flags a person typed
    (``--runs``; ``flags[field]`` where this command names the flag otherwise)."""
    try:
        return factory(**fields)
    except InputError as exc:
        raise InputError(in_flags(exc, flags)) from None


def slo_arg(flag: str, text: str, metrics: Sequence[str] = METRICS) -> SLO:
    """``flag``'s ``ttft:MS,itl:MS`` as an :class:`~pdscope.slo.SLO`, ``metrics`` the objectives
    the command can judge; a bad one is named with its flag."""
    try:
        return parse_slo(text, metrics)
    except InputError as exc:
        raise InputError(f"{flag}: {exc}") from None
