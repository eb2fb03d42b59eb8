"""``pdscope bench --find-capacity``: the highest load that meets an SLO, measured from the
planner's prediction (:mod:`pdscope.plan.measured`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from pdscope.cli.common import (
    console,
    err_console,
    int_in,
    make_config,
    out_folder,
    positive_float,
    print_json,
    run_async,
    slo_arg,
    write_result,
)
from pdscope.cli.server_args import client_kwargs
from pdscope.errors import InputError
from pdscope.load.bench import BenchConfig, Workload
from pdscope.load.results import default_run_dir
from pdscope.plan.calibrate import CalibrationConfig, load_calibration, run_calibration
from pdscope.plan.measured import (
    BY,
    CapacityConfig,
    LevelRun,
    MeasuredCapacity,
    Prediction,
    find_capacity,
    predict,
)

# A quick calibration to seed the search where none is given: two points a part, one run
# each (the full designed set is `pdscope plan calibrate`).
QUICK: dict[str, Any] = {"prefill_tokens": (128, 512), "decode_contexts": (64, 512),
                         "batch_streams": (2, 4), "runs": 1}
LOAD_FLAGS = ("--request-rate", "--concurrency", "--num-prompts", "--duration", "--trace")


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("capacity measured (docs/planner.md)")
    g.add_argument("--find-capacity", action="store_true",
                   help="search for the highest load that meets --slo, from the planner's"
                   " prediction: levels doubled or halved to a bracket, bisected, the"
                   " bracket's ends measured again in alternating order")
    g.add_argument("--slo", metavar="SLO",
                   help="with --find-capacity: objectives in ms at p99, ttft:2000,itl:200"
                   " (ttft, itl, tpot, e2e)")
    g.add_argument("--by", choices=BY, default="concurrency",
                   help="the load searched: closed-loop streams (default) or open-loop rate")
    g.add_argument("--calibration", metavar="FILE",
                   help="the planner's calibration (pdscope plan calibrate) that seeds the"
                   " search; without it a quick one is made first")
    g.add_argument("--capacity-tolerance", type=positive_float, default=0.1, metavar="F",
                   help="bisect until the bracket is at most this share of its low end"
                   " (default 0.1; streams: one apart)")
    g.add_argument("--level-s", type=positive_float, default=10.0, metavar="S",
                   help="seconds of load each level is measured (default 10)")
    g.add_argument("--capacity-runs", type=int_in(0, 10), default=2, metavar="N",
                   help="times the bracket's two ends are measured again (default 2)")
    g.add_argument("--max-levels", type=int_in(2, 50), default=10, metavar="N",
                   help="levels the search measures at most (default 10)")


def run(args: argparse.Namespace, workload: Workload, bench: BenchConfig) -> int:
    if not args.find_capacity:
        raise InputError("--slo is the objective of --find-capacity: add --find-capacity (a"
                         " bench's per-request objectives are --goodput)")
    if args.slo is None:
        raise InputError("--find-capacity needs --slo, e.g. --slo ttft:2000,itl:200")
    values = (args.request_rate, args.concurrency, args.num_prompts, args.duration, args.trace)
    given = [f for f, v in zip(LOAD_FLAGS, values, strict=True) if v is not None]
    if given:
        raise InputError(f"--find-capacity chooses the load itself: leave out {given[0]}"
                         " (--level-s sets how long each level runs)")
    if args.dataset or args.prefix_groups is not None:
        raise InputError("--find-capacity runs synthetic prompts of --input-len and"
                         " --output-len")
    config = make_config(CapacityConfig, {"tolerance": "--capacity-tolerance",
                                          "runs": "--capacity-runs"},
                         slo=slo_arg("--slo", args.slo), by=args.by,
                         tolerance=args.capacity_tolerance, level_s=args.level_s,
                         runs=args.capacity_runs, max_levels=args.max_levels)
    calibration = None
    if args.calibration:
        if not Path(args.calibration).is_file():
            raise InputError(f"--calibration {args.calibration}: no such file")
        calibration = load_calibration(args.calibration)
    with out_folder(args.out or default_run_dir()) as folder:
        if calibration is not None:
            source = f"the calibration {args.calibration}"
        else:
            err_console.print("pdscope: no --calibration: a quick calibration first (about a"
                              " minute)")
            cal_config = make_config(CalibrationConfig, None, **QUICK, **client_kwargs(args))
            calibration = asyncio.run(run_calibration(args.url, cal_config))
            write_result(folder / "calibration.json",
                         json.dumps(calibration.to_json(), indent=2), "the calibration")
            source = "a quick calibration (calibration.json)"
        predicted = predict(calibration, workload, config, source=source)
        if predicted is None:
            err_console.print("pdscope: the planner finds no load meeting the SLO; the search"
                              " starts from one")
        else:
            err_console.print(f"pdscope: the planner predicts {_level(config.by, predicted)}"
                              f" from {source}")

        def on_level(run: LevelRun) -> None:
            what = "again, " if run.round else ""
            err_console.print(f"  {what}{_level(config.by, run.level)}:"
                              f" {'meets' if run.met else 'misses'} the SLO"
                              f" ({_observed(run)}); {run.throughput:.2f} requests/s")

        result = run_async(lambda: find_capacity(args.url, bench, workload, config, folder,
                                                 predicted=predicted, on_level=on_level))
        data = result.to_json()
        write_result(folder / "capacity.json", json.dumps(data, indent=2), "the capacity")
    if args.json:
        print_json(data)
    else:
        show(result)
    return 0


def _level(by: str, x: float | Prediction) -> str:
    level = x.level if isinstance(x, Prediction) else x
    return f"{int(level)} streams" if by == "concurrency" else f"{level:.3g} requests/s"


def _observed(run: LevelRun) -> str:
    return ", ".join(f"{m.upper()} p99 {v * 1000:,.0f} ms" for m, v in run.observed)


def show(result: MeasuredCapacity) -> None:
    by = result.by
    if result.capacity is None:
        console.print(f"[bold]no level met the SLO[/] (the lowest measured:"
                      f" {_level(by, min(r.level for r in result.runs))})")
    else:
        above = ("none missed it" if result.first_failing is None
                 else f"{_level(by, result.first_failing)} missed it")
        console.print(f"capacity at the SLO: [bold]{_level(by, result.capacity)}[/]"
                      f" ({above})")
    if result.predicted is not None:
        console.print(f"  the planner predicted {_level(by, result.predicted)}"
                      f" ({result.predicted.source})")
    if result.held is not None:
        console.print("  measured again, alternated: " + (
            "the bracket held" if result.held else
            "[yellow]the bracket did not hold[/] (the load sits at the SLO's edge; see the"
            " runs below)"))
    console.print(f"  {len(result.search.levels)} levels, {len(result.runs)} stages,"
                  f" {result.elapsed_s:.0f} s; stopped: {result.search.stopped};"
                  f" results in {result.folder}")
    table = Table(title_justify="left")
    for col in ("level", "round", "SLO", "latencies at p99", "req/s", "done / failed"):
        table.add_column(col, justify="left" if col in ("level", "SLO") else "right")
    for r in result.runs:
        table.add_row(_level(by, r.level), str(r.round), "meets" if r.met else "misses",
                      _observed(r), f"{r.throughput:.2f}", f"{r.completed} / {r.failed}")
    console.print(table)
