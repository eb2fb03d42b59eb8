"""What the experiments share: notes on how tokens were counted, least-squares fits and the
inputs of the ceilings (the connection is :mod:`pdscope.client.connection`, chart data
:mod:`pdscope.charts`).

Every experiment follows the probe's manners: the server is detected, the model checked, a
first request is sent and kept apart (it may pay for loading the model), every prompt is of an
exact length by the server's own tokenizer where it has one, and a server that sends no token
counts gets its output counted with its tokenizer. Results are frozen dataclasses; their
``to_json()`` carries a ``charts`` list whose series are plain x/y arrays, so a report can draw
them without knowing the experiment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdscope import roofline
from pdscope.client import Connection, RequestRecord, detect_server, is_loopback, new_session
from pdscope.errors import Field, InputError, Note
from pdscope.experiments.setup import resolve_device, resolve_model
from pdscope.hardware import DeviceSpec
from pdscope.model import ModelGeometry

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called before each request and once at the end."""


# ------------------------------------------------------------------------------ connection


def output_notes(records: Sequence[RequestRecord], max_tokens: int) -> list[str]:
    """What a reader should know about how the records were counted."""
    notes: list[str] = []
    if records and records[0].token_count_source == "chunks-estimate":
        notes.append("output tokens were counted from stream chunks (an estimate)")
    outs = [r.output_tokens for r in records if r.output_tokens is not None]
    if outs and min(outs) < max_tokens:
        notes.append(f"the server stopped some answers early ({min(outs)} of {max_tokens}"
                     " tokens): it offers no way to force the length")
    return notes


# --------------------------------------------------------------------------------- ceiling


@dataclass(frozen=True)
class CeilingInputs:
    """The model geometry and device a result is set beside, and why one is missing."""

    device: DeviceSpec | None = None
    model: ModelGeometry | None = None
    model_source: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return self.device is not None and self.model is not None

    def _peak_tflops(self) -> float | None:
        assert self.model is not None and self.device is not None
        peak = roofline.peak_flops(self.model, self.device)
        return peak / 1e12 if peak else None

    def hold_rate(self, measured: float | None, ceiling: float | None,
                  phase: str) -> roofline.Held | None:
        """A measured ``phase`` rate ("decode" or "prefill") beside its ceiling, the share
        never above 1; ``None`` when either is unknown."""
        if measured is None or not ceiling or not self.known:
            return None
        assert self.device is not None
        return roofline.hold_rate(measured, ceiling, phase=phase, device=self.device.name,
                                  measured_device=self.device.measured,
                                  mem_bandwidth_gb_s=self.device.mem_bandwidth_gb_s,
                                  peak_tflops=self._peak_tflops())

    def hold_ttft(self, measured_s: float | None, floor_s: float | None) -> roofline.Held | None:
        """A measured TTFT beside the roofline's floor, which may not be above it."""
        if measured_s is None or not floor_s or not self.known:
            return None
        assert self.device is not None
        return roofline.hold_ttft(measured_s, floor_s, device=self.device.name,
                                  measured_device=self.device.measured,
                                  peak_tflops=self._peak_tflops(),
                                  mem_bandwidth_gb_s=self.device.mem_bandwidth_gb_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device.name if self.device else None,
            "device_measured": self.device.measured if self.device else None,
            "mem_bandwidth_gb_s": self.device.mem_bandwidth_gb_s if self.device else None,
            "model_source": self.model_source,
            "weight_bytes_read_per_token": self.model.read_weight_bytes() if self.model
            else None,
        }


