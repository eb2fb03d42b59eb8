"""What the experiments share: the connection to a server, prompts, least-squares fits, chart
data and the inputs of the ceilings.

Every experiment follows the probe's manners: the server is detected, the model checked, a
first request is sent and kept apart (it may pay for loading the model), every prompt is of an
exact length by the server's own tokenizer where it has one, and a server that sends no token
counts gets its output counted with its tokenizer. Results are frozen dataclasses; their
``to_json()`` carries a ``charts`` list whose series are plain x/y arrays, so a report can draw
them without knowing the experiment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import numpy as np

from pdscope.client import (
    RecordBuilder,
    RequestRecord,
    ServerInfo,
    Target,
    Timeouts,
    build_request,
    detect_server,
    new_session,
    raise_for_record,
    resolve_target,
    token_counter,
    tokenize,
)
from pdscope.client import ollama as ollama_api
from pdscope.client import openai as openai_api
from pdscope.client.faults import redact
from pdscope.client.request import overrun_limit
from pdscope.client.session import StreamParser, stream_post
from pdscope.errors import InputError
from pdscope.experiments.probe import is_loopback
from pdscope.experiments.setup import resolve_device, resolve_model
from pdscope.hardware import DeviceSpec
from pdscope.model import ModelGeometry
from pdscope.workload import Prompt, PromptBuilder

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called before each request and once at the end."""


@dataclass(frozen=True)
class ClientOptions:
    """How to talk to the server: the settings every experiment shares. ``api_key`` is never
    printed or written to JSON."""

    api: str = "auto"
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    fixed_output: bool = True
    seed: int | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)

    def to_json(self) -> dict[str, Any]:
        return {"api": self.api, "model": self.model, "fixed_output": self.fixed_output,
                "seed": self.seed}


def config_json(config: ClientOptions) -> dict[str, Any]:
    """An experiment config as JSON: its own fields, the client options, no key."""
    out = config.to_json()
    for f in dataclasses.fields(config):
        if f.name in ("api_key", "timeouts") or f.name in out:
            continue
        value = getattr(config, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


# ------------------------------------------------------------------------------ connection


@dataclass
class Connection:
    """An open session on a detected server, with a prompt builder fitted to its tokenizer."""

    session: aiohttp.ClientSession
    info: ServerInfo
    target: Target
    builder: PromptBuilder
    options: ClientOptions
    notes: list[str]

    @property
    def chat(self) -> bool:
        return self.target.api in ("openai-chat", "ollama-chat")

    async def prompt(self, n_tokens: int, index: int, *, prefix: str = "") -> Prompt:
        """A prompt of ``n_tokens`` (by the server's tokenizer where it has one) that no other
        index gives: a prefix cache cannot flatter it (past ``prefix``, kept whole)."""
        return await self.builder.build(n_tokens, index, prefix=prefix)

    async def send(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        system: Prompt | None = None,
        watch: Callable[[RecordBuilder], None] | None = None,
        check: bool = True,
    ) -> RequestRecord:
        """Stream one request. For a chat API ``system`` goes as a system message and
        ``prompt`` as the user's; for a completions API the caller has already put any shared
        prefix into ``prompt``. ``watch`` is handed the live record builder as soon as it
        exists (to see tokens arrive while the stream runs). With ``check`` a failed request
        raises :class:`RunError`."""
        if self.chat:
            messages = [{"role": "user", "content": prompt.text}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system.text})
            record = await stream_watched(self.session, self.target, messages=messages,
                                          max_tokens=max_tokens,
                                          timeouts=self.options.timeouts, watch=watch)
        else:
            if system is not None:
                raise InputError("a completions prompt carries its prefix in its text")
            record = await stream_watched(self.session, self.target, prompt=prompt.text,
                                          max_tokens=max_tokens,
                                          timeouts=self.options.timeouts, watch=watch)
        if check:
            raise_for_record(record)
        if record.prompt_tokens and not prompt.exact and not self.chat:
            # A chat's count includes its template (and, for some models, a default system
            # prompt): it would bias the tokens-a-word ratio.
            self.builder.calibrate(prompt, record.prompt_tokens)
        return await self.recount(record, prompt, system)

    async def recount(
        self, record: RequestRecord, prompt: Prompt, system: Prompt | None = None
    ) -> RequestRecord:
        """A server that sends no usage (llama-cpp-python): take the prompt count from the
        prompt (fitted to the server's tokenizer) and count the output with that tokenizer."""
        if not record.ok or record.token_count_source != "chunks-estimate":
            return record
        if self.info.tokenize_endpoint is None:
            return record
        ids = await tokenize(self.info, self.session, record.output_text,
                             api_key=self.target.api_key, model=self.target.model)
        if ids is None:
            return record
        prompt_tokens = record.prompt_tokens
        if prompt.exact and (system is None or system.exact):
            prompt_tokens = prompt.tokens + (system.tokens if system else 0)
        return replace(record, prompt_tokens=prompt_tokens, output_tokens=len(ids),
                       token_count_source="server-tokenizer")


