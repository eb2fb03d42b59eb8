"""The context sweep: decode slows as the context fills.

The article: every decode step reads the keys and values of every earlier token. The weights
are a fixed cost a token; the KV cache grows with the context, so a long conversation reads
more bytes a step and decodes a little slower.

The experiment asks for long answers (``max_tokens``) to prompts of one or more lengths, and
reads the inter-token latency by position in the answer: positions are binned (``bin_tokens``
a bin) and each bin's median ITL stands at its context (prompt + position). A straight line
``ITL = α + β·context`` is fitted through the bins. The roofline says what β should be on a
memory-bound step: one more token of context adds ``kv_bytes_per_token`` to every step's read,
so ``d(step time)/d(context) = kv_bytes_per_token / bandwidth``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdscope import roofline
from pdscope.charts import Chart, Series
from pdscope.checks import at_least
from pdscope.client import ClientOptions, Connection, RequestRecord, ServerInfo, Target, connect
from pdscope.errors import Field, InputError
from pdscope.experiments.common import (
    CeilingInputs,
    LinearFit,
    ProgressFn,
    median,
    output_notes,
    polyfit,
)
from pdscope.figures import DECODE_RATE, Figures, ResultKind, experiment_figures, number, register
from pdscope.roofline import GB
from pdscope.workload import Prompt

# β is reported as resolved when it is positive and this many standard errors from zero; a
# smaller slope is the line bending to noise (scheduling jitter on a shared machine).
SLOPE_T_MIN = 2.0


@dataclass(frozen=True, kw_only=True)
class ContextConfig(ClientOptions):
    prompt_tokens: tuple[int, ...] = (200, 2000)
    max_tokens: int = 512
    runs: int = 1
    bin_tokens: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.runs, 1, "runs")
        at_least(self.bin_tokens, 1, "bin_tokens")
        if self.max_tokens < 2 * self.bin_tokens:
            raise InputError(Field("max_tokens"), " must be at least two bins"
                             f" ({2 * self.bin_tokens} tokens) to see the decode rate move")
        if not self.prompt_tokens or min(self.prompt_tokens) < 1:
            raise InputError(Field("prompt_tokens"),
                             ": give one or more lengths of at least 1 token")


@dataclass(frozen=True)
class ContextBin:
    """The median ITL of the output positions ``first..last`` after a prompt of
    ``prompt_tokens``, over every run; ``context`` is the mean KV length of those steps."""

    prompt_tokens: int
    first_position: int
    last_position: int
    context: float
    itl_median_s: float
    samples: int

    @property
    def decode_tok_s(self) -> float:
        return 1.0 / self.itl_median_s

    def to_json(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "first_position": self.first_position,
                "last_position": self.last_position, "context": self.context,
                "itl_median_s": self.itl_median_s, "decode_tok_s": self.decode_tok_s,
                "samples": self.samples}


def context_bins(
    runs: list[tuple[int, tuple[float, ...], int]], bin_tokens: int
) -> list[ContextBin]:
    """Bin per-token ITLs by output position. ``runs``: (prompt tokens, ITLs, index of the
    first gap) of each request; gap ``j`` (between output tokens ``j`` and ``j + 1``) is the
    step that read ``prompt + j + 1`` tokens of KV. The first gap is gap 0 unless the first
    write brought several tokens (a server short of CPU sends what piled up in one write): the
    tokens of the first write have no gap, and the first measured one is
    :attr:`~pdscope.client.record.RequestRecord.first_step_index`. The gaps are the records'
    :attr:`~pdscope.client.record.RequestRecord.step_gaps_s`: each write spread over the tokens
    it brought, so a burst after a stall reads as the steps that made it, and a bin's median is
    its step time whether the tokens came one by one or in piles. A bin holding fewer than a
    quarter of ``bin_tokens`` gaps (the ragged end, or a start the first chunk swallowed) is
    left out: its median would rest on a handful of steps."""
    if bin_tokens < 1:
        raise InputError(Field("bin_tokens"), " must be at least 1")
    gathered: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for prompt, itl, first in runs:
        for j, gap in enumerate(itl, start=first):
            gathered[(prompt, j // bin_tokens)].append((j, gap))
    out: list[ContextBin] = []
    for (prompt, _), items in sorted(gathered.items()):
        if len(items) < max(1, bin_tokens // 4):
            continue
        positions = [j for j, _ in items]
        gaps = [g for _, g in items]
        itl_med = median(gaps)
        assert itl_med is not None
        if itl_med <= 0:
            # A server that sends tokens in bursts (several in one write, as vLLM's API server
            # does when its process is short of CPU) leaves most gaps at 0: the median says
            # nothing then, and the mean (the bin's span over its steps) is the step time.
            itl_med = sum(gaps) / len(gaps)
        if itl_med <= 0:
            continue
        ctx = prompt + sum(positions) / len(positions) + 1
        out.append(ContextBin(prompt, min(positions), max(positions), ctx, itl_med,
                              len(items)))
    return sorted(out, key=lambda b: b.context)


@dataclass(frozen=True)
class ContextResult:
    server: ServerInfo
    target: Target
    config: ContextConfig
    cold: RequestRecord
    records: tuple[RequestRecord, ...]
    prompts: tuple[Prompt, ...]
    ceiling: CeilingInputs = field(default_factory=CeilingInputs)
    notes: tuple[str, ...] = ()

    @property
    def bins(self) -> list[ContextBin]:
        runs = [(r.prompt_tokens or p.tokens, r.step_gaps_s, r.first_step_index)
                for r, p in zip(self.records, self.prompts, strict=True)]
        return context_bins(runs, self.config.bin_tokens)

    @property
    def fit(self) -> LinearFit | None:
        """``ITL = coef[0] + coef[1]·context`` through the bins; ``None`` under two contexts."""
        bins = self.bins
        if len({b.context for b in bins}) < 2:
            return None
        return polyfit([b.context for b in bins], [b.itl_median_s for b in bins], 1)

    @property
    def slope_resolved(self) -> bool:
        fit = self.fit
        if fit is None:
            return False
        t = fit.t(1)
        return fit.coef[1] > 0 and t is not None and t >= SLOPE_T_MIN

    def ceiling_at(self, context: float) -> roofline.DecodeCeiling | None:
        ci = self.ceiling
        if not ci.known:
            return None
        assert ci.model is not None and ci.device is not None
        if not ci.model.has_attention_shape:
            return None
        return roofline.decode_ceiling(ci.model, ci.device, round(context))

    def held_at(self, b: ContextBin) -> roofline.Held | None:
        """A bin's decode rate beside the ceiling at its context, the share never above 1."""
        c = self.ceiling_at(b.context)
        return self.ceiling.hold_rate(b.decode_tok_s, c.tok_s if c else None, "decode")

    @property
    def ceiling_warnings(self) -> tuple[str, ...]:
        """The first bin whose decode rate beat its ceiling, in words (one is enough: the
        same spec is low in every bin)."""
        for b in self.bins:
            held = self.held_at(b)
            if held is not None and held.warning is not None:
                return (f"at {b.context:,.0f} tokens of context, {held.warning}",)
        return ()

    @property
    def slope_predicted(self) -> float | None:
        """The roofline's β: KV bytes one more token of context adds to a step's read, over
        the bandwidth, in seconds a token of context (across the measured range, so that
        sliding-window layers count as they should)."""
        bins = self.bins
        ci = self.ceiling
        if len(bins) < 2 or not ci.known:
            return None
        assert ci.model is not None and ci.device is not None
        if not ci.model.has_attention_shape:
            return None
        lo, hi = round(bins[0].context), round(bins[-1].context)
        if hi <= lo:
            return None
        added = (roofline.kv_bytes_per_request(ci.model, hi)
                 - roofline.kv_bytes_per_request(ci.model, lo)) / (hi - lo)
        return added / (ci.device.mem_bandwidth_gb_s * GB)

    def _ends(self) -> dict[str, Any]:
        bins = self.bins
        if not bins:
            return {"first": None, "last": None}
        out: dict[str, Any] = {}
        for key, b in (("first", bins[0]), ("last", bins[-1])):
            c = self.ceiling_at(b.context)
            held = self.held_at(b)
            out[key] = {"context": b.context, "decode_tok_s": b.decode_tok_s,
                        "itl_median_s": b.itl_median_s,
                        "decode_ceiling_tok_s": held.ceiling if held else None,
                        "fraction_of_ceiling": held.share if held else None,
                        "kv_share_of_step": c.kv_share if c else None}
        return out

    @property
    def slowdown(self) -> float | None:
        """``1 − rate(last bin) / rate(first bin)``: how much slower decode got."""
        bins = self.bins
        if len(bins) < 2:
            return None
        return 1.0 - bins[-1].decode_tok_s / bins[0].decode_tok_s

    @property
    def slowdown_predicted(self) -> float | None:
        bins = self.bins
        if len(bins) < 2:
            return None
        lo, hi = self.ceiling_at(bins[0].context), self.ceiling_at(bins[-1].context)
        return 1.0 - hi.tok_s / lo.tok_s if lo and hi else None

    def charts(self) -> list[Chart]:
        bins = self.bins
        fit = self.fit
        series: list[Series] = []
        for prompt in sorted({b.prompt_tokens for b in bins}):
            mine = [b for b in bins if b.prompt_tokens == prompt]
            series.append(Series(f"decode rate, prompt {prompt:,}",
                                 tuple(b.context for b in mine),
                                 tuple(b.decode_tok_s for b in mine), "line", f"{prompt}"))
        xs = tuple(b.context for b in bins)
        ceilings = [self.ceiling_at(x) for x in xs]
        if any(c is not None for c in ceilings):
            series.append(Series("decode ceiling (roofline)", xs,
                                 tuple(c.tok_s if c else None for c in ceilings), "line"))
        itl_series = [Series("ITL, bin median", xs, tuple(b.itl_median_s for b in bins),
                             "points")]
        if fit is not None and xs:
            grid = (min(xs), max(xs))
            itl_series.append(Series("fit α + β·context", grid, tuple(fit(x) for x in grid),
                                     "line"))
            beta = self.slope_predicted
            if beta is not None:
                mid = sum(grid) / 2
                itl_series.append(Series("roofline slope, through the fit's middle", grid,
                                         tuple(fit(mid) + beta * (x - mid) for x in grid),
                                         "line"))
        return [
            Chart("context-decode", "Decode rate as the context fills", "context (tokens)",
                  "decode rate (tok/s)", tuple(series)),
            Chart("context-itl", "Inter-token latency against context", "context (tokens)",
                  "ITL (s)", tuple(itl_series)),
        ]

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        fit = self.fit
        predicted = self.slope_predicted
        ci = self.ceiling
        kv_token = (roofline.kv_bytes_per_token(ci.model)
                    if ci.model is not None and ci.model.has_attention_shape else None)
        out: dict[str, Any] = {
            "experiment": "context",
            "server": self.server.kind,
            "server_version": self.server.version,
            "url": self.server.base_url,
            "api": self.target.api,
            "model": self.target.model,
            "config": self.config.to_json(),
            "token_count_source": self.records[0].token_count_source if self.records else None,
            "prompt_tokens": [r.prompt_tokens or p.tokens
                              for r, p in zip(self.records, self.prompts, strict=True)],
            "output_tokens": [r.output_tokens for r in self.records],
            "bins": [b.to_json() for b in self.bins],
            "fit": {
                "alpha_s": fit.coef[0] if fit else None,
                "beta_s_per_token": fit.coef[1] if fit else None,
                "beta_stderr": fit.stderr[1] if fit and fit.stderr else None,
                "r2": fit.r2 if fit else None,
                "points": fit.points if fit else 0,
                "beta_resolved": self.slope_resolved,
            },
            "roofline": {
                "kv_bytes_per_token": kv_token,
                "beta_predicted_s_per_token": predicted,
                "alpha_predicted_s": (ci.model.read_weight_bytes()
                                      / (ci.device.mem_bandwidth_gb_s * GB))
                if ci.known and ci.model and ci.device else None,
                "beta_measured_over_predicted": fit.coef[1] / predicted
                if fit and predicted else None,
            },
            **self._ends(),
            "slowdown": self.slowdown,
            "slowdown_predicted": self.slowdown_predicted,
            **ci.to_json(),
            "cold": {"ttft_s": self.cold.ttft_s, "decode_tok_s": self.cold.decode_tok_s},
            "charts": [c.to_json() for c in self.charts()],
            "notes": [*self.notes, *ci.notes],
            "ceiling_warnings": list(self.ceiling_warnings),
        }
        if raw:
            out["requests"] = [r.to_dict() for r in (self.cold, *self.records)]
        return out

    def figures(self) -> Figures:
        return context_figures(self.to_json())


