"""``pdscope ab URL_A URL_B``: the same workload on two servers, interleaved, then compared."""

from __future__ import annotations

import argparse
import json

from pdscope.cli.common import (
    command_parser,
    float_in,
    int_in,
    make_config,
    out_folder,
    print_json,
    run_async,
    write_result,
)
from pdscope.cli.compare import gate, show
from pdscope.cli.experiment import progress_bar
from pdscope.cli.server_args import add_server_args, client_kwargs, server_url
from pdscope.compare import compare, parse_limits
from pdscope.compare.ab import OUTPUT_LEN, WORKLOADS, AbConfig, order, run_ab
from pdscope.compare.render import markdown
from pdscope.compare.significance import ALPHA, DEFAULT_THRESHOLD
from pdscope.experiments.interference import InterferenceConfig
from pdscope.load.results import default_run_dir

EXAMPLES = """
  pdscope ab http://127.0.0.1:28100 http://127.0.0.1:28101        4 rounds of 32 requests, 4 users
  pdscope ab URL_A URL_B --request-rate 2 --num-prompts 60 --rounds 6   an open-loop load level
  pdscope ab URL_A URL_B --workload probe --input-len 2000 --runs 5     one request at a time
  pdscope ab URL_A URL_B --workload interference --input-len 1800 --concurrency 4
      a long prompt into 4 decoding streams: the decode stall on each side
  pdscope ab URL_A URL_B --fail-on 'itl_p99:+10%' --markdown            a gate, a PR comment
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub, "ab", "interleaved A/B of two servers, then compare",
        "Runs the same workload on two servers, alternating A B, B A, A B... for --rounds\n"
        "rounds so that the machine's drift falls on both sides equally (both get the same\n"
        "prompts in a round, new ones in the next), then sets them side by side as\n"
        "`pdscope compare` does: every figure with its interval, p-value and verdict. The\n"
        "rounds stay in --out (a/round-01, b/round-01, ...; compare them again at will).",
        EXAMPLES)
    p.add_argument("url_a", metavar="URL_A", type=server_url, help="server A (the baseline)")
    p.add_argument("url_b", metavar="URL_B", type=server_url, help="server B (the change)")
    add_server_args(p, url="none", ceiling=False)  # the same for both servers
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default="load",
                   help="load: a load level (bench); probe: one request at a time;"
                   " interference: a prompt of --input-len tokens injected into --concurrency"
                   " decoding streams (the doctor's experiment: the decode stall)")
    w.add_argument("--rounds", type=int_in(2, 1000), default=4, help="rounds (default 4)")
    w.add_argument("--input-len", type=int_in(1, 1_000_000), default=512, metavar="N",
                   help="prompt tokens (default 512)")
    w.add_argument("--output-len", type=int_in(2, 1_000_000), metavar="N",
                   help=f"output tokens (default {OUTPUT_LEN}); interference: each decoding"
                   f" stream's (default {InterferenceConfig.stream_tokens}, at least"
                   f" {2 * InterferenceConfig.settle_tokens})")
    rate = w.add_mutually_exclusive_group()
    rate.add_argument("--request-rate", type=float_in(0, 1e6, above=True), metavar="R",
                      help="load: open-loop requests a second")
    rate.add_argument("--concurrency", type=int_in(1, 100_000), metavar="C",
                      help="load: closed-loop users; interference: decoding streams"
                      " (default 4)")
    w.add_argument("--num-prompts", type=int_in(2, 1_000_000), default=32, metavar="N",
                   help="load: requests a round on each side (default 32)")
    w.add_argument("--runs", type=int_in(2, 10_000), default=5,
                   help="probe: requests a round on each side (default 5)")
    w.add_argument("--seed", type=int, default=1, help="prompt seed (default 1)")
    c = p.add_argument_group("comparison")
    c.add_argument("--threshold", type=float_in(0, 99), default=100 * DEFAULT_THRESHOLD,
                   metavar="PCT", help="smallest change that is not ~, percent (default 2)")
    c.add_argument("--alpha", type=float_in(0, 0.5, above=True), default=ALPHA,
                   help="significance level (default 0.05)")
    c.add_argument("--fail-on", metavar="SPEC", help="exit 1 past a limit, e.g. 'ttft_p99:+10%%'")
    out = c.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--markdown", action="store_true", help="print Markdown")
    p.add_argument("--out", metavar="DIR", help="folder for the rounds (default runs/ab-DATE-TIME)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    limits = parse_limits(args.fail_on) if args.fail_on else ()
    concurrency = args.concurrency if args.request_rate or args.concurrency else 4
    config = make_config(
        AbConfig, rounds=args.rounds, workload=args.workload, input_len=args.input_len,
        output_len=args.output_len, request_rate=args.request_rate,
        concurrency=None if args.request_rate else concurrency,
        num_prompts=args.num_prompts, runs=args.runs, **client_kwargs(args))
    with out_folder(args.out or default_run_dir("ab")) as folder:
        total = len(order(config.rounds))
        with progress_bar(f"A/B, {config.rounds} rounds", total) as bar:
            a, b = run_async(lambda: run_ab(args.url_a, args.url_b, config, folder,
                                            progress=bar))
        result = compare(a, b, threshold=args.threshold / 100, alpha=args.alpha, force=True)
        write_result(folder / "compare.json", json.dumps(result.to_json(), indent=2),
                     "the comparison")
    if args.json:
        print_json(result.to_json())
    elif args.markdown:
        print(markdown(result))
    else:
        show(result)
        print(f"rounds in {folder}")
    return gate(result, limits)
