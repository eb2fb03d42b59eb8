"""What the four experiment commands (sweep, context, prefix, interference) share: their
flags, a progress bar, the ceiling lookup after a run, and JSON output."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pdscope.cli.common import (
    MAX_COUNT,
    check_out_file,
    console,
    err_console,
    flagged,
    in_flags,
    print_json,
    write_result,
)
from pdscope.cli.server_args import add_server_args, check_ceiling_args
from pdscope.client import ClientOptions, Connection, ServerInfo, Target, connect
from pdscope.errors import InputError
from pdscope.experiments.common import CeilingInputs, ProgressFn, find_ceiling_inputs, parse_counts


def counts(text: str) -> tuple[int, ...]:
    """argparse type: ``200,500,1000``."""
    try:
        values = parse_counts(text, "list")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("list: ")) from None
    except (OverflowError, ValueError):  # inf, nan
        values = (MAX_COUNT + 1,)
    if max(values) > MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"each must be a whole count from 1 to {MAX_COUNT:,}, got {text}")
    return values


def add_client_args(p: argparse.ArgumentParser) -> None:
    """Server flags, and the flags every experiment's output shares."""
    add_server_args(p)
    p.add_argument("--no-fixed-output", action="store_true",
                   help="let the model stop early (do not send ignore_eos / min_tokens)")
    p.add_argument("--seed", type=int, help="prompt seed (default: new prompts every run)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--raw", action="store_true",
                   help="with --json or --out, include every request's timing record")
    p.add_argument("--out", metavar="FILE",
                   help="also write the JSON here (its folder must exist; checked before the"
                   " first request)")


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[ProgressFn]:
    """A transient rich progress bar on stderr; yields the experiment's progress callback.
    Off when stderr is no terminal, so that a failure there is one line and nothing else."""
    with Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=err_console, transient=True,
        disable=not err_console.is_terminal,
    ) as bar:
        task = bar.add_task("", total=total)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=stage)

        yield progress


class _Result(Protocol):
    @property
    def server(self) -> ServerInfo: ...

    @property
    def target(self) -> Target: ...

    @property
    def ceiling(self) -> CeilingInputs: ...

    @property
    def ceiling_warnings(self) -> tuple[str, ...]: ...

    def to_json(self, *, raw: bool = False) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Result)


def measure(
    args: argparse.Namespace, label: str, total: int, options: ClientOptions,
    experiment: Callable[[Connection, ProgressFn], Awaitable[R]],
) -> R:
    """Run an experiment under a progress bar on one connection to the server, then find on
    that connection what its ceiling is set beside. ``--out``, ``--device`` and
    ``--model-config`` are checked first: nothing is measured that could not be kept."""
    check_before_measuring(args)

    async def go() -> R:
        async with connect(args.url, options) as conn:
            with progress_bar(label, total) as progress:
                result = await experiment(conn, progress)
            ceiling = await find_ceiling_inputs(
                conn, result.target.model, device=args.device,
                model_config=args.model_config, api_key=options.api_key)
        return replace(result, ceiling=ceiling)  # type: ignore[type-var]

    return asyncio.run(go())


def check_before_measuring(args: argparse.Namespace) -> None:
    """What would otherwise fail only after the measurement: ``--out`` cannot be written,
    ``--device`` is unknown, ``--model-config`` is no model."""
    if getattr(args, "out", None):
        check_out_file(args.out)
    check_ceiling_args(args)


def emit(args: argparse.Namespace, result: _Result) -> bool:
    """Write ``--out`` (to the rescue folder when that fails, with a warning), print
    ``--json``; True when the JSON was printed."""
    if args.out:
        write_result(args.out, json.dumps(flagged(result.to_json(raw=args.raw)), indent=2))
    if args.json:
        print_json(result.to_json(raw=args.raw))
        return True
    return False


def header(result: _Result) -> None:
    info = result.server
    version = f" {info.version}" if info.version else ""
    console.print(f"[bold]{info.kind}{version}[/bold] at {info.base_url}, model"
                  f" [bold]{result.target.model}[/bold], API {result.target.api}")


def footer(result: _Result, notes: tuple[str, ...]) -> None:
    ci = result.ceiling
    if ci.known:
        assert ci.device is not None
        console.print(f"[dim]ceiling: {ci.device.name}, {ci.device.mem_bandwidth_gb_s:,.1f}"
                      f" GB/s; model from {ci.model_source}[/dim]")
    for warning in result.ceiling_warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]")
    for note in (*notes, *ci.notes):
        console.print(f"[dim]note: {in_flags(note)}[/dim]")


def check_mark(ok: bool | None) -> str:
    return "[green]yes[/]" if ok else ("[red]no[/]" if ok is False else "[dim]—[/]")