async def find_ceiling_inputs(
    where: str | Connection,
    model_name: str,
    *,
    device: str | None = None,
    model_config: str | None = None,
    api_key: str | None = None,
    flags: Sequence[str] = (),
) -> CeilingInputs:
    """Find the geometry and device as the probe does: ``--model-config`` or what the server
    tells (Ollama's ``/api/show``, a local vLLM's or llama.cpp's model files, the lab), and
    ``--device`` or this machine, measured, for a server on this machine. Called after an
    experiment, so the CPU bandwidth probe does not disturb the measurement. An open
    :class:`Connection` is reused (no second detection)."""
    if isinstance(where, Connection):
        local = is_loopback(where.info.base_url)
        model, source = await resolve_model(where.info, where.session, model_name, model_config,
                                            server_is_local=local, api_key=api_key)
    else:
        local = is_loopback(where)
        async with new_session() as session:
            info = await detect_server(where, session, api_key=api_key)
            model, source = await resolve_model(info, session, model_name, model_config,
                                                server_is_local=local, api_key=api_key)
    spec = resolve_device(device, local, model)
    notes: list[str] = []
    if model is None and source:
        notes.append(Note("no ceiling: ", source))
    if spec is None:
        notes.append(Note("no ceiling: the device is unknown (give ", Field("device"), ")"))
    return CeilingInputs(spec, model, source if model else None, tuple(notes))


# ------------------------------------------------------------------------------------ fits


@dataclass(frozen=True)
class LinearFit:
    """Least squares ``y = sum(coef[k] * x**k)``, with standard errors from the residuals.

    ``stderr`` is ``None`` where there are no degrees of freedom left (as many points as
    coefficients): the fit then passes through every point and says nothing about noise."""

    coef: tuple[float, ...]
    stderr: tuple[float, ...] | None
    r2: float | None
    points: int
    residual_s: float | None  # standard deviation of the residuals

    @property
    def dof(self) -> int:
        return self.points - len(self.coef)

    def t(self, k: int) -> float | None:
        """``coef[k] / stderr[k]``: how many standard errors from zero."""
        if self.stderr is None:
            return None
        se = self.stderr[k]
        if se == 0:
            return math.inf if self.coef[k] != 0 else 0.0
        return self.coef[k] / se

    def __call__(self, x: float) -> float:
        return float(sum(c * x**k for k, c in enumerate(self.coef)))


def polyfit(x: Sequence[float], y: Sequence[float], degree: int) -> LinearFit:
    """Least-squares polynomial of ``degree`` through the points. The x axis is scaled to its
    largest value before solving so a quadratic in tens of thousands of tokens stays well
    conditioned; coefficients come back in the original units."""
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError("x and y must be sequences of the same length")
    if len(set(xs.tolist())) < degree + 1:
        raise ValueError(f"a degree-{degree} fit needs {degree + 1} distinct x values")
    scale = float(np.max(np.abs(xs))) or 1.0
    u = xs / scale
    design = np.vander(u, degree + 1, increasing=True)
    coef_u, *_ = np.linalg.lstsq(design, ys, rcond=None)
    fitted = design @ coef_u
    resid = ys - fitted
    rss = float(resid @ resid)
    tss = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - rss / tss if tss > 0 else None
    dof = len(xs) - (degree + 1)
    stderr_u: np.ndarray | None = None
    residual_s: float | None = None
    if dof > 0:
        sigma2 = rss / dof
        residual_s = math.sqrt(sigma2)
        cov = sigma2 * np.linalg.inv(design.T @ design)
        stderr_u = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    powers = scale ** np.arange(degree + 1)
    coef = tuple(float(c) for c in coef_u / powers)
    stderr = tuple(float(s) for s in stderr_u / powers) if stderr_u is not None else None
    return LinearFit(coef, stderr, r2, len(xs), residual_s)


def median(values: Sequence[float]) -> float | None:
    return float(np.median(np.asarray(values, dtype=float))) if values else None


def parse_counts(text: str, what: str = "prompt_tokens") -> tuple[int, ...]:
    """``"200,500,1000"`` (also ``1k``, ``2e3``) as whole counts, at least 1, sorted and
    without repeats."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            value = float(part[:-1]) * 1000 if part.endswith("k") else float(part)
        except ValueError:
            raise InputError(
                f"{what}: not a number: {part!r} (give e.g. 200,1000,2000)") from None
        if value < 1 or value != int(value):
            raise InputError(f"{what}: {part} is not a whole count of at least 1")
        out.add(int(value))
    if not out:
        raise InputError(f"{what}: give at least one count, e.g. 200,1000,2000")
    return tuple(sorted(out))


__all__ = ["CeilingInputs", "LinearFit", "ProgressFn", "find_ceiling_inputs", "median",
           "output_notes", "parse_counts", "polyfit"]
