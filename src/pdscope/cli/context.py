"""pdscope context: the decode rate as the context fills, beside the ceiling line."""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope.cli.common import command_parser, console, make_config, positive_int
from pdscope.cli.experiment import (
    add_client_args,
    check_mark,
    counts,
    emit,
    footer,
    header,
    measure,
)
from pdscope.cli.server_args import client_kwargs
from pdscope.experiments.context import ContextConfig, ContextResult, run_context
from pdscope.report.fmt import human_bytes, rate, seconds

EXAMPLES = """
  pdscope context http://127.0.0.1:28100                       prompts of 200 and 2,000, 512 out
  pdscope context http://127.0.0.1:28100 --prompt-tokens 100,1500,3000 --max-tokens 1000
  pdscope context https://gpu-box:8000 --device h100-sxm --model-config config.json
  pdscope context http://127.0.0.1:28100 --json > context.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "context",
        "the decode rate as the context fills, against the KV bytes each step reads",
        "Asks for --max-tokens output tokens after each --prompt-tokens prompt and reads the\n"
        "inter-token latency (ITL) by position: positions are binned (--bin-tokens a bin) and\n"
        "each bin's median ITL stands at its context (prompt + position). Fits\n"
        "ITL = α + β·context and sets β beside the roofline's kv_bytes_per_token / bandwidth:\n"
        "every decode step reads the whole KV cache, so a longer context makes each step a\n"
        "little slower.",
        EXAMPLES,
    )
    add_client_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--prompt-tokens", type=counts, default=(200, 2000), metavar="N,N,...",
                   help="prompt lengths (default 200,2000)")
    g.add_argument("--max-tokens", type=positive_int, default=512, metavar="N",
                   help="output tokens a request (default 512)")
    g.add_argument("--runs", type=positive_int, default=1, metavar="K",
                   help="requests at each prompt length (default 1)")
    g.add_argument("--bin-tokens", type=positive_int, default=32, metavar="N",
                   help="output positions a bin (default 32)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = make_config(ContextConfig, prompt_tokens=args.prompt_tokens,
                         max_tokens=args.max_tokens, runs=args.runs, bin_tokens=args.bin_tokens,
                         **client_kwargs(args))
    total = 1 + config.runs * len(config.prompt_tokens)
    result = measure(args, "context", total, config,
                     lambda conn, progress: run_context(conn, config, progress=progress))
    if not emit(args, result):
        show(result)
    return 0


def show(r: ContextResult) -> None:
    header(r)
    data = r.to_json()
    cfg = r.config
    console.print(f"prompts of {', '.join(f'{n:,}' for n in data['prompt_tokens'])} tokens,"
                  f" {cfg.max_tokens:,} output tokens each; ITL median by {cfg.bin_tokens}"
                  " positions")
    bins = r.bins
    table = Table(title_justify="left")
    for col in ("context", "ITL median", "decode", "ceiling", "of ceiling"):
        table.add_column(col, justify="right")
    step = max(1, len(bins) // 12)  # about a dozen rows; the JSON has every bin
    shown = [*bins[::step], *([bins[-1]] if bins and (len(bins) - 1) % step else [])]
    for b in shown:
        held = r.held_at(b)
        table.add_row(f"{b.context:,.0f}", seconds(b.itl_median_s), rate(b.decode_tok_s),
                      held.mark + rate(held.ceiling) if held else "—",
                      f"{held.share:.0%}" if held else "—")
    console.print(table)
    fit = data["fit"]
    roof = data["roofline"]
    if fit["beta_s_per_token"] is not None:
        per_k = fit["beta_s_per_token"] * 1000
        r2 = f"R² {fit['r2']:.2f}, " if fit["r2"] is not None else ""
        console.print(f"fit: ITL = α + β·context, α = {seconds(fit['alpha_s'])}, β ="
                      f" {seconds(per_k)} a 1,000 tokens of context ({r2}{fit['points']} bins);"
                      f" slope resolved: {check_mark(fit['beta_resolved'])}")
    if roof["beta_predicted_s_per_token"] is not None:
        ratio = roof["beta_measured_over_predicted"]
        console.print(
            f"roofline: {human_bytes(roof['kv_bytes_per_token'])} of KV a token of context /"
            f" bandwidth = {seconds(roof['beta_predicted_s_per_token'] * 1000)} a 1,000 tokens"
            + (f"; measured ×{ratio:.1f} that" if ratio is not None else "")
        )
    if data["slowdown"] is not None:
        pred = data["slowdown_predicted"]
        console.print(
            f"decode went from {rate(data['first']['decode_tok_s'])} at"
            f" {data['first']['context']:,.0f} tokens to {rate(data['last']['decode_tok_s'])}"
            f" at {data['last']['context']:,.0f}: {data['slowdown']:.0%} slower"
            + (f" (the ceiling drops {pred:.0%})" if pred is not None else "")
        )
    footer(r, r.notes)
