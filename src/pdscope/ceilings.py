"""The figures of ``pdscope ceiling`` and ``pdscope kv``, one plain row a device.

These gather roofline results into the rows the commands print and the JSON they write. The
JSON keys of the article's table are kept exactly (``device``, ``mem_bandwidth_gb_s``,
``decode_ceiling_tok_s``, rounded as the article rounds); everything else sits under other keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from pdscope import roofline
from pdscope.errors import InputError
from pdscope.hardware import DeviceSpec
from pdscope.model.geometry import ModelGeometry


@contextmanager
def _in_range(model: ModelGeometry) -> Iterator[None]:
    """A model whose figures overflow (a count of 1e999, a shape of zero) fails in one line
    rather than with a traceback or an ``inf`` in the output."""
    try:
        yield
    except (OverflowError, ZeroDivisionError) as exc:
        raise InputError(f"the figures of {model.name} are out of range ({exc}): check its"
                         " parameter count and shape") from None


def _check_finite(model: ModelGeometry, **figures: float | None) -> None:
    for name, value in figures.items():
        if value is not None and not math.isfinite(value):
            raise InputError(f"the {name.replace('_', ' ')} of {model.name} is out of range"
                             f" ({value}): check its parameter count and shape")


def _number(x: float) -> float | int:
    """Integral figures as ints, so the JSON reads like the article (90, not 90.0)."""
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class CeilingRow:
    device: DeviceSpec
    decode: roofline.DecodeCeiling
    prefill: roofline.PrefillCeiling
    batched: roofline.BatchedDecode | None
    compute_bound_batch: int | None

    def to_json(self) -> dict[str, Any]:
        d = self.device
        out: dict[str, Any] = {
            "device": d.name,
            "mem_bandwidth_gb_s": _number(d.mem_bandwidth_gb_s),
            "decode_ceiling_tok_s": roofline.article_round(self.decode.tok_s),
            "device_id": d.id,
            "decode_ceiling_tok_s_exact": self.decode.tok_s,
            "context": self.decode.context,
            "weight_bytes_read_per_token": self.decode.weight_bytes_read,
            "kv_bytes_read_per_token": self.decode.kv_bytes_read,
            "dense_tflops": d.bf16_tflops,
            "prefill_prompt_tokens": self.prefill.prompt_tokens,
            "prefill_ceiling_tok_s": self.prefill.tok_s,
            "ttft_floor_s": self.prefill.ttft_s,
            "prefill_bound": self.prefill.bound,
            "compute_bound_batch": self.compute_bound_batch,
            "device_source": d.source,
        }
        if self.batched is not None:
            b = self.batched
            out["batch"] = b.batch
            out["batch_throughput_tok_s"] = b.tok_s
            out["batch_per_sequence_tok_s"] = b.per_sequence_tok_s
            out["batch_bound"] = b.bound
        return out


def ceiling_rows(
    model: ModelGeometry,
    devices: Sequence[DeviceSpec],
    *,
    context: int = 0,
    batch: int | None = None,
    prompt_tokens: int = 1000,
    kv_dtype: str = "fp16",
) -> list[CeilingRow]:
    """Decode and prefill ceilings of ``model`` on each device, in the order given. Raises
    :class:`InputError` when a figure is out of range (not a finite number)."""
    _check_finite(model, parameters=model.parameters,
                  weight_bytes=model.read_weight_bytes() if model.parameters else None)
    with _in_range(model):
        rows = _ceiling_rows(model, devices, context, batch, prompt_tokens, kv_dtype)
    for r in rows:
        _check_finite(model, decode_ceiling=r.decode.tok_s, kv_bytes=r.decode.kv_bytes_read,
                      prefill_ceiling=r.prefill.tok_s, ttft_floor=r.prefill.ttft_s)
    return rows


def _ceiling_rows(model: ModelGeometry, devices: Sequence[DeviceSpec], context: int,
                  batch: int | None, prompt_tokens: int, kv_dtype: str) -> list[CeilingRow]:
    rows = []
    for dev in devices:
        rows.append(
            CeilingRow(
                device=dev,
                decode=roofline.decode_ceiling(model, dev, context, kv_dtype),
                prefill=roofline.prefill_ceiling(model, dev, prompt_tokens),
                batched=(
                    roofline.batched_decode(model, dev, batch, context, kv_dtype)
                    if batch
                    else None
                ),
                compute_bound_batch=(
                    roofline.compute_bound_batch(model, dev, context, kv_dtype)
                    if model.has_attention_shape or not context
                    else None
                ),
            )
        )
    return rows


@dataclass(frozen=True)
class OffloadRow:
    """The ceilings of a model split between one GPU's memory and a CPU's (offload), beside
    the same model all on that GPU."""

    device: DeviceSpec
    cpu: DeviceSpec
    decode: roofline.SplitDecode
    prefill: roofline.SplitPrefill

    def to_json(self) -> dict[str, Any]:
        d, p = self.decode, self.prefill
        return {
            "on_gpu": d.on_gpu,
            "cpu_device": self.cpu.name,
            "cpu_device_id": self.cpu.id,
            "cpu_mem_bandwidth_gb_s": _number(self.cpu.mem_bandwidth_gb_s),
            "cpu_measured": self.cpu.measured,
            "weight_bytes_on_gpu": d.gpu_bytes,
            "weight_bytes_on_cpu": d.cpu_bytes,
            "decode_ceiling_tok_s": d.tok_s,
            "decode_all_on_gpu_tok_s": d.all_on_gpu_tok_s,
            "decode_slowdown": d.slowdown,
            "prefill_ceiling_tok_s": p.tok_s,
            "prefill_all_on_gpu_tok_s": p.all_on_gpu_tok_s,
            "ttft_floor_s": p.ttft_s,
        }


def offload_rows(
    model: ModelGeometry,
    devices: Sequence[DeviceSpec],
    cpu: DeviceSpec,
    on_gpu: float,
    *,
    context: int = 0,
    prompt_tokens: int = 1000,
    kv_dtype: str = "fp16",
) -> list[OffloadRow]:
    """The split ceilings on each GPU of ``devices`` (CPUs and Apple chips, whose one memory
    holds every weight, have none), the rest of the weights in ``cpu``'s memory."""
    with _in_range(model):
        rows = [
            OffloadRow(
                device=dev,
                cpu=cpu,
                decode=roofline.split_decode_ceiling(model, dev, cpu, on_gpu, context, kv_dtype),
                prefill=roofline.split_prefill_ceiling(model, dev, cpu, on_gpu, prompt_tokens),
            )
            for dev in devices
            if dev.kind == "gpu"
        ]
    for r in rows:
        _check_finite(model, split_decode_ceiling=r.decode.tok_s,
                      split_prefill_ceiling=r.prefill.tok_s)
    return rows


