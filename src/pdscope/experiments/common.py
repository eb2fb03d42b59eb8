"""What the experiments share: the connection to a server, prompts, least-squares fits and the
inputs of the ceilings (chart data is :mod:`pdscope.charts`).

Every experiment follows the probe's manners: the server is detected, the model checked, a
first request is sent and kept apart (it may pay for loading the model), every prompt is of an
exact length by the server's own tokenizer where it has one, and a server that sends no token
counts gets its output counted with its tokenizer. Results are frozen dataclasses; their
``to_json()`` carries a ``charts`` list whose series are plain x/y arrays, so a report can draw
them without knowing the experiment.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np

from pdscope.charts import Chart, Series, Span
from pdscope.client import (
    ClientOptions,
    RecordBuilder,
    RequestRecord,
    ServerInfo,
    Target,
    choose_target,
    detect_server,
    is_loopback,
    new_session,
    raise_for_record,
    stream_request,
    token_counter,
    tokenize,
)
from pdscope.errors import InputError
from pdscope.experiments.setup import resolve_device, resolve_model
from pdscope.hardware import DeviceSpec
from pdscope.model import ModelGeometry
from pdscope.workload import Prompt, PromptBuilder

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called before each request and once at the end."""


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
            record = await stream_request(self.session, self.target, messages=messages,
                                          max_tokens=max_tokens,
                                          timeouts=self.options.timeouts, watch=watch)
        else:
            if system is not None:
                raise InputError("a completions prompt carries its prefix in its text")
            record = await stream_request(self.session, self.target, prompt=prompt.text,
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
async def connect(where: str | Connection, options: ClientOptions) -> AsyncIterator[Connection]:
    """A :class:`Connection` to the server at ``where`` with ``options``: a URL is detected and
    its model checked; an open connection is reused (same session, the server detected once)
    with these options' model, API and seed.

    Raises :class:`RunError` (one line) when nothing answers or the model is not served."""
    if isinstance(where, Connection):
        yield _open(where.session, where.info, options)
        return
    async with new_session() as session:
        info = await detect_server(where, session, api_key=options.api_key)
        yield _open(session, info, options)


def _open(session: aiohttp.ClientSession, info: ServerInfo,
          options: ClientOptions) -> Connection:
    target = choose_target(info, model=options.model, api=options.api, api_key=options.api_key,
                           fixed_output=options.fixed_output)
    notes: list[str] = []
    count = token_counter(info, session, target)
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 30)
    if count is None:
        notes.append("the server has no tokenizer endpoint: prompt lengths were estimated"
                      " and calibrated from the reported prompt_tokens")
    elif target.api in ("openai-chat", "ollama-chat"):
        notes.append("message texts are of exact length by the server's tokenizer; the"
                     " chat template adds its own tokens (in the reported prompt_tokens)")
    return Connection(session, info, target, PromptBuilder(count, base_seed=seed), options, notes)


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


__all__ = ["CeilingInputs", "Chart", "ClientOptions", "Connection", "LinearFit", "ProgressFn",
           "Series", "Span", "connect", "find_ceiling_inputs", "median", "output_notes",
           "parse_counts", "polyfit"]
