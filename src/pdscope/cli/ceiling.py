"""pdscope ceiling: the decode and prefill ceilings of a model on each device."""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope import roofline
from pdscope.ceilings import ceiling_rows, model_json
from pdscope.cli.common import (
    command_parser,
    console,
    non_negative_int,
    positive_int,
    print_json,
)
from pdscope.cli.model_args import (
    add_device_args,
    add_model_args,
    check_context,
    resolve_devices,
    resolve_model,
)
from pdscope.report.fmt import human_bytes, human_count, rate, seconds

EXAMPLES = """
  pdscope ceiling --params 8e9 --dtype fp16
      the article's table: an 8B model at 16 bits on six devices (6 ... 209 tok/s)
  pdscope ceiling --params 8e9 --dtype fp16 --device a10g --device h100-sxm --json
  pdscope ceiling --model Llama-3.1-8B/config.json --context 8000 --batch 32 --device l40s
  pdscope ceiling --model model.gguf --device local --what-if
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "ceiling",
        "decode and prefill ceilings of a model on each device",
        "The fastest the hardware allows, worked out on paper: single-stream decode is\n"
        "memory bandwidth / bytes read a token; prefill is peak dense FLOP/s / FLOPs a token.\n"
        "A measured number will be lower; how much lower says whether to fix the serving\n"
        "stack or the hardware.",
        EXAMPLES,
    )
    add_model_args(p)
    add_device_args(p, default_note="Default: the article's six devices.")
    g = p.add_argument_group("workload")
    g.add_argument(
        "--context", type=non_negative_int, default=0, metavar="N",
        help="tokens already in the KV cache: each decode step reads them too (default 0)",
    )
    g.add_argument(
        "--batch", type=positive_int, metavar="B",
        help="also show B sequences decoding together (one read of the weights serves all)",
    )
    g.add_argument(
        "--prompt-tokens", type=positive_int, default=1000, metavar="N",
        help="prompt length for the prefill ceiling and TTFT floor (default 1000)",
    )
    g.add_argument("--kv-dtype", default="fp16", help="KV cache precision: fp16, bf16, fp8")
    p.add_argument(
        "--what-if", action="store_true",
        help="also show the decode ceiling with the weights at 16, 8 and 4 bits",
    )
    p.add_argument("--json", action="store_true", help="print JSON: a list, one object a device")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args, need_shape=bool(args.context))
    devices = resolve_devices(args)
    check_context(model, args.context)
    rows = ceiling_rows(
        model,
        devices,
        context=args.context,
        batch=args.batch,
        prompt_tokens=args.prompt_tokens,
        kv_dtype=args.kv_dtype,
    )
    whatifs = {
        r.device.id: roofline.quantization_whatif(model, r.device, context=args.context)
        for r in rows
    } if args.what_if else {}
    if args.json:
        out = []
        for r in rows:
            row = r.to_json()
            row["model"] = model_json(model)
            if args.what_if:
                row["quantization_whatif"] = [
                    {"bits": w.bits, "weight_bytes": w.weight_bytes,
                     "decode_ceiling_tok_s": w.decode_ceiling_tok_s, "speedup": w.speedup}
                    for w in whatifs[r.device.id]
                ]
            out.append(row)
        print_json(out)
        return 0

    counts = []
    if model.active_parameters < model.parameters:
        counts.append(f"{human_count(model.active_parameters)} active")
    if model.parameters_read_per_token < model.active_parameters:
        counts.append(f"{human_count(model.parameters_read_per_token)} read a token")
    title = (
        f"{model.name}: {human_count(model.parameters)} parameters"
        + (f" ({', '.join(counts)})" if counts else "")
        + f", {model.weight_dtype}, {human_bytes(model.read_weight_bytes())} read a token"
        + (f" + {human_bytes(rows[0].decode.kv_bytes_read)} of KV at {args.context:,} tokens"
           if args.context and rows else "")
    )
    table = Table(title=title, title_justify="left")
    table.add_column("device", no_wrap=True)
    table.add_column("GB/s", justify="right")
    table.add_column("decode tok/s", justify="right")
    table.add_column(f"prefill tok/s @{args.prompt_tokens}", justify="right")
    table.add_column("TTFT floor", justify="right")
    if args.batch:
        table.add_column(f"batch {args.batch} tok/s", justify="right")
        table.add_column("per stream", justify="right")
    table.add_column("compute-bound batch", justify="right")
    if args.what_if:
        table.add_column("8 / 4-bit tok/s", justify="right")
    for r in rows:
        cells = [
            r.device.name,
            f"{r.device.mem_bandwidth_gb_s:,.0f}",
            f"{roofline.article_round(r.decode.tok_s):,}",
            rate(r.prefill.tok_s, ""),
            seconds(r.prefill.ttft_s),
        ]
        if args.batch and r.batched:
            bound = " (compute)" if r.batched.bound == "compute" else ""
            cells += [rate(r.batched.tok_s, "") + bound, rate(r.batched.per_sequence_tok_s, "")]
        if r.compute_bound_batch:
            cells.append(f"{r.compute_bound_batch:,}")
        else:
            # No FLOPS figure, or KV reads grow with the batch as fast as the FLOPs do.
            cells.append("never" if r.prefill.peak_tflops else "—")
        if args.what_if:
            w = {x.bits: x for x in whatifs[r.device.id]}
            cells.append(f"{w[8].decode_ceiling_tok_s:,.0f} / {w[4].decode_ceiling_tok_s:,.0f}")
        table.add_row(*cells)
    console.print(table)
    console.print(
        "Decode = memory bandwidth / bytes read a token: no single stream goes faster. "
        "Measured near it, the hardware is the limit (quantize, a smaller model, more "
        "bandwidth); far below it, look at the serving stack. Prefill = peak dense FLOP/s / "
        "FLOPs a prompt token; the TTFT floor has no queueing or overhead in it. "
        "'—': the device table has no FLOPS figure."
    )
    for note in model.assumptions:
        console.print(f"[dim]assumed: {note}[/dim]")
    return 0
