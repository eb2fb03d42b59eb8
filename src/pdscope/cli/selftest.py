"""pdscope selftest: the client's own timing error, against a server whose timing is known."""

from __future__ import annotations

import argparse
import math
import os

from rich.table import Table

from pdscope.cli.bench import workers_count
from pdscope.cli.common import (
    command_parser,
    console,
    err_console,
    float_in,
    int_in,
    make_config,
    port,
    print_json,
    run_async,
    share,
)
from pdscope.errors import InputError, RunError
from pdscope.load.workers import auto_workers
from pdscope.selftest.check import (
    DEFAULT_LEVELS,
    ERROR_LIMIT_MS,
    SelftestResult,
    run_selftest,
    save,
)
from pdscope.selftest.pin import choose
from pdscope.selftest.server import LOOPS
from pdscope.selftest.server import main as serve
from pdscope.workload.schedule import parse_ints

EXAMPLES = """
  pdscope selftest                         rising concurrency until the error passes 1 ms
  pdscope selftest --levels 1,50,200 --json
  pdscope selftest --levels 200,500,1000 --workers 2
      the same, the load split between two worker processes (as bench --workers 2)
  pdscope selftest --pin --levels 200,500,1000,2000 --all-levels
      the server on one core and the client on another (two cores at least): each side's
      lateness is its own
  pdscope selftest --serve --port 8300 --itl-ms 10 --fault-rate 0.1
      run the reference server alone (127.0.0.1), to try any client against it
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "selftest",
        "measure the client's own timing error and the load it sustains",
        "Starts pdscope's reference streaming server on 127.0.0.1 (exact schedule: TTFT, then\n"
        "one token every ITL, the send and due time of every chunk written into it) and runs\n"
        "closed-loop load at rising concurrency. Reports per level the schedule error of TTFT\n"
        "and ITL (p50, p99), split into the server's lateness and the client's, and the\n"
        f"highest concurrency held with median errors under {ERROR_LIMIT_MS:g} ms; `bench` warns\n"
        "above it.",
        EXAMPLES,
    )
    p.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)),
                   help=f"concurrencies to try (default {','.join(map(str, DEFAULT_LEVELS))})")
    p.add_argument("--itl-ms", type=float_in(0, 10_000, above=True), default=10.0,
                   help="the server's ITL, above 0 and at most 10,000 ms (default 10)")
    p.add_argument("--ttft-ms", type=float_in(0, 60_000), default=50.0,
                   help="the server's TTFT, 0 to 60,000 ms (default 50)")
    p.add_argument("--output-tokens", type=int_in(2, 100_000), default=100,
                   help="tokens a request, 2 to 100,000 (default 100)")
    p.add_argument("--burst", action="store_true",
                   help="start every stream at once (default: spread over one request's length,"
                   " as independent users arrive); a burst measures the server's backlog too")
    p.add_argument("--all-levels", action="store_true",
                   help="run every level even after one fails the 1 ms limit")
    p.add_argument("--workers", type=workers_count, metavar="N|auto",
                   help="split each level between N worker processes, as `bench --workers`"
                   " does (auto: one per core, less the reference server's)")
    p.add_argument("--pin", action="store_true",
                   help="pin the reference server to one core and the client (and its workers)"
                   " to another, so that neither's lateness is the other's (needs two cores;"
                   " with --serve: the server on its core)")
    p.add_argument("--server-loop", choices=LOOPS, default="auto",
                   help="the reference server's event loop (default auto: uvloop when it is"
                   " installed; asyncio: Python's own)")
    p.add_argument("--serve", action="store_true",
                   help="only run the reference server until Ctrl-C (prints its URL)")
    p.add_argument("--port", type=port, default=0, help="with --serve: the port (0: any)")
    p.add_argument("--fault-rate", type=share, default=0.0,
                   help="with --serve: share of requests (0 to 1) given a random fault")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    pinning = make_config(choose) if args.pin else None
    if args.serve:
        if pinning is not None:
            os.sched_setaffinity(0, {pinning.server_cpu})
        argv = ["--loop", args.server_loop,
                "--port", str(args.port), "--itl-s", str(args.itl_ms / 1000),
                "--ttft-base-s", str(args.ttft_ms / 1000), "--fault-rate", str(args.fault_rate)]
        try:
            serve(argv)
        except OSError as exc:
            raise RunError(f"cannot serve on 127.0.0.1:{args.port}:"
                           f" {exc.strerror or exc}") from None
        return 0
    if args.port or args.fault_rate:
        raise InputError("--port and --fault-rate go with --serve (the self-test starts its own"
                         " server, without faults)")
    levels = parse_ints(args.levels, "--levels")
    workers = (auto_workers("http://127.0.0.1") if args.workers == "auto" else args.workers)

    async def main() -> SelftestResult:
        return await run_selftest(
            levels, itl_s=args.itl_ms / 1000, ttft_s=args.ttft_ms / 1000,
            output_tokens=args.output_tokens, stop_after_failure=not args.all_levels,
            ramp=not args.burst,
            progress=lambda c: err_console.print(f"[dim]concurrency {c}...[/dim]"),
            workers=workers, pin=args.pin, server_loop=args.server_loop,
        )

    result = run_async(main)
    path = save(result)
    if args.json:
        print_json(result.to_json())
        return 0
    where = f"{workers} worker processes" if workers is not None else "one process"
    where += f"; server event loop: {result.server_loop}"
    if result.pinning is not None:
        where += (f"; pinned: server on core {result.pinning.server_cpu}, client on core"
                  f" {result.pinning.client_cpu}")
    console.print(f"reference server: TTFT {args.ttft_ms:g} ms, one token every"
                  f" {args.itl_ms:g} ms, {args.output_tokens} tokens; client event loop:"
                  f" {result.loop}, {where}")
    table = Table(title_justify="left")
    for col in ("streams", "requests", "TTFT err p50", "p99", "ITL err p50", "p99",
                "transit p50", "server late p50", "client late p50", "p99", "tok/s (ideal)"):
        table.add_column(col, justify="right")

    def ms(x: float) -> str:
        return "—" if math.isnan(x) else f"{x:+.2f}"

    for lv in result.levels:
        style = "" if lv.sustained else "yellow"
        table.add_row(
            str(lv.concurrency), f"{lv.requests}" + (f" ({lv.failed} failed)" if lv.failed else ""),
            ms(lv.ttft_err_p50_ms), ms(lv.ttft_err_p99_ms), ms(lv.itl_err_p50_ms),
            ms(lv.itl_err_p99_ms), ms(lv.transit_p50_ms), ms(lv.server_late_p50_ms),
            ms(lv.client_late_p50_ms), ms(lv.client_late_p99_ms),
            f"{lv.output_tok_s:,.0f} ({lv.ideal_tok_s:,.0f})", style=style,
        )
    console.print(table)
    best = result.max_sustained
    console.print(
        "Errors in ms: reported minus scheduled. Transit: send to the server's clock start;"
        " server late: its send minus its due time; client late: receive minus the server's"
        " send (the client's own overhead)."
    )
    if best is None:
        console.print(f"[yellow]No level held median errors under {ERROR_LIMIT_MS:g} ms.[/]")
    else:
        console.print(f"Sustained: up to [bold]{best}[/bold] concurrent streams with median"
                      f" TTFT and ITL errors under {ERROR_LIMIT_MS:g} ms. Saved to {path}.")
    return 0
