"""pdscope probe: TTFT, prefill rate, decode rate and ITL of one server, beside the ceiling."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace

from rich.table import Table

from pdscope.cli.common import (
    command_parser,
    console,
    flagged,
    in_flags,
    make_config,
    positive_int,
    print_json,
    warn,
    write_result,
)
from pdscope.cli.experiment import check_before_measuring, progress_bar
from pdscope.cli.server_args import add_server_args, client_kwargs
from pdscope.client import connect
from pdscope.experiments.common import find_ceiling_inputs
from pdscope.experiments.probe import ProbeConfig, ProbeResult, ceiling_verdict
from pdscope.experiments.probe import run_probe as probe_server
from pdscope.report.fmt import human_bytes, rate, seconds
from pdscope.stats import Summary, percentile

EXAMPLES = """
  pdscope probe http://127.0.0.1:28100                       the lab's vLLM (pdscope lab start)
  pdscope probe http://127.0.0.1:28100 --prompt-tokens 2000  the article's minute: 200 vs 2,000
  pdscope probe http://localhost:11434 --model llama3.2       Ollama (native API, its counters)
  pdscope probe https://gpu-box:8000 --device h100-sxm --model-config Llama-3.1-8B/config.json
  pdscope probe http://127.0.0.1:28100 --runs 10 --json > probe.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "probe",
        "measure both phases of one server and set them beside the ceiling",
        "Sends one warm-up request (reported apart as cold: it may include loading the model)\n"
        "and then --runs requests, each with a prompt of exactly --prompt-tokens tokens (by the\n"
        "server's tokenizer) that it has not seen before, asking for --max-tokens output\n"
        "tokens. Reports the median and spread of TTFT, prefill rate, decode rate, ITL and\n"
        "end-to-end time, and the decode rate as a share of the memory-bandwidth ceiling.",
        EXAMPLES,
    )
    add_server_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--prompt-tokens", type=positive_int, default=512, metavar="N",
                   help="prompt length in tokens (default 512)")
    g.add_argument("--max-tokens", type=positive_int, default=128, metavar="N",
                   help="output tokens to ask for (default 128)")
    g.add_argument("--runs", type=positive_int, default=5, metavar="K",
                   help="measured runs after the cold one (default 5)")
    g.add_argument("--no-fixed-output", action="store_true",
                   help="let the model stop early (do not send ignore_eos / min_tokens)")
    g.add_argument("--seed", type=int, help="prompt seed (default: new prompts every probe)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--raw", action="store_true",
                   help="with --json, include every request's timing record")
    p.add_argument("--out", metavar="FILE",
                   help="also write the JSON (with the records) here (its folder must exist;"
                   " checked before the first request)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = make_config(
        ProbeConfig,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        runs=args.runs,
        **client_kwargs(args),
    )
    check_before_measuring(args)
    result = asyncio.run(_probe(args, config))
    data = result.to_json()
    if args.out:
        write_result(args.out, json.dumps(flagged(data), indent=2))
    if args.json:
        if not args.raw:
            data.pop("requests")
        print_json(data)
    else:
        show(result)
    if result.truncation_warning:
        warn(result.truncation_warning)
    return 0


async def _probe(args: argparse.Namespace, config: ProbeConfig) -> ProbeResult:
    async with connect(args.url, config) as conn:
        with progress_bar("probing", config.runs + 1) as progress:
            result = await probe_server(conn, config, progress=progress)
        ceiling = await find_ceiling_inputs(conn, result.target.model, device=args.device,
                                            model_config=args.model_config,
                                            api_key=config.api_key)
    return replace(result, model=ceiling.model, model_source=ceiling.model_source,
                   device=ceiling.device, notes=result.notes + ceiling.notes)


def _spread(s: Summary | None, fmt: str) -> str:
    if s is None:
        return "—"
    text = f"{fmt.format(s.min)} – {fmt.format(s.max)}"
    return text + " [yellow](noisy)[/]" if s.noisy else text


