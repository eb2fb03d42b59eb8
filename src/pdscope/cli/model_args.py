"""Turning --model/--params/--device flags into a model geometry and device specs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from pdscope.cli.common import int_in, parse_count, warn
from pdscope.errors import InputError
from pdscope.hardware import DeviceSpec, all_devices, article_devices, find_device
from pdscope.model import ModelGeometry, from_parameter_count, load_model

LOCAL = "local"


def add_model_args(parser: argparse.ArgumentParser, *, shape: bool = False) -> None:
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        metavar="PATH",
        help="config.json (or its folder) or a .gguf file: the model's real geometry",
    )
    g.add_argument(
        "--params",
        type=parse_count,
        metavar="N",
        help="parameter count instead of --model: 8e9, 8B",
    )
    g.add_argument(
        "--active-params",
        type=parse_count,
        metavar="N",
        help="active parameters of a mixture of experts given by --params (the card's figure;"
        " with a bare count it is also taken as the parameters read a token)",
    )
    g.add_argument(
        "--dtype",
        help="weight precision: fp16, bf16, fp8, int8, int4, mxfp4 (default: the model's own;"
        " fp16 with --params)",
    )
    if shape:
        g.add_argument("--layers", type=int_in(1, 100_000), metavar="N",
                       help="layers, with --kv-heads and --head-dim")
        g.add_argument("--kv-heads", type=int_in(1, 100_000), metavar="N", help="KV heads (GQA)")
        g.add_argument("--head-dim", type=int_in(1, 100_000), metavar="N",
                       help="size of one attention head")


def add_device_args(parser: argparse.ArgumentParser, *, default_note: str) -> None:
    g = parser.add_argument_group("device")
    g.add_argument(
        "--device",
        action="append",
        metavar="D",
        help=f"a device id, name or alias (repeat for several); 'local' probes this machine."
        f" {default_note} 'pdscope devices' lists them",
    )
    g.add_argument("--all-devices", action="store_true", help="every device in the table")


def resolve_model(args: argparse.Namespace, *, need_shape: bool = False) -> ModelGeometry:
    model_path = getattr(args, "model", None)
    params = getattr(args, "params", None)
    if model_path and params:
        raise InputError("give --model or --params, not both")
    if model_path:
        model = load_model(model_path)
        if args.dtype:
            model = model.with_dtype(args.dtype)
    elif params:
        model = from_parameter_count(
            params, args.dtype or "fp16", active_parameters=args.active_params
        )
    elif need_shape and getattr(args, "layers", None):
        model = from_parameter_count(1.0, args.dtype or "fp16", name="given shape")
        model = replace(model, source="--layers --kv-heads --head-dim")
    else:
        raise InputError("say which model: --model PATH (config.json or .gguf) or --params N")
    layers = getattr(args, "layers", None)
    if layers is not None or getattr(args, "kv_heads", None) or getattr(args, "head_dim", None):
        if not (layers and args.kv_heads and args.head_dim):
            raise InputError("--layers, --kv-heads and --head-dim go together: give all three")
        model = replace(
            model,
            num_layers=layers,
            num_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            layer_types=None,
            sliding_window=None,
            kv_lora_rank=None,
        )
    if need_shape and not model.has_attention_shape:
        raise InputError(
            "the KV cache needs the model's shape: give --model PATH (config.json or .gguf),"
            " or --layers, --kv-heads and --head-dim"
        )
    return model


def resolve_devices(args: argparse.Namespace, *, default: str = "article") -> list[DeviceSpec]:
    """Devices named by --device, all with --all-devices, else the default set."""
    if getattr(args, "all_devices", False):
        return list(all_devices())
    names: Sequence[str] = getattr(args, "device", None) or []
    if not names:
        return list(article_devices()) if default == "article" else []
    out = []
    for name in names:
        if name.strip().lower() == LOCAL:
            from pdscope.hardware import detect_local_device

            dev = detect_local_device(probe_cpu=True)
            if dev is None:
                raise InputError("could not detect a local device")
            out.append(dev)
        else:
            out.append(find_device(name))
    return out


def resolve_cpu_device(name: str | None) -> DeviceSpec:
    """The CPU whose memory holds the weights a server spilled off the GPU: a CPU row of the
    device table (``ddr5-5600-2ch``), else this machine's CPU measured now (``local``, the
    default: the self-hoster runs pdscope on the machine that serves)."""
    if name is None or name.strip().lower() == LOCAL:
        from pdscope.hardware import measure_local_cpu

        return measure_local_cpu()
    dev = find_device(name)
    if dev.kind != "cpu":
        raise InputError(f"--cpu-device must name a CPU (or 'local'), and {dev.id} is a"
                         f" {dev.kind}: `pdscope devices` lists the CPU rows")
    return dev


def check_context(model: ModelGeometry, context: int) -> None:
    """Warn (not fail) when the context is beyond what the model was trained for."""
    if model.max_context and context > model.max_context:
        warn(
            f"context {context:,} is beyond {model.name}'s maximum of {model.max_context:,}"
            " tokens; figures are extrapolated"
        )
