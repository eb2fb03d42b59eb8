"""pdscope sweep: TTFT and decode rate against prompt length, with the fit and the article's
checks."""

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
from pdscope.experiments.sweep import BARELY_MOVES, SweepConfig, SweepResult, run_sweep
from pdscope.report.fmt import rate, seconds

EXAMPLES = """
  pdscope sweep http://127.0.0.1:28100                          200, 500, 1,000, 2,000 tokens
  pdscope sweep http://127.0.0.1:28100 --prompt-tokens 200,2000 the article's minute
  pdscope sweep http://localhost:11434 --model llama3.2 --prompt-tokens 500,1000,2000,4000
  pdscope sweep https://gpu-box:8000 --device h100-sxm --model-config config.json --runs 5
  pdscope sweep http://127.0.0.1:28100 --json > sweep.json
"""


# ---------------------------------------------------------------------------------- sweep


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "sweep",
        "TTFT and decode rate against prompt length, with a fit of the prefill cost",
        "Sends, for each --prompt-tokens length, --runs prompts of exactly that many tokens\n"
        "that the server has not seen (a prefix cache cannot flatter them), each asking for\n"
        "--max-tokens output tokens. Fits TTFT = a + b·n + c·n² (least squares over every run):\n"
        "a is the fixed overhead, b the cost of a prompt token (1/b its prefill rate), c the\n"
        "attention's quadratic term, kept only when the data resolve it. Checks the article's\n"
        "claims: doubling the prompt at least doubles the prefill part of TTFT, and the decode\n"
        "rate barely moves.",
        EXAMPLES,
    )
    add_client_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--prompt-tokens", type=counts, default=(200, 500, 1000, 2000),
                   metavar="N,N,...", help="prompt lengths (default 200,500,1000,2000)")
    g.add_argument("--max-tokens", type=positive_int, default=32, metavar="N",
                   help="output tokens to ask for, the same at every length (default 32)")
    g.add_argument("--runs", type=positive_int, default=3, metavar="K",
                   help="runs at each length (default 3)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = make_config(SweepConfig, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                         runs=args.runs, **client_kwargs(args))
    total = 1 + config.runs * len(config.prompt_tokens)
    result = measure(args, "sweep", total, config,
                     lambda conn, progress: run_sweep(conn, config, progress=progress))
    if not emit(args, result):
        show(result)
    return 0


def show(r: SweepResult) -> None:
    header(r)
    data = r.to_json()
    cfg = r.config
    exact = "exact, by the server's tokenizer" if data["prompt_exact"] else "estimated"
    source = data["points"][0]["prefill_source"] if data["points"] else None
    console.print(f"{len(r.points)} prompt lengths ({exact}), {cfg.runs} fresh prompts each,"
                  f" {cfg.max_tokens} output tokens; counts from {data['token_count_source']};"
                  f" prefill rate from {source}")
    table = Table(title_justify="left")
    for col in ("prompt tokens", "TTFT", "spread (min – max)", "TTFT floor", "prefill",
                "decode", "decode ceiling"):
        table.add_column(col, justify="right")
    for p in data["points"]:
        spread = p["spread"]["ttft_s"]
        table.add_row(
            f"{p['prompt_tokens']:,}", seconds(p["ttft_s"]),
            f"{spread['min']:.3f} – {spread['max']:.3f} s" if spread else "—",
            ("at most " if p.get("ttft_floor_beaten") else "") + seconds(p["ttft_floor_s"]),
            rate(p["prefill_tok_s"]), rate(p["decode_tok_s"]),
            ("at least " if p.get("decode_ceiling_beaten") else "")
            + rate(p["decode_ceiling_tok_s"]),
        )
    console.print(table)
    fit = r.fit
    if fit.a is not None and fit.b is not None:
        terms = f"{fit.a:.3f} s + {fit.b * 1e3:.4f} ms·n"
        if fit.c is not None:
            terms += f" + {fit.c * 1e6:.3g} µs·n²"
        r2 = f"R² {fit.r2:.3f}, " if fit.r2 is not None else ""
        console.print(f"fit: TTFT = {terms}  ({r2}{fit.points} runs)")
        console.print(f"  fixed overhead a = {seconds(fit.a)}; a prompt token costs"
                      f" b = {seconds(fit.b)} (prefill {rate(fit.prefill_tok_s)})")
        q = fit.quadratic_matters_tokens
        if fit.c is not None and q is not None:
            where = " (extrapolated)" if q > fit.n_max else ""
            console.print(f"  quadratic term: c·n² reaches 10% of the prefill part at"
                          f" {q:,} tokens{where}")
        else:
            console.print(f"  quadratic term not resolved: {fit.c_note}")
    else:
        console.print(f"fit: {fit.c_note}")
    share = r.attention_share_tokens
    if share is not None:
        console.print(f"  roofline: attention reaches 10% of prefill FLOPs at {share:,} tokens")
    checks = data["checks"]
    pairs = ", ".join(
        f"{d['n']:,}→{d['2n']:,} ×{d['ratio']:.2f}" for d in checks["doubling"]
        if d["ratio"] is not None
    )
    console.print(f"doubling the prompt at least doubles the prefill part:"
                  f" {check_mark(checks['doubling_at_least_doubles_prefill'])}"
                  + (f" ({pairs})" if pairs else " (no pair n, 2n in the lengths)"))
    change = checks["decode_rate_change"]
    if change is not None:
        predicted = checks["decode_rate_change_predicted"]
        pred = f"; the roofline predicts {predicted:.0%}" if predicted is not None else ""
        console.print(f"the decode rate barely moves (under {BARELY_MOVES:.0%}):"
                      f" {check_mark(checks['decode_rate_barely_moves'])}"
                      f" (largest change {change:.0%}{pred})")
    footer(r, r.notes)
