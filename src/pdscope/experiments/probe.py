"""The probe: one server, both phases, set beside the ceiling.

The article's "how do I measure each phase on my own server", done with care: the server is
detected; a first request is sent and kept apart as *cold* (it may include loading the model);
then K requests, each with a prompt of the asked length that the server has not seen (so a
prefix cache cannot flatter the prefill), asking for a fixed number of output tokens where the
server allows it. Connection set-up is timed apart and left out of TTFT (the article: subtract
``time_pretransfer``). Each phase is reported as the median of the K runs with its spread, and
decode beside the single-stream ceiling of the model on the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdscope import roofline
from pdscope.checks import at_least
from pdscope.client import ClientOptions, Connection, RequestRecord, ServerInfo, Target, connect
from pdscope.client.record import request_series
from pdscope.client.truncation import TruncationCount, count_truncation, truncation_warning
from pdscope.errors import Field, Note
from pdscope.experiments.common import ProgressFn, output_notes
from pdscope.figures import REQUEST_METRICS, Figures, ResultKind, number, register, scalars
from pdscope.hardware import DeviceSpec
from pdscope.model import ModelGeometry
from pdscope.stats import Summary, percentile, summarize
from pdscope.workload import Prompt

# How a measured decode rate reads against the single-stream ceiling. A stack that is close to
# the memory bus is the hardware's limit; one far below it has overhead to find first. The
# thresholds are judgement, stated so a reader can disagree with them.
NEAR_CEILING = 0.7
FAR_BELOW_CEILING = 0.3


def ceiling_verdict(fraction: float | None, beaten: bool = False) -> str:
    """One sentence on what a measured fraction of the decode ceiling means; ``beaten``: the
    measurement was above the ceiling the specs gave (``roofline.Held``)."""
    if fraction is None:
        return Note(
            "The ceiling is unknown: give ", Field("device"), " and ", Field("model_config"),
            " (or probe a local server) to see how far this is from what the hardware allows.")
    if beaten:
        return (
            "Decode ran faster than the memory-bandwidth ceiling the specs give: that ceiling"
            " is wrong (see the warning), so how close decode is to the hardware's real limit"
            " is unknown; the ceiling is taken as at least the measured rate."
        )
    pct = f"{fraction:.0%}"
    if fraction >= NEAR_CEILING:
        return (
            f"Decode runs at {pct} of the memory-bandwidth ceiling: the hardware is the limit."
            " To go faster, read fewer bytes a token (quantize, a smaller model) or buy"
            " bandwidth; a card with more FLOPS and the same bandwidth will not help."
        )
    if fraction >= FAR_BELOW_CEILING:
        return (
            f"Decode runs at {pct} of the memory-bandwidth ceiling: part of each step is spent"
            " on something other than reading weights. Look at the serving stack (kernels,"
            " threads, batching) before the hardware."
        )
    return (
        f"Decode runs at only {pct} of the memory-bandwidth ceiling: the serving stack, not the"
        " memory bus, sets the pace (per-step overhead, scheduling, small-batch kernels, CPU"
        " threads). Faster memory would not help; a leaner stack would."
    )


@dataclass(frozen=True, kw_only=True)
class ProbeConfig(ClientOptions):
    prompt_tokens: int = 512
    max_tokens: int = 128
    runs: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.prompt_tokens, 1, "prompt_tokens")
        at_least(self.max_tokens, 2, "max_tokens")
        at_least(self.runs, 1, "runs")


@dataclass(frozen=True)
class ProbeResult:
    """Everything one probe measured, with the ceiling it was set beside."""

    server: ServerInfo
    target: Target
    config: ProbeConfig
    cold: RequestRecord
    runs: tuple[RequestRecord, ...]
    prompts: tuple[Prompt, ...]
    device: DeviceSpec | None
    model: ModelGeometry | None
    model_source: str | None
    notes: tuple[str, ...] = ()

    # -- per-phase summaries -----------------------------------------------------------------

    @property
    def ttft(self) -> Summary | None:
        return summarize(r.ttft_s for r in self.runs)

    @property
    def prefill(self) -> Summary | None:
        return summarize(r.prefill_tok_s for r in self.runs)

    @property
    def decode(self) -> Summary | None:
        return summarize(r.decode_tok_s for r in self.runs)

    @property
    def e2e(self) -> Summary | None:
        return summarize(r.e2e_s for r in self.runs)

    @property
    def reasoned(self) -> bool:
        """The model thought before it answered (its streams carried reasoning)."""
        return any(r.reasoned for r in self.runs)

    @property
    def ttfo(self) -> Summary | None:
        """The time to the first answer token, of the runs that reasoned."""
        return summarize(r.ttfo_s for r in self.runs if r.reasoned)

    @property
    def thinking(self) -> Summary | None:
        """From the first token to the first answer token: the thinking."""
        return summarize(r.thinking_s for r in self.runs)

    @property
    def reasoning_tokens(self) -> int | None:
        counts = sorted(r.reasoning_tokens for r in self.runs if r.reasoning_tokens is not None)
        return counts[len(counts) // 2] if counts else None

    @property
    def itl_all(self) -> list[float]:
        return [gap for r in self.runs for gap in r.itl_s]

    @property
    def prompt_tokens(self) -> int | None:
        counts = [r.prompt_tokens for r in self.runs if r.prompt_tokens is not None]
        return sorted(counts)[len(counts) // 2] if counts else None

    @property
    def output_tokens(self) -> int | None:
        counts = [r.output_tokens for r in self.runs if r.output_tokens is not None]
        return sorted(counts)[len(counts) // 2] if counts else None

    @property
    def token_count_source(self) -> str | None:
        return self.runs[0].token_count_source if self.runs else None

    @property
    def prefill_source(self) -> str | None:
        return self.runs[0].prefill_source if self.runs else None

    @property
    def server_decode_tok_s(self) -> float | None:
        """The decode rate the server itself reports (Ollama's eval counters, llama.cpp's
        timings), when it does: the article's eval_count / eval_duration x 1e9."""
        rates = []
        for r in self.runs:
            st = r.server_timings or {}
            if st.get("eval_count") and st.get("eval_duration"):
                rates.append(st["eval_count"] / st["eval_duration"] * 1e9)
            elif st.get("predicted_n") and st.get("predicted_ms"):
                rates.append(st["predicted_n"] / st["predicted_ms"] * 1000.0)
        s = summarize(rates)
        return s.median if s else None

    # -- ceilings ----------------------------------------------------------------------------

    @property
    def mean_context(self) -> int:
        """Tokens in the KV cache halfway through the decode: what a mean step reads."""
        return (self.prompt_tokens or self.config.prompt_tokens) + (
            self.output_tokens or self.config.max_tokens
        ) // 2

    @property
    def decode_ceiling(self) -> roofline.DecodeCeiling | None:
        if self.device is None or self.model is None:
            return None
        ctx = self.mean_context if self.model.has_attention_shape else 0
        return roofline.decode_ceiling(self.model, self.device, ctx)

    def _hold(self, measured: float, ceiling: float, phase: str) -> roofline.Held:
        assert self.device is not None and self.model is not None
        peak = roofline.peak_flops(self.model, self.device)
        return roofline.hold_rate(measured, ceiling, phase=phase, device=self.device.name,
                                  measured_device=self.device.measured,
                                  mem_bandwidth_gb_s=self.device.mem_bandwidth_gb_s,
                                  peak_tflops=peak / 1e12 if peak else None)

    @property
    def decode_held(self) -> roofline.Held | None:
        """The median decode rate beside its ceiling, the share never above 1."""
        c, d = self.decode_ceiling, self.decode
        if c is None or d is None:
            return None
        return self._hold(d.median, c.tok_s, "decode")

    @property
    def decode_fraction(self) -> float | None:
        held = self.decode_held
        return held.share if held is not None else None

    @property
    def prefill_ceiling(self) -> roofline.PrefillCeiling | None:
        if self.device is None or self.model is None:
            return None
        return roofline.prefill_ceiling(
            self.model, self.device, self.prompt_tokens or self.config.prompt_tokens
        )

    @property
    def prefill_held(self) -> roofline.Held | None:
        """The median prefill rate beside its ceiling, the share never above 1."""
        c, p = self.prefill_ceiling, self.prefill
        if c is None or c.tok_s is None or p is None:
            return None
        return self._hold(p.median, c.tok_s, "prefill")

    @property
    def prefill_fraction(self) -> float | None:
        held = self.prefill_held
        return held.share if held is not None else None

    @property
    def ttft_held(self) -> roofline.Held | None:
        """The median TTFT beside the prefill's floor, which may not be above it."""
        c, t = self.prefill_ceiling, self.ttft
        if c is None or c.ttft_s is None or t is None or self.device is None:
            return None
        assert self.model is not None
        peak = roofline.peak_flops(self.model, self.device)
        return roofline.hold_ttft(t.median, c.ttft_s, device=self.device.name,
                                  measured_device=self.device.measured,
                                  peak_tflops=peak / 1e12 if peak else None,
                                  mem_bandwidth_gb_s=self.device.mem_bandwidth_gb_s)

    @property
    def ceiling_warnings(self) -> tuple[str, ...]:
        """A sentence for each ceiling (or floor) a measurement beat: which spec was low."""
        held = (self.prefill_held, self.ttft_held, self.decode_held)
        return tuple(h.warning for h in held if h is not None and h.warning is not None)

    @property
    def truncation(self) -> TruncationCount:
        """Prompts the server cut short, the cold run's included."""
        return count_truncation([self.cold, *self.runs])

    @property
    def truncation_warning(self) -> str | None:
        """One line when the server cut any prompt short (its TTFT is a shorter prompt's)."""
        return truncation_warning(self.truncation)

    def to_json(self) -> dict[str, Any]:
        ttft, prefill, decode, e2e = self.ttft, self.prefill, self.decode, self.e2e
        ttfo, thinking = self.ttfo, self.thinking
        itl = self.itl_all
        dc, pc = self.decode_ceiling, self.prefill_ceiling
        dh, ph, th = self.decode_held, self.prefill_held, self.ttft_held
        return {
            "server": self.server.kind,
            "server_version": self.server.version,
            "url": self.server.base_url,
            "api": self.target.api,
            "model": self.target.model,
            "runs": len(self.runs),
            "prompt_tokens_requested": self.config.prompt_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens_requested": self.config.max_tokens,
            "output_tokens": self.output_tokens,
            "token_count_source": self.token_count_source,
            "prompt_exact": all(p.exact for p in self.prompts),
            "truncated_prompts": self.truncation.truncated,
            "ttft_s": ttft.median if ttft else None,
            "prefill_tok_s": prefill.median if prefill else None,
            "prefill_source": self.prefill_source,
            "decode_tok_s": decode.median if decode else None,
            "server_decode_tok_s": self.server_decode_tok_s,
            "itl_p50_s": percentile(itl, 50),
            "itl_p99_s": percentile(itl, 99),
            "e2e_s": e2e.median if e2e else None,
            "ttfo_s": ttfo.median if ttfo else None,
            "thinking_s": thinking.median if thinking else None,
            "reasoning_tokens": self.reasoning_tokens,
            "spread": {
                "ttft_s": ttft.to_json() if ttft else None,
                "prefill_tok_s": prefill.to_json() if prefill else None,
                "decode_tok_s": decode.to_json() if decode else None,
                "e2e_s": e2e.to_json() if e2e else None,
            },
            "device": self.device.name if self.device else None,
            "device_measured": self.device.measured if self.device else None,
            "mem_bandwidth_gb_s": self.device.mem_bandwidth_gb_s if self.device else None,
            "model_source": self.model_source,
            "weight_bytes_read_per_token": self.model.read_weight_bytes() if self.model else None,
            "decode_ceiling_tok_s": dh.ceiling if dh else (dc.tok_s if dc else None),
            "decode_ceiling_context": dc.context if dc else None,
            "decode_fraction_of_ceiling": self.decode_fraction,
            "prefill_ceiling_tok_s": ph.ceiling if ph else (pc.tok_s if pc else None),
            "prefill_fraction_of_ceiling": self.prefill_fraction,
            "ttft_floor_s": th.limit if th else (pc.ttft_s if pc else None),
            "held": {"decode": dh.to_json() if dh else None,
                     "prefill": ph.to_json() if ph else None,
                     "ttft": th.to_json() if th else None},
            "ceiling_warnings": list(self.ceiling_warnings),
            "verdict": ceiling_verdict(self.decode_fraction, bool(dh and dh.beaten)),
            "cold": {
                "ttft_s": self.cold.ttft_s,
                "decode_tok_s": self.cold.decode_tok_s,
                "e2e_s": self.cold.e2e_s,
                "connect_s": self.cold.connect_s,
                "load_duration_s": (self.cold.server_timings or {}).get("load_duration", 0) / 1e9
                if (self.cold.server_timings or {}).get("load_duration")
                else None,
            },
            "notes": list(self.notes),
            "requests": [r.to_dict() for r in (self.cold, *self.runs)],
            # What the user added to every request (header values redacted), where anything.
            **({} if self.target.fields.empty
               else {"request_fields": self.target.fields.to_json()}),
        }

    def figures(self) -> Figures:
        return probe_figures(self.to_json())


