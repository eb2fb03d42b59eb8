"""pdscope bench: load a server at a rate or a concurrency; percentiles, goodput, sweeps."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pdscope.cli.common import (
    command_parser,
    console,
    err_console,
    float_in,
    int_in,
    make_config,
    non_negative_float,
    non_negative_int,
    out_folder,
    positive_float,
    positive_int,
    print_error,
    print_json,
    run_async,
    share,
    slo_arg,
    warn,
    write_result,
)
from pdscope.cli.compare import gate
from pdscope.cli.compare import show as show_comparison
from pdscope.cli.server_args import add_server_args, client_kwargs
from pdscope.client import Timeouts
from pdscope.compare import Limit, Side, compare, parse_limits, read_side
from pdscope.errors import InputError
from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.results import default_run_dir
from pdscope.load.runner import Stage, StageRun
from pdscope.load.schedule import parse_ints, parse_rates
from pdscope.load.summary import GOODPUT_NAMES
from pdscope.load.workers import auto_workers, import_ray
from pdscope.selftest.check import saved_capacity
from pdscope.workload.datasets import parse_lengths

EXAMPLES = """
  pdscope bench http://127.0.0.1:28100 --num-prompts 40 --request-rate 2
      open loop, Poisson arrivals at 2 requests/s: TTFT, TPOT, ITL and E2E percentiles
  pdscope bench http://127.0.0.1:28100 --concurrency 1,4,16 --num-prompts 48
      a sweep: throughput rises with the batch while p99 latency rises too
  pdscope bench URL --request-rate 4 --duration 60 --goodput ttft:500,tpot:50
  pdscope bench URL --concurrency 8 --num-prompts 64 --prefix-groups 2 --prefix-tokens 1500
  pdscope bench URL --request-rate inf --num-prompts 32 --max-concurrency 8 --json
  pdscope bench URL --dataset prompts.jsonl --request-rate 1 --num-prompts 100 --out runs/a
  pdscope bench URL --request-rate 1 --num-prompts 60 --seed 1 --baseline runs/a
      set beside an earlier run of the same workload (add --fail-on 'itl_p50:+10%' for CI)
  pdscope bench URL --concurrency 1000 --duration 60 --workers auto
      the load split between worker processes, one per core (less the server's when local)
  pdscope bench URL --request-rate 200 --duration 120 --ray auto
      one worker on each node of the Ray cluster this machine belongs to (pdscope[ray])
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "bench",
        "load a server: open/closed loop, percentiles, goodput, sweeps",
        "Open loop (--request-rate): every request is sent at its scheduled time whatever\n"
        "earlier ones are doing, so a slow server cannot hide its slowness; the lag between\n"
        "schedule and send is reported. Closed loop (--concurrency): C streams, each sending\n"
        "its next request when the last ends. A list of rates or concurrencies is a sweep.\n"
        "Every finished request is written at once to the run folder's requests.jsonl;\n"
        "Ctrl-C stops scheduling, lets what is in flight finish, and still writes the summary.",
        EXAMPLES,
    )
    add_server_args(p)
    g = p.add_argument_group("load")
    g.add_argument("--request-rate", metavar="R", help="requests a second (open loop, Poisson);"
                   " a list sweeps: 1,2,4,8; inf: all at once")
    g.add_argument("--burstiness", type=float_in(0, 1000, above=True), default=1.0,
                   help="gamma shape of the gaps between arrivals: 1 Poisson, <1 burstier")
    g.add_argument("--concurrency", metavar="C",
                   help="streams (closed loop); a list sweeps: 1,4,16,64")
    g.add_argument("--max-concurrency", type=positive_int, metavar="C",
                   help="open loop: at most C in flight; the wait is reported apart from TTFT")
    g.add_argument("--ramp", type=non_negative_float, default=0.0, metavar="S",
                   help="closed loop: start the streams evenly over S seconds (default 0)")
    g.add_argument("--num-prompts", type=positive_int, metavar="N", help="requests a stage")
    g.add_argument("--duration", type=positive_float, metavar="S", help="seconds a stage")
    g.add_argument("--warmup", type=non_negative_int, default=0, metavar="N",
                   help="first N requests of each stage left out of the statistics")
    s = p.add_argument_group("scale-out (docs/scale-out.md)")
    s.add_argument("--workers", type=workers_count, metavar="N|auto",
                   help="split the load between N worker processes on this machine, each with"
                   " its own event loop; auto: one per core, less one when the server is local")
    s.add_argument("--ray", metavar="ADDRESS",
                   help="split the load between Ray actors, one on each node: local (a throwaway"
                   " Ray here), auto (this machine's cluster), ray://HOST:PORT or HOST:PORT;"
                   " needs pip install 'pdscope[ray]'")
    w = p.add_argument_group("workload")
    w.add_argument("--input-len", default="512",
                   help="prompt tokens: N, uniform:MIN:MAX or normal:MEAN:SD (default 512)")
    w.add_argument("--output-len", default="128",
                   help="output tokens: N, uniform:MIN:MAX or normal:MEAN:SD (default 128)")
    w.add_argument("--prefix-groups", type=positive_int, metavar="G",
                   help="shared-prefix workload: G groups, each with its own system prompt")
    w.add_argument("--prefix-tokens", type=positive_int, default=1000, metavar="S",
                   help="tokens of each group's shared system prompt (default 1000)")
    w.add_argument("--dataset", metavar="PATH",
                   help="JSONL ({prompt|messages, max_tokens} a line) or ShareGPT JSON")
    w.add_argument("--dataset-format", default="auto", choices=("auto", "jsonl", "sharegpt"))
    w.add_argument("--no-fixed-output", action="store_true",
                   help="let answers stop early (no ignore_eos / min_tokens)")
    w.add_argument("--seed", type=int, default=0, help="workload and arrival seed (0: random)")
    t = p.add_argument_group("timeouts (seconds)")
    t.add_argument("--timeout-connect", type=positive_float, default=Timeouts.connect)
    t.add_argument("--timeout-first-token", type=positive_float, default=Timeouts.first_token)
    t.add_argument("--timeout-between-tokens", type=positive_float,
                   default=Timeouts.between_tokens)
    t.add_argument("--timeout-total", type=positive_float, default=Timeouts.total)
    t.add_argument("--drain", type=non_negative_float, default=30.0,
                   help="after Ctrl-C, seconds in-flight requests get to finish (default 30)")
    o = p.add_argument_group("output")
    o.add_argument("--no-metrics", action="store_true",
                   help="do not scrape the server's /metrics beside the load (metrics.jsonl)")
    o.add_argument("--goodput", metavar="SLO", help="objectives in ms: ttft:500,tpot:50,e2el:5000")
    o.add_argument("--out", metavar="DIR", help="run folder (default runs/bench-DATE-TIME);"
                   " made with its parents before the first request")
    o.add_argument("--max-failed", type=share, metavar="F",
                   help="exit 1 when more than this share (0 to 1) of a stage's requests failed"
                   " (default: only when none completed)")
    o.add_argument("--json", action="store_true",
                   help="print the summary JSON (a list for a sweep) on stdout")
    o.add_argument("--baseline", metavar="DIR",
                   help="an earlier bench run folder (or a folder of them): at the end, every"
                   " figure set beside it as pdscope compare does (compare.json in --out)")
    o.add_argument("--fail-on", metavar="SPEC",
                   help="with --baseline: exit 1 when a significant change passes a limit,"
                   " e.g. 'ttft_p99:+10%%,decode_tok_s:-5%%'")
    p.set_defaults(handler=run)


