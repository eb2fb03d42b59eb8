"""pdscope demo: the main job on the lab, for a first look with nothing but this machine."""

from __future__ import annotations

import argparse

from pdscope import lab
from pdscope.cli import probe as probe_cmd
from pdscope.cli.common import command_parser, console
from pdscope.cli.lab import print_started, start_with_progress

EXAMPLES = """
  pdscope demo                  start vLLM-CPU on the bundled model and measure it
  pdscope demo --engine llamacpp
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "demo",
        "start the lab and run the main job against it",
        "Starts (or reuses) a lab server on the bundled SmolLM2-135M model, then works out\n"
        "probes both phases beside this machine's ceiling, measured. The server keeps running:\n"
        "stop it with `pdscope lab stop`.",
        EXAMPLES,
    )
    p.add_argument("--engine", default="vllm", choices=sorted(lab.ENGINES), help="default vllm")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    server, reused, took = start_with_progress(args.engine, None, [], 900.0)
    print_started(server, reused, took)
    engine = lab.get_engine(args.engine)
    console.rule(f"Both phases of the lab's {engine.name}, beside this machine's ceiling")
    probe_args = argparse.Namespace(
        url=server.url, model=None, api="auto", api_key=None, api_key_env=None, device=None,
        model_config=None, prompt_tokens=512, max_tokens=128, runs=5, no_fixed_output=False,
        seed=None, json=False, raw=False, out=None,
    )
    return probe_cmd.run(probe_args)