def context_figures(d: Mapping[str, Any]) -> Figures:
    """A context sweep's figure: the decode rate at the shortest context it measured."""
    first = d.get("first")
    rate = number(first.get("decode_tok_s")) if isinstance(first, Mapping) else None
    return experiment_figures(d, (DECODE_RATE,), decode_tok_s=rate)


CONTEXT = register(ResultKind("context", (DECODE_RATE,), from_json=context_figures))


async def run_context(
    url: str | Connection,
    config: ContextConfig,
    *,
    ceiling: CeilingInputs | None = None,
    progress: ProgressFn | None = None,
) -> ContextResult:
    """Decode rate by context on the server at ``url``: long answers to each prompt length.
    Raises :class:`RunError` when a request fails, :class:`InputError` for a bad config."""
    lengths = tuple(sorted(set(config.prompt_tokens)))
    total = 1 + config.runs * len(lengths)
    async with connect(url, config) as conn:
        if progress:
            progress("cold", 0, total)
        cold = await conn.send(await conn.prompt(min(lengths[0], 64), 0), 16)
        records: list[RequestRecord] = []
        prompts: list[Prompt] = []
        index = 1
        for run in range(config.runs):
            for n in lengths:
                if progress:
                    progress(f"{n:,} + {config.max_tokens:,} tokens, run {run + 1} of"
                             f" {config.runs}", index, total)
                prompt = await conn.prompt(n, index)
                records.append(await conn.send(prompt, config.max_tokens))
                prompts.append(prompt)
                index += 1
        if progress:
            progress("done", total, total)
        notes = [*conn.notes, *output_notes(records, config.max_tokens)]
        info, target = conn.info, conn.target
    return ContextResult(info, target, config, cold, tuple(records), tuple(prompts),
                         ceiling or CeilingInputs(), tuple(notes))