def stages_from_args(args: argparse.Namespace) -> list[Stage]:
    if (args.request_rate is None) == (args.concurrency is None):
        raise InputError("give --request-rate or --concurrency (one of them)")
    if args.num_prompts is None and args.duration is None:
        raise InputError("give --num-prompts or --duration: a load test must end by itself")
    if args.prefix_groups is not None and args.dataset:
        raise InputError("--prefix-groups and --dataset exclude each other: a dataset brings"
                         " its own prompts")
    common: dict[str, Any] = dict(
        num_prompts=args.num_prompts, duration_s=args.duration, warmup=args.warmup,
        seed=args.seed,
    )
    if args.request_rate is not None:
        return [Stage(request_rate=r, burstiness=args.burstiness,
                      max_concurrency=args.max_concurrency, **common)
                for r in _flagged("--request-rate", parse_rates, args.request_rate)]
    return [Stage(concurrency=c, ramp_s=args.ramp, **common)
            for c in parse_ints(args.concurrency, "--concurrency")]


def workers_count(text: str) -> int | str:
    """``--workers``: ``auto`` or a whole number from 1 to 1,024."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int_in(1, 1024)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a number of processes, or auto)") from None


T = TypeVar("T")


def _flagged(flag: str, parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``, its complaint naming the flag."""
    try:
        return parse(text)
    except InputError as exc:
        message = str(exc)
        raise InputError(message if flag in message else f"{flag}: {message}") from None