def measured_requests(d: Mapping[str, Any]) -> list[Any]:
    """The measured requests of a probe's JSON, without the cold one (first, reported apart)."""
    records = list(d.get("requests") or [])
    runs = d.get("runs")
    if isinstance(runs, int) and 0 < runs < len(records):
        records = records[-runs:]
    return records


def probe_figures(d: Mapping[str, Any]) -> Figures:
    """A probe's figures from its JSON: its measured requests (not the cold one, reported
    apart), else, in a file written without them, its medians."""
    identity = {k: d.get(k) for k in ("model", "server", "server_version", "prompt_tokens",
                                      "output_tokens")}
    series = request_series(measured_requests(d))
    values = {} if series else scalars(
        decode_tok_s=number(d.get("decode_tok_s")), prefill_tok_s=number(d.get("prefill_tok_s")),
        itl_p50_s=number(d.get("itl_p50_s")), itl_p99_s=number(d.get("itl_p99_s")),
        ttft_p50_s=number(d.get("ttft_s")))
    return Figures("probe", REQUEST_METRICS, identity, series, values)


PROBE = register(ResultKind(
    "probe", REQUEST_METRICS, from_json=probe_figures,
    recognise=lambda d: "decode_tok_s" in d and "prompt_tokens_requested" in d))


