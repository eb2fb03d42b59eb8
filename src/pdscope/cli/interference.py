"""pdscope interference: how long a prefill stalls the streams that are decoding."""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope.cli.common import command_parser, console, make_config, positive_int
from pdscope.cli.experiment import (
    add_client_args,
    check_mark,
    emit,
    footer,
    header,
    measure,
)
from pdscope.cli.server_args import client_kwargs
from pdscope.experiments.interference import (
    STALL_FACTOR,
    InterferenceConfig,
    InterferenceResult,
    run_interference,
)
from pdscope.report.fmt import seconds

EXAMPLES = """
  pdscope interference http://127.0.0.1:28100                   4 streams, 1,800-token prompt
  pdscope interference http://127.0.0.1:28100 --streams 8 --inject-tokens 3000
  pdscope interference https://gpu-box:8000 --device h100-sxm --model-config config.json
  pdscope interference http://127.0.0.1:28100 --json > budget-2048.json   then another server,
                                            same flags, and compare the two stall_s
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "interference",
        "inject a long prompt into decoding streams and measure the stall it causes",
        "Starts --streams requests with short prompts and --stream-tokens long answers, waits\n"
        "until each has streamed --settle-tokens tokens, then sends one prompt of\n"
        "--inject-tokens. While that prompt is prefilled (from its send to its first token) the\n"
        "streams' token gaps show what its prefill costs them: the longest gap (the stall),\n"
        "and the p99 ITL before, during and after. This is what chunked prefill and vLLM's\n"
        "--max-num-batched-tokens trade: a smaller budget stalls the streams less and delays\n"
        "the new prompt's first token more. Runs with the same flags compare (stall_s).",
        EXAMPLES,
    )
    add_client_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--streams", type=positive_int, default=4, metavar="K",
                   help="streams decoding when the prompt lands (default 4)")
    g.add_argument("--inject-tokens", type=positive_int, default=1800, metavar="N",
                   help="tokens of the injected prompt (default 1800)")
    g.add_argument("--stream-tokens", type=positive_int, default=256, metavar="N",
                   help="output tokens of each stream (default 256)")
    g.add_argument("--stream-prompt-tokens", type=positive_int, default=32, metavar="N",
                   help="prompt tokens of each stream (default 32)")
    g.add_argument("--settle-tokens", type=positive_int, default=16, metavar="N",
                   help="tokens every stream has before the injection (default 16)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = make_config(InterferenceConfig, streams=args.streams,
                         inject_tokens=args.inject_tokens, stream_tokens=args.stream_tokens,
                         stream_prompt_tokens=args.stream_prompt_tokens,
                         settle_tokens=args.settle_tokens, **client_kwargs(args))
    result = measure(args, "interference", 4, config,
                     lambda conn, progress: run_interference(conn, config, progress=progress))
    if not emit(args, result):
        show(result)
    return 0


def show(r: InterferenceResult) -> None:
    header(r)
    data = r.to_json()
    cfg = r.config
    console.print(f"{cfg.streams} streams of {cfg.stream_tokens:,} tokens; after"
                  f" {cfg.settle_tokens} tokens each, a prompt of {r.inject_tokens:,} tokens"
                  f" landed: its first token came {seconds(r.inject_ttft_s)} later")
    table = Table(title_justify="left")
    for col in ("window", "gaps", "ITL p50", "ITL p99", "longest gap"):
        table.add_column(col, justify="left" if col == "window" else "right")
    for key, label in (("before", "before (all decoding)"), ("during", "during the prefill"),
                       ("after", "after")):
        w = data[key]
        table.add_row(label, f"{w['gaps']:,}", seconds(w["itl_p50_s"]),
                      seconds(w["itl_p99_s"]), seconds(w["max_gap_s"]))
    console.print(table)
    if data["stall_s"] is not None:
        share = data["stall_share_of_inject_ttft"]
        console.print(
            f"stall: {check_mark(data['stalled'])} the longest gap during the prefill was"
            f" {seconds(data['stall_s'])} ({share:.0%} of the injected prompt's TTFT;"
            f" {seconds(data['stall_s_per_1k_inject_tokens'])} a 1,000 prompt tokens)"
        )
        console.print(f"[dim]a stall: longer than the p99 before and {STALL_FACTOR:g} x its"
                      " median[/dim]")
    if data["inject_ttft_floor_s"] is not None:
        held = " (held at the measurement: the specs' floor was above it)"
        step = data["batched_step_floor_s"]
        console.print("roofline: the prefill needs at least"
                      f" {seconds(data['inject_ttft_floor_s'])}"
                      + (held if data["inject_ttft_floor_beaten"] else "")
                      + (f"; a step of {cfg.streams} streams at least {seconds(step)}"
                         + (held if data["batched_step_floor_beaten"] else "")
                         if step is not None else ""))
    if data["stall_share_of_inject_ttft"] is not None:
        if data["stalled"] and data["stall_share_of_inject_ttft"] > 0.5:
            console.print("The prefill ran in one long step that the streams had to wait for:"
                          " a smaller token budget a step (vLLM --max-num-batched-tokens,"
                          " chunked prefill) would split it and shorten the stall.")
        elif data["stalled"]:
            console.print("The prefill was split across steps, but each piece still"
                          " stretched the streams' steps.")
    footer(r, r.notes)
