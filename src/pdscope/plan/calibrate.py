"""Calibration: a short designed set of requests that fits the step-time model to one server.

Three parts, each kept well below saturation (a fit made on an overloaded server learns the
queue, not the engine):

1. **prefill**: one stream, prompts of several lengths, a few output tokens. A TTFT is the sum
   of the prompt's steps: ``ceil(P / budget)`` chunks, each with its prompt tokens and the
   attention pairs of a chunk after the ones before it.
2. **decode**: one stream at two or more contexts. Each gap between two tokens is one step of
   one sequence at the context it has reached; a stream's gaps sum to the time from its first
   to its last token.
3. **batch**: C streams started together. While all C decode (after the last first token and
   before the first stream ends), every step holds C sequences; this separates a step's fixed
   cost from its cost a sequence, which one stream alone cannot.

The fit is :func:`pdscope.plan.stepmodel.fit_step_model` (non-negative, with the roofline's
figures as the prior for a term the data cannot see). The decode part's gaps, less the fitted
model's step at their context, are kept as the step's jitter (:func:`decode_residuals`): what a
one-slot server's ITL tail is made of. The server's scheduling settings (token
budget, sequences, KV pool, block size, prefix caching) are read from the server where it
tells them (:func:`pdscope.experiments.setup.read_settings`), else stated as assumptions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdscope import __version__
from pdscope.checks import at_least
from pdscope.client import ClientOptions, Connection, RequestRecord, connect
from pdscope.errors import InputError, PdscopeError, RunError
from pdscope.experiments.common import find_ceiling_inputs
from pdscope.experiments.setup import lab_flags, read_settings
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.stepmodel import (
    HardwareFigures,
    StepModel,
    StepObservation,
    attention_pairs,
    chunks,
    fit_step_model,
    jitter_quantiles,
    roofline_prior,
)
from pdscope.servers import ServerSettings

FORMAT = "pdscope-calibration"
VERSION = 1

# What a server that does not tell its settings is assumed to run with, and why. vLLM V1's
# defaults: max_num_seqs 256 and block_size 16 (vllm/config/scheduler.py, cache.py); a token
# budget of 2,048 where chunked prefill is on (vLLM's online-serving default).
ASSUMED_BUDGET = 2048
ASSUMED_MAX_SEQUENCES = 256
ASSUMED_BLOCK_SIZE = 16

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig(ClientOptions):
    """The designed set: ``prefill_tokens`` (prompt lengths, a few output tokens each),
    ``decode_contexts`` (one stream decoding ``decode_tokens`` at each prompt length),
    ``batch_streams`` (stream counts started together, each with ``batch_prompt_tokens``),
    each point ``runs`` times."""

    prefill_tokens: tuple[int, ...] = (128, 512, 1024, 2048)
    decode_contexts: tuple[int, ...] = (64, 1536)
    decode_tokens: int = 96
    batch_streams: tuple[int, ...] = (2, 4, 8, 16)
    batch_prompt_tokens: int = 256
    runs: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.prefill_tokens) < 2:
            raise InputError("the prefill part needs at least two prompt lengths")
        if len(self.decode_contexts) < 2:
            raise InputError("the decode part needs at least two contexts")
        if not self.batch_streams:
            raise InputError("the batch part needs at least one stream count")
        for n in self.prefill_tokens:
            at_least(n, 1, "prefill prompt lengths")
        for n in self.decode_contexts:
            at_least(n, 1, "decode contexts")
        for n in self.batch_streams:
            at_least(n, 2, "batch stream counts")
        at_least(self.decode_tokens, 8, "decode_tokens")
        at_least(self.batch_prompt_tokens, 1, "batch_prompt_tokens")
        at_least(self.runs, 1, "runs")


@dataclass(frozen=True)
class Point:
    """One observation and where it came from: ``part`` (prefill, decode, batch), the label
    of its setting, the observation and the model's prediction of it once fitted."""

    part: str
    label: str
    observation: StepObservation
    predicted_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        o = self.observation
        return {
            "part": self.part, "label": self.label, "steps": o.steps,
            "prompt_tokens": o.prompt_tokens, "sequences": o.sequences,
            "context_tokens": o.context_tokens, "attention_pairs": o.attention_pairs,
            "duration_s": o.duration_s, "predicted_s": self.predicted_s,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Point:
        return cls(
            part=str(d["part"]), label=str(d["label"]),
            observation=StepObservation(
                steps=float(d["steps"]), prompt_tokens=float(d["prompt_tokens"]),
                sequences=float(d["sequences"]), context_tokens=float(d["context_tokens"]),
                attention_pairs=float(d["attention_pairs"]), duration_s=float(d["duration_s"]),
            ),
            predicted_s=None if d.get("predicted_s") is None else float(d["predicted_s"]),
        )


@dataclass(frozen=True)
class CalibratedServer:
    """What a calibration knows of the server it was made on: where it was and what it ran
    (family, version, model, API), its scheduling ``settings`` as it told them, the device and
    the model's files where known, the ``hardware`` figures a what-if moves the model with, and
    the bench or doctor ``runs`` a calibration from runs was fitted to (none for a live one)."""

    url: str | None = None
    family: str | None = None
    version: str | None = None
    model: str | None = None
    api: str | None = None
    settings: ServerSettings = field(default_factory=ServerSettings)
    device: str | None = None
    model_source: str | None = None
    hardware: HardwareFigures = field(default_factory=HardwareFigures)
    runs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The calibration file's ``server``: the hardware figures beside the rest, ``runs``
        only for a calibration from runs."""
        out: dict[str, Any] = {
            "url": self.url, "family": self.family, "version": self.version,
            "model": self.model, "api": self.api, "settings": self.settings.to_json(),
            "device": self.device, "model_source": self.model_source,
            **self.hardware.to_json(),
        }
        if self.runs:
            out["runs"] = list(self.runs)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CalibratedServer:
        def text(key: str) -> str | None:
            value = d.get(key)
            return None if value is None else str(value)

        return cls(
            url=text("url"), family=text("family"), version=text("version"),
            model=text("model"), api=text("api"),
            settings=ServerSettings.from_json(d.get("settings") or {}),
            device=text("device"), model_source=text("model_source"),
            hardware=HardwareFigures.from_json(d),
            runs=tuple(str(r) for r in d.get("runs") or ()),
        )


@dataclass(frozen=True)
class Calibration:
    """A fitted step-time model with the server it was fitted on and that server's
    scheduling settings (``scheduler``), ``assumptions`` for the settings it did not tell."""

    step_model: StepModel
    scheduler: SchedulerConfig
    server: CalibratedServer = field(default_factory=CalibratedServer)
    points: tuple[Point, ...] = ()
    assumptions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    created_at: float = field(default_factory=time.time)
    duration_s: float | None = None

    def errors_by_part(self) -> dict[str, float]:
        """Median absolute relative error of the fit's predictions, by part."""
        out: dict[str, float] = {}
        for part in sorted({p.part for p in self.points}):
            errs = [abs(p.predicted_s / p.observation.duration_s - 1) for p in self.points
                    if p.part == part and p.predicted_s is not None
                    and p.observation.duration_s > 0]
            if errs:
                out[part] = float(np.median(errs))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "pdscope": __version__,
            "created_at": self.created_at, "duration_s": self.duration_s,
            "server": self.server.to_json(), "scheduler": self.scheduler.to_json(),
            "assumptions": list(self.assumptions), "step_model": self.step_model.to_json(),
            "fit_error_by_part": self.errors_by_part(),
            "points": [p.to_json() for p in self.points], "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "the calibration") -> Calibration:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InputError(f"{where} is not a pdscope calibration (no \"format\": \"{FORMAT}\")")
        if d.get("version") != VERSION:
            raise InputError(f"{where} is calibration format {d.get('version')!r}; this pdscope"
                             f" reads format {VERSION}: calibrate again")
        try:
            return cls(
                step_model=StepModel.from_json(d["step_model"]),
                scheduler=SchedulerConfig.from_json(d["scheduler"]),
                server=CalibratedServer.from_json(d.get("server") or {}),
                points=tuple(Point.from_json(p) for p in d.get("points") or ()),
                assumptions=tuple(str(a) for a in d.get("assumptions") or ()),
                notes=tuple(str(n) for n in d.get("notes") or ()),
                created_at=float(d.get("created_at") or 0.0),
                duration_s=None if d.get("duration_s") is None else float(d["duration_s"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{where} is damaged: {type(exc).__name__}: {exc}") from None

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/calibration.json`` (the folder is made); returns the file."""
        path = Path(folder) / "calibration.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, allow_nan=False))
        tmp.replace(path)  # whole or not at all
        return path


def load_calibration(path: str | Path) -> Calibration:
    """A calibration from its folder or its ``calibration.json``; :class:`InputError` else."""
    p = Path(path)
    if p.is_dir():
        p = p / "calibration.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the calibration {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(f"{p} is not JSON: {exc}") from None
    return Calibration.from_json(data, str(p))


# ----------------------------------------------------------------------------- observations


def prefill_observation(prompt_tokens: int, budget: int, ttft_s: float) -> StepObservation:
    """A TTFT as the sum of the prompt's steps, one sequence each."""
    parts = chunks(prompt_tokens, budget)
    return StepObservation(
        steps=len(parts), prompt_tokens=prompt_tokens, sequences=len(parts), context_tokens=0,
        attention_pairs=sum(attention_pairs(p, c) for p, c in parts), duration_s=ttft_s,
    )


def decode_observation(record: RequestRecord) -> StepObservation | None:
    """One stream's decode: its gaps after the first token, one step each at the context
    reached (prompt plus the tokens before). ``None`` without two tokens or a prompt count."""
    if record.prompt_tokens is None or record.t_first_token_ns is None:
        return None
    if record.t_last_token_ns is None:
        return None
    steps = (record.output_tokens or record.n_out) - 1
    if steps < 1:
        return None
    duration = (record.t_last_token_ns - record.t_first_token_ns) / 1e9
    p = record.prompt_tokens
    # Step i (1..steps) decodes at context p + i: its input is the prompt and i tokens.
    context = steps * p + steps * (steps + 1) / 2
    return StepObservation(steps=steps, prompt_tokens=0, sequences=steps,
                           context_tokens=context, attention_pairs=0, duration_s=duration)


def decode_residuals(records: Sequence[RequestRecord], model: StepModel) -> np.ndarray:
    """Each single-token gap of the streams' decodes minus the model's step at the context it
    was decoded at (seconds): the scatter the model's mean step leaves out."""
    out: list[np.ndarray] = []
    for r in records:
        if r.prompt_tokens is None or len(r.token_times_ns) < 3:
            continue
        times = np.asarray(r.token_times_ns, dtype=np.int64)
        tokens = np.cumsum(np.asarray(r.chunk_tokens or (1,) * len(times), dtype=np.int64))
        gaps = np.diff(times) / 1e9
        single = np.diff(tokens) == 1
        # The gap after the k-th token is the step at context prompt + k (decode_observation).
        context = r.prompt_tokens + tokens[:-1]
        steps = np.array([model.step_time(sequences=1, context_tokens=float(c))
                          for c in context])
        out.append((gaps - steps)[single])
    return np.concatenate(out) if out else np.zeros(0)


def batch_observations(records: Sequence[RequestRecord]) -> list[StepObservation]:
    """Streams started together: for each, its gaps while every stream was decoding, each a
    step of ``len(records)`` sequences whose contexts are the streams' prompts plus the
    tokens each had received by then."""
    times = [np.asarray(r.token_times_ns, dtype=np.int64) for r in records]
    counts = [np.cumsum(np.asarray(r.chunk_tokens or (1,) * len(t), dtype=np.int64))
              for r, t in zip(records, times, strict=True)]
    if any(t.size < 3 for t in times) or any(r.prompt_tokens is None for r in records):
        return []
    start = max(int(t[0]) for t in times)
    end = min(int(t[-1]) for t in times)
    n = len(records)
    out = []
    for t, c in zip(times, counts, strict=True):
        inside = np.flatnonzero((t >= start) & (t <= end))
        if inside.size < 3:
            continue
        first, last = int(inside[0]), int(inside[-1])
        steps = int(c[last] - c[first])
        if steps < 2:
            continue
        # Context of every stream at each token of this one, in the window.
        context = 0.0
        for r, t2, c2 in zip(records, times, counts, strict=True):
            at = np.searchsorted(t2, t[first + 1:last + 1], side="right") - 1
            got = np.where(at >= 0, c2[np.clip(at, 0, None)], 0)
            context += float(np.sum(got)) + (r.prompt_tokens or 0) * (last - first)
        # A chunk of several tokens is several steps: scale the context sum to the steps.
        context *= steps / max(1, last - first)
        out.append(StepObservation(steps=steps, prompt_tokens=0, sequences=n * steps,
                                   context_tokens=context, attention_pairs=0,
                                   duration_s=(int(t[last]) - int(t[first])) / 1e9))
    return out


# ------------------------------------------------------------------------------------- run


def scheduler_from_settings(
    settings: ServerSettings, scheduling: str
) -> tuple[SchedulerConfig, list[str]]:
    """The simulator's settings from what the server told; an assumption for each it did not."""
    assumptions: list[str] = []
    budget = settings.prefill_budget_tokens
    if budget is None:
        budget = ASSUMED_BUDGET
        assumptions.append(f"token budget a step {ASSUMED_BUDGET} (not reported by the server)")
    seqs = settings.max_sequences
    if seqs is None:
        seqs = 1 if scheduling == "slots" else ASSUMED_MAX_SEQUENCES
        assumptions.append(f"at most {seqs} sequences at once (not reported by the server)")
    block = settings.block_size
    if block is None:
        block = ASSUMED_BLOCK_SIZE
        if scheduling == "budget":  # slots hold their context whole: no blocks to assume
            assumptions.append(f"KV blocks of {ASSUMED_BLOCK_SIZE} tokens (not reported)")
    if settings.kv_pool_tokens is None:
        assumptions.append("a KV pool without limit (its size is not reported)")
    prefix = settings.prefix_caching
    if prefix is None:
        prefix = scheduling == "budget"
        assumptions.append(f"prefix caching {'on' if prefix else 'off'} (not reported)")
    if scheduling == "slots":
        config = SchedulerConfig(policy="slots", slots=seqs, n_batch=budget,
                                 kv_pool_tokens=settings.kv_pool_tokens,
                                 block_size=block, prefix_caching=prefix)
    else:
        config = SchedulerConfig(policy="budget", max_num_batched_tokens=budget,
                                 max_num_seqs=seqs, kv_pool_tokens=settings.kv_pool_tokens,
                                 block_size=block, prefix_caching=prefix)
    return config, assumptions


async def run_calibration(
    url: str | Connection,
    config: CalibrationConfig,
    *,
    device: str | None = None,
    model_config: str | None = None,
    progress: ProgressFn | None = None,
) -> Calibration:
    """Send the designed set to the server at ``url`` and fit the step-time model.

    Raises :class:`RunError` (one line, naming the part) when a part cannot be measured: a
    request fails, the server sends too few tokens, or the server is saturated (the batch part
    finds streams that never decoded together)."""
    t0 = time.monotonic()
    async with connect(url, config) as conn:
        flags = lab_flags(conn.info.base_url)
        settings = await read_settings(conn.info, conn.session, flags, api_key=config.api_key)
        scheduling = conn.info.family.scheduling
        scheduler, assumptions = scheduler_from_settings(settings, scheduling)
        budget = (scheduler.max_num_batched_tokens if scheduler.policy == "budget"
                  else scheduler.n_batch)
        limit = settings.context_tokens
        if limit is not None:
            too_long = [n for n in (*config.prefill_tokens, *config.decode_contexts)
                        if n + config.decode_tokens > limit]
            if too_long:
                raise InputError(f"prompt lengths {too_long} do not fit the server's context"
                                 f" of {limit} tokens with {config.decode_tokens} to decode")
        plan = _plan(config, serial=conn.info.family.serial or (scheduler.policy == "slots"
                     and scheduler.slots < 2),
                     max_streams=scheduler.slots if scheduler.policy == "slots" else None)
        total = len(plan) + 1
        index = 0

        async def send(n_prompt: int, n_out: int) -> RequestRecord:
            nonlocal index
            index += 1
            prompt = await conn.prompt(n_prompt, index)
            return await conn.send(prompt, n_out)

        if progress:
            progress("warm-up", 0, total)
        try:
            await send(config.prefill_tokens[0], 8)  # the first request pays for loading
        except PdscopeError as exc:
            raise RunError("calibration: the warm-up request failed: ", exc) from None
        points: list[Point] = []
        decodes: list[RequestRecord] = []
        for step, (part, label, n_prompt, n_out, streams) in enumerate(plan, start=1):
            if progress:
                progress(f"{part}: {label}", step, total)
            try:
                records = await asyncio.gather(
                    *(send(n_prompt, n_out) for _ in range(streams)))
            except PdscopeError as exc:
                raise RunError(f"calibration, {part} part ({label}): ", exc) from None
            points += _observe(part, label, records, budget)
            if part == "decode":
                decodes += records
        if progress:
            progress("fitting", total, total)
        inputs = await find_ceiling_inputs(conn, conn.target.model, device=device,
                                           model_config=model_config, api_key=config.api_key,
                                           flags=flags)
        server = CalibratedServer(
            url=conn.info.base_url, family=conn.info.family.name, version=conn.info.version,
            model=conn.target.model, api=conn.target.api, settings=settings,
            device=inputs.device.name if inputs.device else None,
            model_source=inputs.model_source,
            hardware=HardwareFigures.of(inputs.model, inputs.device))
    for part in ("prefill", "decode"):
        if not any(p.part == part for p in points):
            raise RunError(f"calibration: the {part} part measured nothing usable")
    if config.batch_streams and not any(p.part == "batch" for p in points) and not (
            scheduler.policy == "slots" and scheduler.slots < 2):
        raise RunError("calibration: in the batch part no streams decoded together: the"
                       " server is saturated or serves one request at a time")
    prior = (roofline_prior(inputs.model, inputs.device)
             if inputs.model is not None and inputs.device is not None else None)
    model = fit_step_model([p.observation for p in points], prior=prior)
    model = replace(model, jitter_s=jitter_quantiles(decode_residuals(decodes, model)))
    fitted = tuple(Point(p.part, p.label, p.observation,
                         model.predict(p.observation)) for p in points)
    notes = list(inputs.notes) + list(conn.notes)
    if prior is None:
        notes.append("no roofline prior (model or device unknown): a term the data could not"
                     " see is 0")
    return Calibration(model, scheduler, server, fitted, tuple(assumptions), tuple(notes),
                       duration_s=time.monotonic() - t0)


def _plan(config: CalibrationConfig, serial: bool, max_streams: int | None = None
          ) -> list[tuple[str, str, int, int, int]]:
    """``(part, label, prompt tokens, output tokens, streams)`` for each request group.
    ``max_streams``: the most that decode at once (a slots server's slot count): a batch of
    more never has all its streams decoding together (the last first token comes after the
    first stream ends), so it would measure nothing; it is sent at that count instead."""
    batches = sorted({min(c, max_streams) if max_streams else c for c in config.batch_streams})
    batches = [c for c in batches if c >= 2]
    out = []
    for _ in range(config.runs):
        for n in config.prefill_tokens:
            out.append(("prefill", f"{n} prompt tokens", n, 4, 1))
        for n in config.decode_contexts:
            out.append(("decode", f"context {n}", n, config.decode_tokens, 1))
        if not serial:
            for c in batches:
                out.append(("batch", f"{c} streams", config.batch_prompt_tokens,
                            config.decode_tokens, c))
    return out


def _observe(part: str, label: str, records: Sequence[RequestRecord],
             budget: int) -> list[Point]:
    if part == "batch":
        return [Point(part, label, o) for o in batch_observations(records)]
    out = []
    for r in records:
        if part == "prefill" and r.ttft_s is not None and r.prompt_tokens:
            out.append(Point(part, label, prefill_observation(r.prompt_tokens, budget,
                                                              r.ttft_s)))
        obs = decode_observation(r)
        if obs is not None and part == "decode":
            out.append(Point(part, label, obs))
    return out

