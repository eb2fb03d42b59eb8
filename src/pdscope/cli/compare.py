"""``pdscope compare A B [C ...]``: did the change help?"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from pdscope.cli.common import (
    check_out_file,
    command_parser,
    console,
    float_in,
    print_json,
    warn,
    write_result,
)
from pdscope.compare import Comparison, Limit, compare_sides, parse_limits, read_side, tripped
from pdscope.compare.render import HEAD, cells, geomean_cells, html, markdown
from pdscope.compare.significance import ALPHA, DEFAULT_THRESHOLD
from pdscope.errors import InputError

EXAMPLES = """
  pdscope compare runs/before runs/after                 every figure, with a verdict
  pdscope compare runs/base runs/b256 runs/b512          each against the first
  pdscope compare runs/ab/a runs/ab/b --markdown         folders of rounds (pdscope ab)
  pdscope compare base/ new/ --fail-on 'ttft_p99:+10%,decode_tok_s:-5%'   a CI gate
  pdscope compare runs/bench pred.json                   a measurement against plan predict
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub, "compare", "set runs side by side: change, interval, p-value, verdict",
        "Sets run folders side by side: every figure both have (TTFT, ITL, TPOT and E2E\n"
        "percentiles, decode and prefill rates, throughput, goodput, users at the SLO,\n"
        "prefill stall), each with a 95% interval, the change in percent with its interval,\n"
        "a p-value and a verdict: better, worse, or ~ (no significant difference, or one\n"
        "under --threshold). Medians are tested on the requests (a block bootstrap and a\n"
        "rank test that count the dependence load brings), tails (p99) across runs, three or\n"
        "more a side; see docs/compare.md. A run is a bench or doctor folder, the --out file of\n"
        "probe, sweep, context, prefix or interference, a saved `plan predict --json`, or a\n"
        "folder of such runs (the rounds of `pdscope ab`). Exit 1 when --fail-on trips.",
        EXAMPLES)
    p.add_argument("runs", nargs="+", metavar="RUN", help="runs or folders of runs: B, C...")
    p.add_argument("--threshold", type=float_in(0, 99), default=100 * DEFAULT_THRESHOLD,
                   metavar="PCT", help="smallest change that is not ~, in percent (default 2)")
    p.add_argument("--alpha", type=float_in(0, 0.5, above=True), default=ALPHA,
                   help="significance level (default 0.05)")
    p.add_argument("--force", action="store_true",
                   help="compare unlike runs (another workload, model or server build)")
    p.add_argument("--fail-on", metavar="SPEC",
                   help="exit 1 when a significant change passes a limit, e.g."
                   " 'ttft_p99:+10%%,decode_tok_s:-5%%'")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--markdown", action="store_true",
                     help="print Markdown (a pull-request comment)")
    p.add_argument("--html", metavar="FILE", help="also write a page with the distributions")
    p.set_defaults(handler=run)


def show(c: Comparison) -> None:
    table = Table(title=f"{c.b} against {c.a}", title_justify="left")
    for i, h in enumerate(HEAD):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in c.rows:
        row = cells(r)
        style = {"better": "green", "worse": "red"}.get(r.verdict)
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/]" if style else row[-1])
    table.add_row(*geomean_cells(c))
    console.print(table)
    for f in c.findings:
        console.print(f"  finding {f.change}: {f.title} ({f.a or '—'} → {f.b or '—'})")
    for d in c.differences:
        console.print(f"  [yellow]unlike[/]: {d}")
    for n in c.notes:
        console.print(f"  [dim]{n}[/]")


def run(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        raise InputError("give two runs or more: A B [C ...]")
    limits: tuple[Limit, ...] = parse_limits(args.fail_on) if args.fail_on else ()
    if args.html:
        check_out_file(args.html, "--html")
    sides = [read_side(p) for p in args.runs]
    base = sides[0]
    comparisons = [compare_sides(base, other, threshold=args.threshold / 100, alpha=args.alpha,
                                 force=args.force, seed=args.seed) for other in sides[1:]]
    failed = [(c, limit, row) for c in comparisons for limit, row in tripped(c, limits)]
    if args.json:
        data: dict[str, Any] = (comparisons[0].to_json() if len(comparisons) == 1
                                else {"comparisons": [c.to_json() for c in comparisons]})
        if limits:
            data["gate"] = {"limits": [str(x) for x in limits],
                            "tripped": [f"{c.b}: {x} ({r.delta_pct:+.1f}%)"
                                        for c, x, r in failed]}
        print_json(data)
    elif args.markdown:
        print("\n".join(markdown(c) for c in comparisons))
    else:
        for c in comparisons:
            show(c)
    if args.html:
        pages = [html(c, base, side) for c, side in zip(comparisons, sides[1:], strict=True)]
        path = Path(args.html)
        for i, text in enumerate(pages):
            target = path if i == 0 else path.with_name(f"{path.stem}-{i + 1}{path.suffix}")
            write_result(target, text, "the comparison page")
    return max((gate(c, limits) for c in comparisons), default=0)


def gate(c: Comparison, limits: tuple[Limit, ...]) -> int:
    """Warn of each limit the comparison trips; the exit status: 1 when one trips, else 0."""
    failed = tripped(c, limits)
    for limit, row in failed:
        warn(f"gate: {row.label} changed {row.delta_pct:+.1f}% ({c.b} against {c.a}),"
             f" past the limit {limit}")
    return 1 if failed else 0
