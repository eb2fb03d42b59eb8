"""pdscope prefix: does the server cache a shared prompt prefix, and what does it save?"""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope.cli.common import command_parser, console, in_flags, make_config, positive_int
from pdscope.cli.experiment import (
    add_client_args,
    check_mark,
    emit,
    footer,
    header,
    measure,
)
from pdscope.cli.server_args import client_kwargs
from pdscope.experiments.prefix import PrefixConfig, PrefixResult, run_prefix
from pdscope.report.fmt import human_bytes, seconds

EXAMPLES = """
  pdscope prefix http://127.0.0.1:28100                           1,500-token prefix + 100
  pdscope prefix http://127.0.0.1:28100 --prefix-tokens 3000 --requests 8
  pdscope prefix http://localhost:11434 --model llama3.2 --api ollama-chat   a system message
  pdscope prefix http://127.0.0.1:28100 --json > prefix.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "prefix",
        "prefix-cache A/B: a shared system prompt against unique prompts of the same length",
        "A: a shared prefix of --prefix-tokens (the system prompt: a system message for a chat\n"
        "API, the start of the prompt otherwise) and a different --suffix-tokens question each\n"
        "request, sent once cold and then --requests times warm. B: --requests prompts of the\n"
        "same total length, each unique from its first token. A server that caches prefixes\n"
        "answers warm A requests much sooner than B; the prefix cache is called detected when\n"
        "warm A saves at least half of what a full hit on the prefix could (warm <= (1 - 0.5 x\n"
        "prefix share) x B). Also reports the cached tokens the server counts.",
        EXAMPLES,
    )
    add_client_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--prefix-tokens", type=positive_int, default=1500, metavar="N",
                   help="tokens of the shared prefix (default 1500)")
    g.add_argument("--suffix-tokens", type=positive_int, default=100, metavar="N",
                   help="tokens of each request's own question (default 100)")
    g.add_argument("--requests", type=positive_int, default=5, metavar="K",
                   help="warm A requests, and B requests (default 5)")
    g.add_argument("--max-tokens", type=positive_int, default=8, metavar="N",
                   help="output tokens a request (default 8: only the TTFT matters here)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = make_config(PrefixConfig, prefix_tokens=args.prefix_tokens,
                         suffix_tokens=args.suffix_tokens, requests=args.requests,
                         max_tokens=args.max_tokens, **client_kwargs(args))
    total = 2 + 2 * config.requests
    result = measure(args, "prefix", total, config,
                     lambda conn, progress: run_prefix(conn, config, progress=progress))
    if not emit(args, result):
        show(result)
    return 0


def show(r: PrefixResult) -> None:
    header(r)
    data = r.to_json()
    console.print(f"prompts of {r.prompt_tokens:,} tokens: A = a shared {r.prefix.tokens:,}-token"
                  f" prefix + a new question, B = unique; {r.config.requests} of each")
    cached = data["cached_tokens"]
    table = Table(title_justify="left")
    for col, just in (("arm", "left"), ("TTFT", "right"), ("spread (min – max)", "right"),
                      ("cached tokens", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]

    def spread(key: str) -> str:
        s = data["spread"][key]
        return f"{s['min']:.3f} – {s['max']:.3f} s" if s else "—"

    def tokens(value: float | None) -> str:
        return f"{value:,.0f}" if value is not None else "—"

    table.add_row("A cold (shared prefix, first time)", seconds(data["ttft_a_cold_s"]), "",
                  tokens(cached["a_cold"]))
    table.add_row("A warm (shared prefix again), median", seconds(data["ttft_a_warm_s"]),
                  spread("a_warm"), tokens(cached["a_warm_median"]))
    table.add_row("B unique, median", seconds(data["ttft_b_s"]), spread("b"),
                  tokens(cached["b_median"]))
    console.print(table)
    threshold = data["detection"]["threshold"]
    if data["warm_over_b"] is not None and threshold is not None:
        console.print(f"prefix cache detected: {check_mark(data['prefix_cache_detected'])}"
                      f" (warm / B = {data['warm_over_b']:.2f}; a cache is called working at"
                      f" <= {threshold:.2f})")
    if data["ttft_saved_s"] is not None:
        console.print(f"TTFT saved a request: {seconds(data['ttft_saved_s'])}")
    if cached["source"] is not None and cached["share_of_prompt"] is not None:
        console.print(f"the server counts {cached['a_warm_median']:,.0f} cached tokens a warm"
                      f" request ({cached['share_of_prompt']:.0%} of the prompt), from"
                      f" {cached['metric'] or cached['source']}")
    elif cached["source"] is None:
        console.print("the server reports no cached-token count")
    if data["prefix_ttft_floor_s"] is not None:
        kv = data["prefix_kv_bytes"]
        held = (" (held at a unique prompt's TTFT: the specs' floor was above it)"
                if data["prefix_ttft_floor_beaten"] else "")
        console.print(f"roofline: computing the prefix takes at least"
                      f" {seconds(data['prefix_ttft_floor_s'])}{held}"
                      + (f"; its KV cache holds {human_bytes(kv)}" if kv else ""))
    console.print(in_flags(r.verdict))
    footer(r, r.notes)
