"""What-if: one change at a time to a calibrated server, and what it does to the users it holds.

Each :class:`Change` is the calibrated server with one thing different: a scheduler setting (the
token budget a step, the sequences at once, prefix caching, replicas behind a router), prefill/
decode disaggregation (:mod:`~pdscope.plan.disaggregation`: 1P:1D and 1P:3D, the KV cache sent
over a link), or the hardware or the weights' precision. Replicas and disaggregation use more
devices than the server as calibrated, and their rows say how many. A scheduler change or a
disaggregation is simulated as it is; a hardware or precision change moves the step-time model
by the roofline's ratios (:meth:`~pdscope.plan.stepmodel.StepModel.scaled`) and is marked an
extrapolation: the fitted model's software overheads do not shrink with a faster chip, so such
rows are a bound on what the change can do rather than a measurement-backed prediction.

For each change, :func:`what_if` gives the most closed-loop users that meet the SLO and the TTFT
and ITL p99 at the load the server holds today (the baseline's users), so that rows can be read
side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdscope.errors import InputError
from pdscope.hardware import DeviceSpec, find_device
from pdscope.plan.capacity import SloUnreachable, max_users, request_alone_s
from pdscope.plan.demand import LengthMix, SharedPrefix, closed_loop
from pdscope.plan.disaggregation import DEFAULT_LINK_GB_S, Disaggregation
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import simulate
from pdscope.plan.stepmodel import HardwareFigures, StepModel
from pdscope.slo import SLO

# The article's devices, and the token budgets the advice names (vLLM's default 2,048; 256 and
# 512 to shorten the pauses a prefill makes; 8,192 for throughput).
DEVICES = ("h100-sxm", "a100-80gb-sxm", "l40s", "rtx-4090")
BUDGETS = (256, 512, 2048, 8192)
REPLICAS = (2, 4)
WEIGHT_BITS = (8, 4)
# Prefill and decode instances: as many devices as the two replica rows, one prefill instance
# for one decode instance and for three (decode holds a request far longer than prefill does).
SPLITS = ((1, 1), (1, 3))


@dataclass(frozen=True)
class Change:
    """The server with one thing different: its ``label``, the step model and scheduler it
    runs with, and ``extrapolation`` (how the model was moved) for a hardware change."""

    label: str
    model: StepModel
    scheduler: SchedulerConfig
    extrapolation: str | None = None
    disaggregation: Disaggregation | None = None

    @property
    def devices(self) -> int:
        """Instances of the server the change runs: replicas, or prefill and decode ones."""
        if self.disaggregation is not None:
            return self.disaggregation.devices
        return self.scheduler.replicas


@dataclass(frozen=True)
class WhatIfRow:
    """A change and what it does: ``users`` that meet the SLO (``None``: not even one),
    ``binding`` (the objective that stops more users), the TTFT and ITL p99 with the
    baseline's users, and a ``note`` when the SLO cannot be met."""

    change: Change
    users: int | None
    binding: str | None
    ttft_p99_s: float | None
    itl_p99_s: float | None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change.label, "users": self.users, "binding": self.binding,
            "ttft_p99_s": self.ttft_p99_s, "itl_p99_s": self.itl_p99_s,
            "extrapolation": self.change.extrapolation, "note": self.note,
            "devices": self.change.devices,
            "disaggregation": (None if self.change.disaggregation is None
                               else self.change.disaggregation.to_json()),
            "scheduler": self.change.scheduler.to_json(),
        }


