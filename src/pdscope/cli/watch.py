"""pdscope watch: the server's own /metrics, a window at a time, and what it means."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime

import aiohttp
from rich import box
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pdscope.cli.common import (
    command_parser,
    console,
    positive_float,
    positive_int,
    print_json,
    warn,
)
from pdscope.cli.server_args import server_url
from pdscope.errors import InputError, RunError
from pdscope.hardware.devices import find_device
from pdscope.metrics import (
    METRIC_MAPS,
    MetricMap,
    Snapshot,
    Window,
    detect_metric_map,
    make_window,
    metric_map_named,
    metrics_url,
    scrape,
)
from pdscope.metrics.dashboard import Row, dashboard_rows, window_record
from pdscope.metrics.grafana import grafana_dashboard

EXAMPLES = """
  pdscope watch http://127.0.0.1:28100
      live dashboard of the lab's vLLM: a window every 2 s until Ctrl-C
  pdscope watch http://127.0.0.1:28100 --once
      one 2-second window, printed, then exit
  pdscope watch http://gpu-box:8000/v1 --json --interval 1 --count 60 > windows.jsonl
      a minute of one-second windows, one JSON object a line
  pdscope watch http://gpu-box:8000 --device h100-sxm --model llama-8b
      one model's series only, bandwidth set beside the H100's
  pdscope watch --grafana-dashboard --family sglang > dashboard.json
      a Grafana dashboard of the same names, for Prometheus users
"""

# Seconds of failed scrapes in a row (a server restarting) before watch gives up, by default.
PATIENCE_S = 300.0

LEVEL_STYLE = {"ok": "", "warn": "bold yellow", "unknown": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    families = [m.name for m in METRIC_MAPS]
    p = command_parser(
        sub,
        "watch",
        "live dashboard of a server's /metrics: the five names and what they mean",
        "Scrape URL/metrics every --interval seconds and show what the server did between two\n"
        "scrapes: requests running and waiting, KV-cache usage, TTFT and inter-token latency\n"
        "percentiles (read from the histograms' difference, with the bucket each falls in),\n"
        "then the signals derived from them: prefix-cache hit rate, preemptions, whether\n"
        "waiting requests wait for KV blocks (capacity) or for the scheduler, tokens an\n"
        "engine step and memory bandwidth. A value the server does not export is shown with\n"
        "the reason, never as 0. Works with vLLM, SGLang, llama.cpp (--metrics) and TGI;\n"
        "Ollama has no /metrics (use `pdscope probe`).",
        EXAMPLES,
    )
    p.add_argument(
        "url", nargs="?", metavar="URL", type=server_url,
        help="the server's base URL (http://host:port; a trailing /v1 or /metrics is fine)",
    )
    p.add_argument("--interval", type=positive_float, default=2.0, metavar="S",
                   help="seconds between scrapes: the length of a window (default 2)")
    p.add_argument("--count", type=positive_int, metavar="N", help="stop after N windows")
    p.add_argument("--once", action="store_true", help="one window (two scrapes), then exit")
    p.add_argument("--json", action="store_true", help="one JSON object a window, a line each")
    p.add_argument("--model", metavar="NAME", help="only the series of this model name")
    p.add_argument("--engine", metavar="E", help="only this engine (vLLM's engine label)")
    p.add_argument(
        "--family", choices=families,
        help="the server family, when detection from the metric names is not wanted; for "
        "--grafana-dashboard it picks the names (default vllm)",
    )
    p.add_argument(
        "--device", metavar="ID",
        help="set the achieved bandwidth beside this device's (see `pdscope devices`)",
    )
    p.add_argument("--timeout", type=positive_float, default=5.0, metavar="S",
                   help="seconds to wait for one scrape (default 5)")
    p.add_argument(
        "--patience", type=positive_float, default=PATIENCE_S, metavar="S",
        help="while scrapes fail (a server restarting), keep trying for S seconds before "
        f"giving up (default {PATIENCE_S:g}); the window across a restart says so",
    )
    p.add_argument("--grafana-dashboard", action="store_true",
                   help="print a Grafana dashboard JSON of the five names and exit")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.grafana_dashboard:
        print_json(grafana_dashboard(metric_map_named(args.family or "vllm")))
        return 0
    if not args.url:
        raise InputError("watch: give the server's URL, e.g. http://127.0.0.1:8000 (see --help)")
    if args.once and args.count is not None:
        raise InputError("watch: --once and --count exclude each other (--once is --count 1)")
    ceiling = find_device(args.device).mem_bandwidth_gb_s if args.device else None
    family = metric_map_named(args.family) if args.family else None
    windows = 1 if args.once else args.count
    try:
        asyncio.run(watch(args, family, windows, ceiling))
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how a live dashboard is meant to end
    return 0


def _raise_if_cancelled() -> None:
    """Ctrl-C cancels the running task (``asyncio.run``); a cancellation that arrived inside a
    scrape can come out of aiohttp as a timeout, read here as a failed scrape, and the
    dashboard would go on trying: the task's pending cancellation says it should stop."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11 on
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