def model_json(model: ModelGeometry) -> dict[str, Any]:
    """The model's figures as the JSON outputs show them. ``active_parameters`` counts as model
    cards do (the input embedding included); ``parameters_read_per_token`` is what the ceilings
    divide by (the input embedding is a lookup of one row, not read whole)."""
    return {
        "name": model.name,
        "source": model.source,
        "parameters": model.parameters,
        "active_parameters": model.active_parameters,
        "parameters_source": model.parameters_source,
        "parameters_read_per_token": model.parameters_read_per_token,
        "weight_dtype": model.weight_dtype,
        "bytes_per_weight": model.bytes_per_weight,
        "weight_bytes": model.total_weight_bytes(),
        "weight_bytes_read_per_token": model.read_weight_bytes(),
        "num_layers": model.num_layers,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "max_context": model.max_context,
        "num_experts": model.num_experts,
        "experts_per_token": model.experts_per_token,
        "kv_lora_rank": model.kv_lora_rank,
        "sliding_window": model.sliding_window,
        "assumptions": list(model.assumptions),
    }


@dataclass(frozen=True)
class KVReport:
    model: ModelGeometry
    context: int
    kv_dtype: str
    kv_bytes_per_token: float
    kv_bytes_per_request: float
    pools: tuple[roofline.KVPool, ...]
    slots: int | None = None
    fits: tuple[roofline.SlotsFit, ...] = ()  # one a device with a memory size, with slots

    @property
    def slots_kv_bytes(self) -> float | None:
        """KV of every slot at ``context`` tokens each, allocated at start."""
        return self.slots * self.kv_bytes_per_request if self.slots else None

    def to_json(self) -> dict[str, Any]:
        m = self.model
        out: dict[str, Any] = {
            "model": m.name,
            "parameters": m.parameters,
            "active_parameters": m.active_parameters,
            "parameters_read_per_token": m.parameters_read_per_token,
            "kv_dtype": self.kv_dtype,
            "context": self.context,
            "kv_bytes_per_token": _number(self.kv_bytes_per_token),
            "kv_bytes_per_request": _number(self.kv_bytes_per_request),
            "num_layers": m.num_layers,
            "num_kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim,
            "mla": m.is_mla,
            "sliding_window": m.sliding_window,
            "sliding_layers": sum(1 for k in m.layer_kinds() if k == "sliding_attention"),
            "max_context": m.max_context,
            "assumptions": list(m.assumptions),
        }
        if self.slots:
            out["slots"] = self.slots
            out["context_per_slot"] = self.context
            out["slots_kv_bytes"] = self.slots_kv_bytes
        if self.pools:
            out["devices"] = [
                {
                    "device": p.device,
                    "memory_gb": p.memory_gb,
                    "mem_util": p.mem_util,
                    "reserve_gb": p.reserve_gb,
                    "weight_bytes": p.weight_bytes,
                    "kv_pool_bytes": p.pool_bytes,
                    "kv_pool_tokens": p.max_tokens,
                    "max_concurrent_sequences": p.max_concurrent_sequences,
                }
                for p in self.pools
            ]
            if self.slots:
                for entry, fit in zip(out["devices"], self.fits, strict=True):
                    entry["weights_on_gpu_beside_slots"] = fit.on_gpu
                    entry["weights_spill"] = fit.weights_spill
            # With one device, the capacity sits at the top level too.
            if len(self.pools) == 1:
                out["max_concurrent_sequences"] = self.pools[0].max_concurrent_sequences
                out["kv_pool_tokens"] = self.pools[0].max_tokens
                out["kv_pool_bytes"] = self.pools[0].pool_bytes
        return out


