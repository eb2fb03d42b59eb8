"""pdscope doctor: the article's experiments, a ranked diagnosis, and a report."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from pdscope.cli.common import (
    command_parser,
    console,
    err_console,
    flag_of,
    in_flags,
    make_config,
    out_folder,
    print_json,
    run_async,
    slo_arg,
    warn,
)
from pdscope.cli.compare import show as show_comparison
from pdscope.cli.server_args import add_server_args, check_ceiling_args, client_kwargs
from pdscope.compare import compare, read_side
from pdscope.doctor.report import phase_cards, write_run
from pdscope.doctor.run import (
    DEFAULT_SLO,
    DoctorConfig,
    DoctorRun,
    previous_interference,
    run_doctor,
)
from pdscope.load.results import default_run_dir, rescue_dir
from pdscope.slo import SLO

EXAMPLES = """
  pdscope doctor http://127.0.0.1:28100 --quick      the lab's vLLM, in about two minutes
  pdscope doctor http://127.0.0.1:28100 --out runs/a  everything, report in runs/a/report.html
  pdscope doctor http://gpu-box:8000 --device h100-sxm --model-config Llama-3.1-8B/config.json
  pdscope doctor URL --slo ttft:500,itl:50            how many users within these objectives
  pdscope doctor URL --baseline runs/a                every figure and finding beside a's
  pdscope doctor URL --thorough --slo ttft:1000,itl:100
      and the users at the SLO measured, by a search from the planner's prediction
"""

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "blue"}


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "doctor",
        "run the article's experiments and say what to change, with the numbers",
        "Probes both phases beside the hardware's ceiling, sweeps the prompt length, tests the\n"
        "prefix cache, injects a long prompt into running streams, follows decode as the\n"
        "context fills, and loads the server at a few concurrencies with its /metrics recorded.\n"
        "Then a set of rules turns the evidence into ranked findings, each with the numbers\n"
        "behind it and the setting to change on this server. Writes evidence.json,\n"
        "findings.json and a self-contained report.html to --out.",
        EXAMPLES,
    )
    add_server_args(p)
    p.add_argument("--quick", action="store_true",
                   help="fewer runs, no context sweep, the load's prompts sized to the"
                   " server's prefill rate: about two minutes on the lab's vLLM")
    p.add_argument("--thorough", action="store_true",
                   help="also measure the capacity: a search for the most users meeting --slo"
                   " from the planner's prediction (several minutes more)")
    p.add_argument("--slo", default="ttft:2000,itl:200", metavar="ttft:MS,itl:MS",
                   help="objectives for the capacity sweep (default ttft:2000,itl:200)")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/doctor-DATE-TIME);"
                   " made with its parents before the first request")
    p.add_argument("--baseline", "--compare-with", dest="compare_with", action="append",
                   default=[], metavar="DIR",
                   help="an earlier doctor --out folder: at the end, every figure and finding"
                   " set beside it (pdscope compare), and its prefill stalls in the report")
    p.add_argument("--json", action="store_true", help="print the findings and evidence as JSON")
    p.set_defaults(handler=run)


def doctor_slo(text: str) -> SLO:
    """``--slo``: the objectives given, the default's for the one left out."""
    given = slo_arg("--slo", text, ("ttft", "itl"))
    return replace(DEFAULT_SLO, **{f"{m}_s": v for m, v in given.limits().items()})


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else default_run_dir("doctor")
    config = make_config(
        DoctorConfig, quick=args.quick, thorough=args.thorough, **client_kwargs(args),
        device=args.device, model_config=args.model_config, slo=doctor_slo(args.slo), out=out,
        compare_with=tuple(Path(p) for p in args.compare_with),
    )
    # Everything that would otherwise fail only at the end is read before the first request.
    for folder in config.compare_with:
        previous_interference(folder)
        read_side(folder)
    check_ceiling_args(args)
    t0 = time.monotonic()
    with out_folder(out), err_console.status("doctor: starting") as status:

        def progress(step: str) -> None:
            status.update(f"doctor: {step} [dim]({time.monotonic() - t0:.0f} s)[/dim]")

        result = run_async(lambda: run_doctor(args.url, config, progress))
    paths = _write(result, out)
    took = time.monotonic() - t0
    if args.json:
        print_json({
            "findings": [f.to_json() for f in result.findings],
            "evidence": result.evidence.to_json(),
            "skipped": result.skipped,
            "files": {k: str(v) for k, v in paths.items()},
            "seconds": took,
            "comparisons": [compare(f, paths["findings"].parent, force=True).to_json()
                            for f in config.compare_with],
        })
        return 0
    show(result, paths, took)
    for folder in config.compare_with:
        show_comparison(compare(folder, paths["findings"].parent, force=True))
    return 0


def _write(result: DoctorRun, out: Path) -> dict[str, Path]:
    """The run folder; in the rescue folder, with a warning, when ``out`` cannot be written
    any more (the disk filled, the folder went away): a diagnosis is never dropped."""
    try:
        return write_run(result, out, naming=flag_of)
    except OSError as exc:
        reason = exc.strerror or str(exc)
    rescue = rescue_dir() / f"{out.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        paths = write_run(result, rescue, naming=flag_of)
    except OSError:
        rescue = Path.cwd() / f"{out.name}-rescued"
        paths = write_run(result, rescue, naming=flag_of)
    warn(f"could not write the report to {out} ({reason}); wrote it to {rescue} instead")
    return paths


def show(run: DoctorRun, paths: dict[str, Path], took: float) -> None:
    ev = run.evidence
    console.print(f"[bold]pdscope doctor[/bold]: {ev.server.kind} {ev.server.version or ''} at"
                  f" {ev.server.url}, model {ev.server.model}"
                  + (f", flags {' '.join(ev.server.flags)}" if ev.server.flags else ""))
    cards = phase_cards(run)
    if cards:
        table = Table(show_header=True, title_justify="left")
        for c in cards:
            table.add_column(c.name, ratio=1)
        cells = []
        for c in cards:
            frac = c.fraction
            line = (f"{c.rate:,.1f} of {c.ceiling_text} {c.unit} allowed: {frac:.0%}"
                    if frac is not None and c.rate is not None and c.ceiling else
                    "ceiling unknown")
            cells.append("\n".join([f"[bold]{c.headline}[/bold]", line, *c.lines]))
        table.add_row(*cells)
        console.print(table)
    for warning in ev.phases.ceiling_warnings if ev.phases else ():
        console.print(f"[yellow]warning: {warning}[/yellow]")
    fired = [f for f in run.findings if f.fired]
    console.print(f"\n[bold]What to change[/bold] ({len(fired)} findings, most important first)")
    for i, f in enumerate(fired, 1):
        style = SEVERITY_STYLE.get(f.severity, "")
        console.print(f"{i}. [{style}]{f.title}[/] [dim]({f.id}, {f.severity})[/dim]")
        console.print(f"   {in_flags(f.reason)}")
        for a in f.advice:
            console.print(f"   → {in_flags(a)}")
    clear = [f.id for f in run.findings if f.status == "clear"]
    missing = [f.id for f in run.findings if f.status == "insufficient"]
    if clear:
        console.print(f"\n[dim]checked and clear: {', '.join(clear)}[/dim]")
    if missing:
        console.print(f"[dim]not enough evidence: {', '.join(missing)}[/dim]")
    for name, why in run.skipped.items():
        console.print(f"[dim]skipped {name}: {in_flags(why)}[/dim]")
    console.print(f"\nreport: {paths['report']}  (evidence.json, findings.json beside it;"
                  f" {took:.0f} s)")
