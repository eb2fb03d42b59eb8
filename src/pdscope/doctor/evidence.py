"""Everything the doctor measured, in one object the rules read.

Each part is optional: a rule that needs a part that is missing says so instead of guessing.
The parts hold plain numbers (seconds, tokens/s, bytes), already reduced from the experiments'
results, so the rules stay small, pure and testable with hand-made evidence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerEvidence:
    kind: str  # as detected: vllm, sglang, llama.cpp, llama-cpp-python, ollama, tgi, openai
    version: str | None = None
    model: str = ""
    url: str = ""
    flags: tuple[str, ...] = ()  # engine flags when known (a lab server records them)
    devices: int = 1  # accelerators the server runs on, as far as pdscope knows
    settings: dict[str, Any] = field(default_factory=dict)  # ServerSettings.to_json()


@dataclass(frozen=True)
class HardwareEvidence:
    device: str
    measured: bool
    mem_bandwidth_gb_s: float
    peak_tflops: float | None
    weight_bytes_read: float
    weight_bytes: float
    kv_bytes_per_token: float | None
    parameters: float
    active_parameters: float
    bytes_per_weight: float
    device_id: str | None = None
    parameters_read_per_token: float | None = None


@dataclass(frozen=True)
class PhaseEvidence:
    """The probe: both phases at one prompt length, median of several runs."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    prefill_tok_s: float | None
    decode_tok_s: float
    itl_p50_s: float | None
    itl_p99_s: float | None
    cold_ttft_s: float | None
    decode_ceiling_tok_s: float | None = None
    prefill_ceiling_tok_s: float | None = None
    ttft_floor_s: float | None = None
    kv_share_of_step: float | None = None  # KV bytes / all bytes read a step at its context
    context: int | None = None
    runs: int = 0

    @property
    def decode_fraction(self) -> float | None:
        if not self.decode_ceiling_tok_s:
            return None
        return self.decode_tok_s / self.decode_ceiling_tok_s


@dataclass(frozen=True)
class SweepEvidence:
    """TTFT against prompt length: TTFT = a + b n + c n^2."""

    prompt_tokens: tuple[int, ...]
    ttft_s: tuple[float, ...]
    decode_tok_s: tuple[float, ...]
    a_s: float
    b_s_per_token: float
    c_s_per_token2: float | None
    r2: float | None
    decode_rate_change: float | None  # max relative change across lengths

    def prefill_share(self, n: int) -> float:
        """Share of the TTFT at n tokens that is prefill work (not the fixed overhead a)."""
        prefill = self.b_s_per_token * n + (self.c_s_per_token2 or 0.0) * n * n
        total = self.a_s + prefill
        return prefill / total if total > 0 else 0.0


@dataclass(frozen=True)
class ContextEvidence:
    """Decode as the context fills."""

    contexts: tuple[int, ...]
    decode_tok_s: tuple[float, ...]
    slope_s_per_token: float | None  # measured d(ITL)/d(context)
    predicted_slope_s_per_token: float | None  # KV bytes a token / bandwidth


@dataclass(frozen=True)
class PrefixEvidence:
    prefix_tokens: int
    suffix_tokens: int
    cold_ttft_s: float
    warm_ttft_s: float
    unique_ttft_s: float
    detected: bool
    cached_tokens: int | None = None

    @property
    def saved_s(self) -> float:
        return self.unique_ttft_s - self.warm_ttft_s


@dataclass(frozen=True)
class InterferenceEvidence:
    streams: int
    inject_tokens: int
    p99_before_s: float | None
    p99_during_s: float | None
    max_gap_during_s: float | None
    budget_tokens: int | None = None  # the server's prefill token budget, when known
    label: str = ""  # e.g. "--max-num-batched-tokens 256"

    @property
    def stall_s(self) -> float | None:
        return self.max_gap_during_s


@dataclass(frozen=True)
class LoadLevel:
    concurrency: int
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    meets_slo: bool | None = None


@dataclass(frozen=True)
class LoadEvidence:
    levels: tuple[LoadLevel, ...]
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None

    @property
    def capacity(self) -> int | None:
        """The highest concurrency that met the SLO (every lower one met it too)."""
        best = None
        for lv in self.levels:
            if lv.meets_slo is not True:
                break
            best = lv.concurrency
        return best


@dataclass(frozen=True)
class QueueEvidence:
    """What the server's /metrics said under load (the worst window)."""

    max_waiting: float | None
    kv_usage_at_max_waiting: float | None
    waiting_for_capacity: float | None
    preemptions: float | None
    queueing: str | None  # none / capacity / scheduler / None (unknown)
    kv_usage_exported: bool = True
    windows: int = 0


@dataclass(frozen=True)
class PlanEvidence:
    """What the planner, calibrated on this server during the run, predicts for the load
    levels' workload (``input_tokens`` in, ``output_tokens`` out, closed loop) at the SLO:
    ``predicted_users`` (``None``: not even one; ``floor`` says why), the objective that stops
    more (``binding``), the best scheduler change and the users it would hold, the predicted
    p99s by users (``curve``: users, TTFT p99 s, ITL p99 s) and the fit's quality."""

    slo_ttft_s: float
    slo_itl_s: float
    input_tokens: int
    output_tokens: int
    predicted_users: int | None
    binding: str | None = None
    floor: str | None = None
    best_change: str | None = None
    best_change_users: int | None = None
    curve: tuple[tuple[int, float | None, float | None], ...] = ()
    fit_r_squared: float | None = None
    fit_error: float | None = None  # the largest median error of a calibration part
    assumptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    server: ServerEvidence
    hardware: HardwareEvidence | None = None
    phases: PhaseEvidence | None = None
    sweep: SweepEvidence | None = None
    context: ContextEvidence | None = None
    prefix: PrefixEvidence | None = None
    interference: tuple[InterferenceEvidence, ...] = ()
    load: LoadEvidence | None = None
    queue: QueueEvidence | None = None
    plan: PlanEvidence | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