def kv_report(
    model: ModelGeometry,
    context: int,
    devices: Sequence[DeviceSpec] = (),
    *,
    kv_dtype: str = "fp16",
    mem_util: float = roofline.DEFAULT_MEM_UTIL,
    reserve_gb: float = roofline.DEFAULT_RESERVE_GB,
    slots: int | None = None,
) -> KVReport:
    """KV bytes a token and a request, and the pool on each device; with ``slots``, the KV of
    that many parallel slots of ``context`` tokens each and the share of the weights that
    still fits on each device beside it. Raises :class:`InputError` when a figure is out of
    range (not a finite number)."""
    with _in_range(model):
        report = _kv_report(model, context, devices, kv_dtype, mem_util, reserve_gb)
        if slots:
            report = replace(report, slots=slots, fits=tuple(
                roofline.slots_fit(model, d, slots, context, mem_util=mem_util,
                                   reserve_gb=reserve_gb, kv_dtype=kv_dtype)
                for d in devices))
    _check_finite(model, KV_bytes_a_token=report.kv_bytes_per_token,
                  KV_bytes_a_request=report.kv_bytes_per_request)
    return report


def _kv_report(model: ModelGeometry, context: int, devices: Sequence[DeviceSpec],
               kv_dtype: str, mem_util: float, reserve_gb: float) -> KVReport:
    return KVReport(
        model=model,
        context=context,
        kv_dtype=kv_dtype,
        kv_bytes_per_token=roofline.kv_bytes_per_token(model, kv_dtype),
        kv_bytes_per_request=roofline.kv_bytes_per_request(model, context, kv_dtype),
        pools=tuple(
            roofline.kv_pool(
                model, d, context, mem_util=mem_util, reserve_gb=reserve_gb, kv_dtype=kv_dtype
            )
            for d in devices
        ),
    )
