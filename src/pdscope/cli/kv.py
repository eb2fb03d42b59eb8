"""pdscope kv: the KV cache a token and a request take, and how many requests fit."""

from __future__ import annotations

import argparse

from rich.table import Table

from pdscope import roofline
from pdscope.ceilings import kv_report
from pdscope.cli.common import (
    command_parser,
    console,
    float_in,
    fraction,
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
from pdscope.model import dtype_bytes
from pdscope.report.fmt import human_bytes, human_count

EXAMPLES = """
  pdscope kv --layers 32 --kv-heads 8 --head-dim 128 --context 8000
      the article's 8B example: 131,072 bytes a token, about 1 GB at 8,000 tokens
  pdscope kv --model Llama-3.1-8B/config.json --context 8000 --device a100-80gb-sxm
  pdscope kv --model model.gguf --context 32000 --kv-dtype fp8 --device h100-sxm --mem-util 0.9
  pdscope kv --model Llama-3.1-8B/config.json --context 8192 --slots 8 --device rtx-4090
      8 parallel slots of 8,192 tokens (OLLAMA_NUM_PARALLEL=8, or llama-server -np 8 -c 65536):
      8.6 GB of KV, and 16 GB of weights no longer fit in 24 GB
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "kv",
        "KV-cache bytes a token and a request, and the pool a device holds",
        "Bytes a token = 2 (key and value) x layers x KV heads x head size x bytes an element.\n"
        "Sliding-window layers hold at most the window; MLA models cache one compressed\n"
        "latent. The pool is memory x utilisation - weights - a reserve, as vLLM sizes it\n"
        "at start-up (--gpu-memory-utilization).",
        EXAMPLES,
    )
    add_model_args(p, shape=True)
    add_device_args(p, default_note="Default: none (no pool figure).")
    p.add_argument(
        "--context", type=non_negative_int, default=4096, metavar="N",
        help="tokens in one request (prompt + output so far), default 4096",
    )
    p.add_argument("--kv-dtype", default="fp16", help="KV cache precision: fp16, bf16, fp8")
    p.add_argument(
        "--slots", "--parallel", type=positive_int, metavar="N",
        help="parallel slots, each holding --context tokens of KV from the start (Ollama"
        " OLLAMA_NUM_PARALLEL x num_ctx; llama-server -np, which splits -c between them):"
        " their KV, and whether the weights still fit on the device beside it",
    )
    p.add_argument(
        "--mem-util", type=fraction, default=roofline.DEFAULT_MEM_UTIL, metavar="F",
        help=f"share of device memory the server takes (vLLM --gpu-memory-utilization),"
        f" default {roofline.DEFAULT_MEM_UTIL}",
    )
    p.add_argument(
        "--reserve-gb", type=float_in(0, 1e6), default=roofline.DEFAULT_RESERVE_GB,
        metavar="GB", help="memory kept for activations and the runtime, 0 or more, default"
        f" {roofline.DEFAULT_RESERVE_GB}",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args, need_shape=True)
    devices = resolve_devices(args, default="none")
    check_context(model, args.context)
    report = kv_report(
        model,
        args.context,
        devices,
        kv_dtype=args.kv_dtype,
        mem_util=args.mem_util,
        reserve_gb=args.reserve_gb,
        slots=args.slots,
    )
    if args.json:
        print_json(report.to_json())
        return 0

    m = model
    if m.is_mla:
        shape = f"MLA: {m.num_layers} layers x ({m.kv_lora_rank} + {m.qk_rope_head_dim}) latent"
    else:
        shape = f"2 x {m.num_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim}"
    shape += f" x {dtype_bytes(args.kv_dtype):g} bytes ({args.kv_dtype})"
    if m.source != "--layers --kv-heads --head-dim":
        active = (f", {human_count(m.active_parameters)} active"
                  if m.active_parameters < m.parameters else "")
        console.print(f"[bold]{m.name}[/bold] ({human_count(m.parameters)} parameters{active})")
    console.print(f"KV a token:   {report.kv_bytes_per_token:,.0f} bytes"
                  f" ({human_bytes(report.kv_bytes_per_token)})   = {shape}")
    if m.sliding_window:
        n_sliding = sum(1 for k in m.layer_kinds() if k == "sliding_attention")
        console.print(
            f"              {n_sliding} of {m.num_layers} layers use a sliding window of"
            f" {m.sliding_window:,} tokens and hold no more than that"
        )
    console.print(
        f"KV a request: {human_bytes(report.kv_bytes_per_request)} at {args.context:,} tokens"
        " (read again at every decode step)"
    )
    if report.slots:
        console.print(
            f"KV of {report.slots} slots: {human_bytes(report.slots_kv_bytes or 0.0)}"
            f" = {report.slots} x {args.context:,} tokens, allocated at start whether or not"
            " the slots are busy"
        )
        for fit in report.fits:
            if fit.weights_spill:
                console.print(
                    f"  on {fit.device}: beside that KV only {fit.on_gpu:.0%} of the"
                    f" {human_bytes(fit.weight_bytes)} of weights fit; Ollama and llama.cpp"
                    f" put the other {1 - fit.on_gpu:.0%} in system RAM, and decode slows to"
                    f" `pdscope ceiling --on-gpu {fit.on_gpu:.2f}`. Fewer slots or a shorter"
                    " context keep them on the GPU"
                )
            else:
                console.print(f"  on {fit.device}: the weights"
                              f" ({human_bytes(fit.weight_bytes)}) and that KV fit")
    if report.pools:
        table = Table(title_justify="left")
        table.add_column("device", no_wrap=True)
        table.add_column("memory", justify="right")
        table.add_column("weights", justify="right")
        table.add_column("KV pool", justify="right")
        table.add_column("pool tokens", justify="right")
        table.add_column(f"requests of {args.context:,} tokens", justify="right")
        for pool in report.pools:
            table.add_row(
                pool.device,
                f"{pool.memory_gb:g} GB x {pool.mem_util:g}",
                human_bytes(pool.weight_bytes),
                human_bytes(pool.pool_bytes) if pool.pool_bytes > 0 else "weights do not fit",
                f"{pool.max_tokens:,}",
                f"{pool.max_concurrent_sequences:,}",
            )
        console.print(table)
        console.print(
            f"Pool = memory x {args.mem_util:g} - weights - {args.reserve_gb:g} GB reserve."
            " When it is full, new requests wait (vllm:num_requests_waiting rises while"
            " vllm:kv_cache_usage_perc sits near 1)."
        )
    for note in m.assumptions:
        console.print(f"[dim]assumed: {note}[/dim]")
    return 0
