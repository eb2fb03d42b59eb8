"""Everything the doctor measured, in one object the rules read.

Each part is optional: a rule that needs a part that is missing says so instead of guessing.
The parts hold plain numbers (seconds, tokens/s, bytes), already reduced from the experiments'
results, so the rules stay small, pure and testable with hand-made evidence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pdscope.servers import ServerSettings


@dataclass(frozen=True)
class ServerEvidence:
    kind: str  # as detected: vllm, sglang, llama.cpp, llama-cpp-python, ollama, tgi, openai
    version: str | None = None
    model: str = ""
    url: str = ""
    flags: tuple[str, ...] = ()  # engine flags when known (a lab server records them)
    devices: int = 1  # accelerators the server runs on, as far as pdscope knows
    settings: ServerSettings = field(default_factory=ServerSettings)  # as the server told


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
    # The ceilings above are held (``roofline.Held``): where a measurement beat the one the
    # specs gave, the ceiling is the measurement ("at least" it), ``*_beaten`` says so, the
    # specs' figure is kept apart and ``ceiling_warnings`` says which spec was low and why.
    decode_ceiling_beaten: bool = False
    prefill_ceiling_beaten: bool = False
    ttft_floor_beaten: bool = False
    spec_decode_ceiling_tok_s: float | None = None
    ceiling_warnings: tuple[str, ...] = ()

    @property
    def decode_fraction(self) -> float | None:
        """The decode rate's share of its ceiling, never above 1."""
        if not self.decode_ceiling_tok_s:
            return None
        return min(1.0, self.decode_tok_s / self.decode_ceiling_tok_s)

    @property
    def prefill_fraction(self) -> float | None:
        """The prefill rate's share of its ceiling, never above 1."""
        if not self.prefill_ceiling_tok_s or self.prefill_tok_s is None:
            return None
        return min(1.0, self.prefill_tok_s / self.prefill_ceiling_tok_s)


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
    # A server of fixed slots (llama.cpp), where a request waits only when all are busy: how
    # many, each one's context, and whether they share one KV pool (ServerSettings).
    running_at_max_waiting: float | None = None
    slots: int | None = None
    slot_context_tokens: int | None = None
    kv_unified: bool | None = None


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
class CapacitySearchEvidence:
    """``--thorough``: the most users measured to meet the SLO by a search that started from
    the planner's prediction (:mod:`pdscope.plan.measured`): ``users`` (``None``: no level met
    it), the lowest level above that missed it, whether the bracket held when its ends were
    measured again, and what the search cost."""

    users: int | None
    first_failing: int | None
    held: bool | None
    predicted_users: int | None
    levels: int
    stages: int
    elapsed_s: float
    stopped: str


@dataclass(frozen=True)
class OffloadEvidence:
    """Where the server keeps the model's weights (its ``WeightPlacement``): ``on_gpu`` of them
    in GPU memory, the rest read from system RAM each token; and what that costs, the split
    decode ceiling against all on the GPU, where the device, the model and the CPU are known.
    ``gpu_device`` is ``None`` when the server runs on a device that is not a GPU (one memory
    holds every weight: nothing to move). ``slots_kv_bytes``: the KV cache its parallel slots
    allocate at start (slots x context a slot), which takes GPU memory from the weights."""

    on_gpu: float
    source: str
    gpu_device: str | None = None
    device_kind: str | None = None
    cpu_device: str | None = None
    cpu_mem_bandwidth_gb_s: float | None = None
    cpu_measured: bool = False
    decode_ceiling_tok_s: float | None = None
    all_on_gpu_tok_s: float | None = None
    slots: int | None = None
    slot_context_tokens: int | None = None
    slots_kv_bytes: float | None = None

    @property
    def off_gpu(self) -> float:
        return 1.0 - self.on_gpu


@dataclass(frozen=True)
class TruncationEvidence:
    """The prompt tokens the server reported against those sent, over the run's requests
    (:class:`pdscope.client.truncation.TruncationCount`): ``checked`` had both counts,
    ``truncated`` fell short (``sent_tokens`` and ``reported_tokens``: the largest shortfall);
    ``refused`` were turned away as longer than the context (``refusal``: the first one's
    line). ``context_tokens``, ``slots`` and ``kv_unified``: the context a request may have,
    where the server's settings say (llama.cpp: a slot's, ``-c`` over ``-np``)."""

    checked: int
    truncated: int = 0
    sent_tokens: int | None = None
    reported_tokens: int | None = None
    refused: int = 0
    refusal: str | None = None
    context_tokens: int | None = None
    slots: int | None = None
    kv_unified: bool | None = None


@dataclass(frozen=True)
class ThinkingEvidence:
    """The probe's requests as a reasoning model sees them: did they think before answering,
    and for how long. ``reasoned``: some streams carried reasoning (thought) apart from the
    answer; the times are medians over those that did: ``ttft_s`` the first token (the
    prefill), ``ttfo_s`` the first answer token, ``thinking_s`` between the two.
    ``answered``: of the ``runs`` that reasoned, how many reached an answer within the output
    cap."""

    reasoned: bool
    runs: int
    ttft_s: float | None = None
    ttfo_s: float | None = None
    thinking_s: float | None = None
    reasoning_tokens: int | None = None
    output_tokens: int | None = None
    answered: int = 0


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
    capacity_search: CapacitySearchEvidence | None = None
    offload: OffloadEvidence | None = None
    truncation: TruncationEvidence | None = None
    thinking: ThinkingEvidence | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
