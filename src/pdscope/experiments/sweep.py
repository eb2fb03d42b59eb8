"""The prompt-length sweep: TTFT and decode rate against prompt length.

The article: "send a 200-token prompt, then a 2,000-token one, asking for the same output
length. The TTFT grows a lot; the streaming speed after it barely changes." And: prefill has a
linear part (the matrix multiplications of every layer) and a quadratic part (attention: every
token attends to every earlier one), so "doubling the prompt at least doubles the TTFT".

The sweep sends, for each prompt length, ``runs`` prompts the server has not seen (a prefix
cache cannot flatter them) with the same output length, lengths interleaved run by run (up, then
down) so that a drift of the machine falls on every length alike. It fits
``TTFT = a + b·n + c·n²`` by least squares and turns the article's two claims into checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from pdscope.figures import PREFILL_RATE, Figures, ResultKind, experiment_figures, number, register
from pdscope.stats import Summary, summarize
from pdscope.workload import Prompt

# The quadratic term is reported only when the data show it: c > 0, at least this many standard
# errors from zero (about 95 % for a normal error), and large enough to matter where it was
# measured — at least this share of the prefill part at the longest prompt. A smaller c is the
# fit bending to noise, and extrapolating it would invent an effect.
QUAD_T_MIN = 2.0
QUAD_MIN_SHARE = 0.05
# Where the quadratic "starts to matter": the length at which it is this share of the prefill
# part (c·n² = 0.1·(b·n + c·n²), so n = b / (9·c)), as the roofline's attention_share_tokens.
QUAD_MATTERS_SHARE = 0.1
# "The streaming speed barely changes": a tenfold longer prompt multiplies the TTFT many times
# over; a decode rate that moves less than 30 % is small beside that. The roofline's prediction
# (the KV cache each step reads grows with the prompt) is reported beside: an 8B model on a GPU
# moves a few per cent at 2,000 tokens, the lab's 135M model on a CPU 16-33 % (near this line:
# its KV cache is large beside its weights, and CPU attention costs several times its bytes).
BARELY_MOVES = 0.3
# A prefill that is exactly linear doubles: TTFT(2n) − a = 2·(TTFT(n) − a), measured as 2 give or
# take the clock's and the scheduler's noise, which three runs' range understates. The claim is
# taken as contradicted only below 2 − this slack.
DOUBLING_SLACK = 0.05


@dataclass(frozen=True, kw_only=True)
class SweepConfig(ClientOptions):
    prompt_tokens: tuple[int, ...] = (200, 500, 1000, 2000)
    max_tokens: int = 32
    runs: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.runs, 1, "runs")
        if self.max_tokens < 2:
            raise InputError(Field("max_tokens"),
                             " must be at least 2 (a decode rate needs two tokens)")
        if not self.prompt_tokens or min(self.prompt_tokens) < 1:
            raise InputError(Field("prompt_tokens"),
                             ": give one or more lengths of at least 1 token")


@dataclass(frozen=True)
class TtftFit:
    """``TTFT = a + b·n (+ c·n²)`` fitted to every run; ``c`` is ``None`` unless resolved."""

    kind: str  # "quadratic", "linear" or "none"
    a: float | None
    b: float | None
    c: float | None
    a_stderr: float | None
    b_stderr: float | None
    r2: float | None
    points: int
    c_fitted: float | None  # the quadratic fit's c, resolved or not
    c_stderr: float | None
    c_resolved: bool
    c_note: str
    n_max: int

    @property
    def prefill_tok_s(self) -> float | None:
        """``1 / b``: the marginal prefill rate, fixed overhead left out."""
        return 1.0 / self.b if self.b and self.b > 0 else None

    @property
    def quadratic_matters_tokens(self) -> int | None:
        """The length where ``c·n²`` is 10 % of the prefill part: ``b / (9·c)``."""
        if self.c is None or not self.b or self.b <= 0:
            return None
        s = QUAD_MATTERS_SHARE
        return round(s * self.b / ((1 - s) * self.c))

    def ttft(self, n: float) -> float | None:
        if self.a is None or self.b is None:
            return None
        return self.a + self.b * n + (self.c or 0.0) * n * n

    def to_json(self) -> dict[str, Any]:
        q = self.quadratic_matters_tokens
        return {
            "kind": self.kind,
            "a_s": self.a,
            "b_s_per_token": self.b,
            "c_s_per_token2": self.c,
            "a_stderr_s": self.a_stderr,
            "b_stderr_s_per_token": self.b_stderr,
            "r2": self.r2,
            "points": self.points,
            "prefill_tok_s": self.prefill_tok_s,
            "c_resolved": self.c_resolved,
            "c_fitted": self.c_fitted,
            "c_stderr": self.c_stderr,
            "c_note": self.c_note,
            "quadratic_10pct_tokens": q,
            "quadratic_10pct_extrapolated": q is not None and q > self.n_max,
        }


def fit_ttft(n: Sequence[float], ttft: Sequence[float]) -> TtftFit:
    """Fit ``TTFT = a + b·n + c·n²`` with the guards the numbers need.

    Two distinct lengths give ``a + b·n`` only. The quadratic term is kept when ``c`` is
    positive, at least :data:`QUAD_T_MIN` standard errors from zero and at least
    :data:`QUAD_MIN_SHARE` of the prefill part at the longest prompt; otherwise ``c`` is not
    resolved, ``c_note`` says why, and the linear fit is reported."""
    if len(n) != len(ttft):
        raise ValueError("n and ttft must have the same length")
    distinct = len(set(n))
    n_max = int(max(n)) if n else 0
    if distinct < 2:
        return TtftFit("none", None, None, None, None, None, None, len(n), None, None, False,
                       "one prompt length: nothing to fit (give two or more)", n_max)
    lin = polyfit(n, ttft, 1)
    c_fit: LinearFit | None = None
    if distinct < 3:
        note = "fewer than 3 prompt lengths: fitted a + b·n only"
    else:
        c_fit = polyfit(n, ttft, 2)
        c, t = c_fit.coef[2], c_fit.t(2)
        b_q = c_fit.coef[1]
        prefill_at_max = b_q * n_max + c * n_max**2
        quad_share = c * n_max**2 / prefill_at_max if prefill_at_max > 0 else 0.0
        if t is None:
            note = ("as many points as coefficients: the noise is unknown, so c cannot be told"
                    " from it (add runs or lengths)")
        elif c <= 0:
            note = (f"c came out negative ({c:.3g}): the TTFT grows no faster than linearly"
                    " over these lengths")
        elif t < QUAD_T_MIN:
            note = (f"c = {c:.3g} is within {QUAD_T_MIN:g} standard errors of zero"
                    f" (t = {t:.1f}): not told apart from noise")
        elif quad_share < QUAD_MIN_SHARE:
            note = (f"c = {c:.3g} is under {QUAD_MIN_SHARE:.0%} of the prefill part at"
                    f" {n_max:,} tokens ({quad_share:.1%}): too small to matter here")
        else:
            se = c_fit.stderr[2] if c_fit.stderr else None
            return TtftFit("quadratic", c_fit.coef[0], c_fit.coef[1], c,
                           _se(c_fit, 0), _se(c_fit, 1), c_fit.r2, c_fit.points, c, se, True,
                           f"c is {t:.1f} standard errors from zero and"
                           f" {quad_share:.0%} of the prefill part at {n_max:,} tokens", n_max)
    return TtftFit("linear", lin.coef[0], lin.coef[1], None, _se(lin, 0), _se(lin, 1), lin.r2,
                   lin.points, c_fit.coef[2] if c_fit else None, _se(c_fit, 2) if c_fit
                   else None, False, note, n_max)


def _se(fit: LinearFit, k: int) -> float | None:
    return fit.stderr[k] if fit.stderr is not None else None


@dataclass(frozen=True)
class DoublingCheck:
    """Is ``TTFT(2n) − a ≥ 2·(TTFT(n) − a)``, within the runs' noise?

    ``ratio`` uses the medians and the fitted ``a``; ``ratio_max`` the most favourable reading
    of the noise (each median moved by half its runs' range, ``a`` by two standard errors). The
    claim holds when ``ratio_max ≥ 2 −`` :data:`DOUBLING_SLACK`: the measurement does not
    contradict it."""

    n: int
    n2: int
    ttft_n_s: float
    ttft_2n_s: float
    overhead_s: float
    ratio: float | None
    ratio_max: float | None
    holds: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "2n": self.n2, "ttft_n_s": self.ttft_n_s,
                "ttft_2n_s": self.ttft_2n_s, "overhead_s": self.overhead_s,
                "ratio": self.ratio, "ratio_max": self.ratio_max, "holds": self.holds}


def doubling_checks(
    lengths: Sequence[int],
    ttfts: Sequence[Sequence[float]],
    overhead: float,
    overhead_stderr: float | None = None,
) -> list[DoublingCheck]:
    """One check for every pair ``n, 2n`` in ``lengths`` (``ttfts[i]``: the runs at
    ``lengths[i]``). ``overhead`` is the fixed part ``a``, never taken below 0."""
    a = max(overhead, 0.0)
    a_high = a + 2 * (overhead_stderr or 0.0)
    by_n = {n: list(t) for n, t in zip(lengths, ttfts, strict=True) if t}
    out: list[DoublingCheck] = []
    for n in sorted(by_n):
        if 2 * n not in by_n:
            continue
        t1, t2 = by_n[n], by_n[2 * n]
        m1, m2 = median(t1) or 0.0, median(t2) or 0.0
        d1, d2 = (max(t1) - min(t1)) / 2, (max(t2) - min(t2)) / 2
        p1, p2 = m1 - a, m2 - a
        ratio = p2 / p1 if p1 > 0 else None
        # The ratio grows with a (as m2 > m1), so its most favourable a is the highest one.
        # None: the noise leaves the prefill part at n indistinguishable from zero.
        low1 = m1 - d1 - a_high
        ratio_max = max((m2 + d2 - a_high) / low1, ratio or 0.0) if low1 > 0 else None
        holds = None if ratio is None else (
            ratio_max is None or ratio_max >= 2.0 - DOUBLING_SLACK)
        out.append(DoublingCheck(n, 2 * n, m1, m2, a, ratio, ratio_max, holds))
    return out


@dataclass(frozen=True)
class SweepPoint:
    """The runs at one prompt length."""

    requested: int
    records: tuple[RequestRecord, ...]
    prompts: tuple[Prompt, ...]

    @property
    def prompt_tokens(self) -> int:
        counts = [r.prompt_tokens for r in self.records if r.prompt_tokens is not None]
        if not counts:
            counts = [p.tokens for p in self.prompts]
        return sorted(counts)[len(counts) // 2]

    @property
    def ttft(self) -> Summary | None:
        return summarize(r.ttft_s for r in self.records)

    @property
    def decode(self) -> Summary | None:
        return summarize(r.decode_tok_s for r in self.records)

    @property
    def prefill(self) -> Summary | None:
        """Prompt tokens a second of prefill: the server's own timings where it reports them
        (llama.cpp, Ollama), else prompt tokens / TTFT (``prefill_source`` says which)."""
        return summarize(r.prefill_tok_s for r in self.records)

    @property
    def prefill_source(self) -> str | None:
        return self.records[0].prefill_source if self.records else None

    @property
    def output_tokens(self) -> int | None:
        counts = [r.output_tokens for r in self.records if r.output_tokens is not None]
        return sorted(counts)[len(counts) // 2] if counts else None


@dataclass(frozen=True)
class SweepResult:
    server: ServerInfo
    target: Target
    config: SweepConfig
    cold: RequestRecord
    points: tuple[SweepPoint, ...]
    ceiling: CeilingInputs = field(default_factory=CeilingInputs)
    notes: tuple[str, ...] = ()

    @property
    def fit(self) -> TtftFit:
        xs: list[float] = []
        ys: list[float] = []
        for p in self.points:
            for r in p.records:
                if r.ttft_s is not None:
                    xs.append(float(r.prompt_tokens or p.prompt_tokens))
                    ys.append(r.ttft_s)
        return fit_ttft(xs, ys)

    @property
    def doubling(self) -> list[DoublingCheck]:
        fit = self.fit
        return doubling_checks(
            [p.requested for p in self.points],
            [[r.ttft_s for r in p.records if r.ttft_s is not None] for p in self.points],
            fit.a if fit.a is not None else 0.0,
            fit.a_stderr,
        )

    @property
    def doubling_at_least_doubles_prefill(self) -> bool | None:
        """The article's claim, over every pair n, 2n; ``None`` with no such pair."""
        verdicts = [d.holds for d in self.doubling if d.holds is not None]
        return all(verdicts) if verdicts else None

    def _decode_medians(self) -> list[tuple[int, float]]:
        return [(p.prompt_tokens, d.median) for p in self.points if (d := p.decode) is not None]

    @property
    def decode_rate_change(self) -> float | None:
        """Largest change of the median decode rate from the shortest prompt's, as a share of
        it: ``max |rate(n) − rate(n_min)| / rate(n_min)``."""
        rates = self._decode_medians()
        if len(rates) < 2 or rates[0][1] <= 0:
            return None
        base = rates[0][1]
        return max(abs(r - base) for _, r in rates) / base

    def _context(self, p: SweepPoint) -> int:
        return p.prompt_tokens + (p.output_tokens or self.config.max_tokens) // 2

    @property
    def decode_rate_change_predicted(self) -> float | None:
        """What the roofline predicts: the ceiling's drop from the shortest prompt's context to
        the longest's (the KV cache read each step grows with the prompt)."""
        ci = self.ceiling
        if not ci.known or len(self.points) < 2:
            return None
        assert ci.model is not None and ci.device is not None
        if not ci.model.has_attention_shape:
            return None
        lo = roofline.decode_ceiling(ci.model, ci.device, self._context(self.points[0]))
        hi = roofline.decode_ceiling(ci.model, ci.device, self._context(self.points[-1]))
        return 1.0 - hi.tok_s / lo.tok_s

    @property
    def attention_share_tokens(self) -> int | None:
        """The roofline's length where attention is 10 % of prefill FLOPs."""
        if self.ceiling.model is None:
            return None
        return roofline.attention_share_tokens(self.ceiling.model, QUAD_MATTERS_SHARE)

    def point_held(self, p: SweepPoint) -> dict[str, roofline.Held | None]:
        """A point's medians beside the roofline (TTFT floor, prefill and decode ceilings),
        each share never above 1; ``None`` where a side is unknown."""
        ci = self.ceiling
        if not ci.known:
            return {"ttft": None, "prefill": None, "decode": None}
        assert ci.model is not None and ci.device is not None
        pc = roofline.prefill_ceiling(ci.model, ci.device, max(1, p.prompt_tokens))
        ctx = self._context(p) if ci.model.has_attention_shape else 0
        dc = roofline.decode_ceiling(ci.model, ci.device, ctx)
        ttft, prefill, decode = p.ttft, p.prefill, p.decode
        return {"ttft": ci.hold_ttft(ttft.median if ttft else None, pc.ttft_s),
                "prefill": ci.hold_rate(prefill.median if prefill else None, pc.tok_s,
                                        "prefill"),
                "decode": ci.hold_rate(decode.median if decode else None, dc.tok_s, "decode")}

    def point_ceilings(self, p: SweepPoint) -> dict[str, Any]:
        """The roofline's limits at a point, as printed: where a median beat one, the limit
        is the median (``*_beaten`` says so; :attr:`ceiling_warnings` says why)."""
        ci = self.ceiling
        if not ci.known:
            return {"ttft_floor_s": None, "prefill_ceiling_tok_s": None,
                    "decode_ceiling_tok_s": None}
        assert ci.model is not None and ci.device is not None
        pc = roofline.prefill_ceiling(ci.model, ci.device, max(1, p.prompt_tokens))
        ctx = self._context(p) if ci.model.has_attention_shape else 0
        dc = roofline.decode_ceiling(ci.model, ci.device, ctx)
        held = self.point_held(p)
        out: dict[str, Any] = {"ttft_floor_s": pc.ttft_s, "prefill_ceiling_tok_s": pc.tok_s,
                               "decode_ceiling_tok_s": dc.tok_s}
        for name, key, beaten in (("ttft", "ttft_floor_s", "ttft_floor_beaten"),
                                  ("prefill", "prefill_ceiling_tok_s", "prefill_ceiling_beaten"),
                                  ("decode", "decode_ceiling_tok_s", "decode_ceiling_beaten")):
            h = held[name]
            if h is not None:
                out[key] = h.limit
                out[beaten] = h.beaten
        return out

    @property
    def ceiling_warnings(self) -> tuple[str, ...]:
        """For each limit a point's median beat, the first such point, in words."""
        found: dict[str, str] = {}
        for p in self.points:
            for name, h in self.point_held(p).items():
                if h is not None and h.warning is not None and name not in found:
                    found[name] = f"at {p.prompt_tokens:,} prompt tokens, {h.warning}"
        return tuple(found.values())

    def charts(self) -> list[Chart]:
        fit = self.fit
        runs_x: list[float] = []
        runs_y: list[float | None] = []
        for p in self.points:
            for r in p.records:
                runs_x.append(float(r.prompt_tokens or p.prompt_tokens))
                runs_y.append(r.ttft_s)
        xs = tuple(float(p.prompt_tokens) for p in self.points)
        ttft_series = [
            Series("TTFT, each run", tuple(runs_x), tuple(runs_y), "points"),
            Series("TTFT, median", xs, tuple(t.median if (t := p.ttft) else None
                                             for p in self.points), "points"),
        ]
        if fit.a is not None:
            top = max(xs)
            grid = tuple(top * i / 40 for i in range(41))
            ttft_series.append(Series(f"fit ({fit.kind})", grid,
                                      tuple(fit.ttft(x) for x in grid), "line"))
        ceilings = [self.point_ceilings(p) for p in self.points]
        if any(c["ttft_floor_s"] is not None for c in ceilings):
            ttft_series.append(Series("TTFT floor (roofline)", xs,
                                      tuple(c["ttft_floor_s"] for c in ceilings), "line"))
        decode_series = [Series("decode rate, median", xs,
                                tuple(d.median if (d := p.decode) else None
                                      for p in self.points), "line")]
        if any(c["decode_ceiling_tok_s"] is not None for c in ceilings):
            decode_series.append(Series("decode ceiling (roofline)", xs,
                                        tuple(c["decode_ceiling_tok_s"] for c in ceilings),
                                        "line"))
        return [
            Chart("sweep-ttft", "TTFT against prompt length", "prompt tokens", "TTFT (s)",
                  tuple(ttft_series)),
            Chart("sweep-decode", "Decode rate against prompt length", "prompt tokens",
                  "decode rate (tok/s)", tuple(decode_series)),
        ]

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        fit = self.fit
        change = self.decode_rate_change
        points = []
        for p in self.points:
            ttft, decode, prefill = p.ttft, p.decode, p.prefill
            points.append({
                "prompt_tokens_requested": p.requested,
                "prompt_tokens": p.prompt_tokens,
                "output_tokens": p.output_tokens,
                "runs": len(p.records),
                "ttft_s": ttft.median if ttft else None,
                "decode_tok_s": decode.median if decode else None,
                "prefill_tok_s": prefill.median if prefill else None,
                "prefill_source": p.prefill_source,
                "spread": {"ttft_s": ttft.to_json() if ttft else None,
                           "decode_tok_s": decode.to_json() if decode else None},
                **self.point_ceilings(p),
            })
        out: dict[str, Any] = {
            "experiment": "sweep",
            "server": self.server.kind,
            "server_version": self.server.version,
            "url": self.server.base_url,
            "api": self.target.api,
            "model": self.target.model,
            "config": self.config.to_json(),
            "token_count_source": self.points[0].records[0].token_count_source,
            "prompt_exact": all(pr.exact for p in self.points for pr in p.prompts),
            "points": points,
            "fit": fit.to_json(),
            "checks": {
                "doubling_at_least_doubles_prefill": self.doubling_at_least_doubles_prefill,
                "doubling": [d.to_json() for d in self.doubling],
                "decode_rate_change": change,
                "decode_rate_barely_moves": None if change is None else change < BARELY_MOVES,
                "decode_rate_barely_moves_threshold": BARELY_MOVES,
                "decode_rate_change_predicted": self.decode_rate_change_predicted,
            },
            "attention_share_tokens": self.attention_share_tokens,
            **self.ceiling.to_json(),
            "cold": {"ttft_s": self.cold.ttft_s, "decode_tok_s": self.cold.decode_tok_s,
                     "prompt_tokens": self.cold.prompt_tokens},
            "charts": [c.to_json() for c in self.charts()],
            "notes": [*self.notes, *self.ceiling.notes],
            "ceiling_warnings": list(self.ceiling_warnings),
        }
        if raw:
            out["requests"] = [r.to_dict() for r in (self.cold,
                                                     *(r for p in self.points
                                                       for r in p.records))]
        return out

    def figures(self) -> Figures:
        return sweep_figures(self.to_json())


def sweep_figures(d: Mapping[str, Any]) -> Figures:
    """A sweep's figure: the prefill rate of its TTFT fit."""
    fit = d.get("fit") or {}
    return experiment_figures(d, (PREFILL_RATE,), prefill_tok_s=number(fit.get("prefill_tok_s")))


SWEEP = register(ResultKind("sweep", (PREFILL_RATE,), from_json=sweep_figures))


async def run_sweep(
    url: str | Connection,
    config: SweepConfig,
    *,
    ceiling: CeilingInputs | None = None,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Sweep the prompt length on the server at ``url``. Raises :class:`RunError` (one line)
    when a request fails and :class:`InputError` for a config that cannot work."""
    lengths = tuple(sorted(set(config.prompt_tokens)))
    total = 1 + config.runs * len(lengths)
    async with connect(url, config) as conn:
        if progress:
            progress("cold", 0, total)
        warm_prompt = await conn.prompt(min(lengths[0], 64), 0)
        cold = await conn.send(warm_prompt, config.max_tokens)
        records: dict[int, list[RequestRecord]] = {n: [] for n in lengths}
        prompts: dict[int, list[Prompt]] = {n: [] for n in lengths}
        done, index = 1, 1
        for run in range(config.runs):
            order = lengths if run % 2 == 0 else tuple(reversed(lengths))
            for n in order:
                if progress:
                    progress(f"{n:,} tokens, run {run + 1} of {config.runs}", done, total)
                prompt = await conn.prompt(n, index)
                index += 1
                records[n].append(await conn.send(prompt, config.max_tokens))
                prompts[n].append(prompt)
                done += 1
        if progress:
            progress("done", total, total)
        notes = list(conn.notes)
        info, target = conn.info, conn.target
    all_records = [r for n in lengths for r in records[n]]
    notes += output_notes(all_records, config.max_tokens)
    points = tuple(SweepPoint(n, tuple(records[n]), tuple(prompts[n])) for n in lengths)
    return SweepResult(info, target, config, cold, points, ceiling or CeilingInputs(),
                       tuple(notes))