def scheduler_changes(base: SchedulerConfig) -> list[tuple[str, SchedulerConfig]]:
    """The scheduler settings worth trying on ``base``: other token budgets, half and twice
    the sequences (or slots), prefix caching flipped, replicas."""
    out: list[tuple[str, SchedulerConfig]] = []
    for budget in BUDGETS:
        if budget == base.step_tokens or budget < base.sequences:
            continue
        changed = (replace(base, max_num_batched_tokens=budget) if base.policy == "budget"
                   else replace(base, n_batch=budget))
        out.append((f"token budget {budget:,}", changed))
    for seqs in sorted({max(1, base.sequences // 2), base.sequences * 2} - {base.sequences}):
        if seqs > base.step_tokens:
            continue
        if base.policy == "budget":
            out.append((f"max sequences {seqs}", replace(base, max_num_seqs=seqs)))
        else:
            out.append((f"{seqs} slots", replace(base, slots=seqs)))
    flipped = not base.prefix_caching
    out.append((f"prefix caching {'on' if flipped else 'off'}",
                replace(base, prefix_caching=flipped)))
    for n in REPLICAS:
        out.append((f"{n * base.replicas} replicas", replace(base, replicas=n * base.replicas)))
    return out


def disaggregation_changes(model: StepModel, scheduler: SchedulerConfig,
                           kv_bytes_per_token: float | None,
                           link_gb_s: float = DEFAULT_LINK_GB_S) -> tuple[list[Change], list[str]]:
    """The server split into prefill and decode instances (:data:`SPLITS`), the KV cache sent
    over a link of ``link_gb_s`` GB/s at ``kv_bytes_per_token``; a note instead when the KV
    bytes a token are not known."""
    if not kv_bytes_per_token:
        return [], ["no disaggregation: the KV cache's bytes a token are not known (the"
                    " calibration has no model geometry)"]
    single = replace(scheduler, replicas=1)
    out = []
    for p, d in SPLITS:
        split = Disaggregation(p, d, link_gb_s, kv_bytes_per_token)
        out.append(Change(f"{split.label} disaggregated, KV over {link_gb_s:g} GB/s"
                          f" ({split.devices} devices)", model, single, None, split))
    return out, []


def hardware_changes(model: StepModel, hardware: HardwareFigures,
                     devices: Sequence[str] = DEVICES) -> tuple[list[Change], list[str]]:
    """The model moved to other ``devices`` and to 8- and 4-bit weights, from the calibrated
    device's figures in ``hardware`` (its bandwidth and compute, the weights' bytes each).
    Returns the changes (scheduler unset: the caller's) and a note for each that could not be
    made."""
    notes: list[str] = []
    out: list[Change] = []
    unset = SchedulerConfig()
    if not hardware.device_bandwidth_gb_s:
        notes.append("no other device: the calibrated device's bandwidth is not known")
    else:
        for name in devices:
            moved = on_device(model, hardware, name)
            out.append(Change(f"on {find_device(name).name}", moved, unset,
                              moved.extrapolation))
    width = hardware.bytes_per_weight
    if not width:
        notes.append("no other precision: the weights' width is not known")
    else:
        for bits in WEIGHT_BITS:
            ratio = bits / 8 / width
            if ratio >= 1:
                continue
            moved = model.scaled(weights_bytes_ratio=ratio,
                                 label=f"{bits}-bit weights ({ratio:.2g}x the bytes a step)")
            out.append(Change(f"{bits}-bit weights", moved, unset, moved.extrapolation))
    return out, notes


def on_device(model: StepModel, hardware: HardwareFigures, device: str) -> StepModel:
    """The model moved from the calibrated device (``hardware``: its bandwidth and compute)
    to ``device`` by the roofline's bandwidth and compute ratios (compute 1 where either
    figure is unknown)."""
    spec = find_device(device)
    bandwidth = hardware.device_bandwidth_gb_s
    if not bandwidth:
        raise InputError("the calibration does not say the bandwidth of the device it was made"
                         " on, so nothing can be scaled from it")
    tflops = hardware.device_bf16_tflops
    flops_ratio = spec.bf16_tflops / tflops if spec.bf16_tflops and tflops else 1.0
    ratio = spec.mem_bandwidth_gb_s / bandwidth
    return model.scaled(bandwidth_ratio=ratio, flops_ratio=flops_ratio,
                        label=_device_words(spec, ratio, flops_ratio))


def _device_words(spec: DeviceSpec, bandwidth_ratio: float, flops_ratio: float) -> str:
    return (f"{spec.name}: bandwidth x{bandwidth_ratio:.3g}, compute x{flops_ratio:.3g}"
            " (roofline ratios; software overheads are scaled too, which they are not in"
            " reality)")


def standard_changes(model: StepModel, scheduler: SchedulerConfig,
                     hardware: HardwareFigures | None = None,
                     devices: Sequence[str] = DEVICES, *,
                     link_gb_s: float = DEFAULT_LINK_GB_S,
                     kv_bytes_per_token: float | None = None) -> tuple[list[Change], list[str]]:
    """The baseline (first) and every change worth trying; notes for those left out.

    ``kv_bytes_per_token`` (default: ``hardware``'s, which a calibration writes from the
    model's geometry) and ``link_gb_s`` set the disaggregated rows' transfers."""
    hardware = hardware or HardwareFigures()
    changes = [Change("as calibrated", model, scheduler)]
    changes += [Change(label, model, s) for label, s in scheduler_changes(scheduler)]
    kv = kv_bytes_per_token or hardware.kv_bytes_per_token
    split, notes = disaggregation_changes(model, scheduler, kv, link_gb_s)
    changes += split
    moved, more = hardware_changes(model, hardware, devices)
    changes += [replace(c, scheduler=scheduler) for c in moved]
    return changes, notes + more


def what_if(changes: Sequence[Change], lengths: LengthMix, slo: SLO, *, think_s: float = 0.0,
            num_requests: int = 1000, seed: int = 0,
            shared_prefix: SharedPrefix | None = None) -> list[WhatIfRow]:
    """Each change's users at the SLO, and its TTFT and ITL p99 with the first change's
    (the baseline's) users."""
    if not changes:
        raise InputError("a what-if needs at least the baseline")
    found = [_capacity(c, lengths, slo, think_s, num_requests, seed, shared_prefix)
             for c in changes]
    users_today = found[0][0] or 1
    base = changes[0]
    stagger = request_alone_s(base.model, base.scheduler, lengths, seed, base.disaggregation)
    rows = []
    for change, (users, binding, note) in zip(changes, found, strict=True):
        demand = closed_loop(num_requests, users_today, lengths, think_s=think_s, seed=seed,
                             shared_prefix=shared_prefix, stagger_s=stagger)
        summary = simulate(demand, change.model, change.scheduler,
                           disaggregation=change.disaggregation).summary()
        rows.append(WhatIfRow(change, users, binding, _finite(summary["ttft_p99_s"]),
                              _finite(summary["itl_p99_s"]), note))
    return rows


def _capacity(change: Change, lengths: LengthMix, slo: SLO, think_s: float,
              num_requests: int, seed: int, shared_prefix: SharedPrefix | None
              ) -> tuple[int | None, str | None, str | None]:
    try:
        point = max_users(change.model, change.scheduler, lengths, slo, think_s=think_s,
                          num_requests=num_requests, seed=seed, shared_prefix=shared_prefix,
                          disaggregation=change.disaggregation)
    except SloUnreachable as exc:
        return None, None, str(exc)
    return point.users, point.binding, None


def _finite(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)
