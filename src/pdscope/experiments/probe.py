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

from dataclasses import dataclass
from typing import Any

from pdscope import roofline
from pdscope.client import ClientOptions, RequestRecord, ServerInfo, Target
from pdscope.client.options import at_least
from pdscope.experiments.common import Connection, ProgressFn, connect, output_notes
from pdscope.hardware import DeviceSpec
from pdscope.model import ModelGeometry
from pdscope.stats import Summary, percentile, summarize
from pdscope.workload import Prompt

# How a measured decode rate reads against the single-stream ceiling. A stack that is close to
# the memory bus is the hardware's limit; one far below it has overhead to find first. The
# thresholds are judgement, stated so a reader can disagree with them.
NEAR_CEILING = 0.7
FAR_BELOW_CEILING = 0.3


def ceiling_verdict(fraction: float | None) -> str:
    """One sentence on what a measured fraction of the decode ceiling means."""
    if fraction is None:
        return (
            "The ceiling is unknown: give --device and --model-config (or probe a local server)"
            " to see how far this is from what the hardware allows."
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

    @property
    def decode_fraction(self) -> float | None:
        c, d = self.decode_ceiling, self.decode
        if c is None or d is None:
            return None
        return d.median / c.tok_s

    @property
    def prefill_ceiling(self) -> roofline.PrefillCeiling | None:
        if self.device is None or self.model is None:
            return None
        return roofline.prefill_ceiling(
            self.model, self.device, self.prompt_tokens or self.config.prompt_tokens
        )

    @property
    def prefill_fraction(self) -> float | None:
        c, p = self.prefill_ceiling, self.prefill
        if c is None or c.tok_s is None or p is None:
            return None
        return p.median / c.tok_s

    def to_json(self) -> dict[str, Any]:
        ttft, prefill, decode, e2e = self.ttft, self.prefill, self.decode, self.e2e
        itl = self.itl_all
        dc, pc = self.decode_ceiling, self.prefill_ceiling
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
            "ttft_s": ttft.median if ttft else None,
            "prefill_tok_s": prefill.median if prefill else None,
            "prefill_source": self.prefill_source,
            "decode_tok_s": decode.median if decode else None,
            "server_decode_tok_s": self.server_decode_tok_s,
            "itl_p50_s": percentile(itl, 50),
            "itl_p99_s": percentile(itl, 99),
            "e2e_s": e2e.median if e2e else None,
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
            "decode_ceiling_tok_s": dc.tok_s if dc else None,
            "decode_ceiling_context": dc.context if dc else None,
            "decode_fraction_of_ceiling": self.decode_fraction,
            "prefill_ceiling_tok_s": pc.tok_s if pc else None,
            "prefill_fraction_of_ceiling": self.prefill_fraction,
            "verdict": ceiling_verdict(self.decode_fraction),
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
        }


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