def show(r: ProbeResult) -> None:
    info, cfg = r.server, r.config
    version = f" {info.version}" if info.version else ""
    console.print(f"[bold]{info.kind}{version}[/bold] at {info.base_url}, model"
                  f" [bold]{r.target.model}[/bold], API {r.target.api}")
    exact = "exact, by the server's tokenizer" if all(p.exact for p in r.prompts) else "estimated"
    console.print(
        f"prompt {r.prompt_tokens or '?'} tokens ({exact}; asked {cfg.prompt_tokens}),"
        f" output {r.output_tokens or '?'} tokens (counted from: {r.token_count_source});"
        f" {len(r.runs)} runs after 1 cold run"
    )
    ttft, prefill, decode, e2e = r.ttft, r.prefill, r.decode, r.e2e
    itl = r.itl_all

    dc, pc = r.decode_ceiling, r.prefill_ceiling
    table = Table(title_justify="left")
    columns = (("phase", "left"), ("figure", "left"), ("median", "right"),
               ("spread (min – max)", "right"), ("ceiling", "right"), ("of ceiling", "right"))
    for col, just in columns:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    th, ph, dh = r.ttft_held, r.prefill_held, r.decode_held
    floor = (th.mark + seconds(th.limit) if th else
             seconds(pc.ttft_s) if pc and pc.ttft_s else "—")
    table.add_row("prefill", "TTFT", seconds(ttft.median) if ttft else "—",
                  _spread(ttft, "{:.3f} s"), floor, "")
    table.add_row("", f"prefill rate ({r.prefill_source})",
                  rate(prefill.median) if prefill else "—", _spread(prefill, "{:,.0f}"),
                  ph.mark + rate(ph.ceiling) if ph else
                  rate(pc.tok_s) if pc and pc.tok_s else "—",
                  f"{ph.share:.0%}" if ph else "—")
    if r.reasoned:
        ttfo = r.ttfo
        table.add_row("thinking", f"first answer token (TTFO), {r.reasoning_tokens or '?'}"
                      " reasoning tokens", seconds(ttfo.median) if ttfo else "— (no answer)",
                      _spread(ttfo, "{:.3f} s"), "", "")
    table.add_row("decode", "decode rate (1 / TPOT)", rate(decode.median) if decode else "—",
                  _spread(decode, "{:,.1f}"), dh.mark + rate(dh.ceiling) if dh else
                  rate(dc.tok_s) if dc else "—",
                  f"{dh.share:.0%}" if dh else "—")
    if r.server_decode_tok_s is not None:
        table.add_row("", "decode rate (server's own count)", rate(r.server_decode_tok_s),
                      "", "", "")
    p50, p99 = percentile(itl, 50), percentile(itl, 99)
    table.add_row("", "ITL p50 / p99",
                  f"{seconds(p50)} / {seconds(p99)}" if p50 is not None else "—", "", "", "")
    table.add_row("total", "end to end", seconds(e2e.median) if e2e else "—",
                  _spread(e2e, "{:.2f} s"), "", "")
    console.print(table)
    if r.reasoned and ttft is not None:
        thinking = r.thinking
        console.print(
            f"prefill {seconds(ttft.median)}, thinking "
            + (seconds(thinking.median) if thinking else "past the output cap (no answer yet)")
            + ": the model reasons before its first answer token; TTFT counts only the prefill")
    cold = r.cold
    console.print(
        f"cold run (kept apart): TTFT {seconds(cold.ttft_s)}, decode {rate(cold.decode_tok_s)}"
        + (f", new connection {seconds(cold.connect_s)} (not in TTFT)" if cold.connect_s else "")
    )
    if dc is not None and r.device is not None and r.model is not None:
        console.print(
            f"ceiling: {r.device.name}, {r.device.mem_bandwidth_gb_s:,.1f} GB/s /"
            f" ({human_bytes(dc.weight_bytes_read)} of weights + {human_bytes(dc.kv_bytes_read)}"
            f" of KV at {dc.context:,} tokens) a token; model from {r.model_source}"
        )
    console.print(in_flags(ceiling_verdict(r.decode_fraction, bool(dh and dh.beaten))))
    for warning in r.ceiling_warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]")
    for note in r.notes:
        console.print(f"[dim]note: {in_flags(note)}[/dim]")