def run(args: argparse.Namespace) -> int:
    stages = stages_from_args(args)
    workload = Workload(
        input_len=_flagged("--input-len", parse_lengths, args.input_len),
        output_len=_flagged("--output-len", parse_lengths, args.output_len),
        dataset=args.dataset,
        dataset_format=args.dataset_format,
        prefix_groups=args.prefix_groups,
        prefix_tokens=args.prefix_tokens,
    )
    config = make_config(
        BenchConfig, {"drain_s": "--drain", "ray_address": "--ray", "slo": "--goodput"},
        **client_kwargs(args),
        timeouts=Timeouts(connect=args.timeout_connect, first_token=args.timeout_first_token,
                          between_tokens=args.timeout_between_tokens, total=args.timeout_total),
        slo=slo_arg("--goodput", args.goodput, tuple(GOODPUT_NAMES)) if args.goodput else None,
        drain_s=args.drain,
        record_metrics=not args.no_metrics,
        client_capacity_streams=saved_capacity(),
        max_failed=args.max_failed,
        workers=auto_workers(args.url) if args.workers == "auto" else args.workers,
        ray_address=args.ray,
    )
    if args.ray is not None:
        import_ray()  # before anything is measured: one line on how to install it
    if args.dataset and not Path(args.dataset).is_file():
        raise InputError(f"--dataset {args.dataset}: no such file")
    if args.fail_on and not args.baseline:
        raise InputError("--fail-on needs --baseline DIR (the run to compare against)")
    limits = parse_limits(args.fail_on) if args.fail_on else ()
    baseline = read_side(args.baseline) if args.baseline else None
    if baseline is not None and len(stages) > 1:
        raise InputError("--baseline compares one load level: give one --request-rate or"
                         " --concurrency")
    with out_folder(args.out or default_run_dir()) as folder:
        result = _run_with_progress(args.url, config, stages, workload, folder)
    for w in result.warnings:
        warn(w)
    if result.summaries:
        if args.json:
            print_json(result.summaries if result.sweep else result.summaries[0])
        else:
            show(result)
    if any(r.interrupted for r in result.runs):
        return 130
    failure = result.failure(config.max_failed)
    if failure is not None:
        print_error(failure)
        return 1
    if baseline is not None:
        return against_baseline(baseline, result.folder, limits, quiet=args.json)
    return 0


def against_baseline(baseline: Side, folder: Path, limits: tuple[Limit, ...], *,
                     quiet: bool) -> int:
    """The run set beside the baseline (written to compare.json; shown unless ``quiet``); 1
    when a limit trips. Unlike runs are compared anyway, with what differs said."""
    comparison = compare(baseline, folder, force=True)
    write_result(folder / "compare.json", json.dumps(comparison.to_json(), indent=2),
                 "the comparison")
    if not quiet:
        show_comparison(comparison)
    for d in comparison.differences:
        warn(f"the baseline is unlike this run: {d}")
    return gate(comparison, limits)


