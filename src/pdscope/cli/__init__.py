"""The command line: the flags, progress bars and terminal output of every command.

Only this package knows flags: it turns them into library configs (which check themselves) and
a config's complaint back into the flags a person typed. Each command lives in its own module
with ``register(subparsers)``, which adds its parser and sets ``handler``; the work itself is
done by library functions a notebook can call too.

Exit status: 0 when the command did what it was asked, 1 when a run failed (the server is
unreachable, no request completed, an experiment could not conclude: :class:`RunError`), 2 for
bad input (a flag, a file, a URL: :class:`InputError`, checked before the first request), 130
when interrupted. Every error is one line on stderr, ``pdscope: ...``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from pdscope import __version__
from pdscope.cli import (
    ab,
    bench,
    ceiling,
    compare,
    context,
    demo,
    devices,
    doctor,
    interference,
    kv,
    lab,
    plan,
    prefix,
    probe,
    selftest,
    sweep,
    watch,
)
from pdscope.cli.common import CliParser, in_flags, print_error
from pdscope.errors import PdscopeError

COMMANDS = (
    demo, doctor, probe, sweep, context, prefix, interference, bench, watch, plan, compare, ab,
    ceiling, kv, devices, lab, selftest,
)


def version() -> str:
    """The version pip installed (the distribution's metadata); the package's ``__version__``
    where pdscope runs from a source tree that was never installed (``PYTHONPATH=src``)."""
    try:
        return metadata.version("pdscope")
    except metadata.PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="pdscope",
        description=(
            "Measure prefill (time to first token) and decode (tokens/s) on your LLM server,\n"
            "set each beside the physical ceiling of your hardware, and learn what to change."
        ),
        epilog=(
            "examples:\n"
            "  pdscope demo                                    the lab, diagnosed\n"
            "  pdscope doctor http://127.0.0.1:8000 --quick    what to change on your server\n"
            "  pdscope ceiling --params 8e9 --dtype fp16      the article's ceiling table\n"
            "  pdscope kv --model config.json --context 8000  KV cache a request holds\n"
            "  pdscope devices --probe                         measure this machine\n"
            "\n"
            "Run 'pdscope COMMAND --help' for a command's options and examples."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pdscope {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CliParser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code = args.handler(args)
    except PdscopeError as exc:
        print_error(in_flags(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, as other command-line tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return int(code or 0)