async def watch(
    args: argparse.Namespace,
    family: MetricMap | None,
    windows: int | None,
    ceiling: float | None,
) -> None:
    url = args.url
    async with aiohttp.ClientSession() as session:
        previous = await scrape(url, session, timeout=args.timeout)
        if family is None:
            family = detect_metric_map(previous.names)
        if family is None:
            raise RunError(
                f"{metrics_url(url)} serves Prometheus text, but none of the metrics of vLLM, "
                "SGLang, llama.cpp or TGI: name the family with --family if it is one of them"
            )
        _check_filters(previous, family, args.model, args.engine)
        show = _display(args, family, ceiling, url)
        live = None
        if show is None:  # a terminal, and neither --json nor --once: a live dashboard
            live = Live(
                Text(f"scraping {metrics_url(url)} every {args.interval:g} s; the first "
                     f"window closes in {args.interval:g} s", style="dim"),
                console=console, refresh_per_second=4, transient=False,
            )
            live.start()

            def update(window: Window) -> None:
                assert live is not None and family is not None
                live.update(render(window, family, url, ceiling, args.model))

            show = update
        try:
            await _loop(args, session, previous, family, windows, show)
        finally:
            if live is not None:
                live.stop()


def _check_filters(
    snap: Snapshot, family: MetricMap, model: str | None, engine: str | None
) -> None:
    """A --model or --engine the server does not have would make every value "absent"."""
    for value, label, flag in ((model, family.model_label, "--model"),
                               (engine, family.engine_label, "--engine")):
        if value is None or label is None:
            continue
        have = sorted(snap.engines(label))
        if have and value not in have:
            raise InputError(
                f"watch: {flag} {value!r}: the server's {label} values are {', '.join(have)}"
            )


async def _loop(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    previous: Snapshot,
    family: MetricMap,
    windows: int | None,
    show: Callable[[Window], None],
) -> None:
    start = time.monotonic()
    tick = 0
    done = 0
    down_since: float | None = None  # when the first of the scrapes failing in a row failed
    while windows is None or done < windows:
        tick += 1
        await asyncio.sleep(max(0.0, start + tick * args.interval - time.monotonic()))
        try:
            current = await scrape(args.url, session, timeout=args.timeout)
        except RunError as exc:
            _raise_if_cancelled()
            now = time.monotonic()
            if down_since is None:
                down_since = now
                warn(f"{exc}; trying again for up to {args.patience:g} s")
            elif now - down_since >= args.patience:
                raise RunError(
                    f"scrapes failed for {now - down_since:.0f} s in a row, the last: {exc}"
                ) from exc
            continue
        if down_since is not None:
            warn(f"{metrics_url(args.url)} answers again after "
                 f"{time.monotonic() - down_since:.0f} s")
            down_since = None
        show(make_window(previous, current, family, model=args.model, engine=args.engine))
        previous = current
        done += 1
        # A slow scrape overran some ticks: skip them rather than scrape back to back.
        tick = max(tick, int((time.monotonic() - start) / args.interval))


def _display(
    args: argparse.Namespace, family: MetricMap, ceiling: float | None, url: str
) -> Callable[[Window], None] | None:
    """How each window is shown; ``None`` for the live dashboard (a terminal)."""
    if args.json:

        def as_json(window: Window) -> None:
            record = {"url": metrics_url(url), **window_record(window, ceiling_gb_s=ceiling)}
            print(json.dumps(record, allow_nan=False), flush=True)

        return as_json
    if console.is_terminal and not args.once:
        return None

    def as_block(window: Window) -> None:
        block = render(window, family, url, ceiling, args.model)
        if console.is_terminal:
            console.print(block)
            console.print()
            return
        # Piped: plain lines without the padding rich leaves at the end of table rows.
        with console.capture() as captured:
            console.print(block)
        print("\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n", flush=True)

    return as_block


def _clock(wall: float | None) -> str:
    return datetime.fromtimestamp(wall).strftime("%H:%M:%S") if wall is not None else "?"


def render(
    window: Window,
    family: MetricMap,
    url: str,
    ceiling: float | None = None,
    model: str | None = None,
) -> RenderableType:
    """One window as a header line and a table: the five names, then the derived signals."""
    head = Text()
    head.append(f"{family.display} ", style="bold")
    head.append(f"{metrics_url(url)}  ")
    head.append(
        f"window {_clock(window.start_wall)}–{_clock(window.end_wall)} "
        f"({window.duration_s:.1f} s)"
    )
    if model:
        head.append(f"  model {model}")
    if window.reset:
        head.append("  counters went down: the server restarted in this window",
                    style="bold yellow")

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    table.add_column("", no_wrap=True, style="bold")
    table.add_column("value", no_wrap=True)
    table.add_column("what it means", overflow="fold")
    names, signal_rows = dashboard_rows(window, family, ceiling_gb_s=ceiling)

    def add(row: Row) -> None:
        style = LEVEL_STYLE[row.level]
        meaning = Text(row.meaning, style="dim" if row.level == "unknown" else "")
        table.add_row(row.label, Text(row.value, style=style), meaning)

    for row in names:
        add(row)
    table.add_section()
    for row in signal_rows:
        add(row)
    metrics = list(dict.fromkeys(row.metric for row in names if row.metric))
    foot = Text("the five names: " + ", ".join(metrics), style="dim")
    return Group(head, table, foot)