def _run_with_progress(url: str, config: BenchConfig, stages: list[Stage], workload: Workload,
                       folder: Any) -> BenchResult:
    async def main() -> BenchResult:
        stop, cancel = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_sigint() -> None:
            if stop.is_set():
                cancel.set()
                err_console.print("pdscope: cancelling the requests in flight")
            else:
                stop.set()
                err_console.print("pdscope: stopping: no new requests; waiting for those in"
                                  " flight (Ctrl-C again to cancel them)")

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        loop.add_signal_handler(signal.SIGTERM, on_sigint)
        with Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=err_console, transient=True,
            disable=not err_console.is_terminal,  # a failure off a terminal is one line
        ) as bar:
            def for_stage(stage: Stage) -> Any:
                total = stage.num_prompts + stage.warmup if stage.num_prompts else None
                task = bar.add_task(stage.name, total=total, info="")

                def progress(run: StageRun, in_flight: int) -> None:
                    done = len(run.finished)
                    failed = sum(1 for f in run.finished if not f.record.ok)
                    elapsed = max(1e-3, (time.perf_counter_ns() - run.t0_ns) / 1e9)
                    tokens = sum(f.record.output_tokens or 0 for f in run.finished)
                    bar.update(task, completed=done, info=(
                        f"{done - failed} done, {failed} failed, {in_flight} in flight,"
                        f" {tokens / elapsed:,.0f} out tok/s"))
                    if stage.duration_s and not stage.num_prompts:
                        bar.update(task, total=None)
                return progress

            try:
                return await run_bench(url, config, stages, workload, folder, stop=stop,
                                       cancel=cancel, progress=for_stage)
            finally:
                loop.remove_signal_handler(signal.SIGINT)
                loop.remove_signal_handler(signal.SIGTERM)

    return run_async(main)


def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def show(result: BenchResult) -> None:
    console.print(f"[bold]{result.server.kind}[/bold] at {result.server.base_url}, model"
                  f" {result.target.model}; results in {result.folder}")
    table = Table(title_justify="left")
    for col in ("stage", "done / failed", "req/s", "out tok/s", "peak tok/s", "TTFT p50",
                "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99", "E2E p50"):
        table.add_column(col, justify="left" if col == "stage" else "right",
                         no_wrap=col == "stage")
    for s in result.summaries:
        failed = f"{s['failed']}" + (f" +{s['incomplete']} cut" if s["incomplete"] else "")
        table.add_row(
            s["stage"]["name"], f"{s['completed']} / {failed}", f"{s['request_throughput']:.2f}",
            f"{s['output_throughput']:,.0f}", _ms(s["max_output_tokens_per_s"]),
            _ms(s["median_ttft_ms"]), _ms(s["p99_ttft_ms"]), _ms(s["median_tpot_ms"]),
            _ms(s["p99_tpot_ms"]), _ms(s["p99_itl_ms"]), _ms(s["median_e2el_ms"]),
        )
    console.print(table)
    console.print("Times in ms. TTFT from the actual send; TPOT = (last - first token) /"
                  " (tokens - 1); ITL per token; E2E to the last token.")
    for s in result.summaries:
        extra = []
        if s["failed_by_cause"]:
            causes = ", ".join(f"{k} {v}" for k, v in sorted(s["failed_by_cause"].items()))
            extra.append(f"failed: {causes}")
        if s.get("p99_client_queue_ms") is not None:
            extra.append(f"waited for --max-concurrency: p99 {_ms(s['p99_client_queue_ms'])} ms"
                         " (not in TTFT)")
        if s.get("p99_schedule_lag_ms") is not None:
            extra.append(f"send lag behind schedule: p99 {_ms(s['p99_schedule_lag_ms'])} ms")
        if (s.get("workers") or 1) > 1 or s.get("workers_lost"):
            lost = f", {len(s['workers_lost'])} lost" if s.get("workers_lost") else ""
            extra.append(f"{s['workers']} load workers{lost}")
        if s.get("request_goodput") is not None:
            extra.append(f"goodput {s['request_goodput']:.2f} req/s ({s['good_requests']} of"
                         f" {s['completed']} met {s['goodput_slo_ms']})")
        sm = s.get("server_metrics")
        if sm and sm.get("ttft_p50_s") is not None:
            lo, hi = (sm.get("resolution") or {}).get("ttft_p50_s") or (None, None)
            bucket = f" (bucket {lo:g}–{hi:g} s)" if lo is not None and hi is not None else ""
            peak = sm.get("peak") or {}
            waited = (f"; at most {peak['num_requests_waiting']:.0f} waiting (KV"
                      f" {peak['kv_cache_usage']:.0%}: {peak['queueing']})"
                      if peak.get("num_requests_waiting") and peak.get("kv_cache_usage")
                      is not None else "")
            extra.append(f"server's own TTFT p50 {sm['ttft_p50_s']:.3f} s{bucket}{waited}")
        if extra:
            console.print(f"{s['stage']['name']}: " + "; ".join(extra))