@asynccontextmanager
async def connect(url: str, options: ClientOptions) -> AsyncIterator[Connection]:
    """Detect the server at ``url``, check the model, and open a :class:`Connection`.

    Raises :class:`RunError` (one line) when nothing answers or the model is not served."""
    notes: list[str] = []
    async with new_session() as session:
        info, target = await resolve_target(
            url, session, model=options.model, api=options.api, api_key=options.api_key,
            fixed_output=options.fixed_output)
        count = token_counter(info, session, target)
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(
            1 << 30)
        if count is None:
            notes.append("the server has no tokenizer endpoint: prompt lengths were estimated"
                         " and calibrated from the reported prompt_tokens")
        elif target.api in ("openai-chat", "ollama-chat"):
            notes.append("message texts are of exact length by the server's tokenizer; the"
                         " chat template adds its own tokens (in the reported prompt_tokens)")
        yield Connection(session, info, target, PromptBuilder(count, base_seed=seed), options,
                         notes)


async def stream_watched(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = 128,
    timeouts: Timeouts,
    watch: Callable[[RecordBuilder], None] | None = None,
) -> RequestRecord:
    """:func:`pdscope.client.stream_request`, with the live record builder handed to ``watch``
    before the request goes: the interference experiment waits until running streams are
    decoding before it injects a prompt, which needs their tokens while they arrive."""
    url, body = build_request(target, max_tokens, prompt, messages)
    builder = RecordBuilder(request_id=uuid.uuid4().hex[:16], api=target.api,
                            model=target.model)
    if watch is not None:
        watch(builder)
    chat = target.api.endswith("-chat")
    parser: StreamParser
    if target.api.startswith("openai"):
        parser, accept = openai_api.OpenAIStreamParser(builder, chat), "text/event-stream"
    else:
        parser, accept = ollama_api.OllamaStreamParser(builder, chat), "application/x-ndjson"
    await stream_post(session, url, json.dumps(body).encode(), builder=builder, parser=parser,
                      timeouts=timeouts, api_key=target.api_key, accept=accept,
                      max_chunks=overrun_limit(max_tokens))
    record = builder.build()
    if target.api_key and target.api_key in record.output_text:
        record = replace(record, output_text=redact(record.output_text, target.api_key))
    return record


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
    url: str,
    model_name: str,
    *,
    device: str | None = None,
    model_config: str | None = None,
    api_key: str | None = None,
) -> CeilingInputs:
    """Find the geometry and device as the probe does: ``--model-config`` or what the server
    tells (Ollama's ``/api/show``, a local vLLM's or llama.cpp's model files, the lab), and
    ``--device`` or this machine, measured, for a server on this machine. Called after an
    experiment, so the CPU bandwidth probe does not disturb the measurement."""
    local = is_loopback(url)
    async with new_session() as session:
        info = await detect_server(url, session, api_key=api_key)
        model, source = await resolve_model(info, session, model_name, model_config,
                                            server_is_local=local, api_key=api_key)
    spec = resolve_device(device, local)
    notes: list[str] = []
    if model is None and source:
        notes.append(f"no ceiling: {source}")
    if spec is None:
        notes.append("no ceiling: the device is unknown (give --device)")
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


# ----------------------------------------------------------------------------------- charts


@dataclass(frozen=True)
class Series:
    """One line or set of points: ``x`` and ``y`` of equal length (``None``: no value)."""

    name: str
    x: tuple[float, ...]
    y: tuple[float | None, ...]
    kind: str = "line"  # "line", "points" or "bar"
    group: str | None = None  # e.g. the stream a gap belongs to

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"series {self.name!r}: {len(self.x)} x values, {len(self.y)} y")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "x": list(self.x),
                               "y": [None if v is None or not math.isfinite(v) else v
                                     for v in self.y]}
        if self.group is not None:
            out["group"] = self.group
        return out


@dataclass(frozen=True)
class Span:
    """A stretch of the x axis to shade, such as the injected prefill."""

    name: str
    start: float
    end: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class Chart:
    """What a report needs to draw one chart: axes and plain x/y series."""

    id: str
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    spans: tuple[Span, ...] = ()
    categories: tuple[str, ...] | None = None  # bar charts: x values index these labels

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "x_label": self.x_label,
                               "y_label": self.y_label,
                               "series": [s.to_json() for s in self.series]}
        if self.spans:
            out["spans"] = [s.to_json() for s in self.spans]
        if self.categories is not None:
            out["categories"] = list(self.categories)
        return out


def median(values: Sequence[float]) -> float | None:
    return float(np.median(np.asarray(values, dtype=float))) if values else None


def parse_counts(text: str, what: str = "--prompt-tokens") -> tuple[int, ...]:
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