async def run_probe(
    url: str | Connection,
    config: ProbeConfig,
    *,
    device: DeviceSpec | None = None,
    model: ModelGeometry | None = None,
    model_source: str | None = None,
    progress: ProgressFn | None = None,
) -> ProbeResult:
    """Probe the server at ``url`` (or on an open :class:`Connection`). Raises
    :class:`RunError` (one line) when a request fails: the server is down, the model is wrong,
    the key is refused, a stream breaks off."""
    async with connect(url, config) as conn:
        notes = list(conn.notes)

        async def one(index: int) -> tuple[RequestRecord, Prompt]:
            prompt = await conn.prompt(config.prompt_tokens, index)
            return await conn.send(prompt, config.max_tokens), prompt

        total = config.runs + 1
        if progress:
            progress("cold run", 0, total)
        cold, _ = await one(0)
        records: list[RequestRecord] = []
        prompts: list[Prompt] = []
        for i in range(1, total):
            if progress:
                progress(f"run {i} of {config.runs}", i, total)
            record, prompt = await one(i)
            records.append(record)
            prompts.append(prompt)
        if progress:
            progress("done", total, total)
        info, target = conn.info, conn.target

    if any(r.prefill_warning for r in records):
        notes.append(next(r.prefill_warning for r in records if r.prefill_warning))
    gaps = [g for r in records for g in r.chunk_gaps_s]
    bunched = sum(1 for g in gaps if g < 1e-4)
    if gaps and bunched > 0.25 * len(gaps):
        notes.append(
            f"{bunched / len(gaps):.0%} of the token gaps were under 0.1 ms: the server sent"
            " tokens in bursts (several in one write), so ITL percentiles are lumpy; the decode"
            " rate (from TPOT) is the steadier figure"
        )
    notes += output_notes(records, config.max_tokens)
    return ProbeResult(
        server=info,
        target=target,
        config=config,
        cold=cold,
        runs=tuple(records),
        prompts=tuple(prompts),
        device=device,
        model=model,
        model_source=model_source,
        notes=tuple(notes),
    )
