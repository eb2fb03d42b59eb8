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

from pdscope.cli import find_capacity
from pdscope.cli.common import (
    command_parser,
    console,
    err_console,
    flag_of,
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
from pdscope.cli.experiment import progress_bar
from pdscope.cli.server_args import add_server_args, client_kwargs
from pdscope.client import Timeouts
from pdscope.compare import Limit, Side, compare, parse_limits, read_side
from pdscope.errors import InputError
from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.conversations import (
    CONVERSATIONS_FILE,
    ConversationConfig,
    ConversationResult,
    run_conversations,
)
from pdscope.load.results import default_run_dir
from pdscope.load.runner import Stage, StageRun
from pdscope.load.summary import GOODPUT_NAMES
from pdscope.load.workers import auto_workers, import_ray
from pdscope.selftest.check import saved_capacity
from pdscope.workload.conversations import read_conversations
from pdscope.workload.datasets import parse_lengths
from pdscope.workload.schedule import parse_ints, parse_rates
from pdscope.workload.traces import FORMATS as TRACE_FORMATS
from pdscope.workload.traces import Trace, read_trace

EXAMPLES = """
  pdscope bench http://127.0.0.1:28100 --num-prompts 40 --request-rate 2
      open loop, Poisson arrivals at 2 requests/s: TTFT, TPOT, ITL and E2E percentiles
  pdscope bench http://127.0.0.1:28100 --concurrency 1,4,16 --num-prompts 48
      a sweep: throughput rises with the batch while p99 latency rises too
  pdscope bench URL --request-rate 4 --duration 60 --goodput ttft:500,tpot:50
  pdscope bench URL --concurrency 8 --num-prompts 64 --prefix-groups 2 --prefix-tokens 1500
  pdscope bench URL --request-rate inf --num-prompts 32 --max-concurrency 8 --json
  pdscope bench URL --dataset prompts.jsonl --request-rate 1 --num-prompts 100 --out runs/a
  pdscope bench URL --conversations 8 --turns 5 --think-s 2 --user-len 300 --request-rate 1
  pdscope bench URL --conversations 1 --dataset chats.jsonl --no-prefix-reuse --json
  pdscope bench URL --request-rate 1 --num-prompts 60 --seed 1 --baseline runs/a
      set beside an earlier run of the same workload (add --fail-on 'itl_p50:+10%' for CI)
  pdscope bench URL --trace mooncake_trace.jsonl --time-scale 0.5 --max-duration 120
      replay a trace (Mooncake, BurstGPT or pdscope JSONL): each request at its time, with
      its lengths and shared prefixes, twice as fast, its first two minutes
  pdscope bench URL --find-capacity --slo ttft:2000,itl:200 --calibration cal/calibration.json
      the most streams whose TTFT p99 and ITL p99 meet the SLO, measured: from the planner's
      prediction, levels doubled or halved to a bracket, bisected, its ends measured again
  pdscope bench URL --concurrency 1000 --duration 60 --workers auto
      the load split between worker processes, one per core (less the server's when local)
  pdscope bench URL --request-rate 200 --duration 120 --ray auto
      one worker on each node of the Ray cluster this machine belongs to (pdscope[ray])
  pdscope bench URL --concurrency 4 --num-prompts 32 --api openai-chat \\
      --extra-body '{"chat_template_kwargs": {"enable_thinking": false}}' --temperature 0
      every request with the model's thinking off (vLLM, SGLang) and greedy sampling
  pdscope bench URL --concurrency 4 --num-prompts 32 --header "X-Api-Key:$PROXY_KEY"
      through a proxy that wants its own header (the value is never printed or written)
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
    cv = p.add_argument_group("conversations (multi-turn; docs/conversations.md)")
    cv.add_argument("--conversations", type=int, metavar="N",
                    help="N conversations, each a closed loop of --turns turns sending the"
                         " history with the server's real answers (arrivals by --request-rate,"
                         " default all at once); with --dataset, its recorded conversations")
    cv.add_argument("--turns", type=int, default=3, metavar="K", help="turns a conversation")
    cv.add_argument("--think-s", type=float, default=0.0, metavar="S",
                    help="seconds between a turn's answer and the next turn's send")
    cv.add_argument("--user-len", type=int, default=64, metavar="L",
                    help="tokens of each new user message")
    cv.add_argument("--no-prefix-reuse", action="store_true",
                    help="a fresh cache_salt on every request (vLLM): no prefix-cache reuse")
    tr = p.add_argument_group("trace replay")
    tr.add_argument("--trace", metavar="FILE",
                    help="send a trace's requests at its times with its lengths: Mooncake JSONL"
                    " (its hash_ids become shared prefixes), BurstGPT CSV, or pdscope JSONL"
                    " {timestamp (s), input_tokens, output_tokens}")
    tr.add_argument("--trace-format", default="auto", choices=("auto", *TRACE_FORMATS),
                    help="the trace's format (default auto: .csv is BurstGPT, else by its"
                    " first line)")
    tr.add_argument("--time-scale", type=float_in(0, 1e6, above=True), default=1.0,
                    metavar="X", help="multiply the trace's times: 0.5 replays it twice as fast"
                    " (default 1)")
    tr.add_argument("--max-duration", type=positive_float, metavar="S",
                    help="replay the requests due in the first S seconds (after --time-scale)")
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
    find_capacity.add_args(p)
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


def trace_from_args(args: argparse.Namespace) -> Trace | None:
    """``--trace``'s requests, scaled and cut; ``None`` without it."""
    if args.trace is None:
        for flag, value, default in (("--time-scale", args.time_scale, 1.0),
                                     ("--max-duration", args.max_duration, None),
                                     ("--trace-format", args.trace_format, "auto")):
            if value != default:
                raise InputError(f"{flag} needs --trace FILE")
        return None
    for flag, value in (("--request-rate", args.request_rate),
                        ("--concurrency", args.concurrency), ("--duration", args.duration),
                        ("--dataset", args.dataset), ("--prefix-groups", args.prefix_groups)):
        if value is not None:
            raise InputError(f"--trace and {flag} exclude each other: the trace brings its own"
                             " times, lengths and prefixes (--max-duration and --num-prompts"
                             " cut it short)")
    trace = read_trace(args.trace, args.trace_format)
    return _flagged_fields(trace.replayed, args.time_scale, args.max_duration, args.num_prompts)


def _flagged_fields(f: Callable[..., T], *a: Any) -> T:
    """``f(*a)``, the fields its complaint names called by their flags."""
    try:
        return f(*a)
    except InputError as exc:
        raise InputError(exc.naming(lambda field: flag_of(field, {
            "max_duration_s": "--max-duration"}))) from None


def stages_from_args(args: argparse.Namespace, trace: Trace | None = None) -> list[Stage]:
    if trace is not None:
        return [Stage.of_trace(trace, warmup=args.warmup, max_concurrency=args.max_concurrency)]
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
        message = exc.naming(lambda _: flag)
        raise InputError(message if flag in message else f"{flag}: {message}") from None


def workload_from_args(args: argparse.Namespace, trace: Trace | None = None) -> Workload:
    return Workload(
        input_len=_flagged("--input-len", parse_lengths, args.input_len),
        output_len=_flagged("--output-len", parse_lengths, args.output_len),
        dataset=args.dataset,
        dataset_format=args.dataset_format,
        prefix_groups=args.prefix_groups,
        prefix_tokens=args.prefix_tokens,
        trace=trace,
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return make_config(
        BenchConfig, {"slo": "--goodput"},
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


def run(args: argparse.Namespace) -> int:
    if args.conversations is not None:
        return run_conversation_bench(args)
    if args.find_capacity or args.slo is not None:
        return find_capacity.run(args, workload_from_args(args), config_from_args(args))
    trace = trace_from_args(args)
    stages = stages_from_args(args, trace)
    workload = workload_from_args(args, trace)
    config = config_from_args(args)
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
            rows = [summary.to_json() for summary in result.summaries]
            print_json(rows if result.sweep else rows[0])
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
                    done, failed, tokens = len(run.finished), run.failed, run.output_tokens
                    elapsed = max(1e-3, (time.perf_counter_ns() - run.t0_ns) / 1e9)
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


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def _ms(seconds: float | None) -> str:
    """Seconds, shown in milliseconds."""
    return _num(None if seconds is None else seconds * 1000)


def show(result: BenchResult) -> None:
    console.print(f"[bold]{result.server.kind}[/bold] at {result.server.base_url}, model"
                  f" {result.target.model}; results in {result.folder}")
    table = Table(title_justify="left")
    for col in ("stage", "done / failed", "req/s", "out tok/s", "peak tok/s", "TTFT p50",
                "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99", "E2E p50"):
        table.add_column(col, justify="left" if col == "stage" else "right",
                         no_wrap=col == "stage")
    for s in result.summaries:
        failed = f"{s.failed}" + (f" +{s.incomplete} cut" if s.incomplete else "")
        table.add_row(
            s.name, f"{s.completed} / {failed}", f"{s.request_throughput:.2f}",
            f"{s.output_throughput:,.0f}", _num(s.max_output_tokens_per_s),
            _ms(s.ttft.median_s), _ms(s.ttft.p99_s),
            _ms(s.tpot.median_s), _ms(s.tpot.p99_s), _ms(s.itl.p99_s),
            _ms(s.e2e.median_s),
        )
    console.print(table)
    console.print("Times in ms. TTFT from the actual send; TPOT = (last - first token) /"
                  " (tokens - 1); ITL per token; E2E to the last token.")
    for s in result.summaries:
        extra = []
        if s.failed_by_cause:
            causes = ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_cause.items()))
            extra.append(f"failed: {causes}")
        if s.client_queue.p99_s is not None:
            extra.append(f"waited for --max-concurrency: p99 {_ms(s.client_queue.p99_s)}"
                         " ms (not in TTFT)")
        if s.schedule_lag.p99_s is not None:
            extra.append(f"send lag behind schedule: p99 {_ms(s.schedule_lag.p99_s)} ms")
        if s.workers > 1 or s.workers_lost:
            lost = f", {len(s.workers_lost)} lost" if s.workers_lost else ""
            extra.append(f"{s.workers} load workers{lost}")
        if s.ttfo is not None:
            extra.append(f"the model thought before it answered: first answer token (TTFO)"
                         f" p50 {_ms(s.ttfo.median_s)} ms, p99 {_ms(s.ttfo.p99_s)} ms;"
                         f" {s.total_reasoning_tokens or 0:,} of {s.total_output_tokens:,}"
                         " output tokens were reasoning")
        if s.goodput is not None:
            limits = s.goodput.limits_ms()
            extra.append(f"goodput {s.goodput.request_goodput:.2f} req/s"
                         f" ({s.goodput.good_requests} of {s.completed} met {limits})")
        window = s.server_metrics.window if s.server_metrics else None
        if window is not None and window.ttft_p50_s is not None:
            lo, hi = window.resolution.get("ttft_p50_s") or (math.inf, math.inf)
            bucket = (f" (bucket {lo:g}–{hi:g} s)" if math.isfinite(lo) and math.isfinite(hi)
                      else "")
            peak = s.server_metrics.peak if s.server_metrics else None
            waited = (f"; at most {peak.num_requests_waiting:.0f} waiting (KV"
                      f" {peak.kv_cache_usage:.0%}: {peak.queueing})"
                      if peak and peak.num_requests_waiting and peak.kv_cache_usage is not None
                      else "")
            extra.append(f"server's own TTFT p50 {window.ttft_p50_s:.3f} s{bucket}{waited}")
        if extra:
            console.print(f"{s.name}: " + "; ".join(extra))


def run_conversation_bench(args: argparse.Namespace) -> int:
    """``--conversations``: multi-turn conversations, a per-turn table."""
    dialogues: tuple[tuple[str, ...], ...] = ()
    if args.dataset:
        if not Path(args.dataset).is_file():
            raise InputError(f"--dataset {args.dataset}: no such file")
        dialogues = tuple(read_conversations(args.dataset))[:max(args.conversations, 0) or None]
    rates = _flagged("--request-rate", parse_rates, args.request_rate) if args.request_rate \
        else [math.inf]
    if len(rates) > 1:
        raise InputError("--conversations takes one --request-rate")
    output = _flagged("--output-len", parse_lengths, args.output_len)
    if output.kind != "fixed":
        raise InputError("--conversations takes a fixed --output-len (a number of tokens)")
    config = make_config(
        ConversationConfig, None,
        **client_kwargs(args),
        timeouts=Timeouts(connect=args.timeout_connect, first_token=args.timeout_first_token,
                          between_tokens=args.timeout_between_tokens, total=args.timeout_total),
        conversations=args.conversations, turns=args.turns, think_s=args.think_s,
        user_len=args.user_len, output_len=int(output.a),
        request_rate=rates[0], prefix_reuse=not args.no_prefix_reuse, dialogues=dialogues,
    )
    with out_folder(args.out or default_run_dir()) as folder:
        total = sum(len(d) for d in dialogues) if dialogues else args.conversations * args.turns
        with progress_bar("conversations", total) as progress:
            result = run_async(lambda: run_conversations(args.url, config, progress=progress))
        data = result.to_json()
        write_result(folder / CONVERSATIONS_FILE, json.dumps(data, indent=2))
    if args.json:
        print_json(data)
    else:
        show_turns(result)
    failed = sum(1 for r in result.records if r.error is not None)
    if failed:
        print_error(f"{failed} turn(s) failed")
        return 1
    return 0


def show_turns(result: ConversationResult) -> None:
    table = Table(title="per turn")
    for col in ("turn", "n", "TTFT p50 ms", "TTFT p90 ms", "prompt tok", "cached"):
        table.add_column(col, justify="right")
    for t in result.per_turn:
        table.add_row(str(t.turn), str(t.n), _ms(t.ttft_p50_s), _ms(t.ttft_p90_s),
                      _num(t.prompt_tokens_p50),
                      "-" if t.cached_share is None else f"{t.cached_share:.0%}")
    console.print(table)
    if result.server_cache_share is not None:
        console.print(f"server prefix-cache hit share (/metrics): "
                      f"{result.server_cache_share:.0%}")
