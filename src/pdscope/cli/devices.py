"""pdscope devices: the device table, and this machine measured."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from pdscope.cli.common import command_parser, console, print_json
from pdscope.hardware import DeviceSpec, all_devices, measure

EXAMPLES = """
  pdscope devices                 every device with its bandwidth, FLOPS and source
  pdscope devices --probe         also measure this machine's memory bandwidth and matmul speed
  pdscope devices --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub,
        "devices",
        "list known devices; --probe measures this machine",
        "Published memory bandwidth and dense (not sparse) bf16/fp16 and fp8 TFLOPS, one row a\n"
        "device, with where each figure comes from. --probe detects an NVIDIA GPU by its\n"
        "nvidia-smi name, and measures a CPU's memory bandwidth (numpy copy and triad, best of\n"
        "several runs) and matmul speed.",
        EXAMPLES,
    )
    p.add_argument("--probe", action="store_true", help="measure this machine (a few seconds)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def _row(d: DeviceSpec) -> dict[str, Any]:
    return {
        "id": d.id,
        "name": d.name,
        "aliases": list(d.aliases),
        "kind": d.kind,
        "mem_bandwidth_gb_s": d.mem_bandwidth_gb_s,
        "bf16_tflops": d.bf16_tflops,
        "fp8_tflops": d.fp8_tflops,
        "memory_gb": d.memory_gb,
        "source": d.source,
        "measured": d.measured,
    }


def _no_bf16() -> str:
    """Why the bf16 matmul was not measured."""
    if not measure.torch_available():
        return "torch is not installed"
    return "this CPU has no native bfloat16 dot product"


def run(args: argparse.Namespace) -> int:
    local: dict[str, Any] | None = None
    if args.probe:
        gpus = measure.nvidia_smi_gpus()
        bw = measure.probe_cpu_bandwidth()
        matmuls = measure.probe_cpu_matmuls()
        best = measure.best_matmul(matmuls)
        cpu = measure.local_cpu_spec(bw, best.tflops, best.how)
        fp32 = max(p.tflops for p in matmuls if p.dtype == "fp32")
        bf16 = max((p.tflops for p in matmuls if p.dtype == "bf16"), default=None)
        local = {
            "cpu": _row(cpu),
            "copy_gb_s": bw.copy_gb_s,
            "triad_gb_s": bw.triad_gb_s,
            "bandwidth_gb_s": bw.best_gb_s,
            "runs": bw.runs,
            "spread": bw.spread,
            "matmul_tflops_fp32": fp32,
            "matmul_tflops_bf16": bf16,
            "matmul_best": best.how,
            "matmuls": [{"library": p.library, "dtype": p.dtype, "shape": list(p.shape),
                         "threads": p.threads, "runs": p.runs, "tflops": p.tflops}
                        for p in matmuls],
            "nvidia_gpus": [
                {"name": n, "matched": (m.id if (m := measure.match_gpu_name(n)) else None)}
                for n in gpus
            ],
        }
    if args.json:
        out: dict[str, Any] = {"devices": [_row(d) for d in all_devices()]}
        if local is not None:
            out["local"] = local
        print_json(out)
        return 0

    table = Table(title="Devices (published figures; dense FLOPS)", title_justify="left")
    for col, just in (("id", "left"), ("name", "left"), ("bandwidth", "right"),
                      ("bf16 TFLOPS", "right"), ("fp8 TFLOPS", "right"), ("memory", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for d in all_devices():
        table.add_row(
            d.id,
            d.name,
            f"{d.mem_bandwidth_gb_s:,.0f} GB/s",
            f"{d.bf16_tflops:,.1f}" if d.bf16_tflops else "—",
            f"{d.fp8_tflops:,.1f}" if d.fp8_tflops else "—",
            f"{d.memory_gb:g} GB" if d.memory_gb else "—",
        )
    console.print(table)
    console.print("Sources: docs/devices.md, or 'pdscope devices --json'.")
    if local is not None:
        cpu = local["cpu"]
        console.print(
            f"\n[bold]This machine[/bold]: {cpu['name']}\n"
            f"  memory bandwidth {local['bandwidth_gb_s']:.1f} GB/s measured"
            f" (copy {local['copy_gb_s']:.1f}, triad {local['triad_gb_s']:.1f};"
            f" best of {local['runs']} runs, spread {local['spread']:.0%})\n"
            f"  matmul {local['matmul_tflops_fp32'] * 1e3:.0f} GFLOP/s (fp32, best of numpy"
            " and torch)"
            + (f", {local['matmul_tflops_bf16'] * 1e3:.0f} GFLOP/s (bf16, torch)"
               if local["matmul_tflops_bf16"] else f" (bf16 not measured: {_no_bf16()})")
            + f"\n  prefill ceilings use the fastest: {local['matmul_best']}"
        )
        if local["spread"] > 0.2:
            console.print("  [yellow]the runs disagree by more than 20%: the machine is busy[/]")
        for g in local["nvidia_gpus"]:
            console.print(f"  GPU: {g['name']} -> {g['matched'] or 'not in the table'}")
        console.print("Use it as --device local in ceiling, kv and probe.")
    return 0
