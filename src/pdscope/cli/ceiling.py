"""pdscope ceiling: the decode and prefill ceilings of a model on each device."""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope import roofline
from pdscope.ceilings import OffloadRow, ceiling_rows, model_json, offload_rows
from pdscope.cli.common import (
    command_parser,
    console,
    non_negative_int,
    positive_int,
    print_json,
    share,
    warn,
)
from pdscope.cli.model_args import (
    add_device_args,
    add_model_args,
    check_context,
    resolve_cpu_device,
    resolve_devices,
    resolve_model,
)
from pdscope.errors import InputError
from pdscope.report.fmt import human_bytes, human_count, rate, seconds

EXAMPLES = """
  pdscope ceiling --params 8e9 --dtype fp16
      the article's table: an 8B model at 16 bits on six devices (6 ... 209 tok/s)
  pdscope ceiling --params 8e9 --dtype fp16 --device a10g --device h100-sxm --json
  pdscope ceiling --model Llama-3.1-8B/config.json --context 8000 --batch 32 --device l40s
  pdscope ceiling --model model.gguf --device local --what-if
  pdscope ceiling --params 8e9 --dtype int4 --device rtx-4090 --on-gpu 0.63 \
      --cpu-device ddr5-5600-2ch
      63% of the weights in GPU memory, the rest in dual channel DDR5: 53 tok/s, not 252
      (without --cpu-device, this machine's CPU is measured)
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
    g = p.add_argument_group("weights spilled to system RAM (offload)")
    g.add_argument(
        "--on-gpu", type=share, metavar="SHARE",
        help="share of the weights in GPU memory, 0 to 1 (Ollama's size_vram / size, or"
        " llama.cpp's -ngl / its layers): also show the ceiling with the rest read from"
        " system RAM at the CPU's bandwidth",
    )
    g.add_argument(
        "--cpu-device", metavar="D",
        help="the CPU whose memory holds the rest: a CPU row of `pdscope devices`"
        " (ddr5-5600-2ch) or 'local' (default: this machine's CPU, measured, about 1.5 s)",
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
    if args.cpu_device is not None and args.on_gpu is None:
        raise InputError("--cpu-device goes with --on-gpu SHARE (the share of the weights in"
                         " GPU memory)")
    offload = {}
    if args.on_gpu is not None:
        cpu = resolve_cpu_device(args.cpu_device)
        offload = {o.device.id: o for o in offload_rows(
            model, devices, cpu, args.on_gpu, context=args.context,
            prompt_tokens=args.prompt_tokens, kv_dtype=args.kv_dtype)}
        if not offload:
            raise InputError("--on-gpu needs a GPU among the devices: a CPU or an Apple chip"
                             " holds every weight in its one memory")
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
            if r.device.id in offload:
                row["offload"] = offload[r.device.id].to_json()
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
    if offload:
        _print_offload(list(offload.values()), len(rows))
    for note in model.assumptions:
        console.print(f"[dim]assumed: {note}[/dim]")
    return 0


def _print_offload(rows: list[OffloadRow], devices: int) -> None:
    first = rows[0]
    cpu, on_gpu = first.cpu, first.decode.on_gpu
    measured = " (measured now)" if cpu.measured else ""
    table = Table(
        title=f"With {on_gpu:.0%} of the weights in GPU memory and {1 - on_gpu:.0%} in system"
        f" RAM ({cpu.name}{measured}, {cpu.mem_bandwidth_gb_s:,.0f} GB/s)",
        title_justify="left",
    )
    table.add_column("device", no_wrap=True)
    table.add_column("decode tok/s, all on the GPU", justify="right")
    table.add_column("split", justify="right")
    table.add_column("slower", justify="right")
    table.add_column("prefill tok/s, all on the GPU", justify="right")
    table.add_column("split", justify="right")
    for r in rows:
        d, p = r.decode, r.prefill
        table.add_row(
            r.device.name,
            f"{roofline.article_round(d.all_on_gpu_tok_s):,}",
            f"{d.tok_s:,.1f}",
            f"{d.slowdown:,.1f}x",
            rate(p.all_on_gpu_tok_s, ""),
            rate(p.tok_s, ""),
        )
    console.print(table)
    console.print(
        "Split decode = 1 / (bytes on the GPU / its bandwidth + bytes in RAM / the CPU's): each "
        "token reads both shares, and the one in RAM sets the pace. Put every layer on the GPU "
        "(Ollama num_gpu, llama.cpp -ngl 999), a smaller quantization, or a smaller context or "
        "fewer parallel slots so the weights fit. Prefill '—': the CPU has no FLOPS figure "
        "(--cpu-device local measures one)."
    )
    if len(rows) < devices:
        warn("devices that are not GPUs have no split ceiling (one memory holds every weight)")
