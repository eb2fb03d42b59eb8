"""The doctor's run: the article's experiments on one server, reduced to evidence.

In order: the probe (both phases, the cold run kept apart), the prompt-length sweep, the
prefix-cache A/B, the prefill-interference experiment, the context sweep (not in ``quick``), a
short concurrency sweep with the server's ``/metrics`` recorded beside it (capacity and
queueing), and the planner calibrated on the server (:mod:`pdscope.doctor.forecast`). Each
experiment the server cannot take (llama-cpp-python serves one request at a time: no
interference, no concurrency) is skipped with the reason, and the rules that needed it say so.
Nothing here judges: :func:`pdscope.doctor.rules.diagnose` does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdscope import roofline
from pdscope.charts import Chart, Series
from pdscope.client import ClientOptions, Connection, ServerInfo, connect, is_loopback
from pdscope.client.faults import ContextExceeded
from pdscope.client.record import RequestRecord, request_series
from pdscope.client.truncation import count_truncation
from pdscope.doctor.evidence import (
    CapacitySearchEvidence,
    ContextEvidence,
    Evidence,
    HardwareEvidence,
    InterferenceEvidence,
    LoadEvidence,
    LoadLevel,
    OffloadEvidence,
    PhaseEvidence,
    PlanEvidence,
    PrefixEvidence,
    QueueEvidence,
    ServerEvidence,
    SweepEvidence,
    ThinkingEvidence,
    TruncationEvidence,
)
from pdscope.doctor.forecast import forecast, forecast_chart
from pdscope.doctor.rules import Finding, diagnose
from pdscope.errors import Field, InputError, Note, RunError
from pdscope.experiments.common import CeilingInputs, find_ceiling_inputs
from pdscope.experiments.context import ContextConfig, ContextResult, run_context
from pdscope.experiments.interference import (
    PREFILL_STALL,
    InterferenceConfig,
    InterferenceResult,
    run_interference,
)
from pdscope.experiments.prefix import TTFT_SAVED, PrefixConfig, PrefixResult, run_prefix
from pdscope.experiments.probe import ProbeConfig, ProbeResult, measured_requests, run_probe
from pdscope.experiments.setup import lab_flags, read_settings
from pdscope.experiments.sweep import SweepConfig, SweepResult, run_sweep
from pdscope.figures import (
    REQUEST_METRICS,
    Figures,
    FindingState,
    Metric,
    number,
    scalars,
)
from pdscope.hardware import DeviceSpec, find_device, measure_local_cpu
from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.runner import Stage
from pdscope.metrics import (
    classify_queueing,
    detect_metric_map,
    load_recording,
    make_window,
    peak_waiting_window,
)
from pdscope.plan import CalibrationConfig, run_calibration
from pdscope.plan.measured import CapacityConfig, Prediction, find_capacity
from pdscope.servers import ServerSettings
from pdscope.slo import SLO
from pdscope.stats import percentile
from pdscope.workload.datasets import Lengths

# The objectives the load levels and the forecast are judged by unless the caller gives others.
DEFAULT_SLO = SLO(ttft_s=2.0, itl_s=0.2)


@dataclass(frozen=True, kw_only=True)
class DoctorConfig(ClientOptions):
    """A doctor run: ``quick`` leaves out the context sweep, shortens the rest and sizes the
    load levels' prompts to the server's prefill rate (:func:`load_input_tokens`); the SLO the
    load levels are judged by; where the run folder goes; earlier runs to set beside this one."""

    quick: bool = False
    thorough: bool = False  # the capacity measured by a search from the planner's figure
    device: str | None = None
    model_config: str | None = None
    slo: SLO = DEFAULT_SLO
    out: Path = Path("runs/doctor")
    compare_with: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quick and self.thorough:
            raise InputError(Field("quick"), " and ", Field("thorough"), " exclude each other")
        if self.slo.ttft_s is None or self.slo.itl_s is None:
            raise InputError("the doctor's slo needs both ttft_s and itl_s")
        if self.slo.tpot_s is not None or self.slo.e2e_s is not None:
            raise InputError("the doctor judges ttft_s and itl_s only: its slo cannot hold"
                             " tpot_s or e2e_s")
        if self.slo.percentile != 99:
            raise InputError("the doctor judges the p99: its slo's percentile must be 99, got"
                             f" {self.slo.percentile:g}")
        for folder in self.compare_with:
            if not (Path(folder) / "evidence.json").is_file():
                raise InputError(f"{folder} holds no evidence.json: compare with a folder an"
                                 " earlier `pdscope doctor` wrote")

    def to_json(self) -> dict[str, Any]:
        """As :meth:`ClientOptions.to_json`, the SLO as ``slo_ttft_ms`` and ``slo_itl_ms``."""
        out: dict[str, Any] = {}
        for key, value in super().to_json().items():
            if key == "slo":
                limits = self.slo.limits_ms()
                out |= {"slo_ttft_ms": limits["ttft"], "slo_itl_ms": limits["itl"]}
            else:
                out[key] = value
        return out


@dataclass
class DoctorRun:
    """What the doctor measured and concluded."""

    evidence: Evidence
    findings: list[Finding]
    charts: list[Chart]
    results: dict[str, Any] = field(default_factory=dict)  # each experiment's JSON
    skipped: dict[str, str] = field(default_factory=dict)
    probe: ProbeResult | None = None

    def saved_evidence(self) -> dict[str, Any]:
        """``evidence.json``: the evidence, each experiment's JSON and what was skipped."""
        return {**self.evidence.to_json(), "experiments": self.results, "skipped": self.skipped}

    def figures(self) -> Figures:
        return doctor_figures(self.saved_evidence(), [f.to_json() for f in self.findings])


CAPACITY_USERS = Metric("capacity_users", "users at the SLO", False, "users")
DOCTOR_METRICS = (*REQUEST_METRICS, CAPACITY_USERS, PREFILL_STALL, TTFT_SAVED)


def doctor_figures(evidence: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]
                   ) -> Figures:
    """A doctor run's figures from its ``evidence.json`` and ``findings.json``: its probe's
    requests (else the phases' medians), the first interference stall, the users the plan
    predicts at the SLO, the TTFT the prefix cache saved; and its findings."""
    server = evidence.get("server") or {}
    phases = evidence.get("phases") or {}
    identity = {"model": server.get("model"), "server": server.get("kind"),
                "server_version": server.get("version"),
                "prompt_tokens": phases.get("prompt_tokens"),
                "output_tokens": phases.get("output_tokens")}
    probe = (evidence.get("experiments") or {}).get("probe") or {}
    series = request_series(measured_requests(probe))  # the cold request reported apart
    stalls = [number(i.get("p99_during_s")) for i in evidence.get("interference") or []]
    plan = evidence.get("plan") or {}
    prefix = evidence.get("prefix") or {}
    cold, warm = number(prefix.get("unique_ttft_s")), number(prefix.get("warm_ttft_s"))
    values = {} if series else scalars(
        decode_tok_s=number(phases.get("decode_tok_s")),
        prefill_tok_s=number(phases.get("prefill_tok_s")),
        ttft_p50_s=number(phases.get("ttft_s")), itl_p50_s=number(phases.get("itl_p50_s")),
        itl_p99_s=number(phases.get("itl_p99_s")))
    values |= scalars(prefill_stall_s=stalls[0] if stalls else None,
                      capacity_users=number(plan.get("predicted_users")),
                      ttft_saved_share=1 - warm / cold if cold and warm is not None else None)
    states = tuple(FindingState(str(f.get("id")), str(f.get("title", f.get("id"))),
                                str(f.get("status")),
                                None if f.get("severity") is None else str(f.get("severity")))
                   for f in findings if isinstance(f, Mapping))
    return Figures("doctor", DOCTOR_METRICS, identity, series, values, states)


StatusFn = Callable[[str], None]
"""``status(message)``: called as each experiment starts."""


# ---------------------------------------------------------------------------- reductions


def hardware_evidence(ceiling: CeilingInputs) -> HardwareEvidence | None:
    if ceiling.device is None or ceiling.model is None:
        return None
    device, model = ceiling.device, ceiling.model
    peak = roofline.peak_flops(model, device)
    return HardwareEvidence(
        device=device.name,
        measured=device.measured,
        mem_bandwidth_gb_s=device.mem_bandwidth_gb_s,
        peak_tflops=peak / 1e12 if peak else None,
        weight_bytes_read=model.read_weight_bytes(),
        weight_bytes=model.total_weight_bytes(),
        kv_bytes_per_token=roofline.kv_bytes_per_token(model) if model.has_attention_shape
        else None,
        parameters=model.parameters,
        active_parameters=model.active_parameters,
        parameters_read_per_token=model.parameters_read_per_token,
        bytes_per_weight=model.bytes_per_weight,
        device_id=device.id,
    )


def phase_evidence(probe: ProbeResult) -> PhaseEvidence | None:
    ttft, decode = probe.ttft, probe.decode
    if ttft is None or decode is None:
        return None
    decode_ceiling, prefill_ceiling = probe.decode_ceiling, probe.prefill_ceiling
    dh, ph, th = probe.decode_held, probe.prefill_held, probe.ttft_held
    itl = probe.itl_all
    return PhaseEvidence(
        prompt_tokens=probe.prompt_tokens or probe.config.prompt_tokens,
        output_tokens=probe.output_tokens or probe.config.max_tokens,
        ttft_s=ttft.median,
        prefill_tok_s=probe.prefill.median if probe.prefill else None,
        decode_tok_s=decode.median,
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        cold_ttft_s=probe.cold.ttft_s,
        decode_ceiling_tok_s=dh.ceiling if dh else (decode_ceiling.tok_s if decode_ceiling
                                                     else None),
        prefill_ceiling_tok_s=ph.ceiling if ph else (prefill_ceiling.tok_s if prefill_ceiling
                                                      else None),
        ttft_floor_s=th.limit if th else (prefill_ceiling.ttft_s if prefill_ceiling else None),
        decode_ceiling_beaten=dh.beaten if dh else False,
        prefill_ceiling_beaten=ph.beaten if ph else False,
        ttft_floor_beaten=th.beaten if th else False,
        spec_decode_ceiling_tok_s=decode_ceiling.tok_s if decode_ceiling else None,
        ceiling_warnings=probe.ceiling_warnings,
        kv_share_of_step=decode_ceiling.kv_share if decode_ceiling and decode_ceiling.context
        else None,
        context=decode_ceiling.context if decode_ceiling else probe.mean_context,
        runs=len(probe.runs),
    )


def thinking_evidence(probe: ProbeResult) -> ThinkingEvidence | None:
    """Whether the probe's model thought before it answered, and for how long (medians of the
    runs that did)."""
    if not probe.runs:
        return None
    reasoned = [r for r in probe.runs if r.reasoned]
    if not reasoned:
        return ThinkingEvidence(reasoned=False, runs=len(probe.runs),
                                ttft_s=probe.ttft.median if probe.ttft else None)

    def median(xs: Sequence[float | None]) -> float | None:
        known = sorted(x for x in xs if x is not None)
        return percentile(known, 50) if known else None

    tokens = sorted(r.reasoning_tokens or 0 for r in reasoned)
    outs = sorted(r.n_out for r in reasoned)
    return ThinkingEvidence(
        reasoned=True, runs=len(reasoned),
        ttft_s=median([r.ttft_s for r in reasoned]),
        ttfo_s=median([r.ttfo_s for r in reasoned]),
        thinking_s=median([r.thinking_s for r in reasoned]),
        reasoning_tokens=tokens[len(tokens) // 2], output_tokens=outs[len(outs) // 2],
        answered=sum(r.t_first_answer_ns is not None for r in reasoned))


def sweep_evidence(sweep: SweepResult) -> SweepEvidence | None:
    fit = sweep.fit
    if fit.a is None or fit.b is None:
        return None
    pts = [p for p in sweep.points if p.ttft is not None]
    return SweepEvidence(
        prompt_tokens=tuple(p.prompt_tokens for p in pts),
        ttft_s=tuple(p.ttft.median for p in pts if p.ttft),
        decode_tok_s=tuple(p.decode.median if p.decode else math.nan for p in pts),
        a_s=max(fit.a, 0.0),
        b_s_per_token=fit.b,
        c_s_per_token2=fit.c,
        r2=fit.r2,
        decode_rate_change=sweep.decode_rate_change,
    )


def context_evidence(context: ContextResult) -> ContextEvidence:
    bins = context.bins
    fit = context.fit
    return ContextEvidence(
        contexts=tuple(int(b.context) for b in bins),
        decode_tok_s=tuple(b.decode_tok_s for b in bins),
        slope_s_per_token=fit.coef[1] if fit is not None and len(fit.coef) > 1 else None,
        predicted_slope_s_per_token=context.slope_predicted,
    )


def prefix_evidence(prefix: PrefixResult) -> PrefixEvidence | None:
    warm, unique = prefix.ttft_warm, prefix.ttft_unique
    detected = prefix.prefix_cache_detected
    if warm is None or unique is None or prefix.cold.ttft_s is None or detected is None:
        return None
    cached = prefix.cached.warm_median
    return PrefixEvidence(
        prefix_tokens=prefix.prefix.tokens,
        suffix_tokens=prefix.prompt_tokens - prefix.prefix.tokens,
        cold_ttft_s=prefix.cold.ttft_s,
        warm_ttft_s=warm.median,
        unique_ttft_s=unique.median,
        detected=detected,
        cached_tokens=int(cached) if cached is not None else None,
    )


def interference_evidence(result: InterferenceResult,
                          settings: ServerSettings) -> InterferenceEvidence:
    before, during, _ = result.windows()
    return InterferenceEvidence(
        streams=len(result.streams),
        inject_tokens=result.inject_tokens,
        p99_before_s=before.itl_p99_s,
        p99_during_s=during.itl_p99_s,
        max_gap_during_s=result.stall_s,
        budget_tokens=settings.prefill_budget_tokens,
        label=settings.budget_label,
    )


def load_evidence(bench: BenchResult, slo: SLO) -> LoadEvidence:
    """Each load level's figures, and whether its TTFT and ITL p99 met ``slo`` with no
    request failed."""
    slo_ttft_s, slo_itl_s = slo.ttft_s, slo.itl_s
    if slo_ttft_s is None or slo_itl_s is None:
        raise InputError("load levels are judged by an slo with both ttft_s and itl_s")
    levels = []
    for summary in bench.summaries:
        ttft99, itl99 = summary.ttft.p99_s, summary.itl.p99_s
        meets = (ttft99 is not None and itl99 is not None and summary.failed == 0
                 and ttft99 <= slo_ttft_s and itl99 <= slo_itl_s)
        levels.append(LoadLevel(
            concurrency=summary.stage.concurrency or 0,
            completed=summary.completed, failed=summary.failed,
            request_throughput=summary.request_throughput,
            output_throughput=summary.output_throughput, ttft_p50_s=summary.ttft.median_s,
            ttft_p99_s=ttft99, itl_p50_s=summary.itl.median_s, itl_p99_s=itl99,
            meets_slo=meets,
        ))
    return LoadEvidence(tuple(levels), slo_ttft_s, slo_itl_s)


def queue_evidence(metrics_path: Path, settings: ServerSettings) -> QueueEvidence | None:
    """The worst window (most requests waiting) of the /metrics recorded beside the load; the
    slots from ``settings`` where requests wait only for a slot (llama.cpp)."""
    if not metrics_path.exists():
        return None
    snaps = load_recording(metrics_path)
    if len(snaps) < 2:
        return None
    family = detect_metric_map(snaps[-1].names)
    if family is None:
        return None
    whole = make_window(snaps[0], snaps[-1], family)
    worst = peak_waiting_window(snaps, family)
    if worst is None:
        return QueueEvidence(None, None, None, whole.preemptions, None,
                             kv_usage_exported=False, windows=len(snaps) - 1)
    slots = family.waiting_for_slot
    return QueueEvidence(
        max_waiting=worst.num_requests_waiting,
        kv_usage_at_max_waiting=worst.kv_cache_usage,
        waiting_for_capacity=worst.waiting_capacity,
        preemptions=whole.preemptions,
        queueing=classify_queueing(worst),
        kv_usage_exported=worst.kv_cache_usage is not None,
        windows=len(snaps) - 1,
        running_at_max_waiting=worst.num_requests_running,
        slots=settings.max_sequences if slots else None,
        slot_context_tokens=settings.context_tokens if slots else None,
        kv_unified=settings.kv_unified if slots else None,
    )


# Where the spilled weights are read from when the server is not on this machine: the device
# table's dual channel DDR5-5600 (90 GB/s), a common desktop, said to be assumed in the finding.
ASSUMED_CPU = "cpu-ddr5-5600-2ch"


def offload_evidence(settings: ServerSettings, ceiling: CeilingInputs,
                     cpu: DeviceSpec | None) -> OffloadEvidence | None:
    """The share of the weights in GPU memory, as the server's settings say (``None`` when
    they do not), and on a GPU of the device table the split decode ceiling with the rest read
    at ``cpu``'s bandwidth, against all on the GPU; the KV its slots allocate at start."""
    placement = settings.weights
    model, device = ceiling.model, ceiling.device
    if placement is None and device is not None and device.kind != "gpu":
        # A server on a CPU (the lab): one memory holds every weight, whatever its flags say.
        return OffloadEvidence(on_gpu=0.0, source=f"the device is a {device.kind}",
                               device_kind=device.kind)
    if placement is None:
        return None
    share = placement.on_gpu(model.num_layers if model else None,
                             model.total_weight_bytes() if model else None)
    if share is None:
        return None
    gpu = device if device is not None and device.kind == "gpu" else None
    split = (roofline.split_decode_ceiling(model, gpu, cpu, share)
             if model is not None and gpu is not None and cpu is not None else None)
    slots, ctx = settings.max_sequences, settings.context_tokens
    slots_kv = (roofline.kv_bytes_for_slots(model, slots, ctx)
                if model is not None and model.has_attention_shape and slots and ctx
                and settings.kv_unified is not True else None)
    return OffloadEvidence(
        on_gpu=share,
        source=placement.source,
        gpu_device=gpu.name if gpu else None,
        device_kind=device.kind if device else None,
        cpu_device=cpu.name if split and cpu else None,
        cpu_mem_bandwidth_gb_s=cpu.mem_bandwidth_gb_s if split and cpu else None,
        cpu_measured=bool(split and cpu and cpu.measured),
        decode_ceiling_tok_s=split.tok_s if split else None,
        all_on_gpu_tok_s=split.all_on_gpu_tok_s if split else None,
        slots=slots if slots_kv else None,
        slot_context_tokens=ctx if slots_kv else None,
        slots_kv_bytes=slots_kv,
    )


def truncation_evidence(records: Sequence[RequestRecord],
                        settings: ServerSettings) -> TruncationEvidence:
    """What the run's requests say about prompts cut short, with the context a request may
    have where the server's settings say."""
    n = count_truncation(records)
    return TruncationEvidence(
        checked=n.checked, truncated=n.truncated, sent_tokens=n.sent_tokens,
        reported_tokens=n.reported_tokens, refused=n.refused, refusal=n.refusal,
        context_tokens=settings.context_tokens, slots=settings.max_sequences,
        kv_unified=settings.kv_unified)


def offload_cpu(settings: ServerSettings, ceiling: CeilingInputs, local: bool) -> DeviceSpec | None:
    """The CPU the spilled weights are read from, only when some are spilled onto a GPU's
    host: this machine's, measured, for a server on it; else :data:`ASSUMED_CPU`."""
    placement, model = settings.weights, ceiling.model
    if placement is None or ceiling.device is None or ceiling.device.kind != "gpu":
        return None
    share = placement.on_gpu(model.num_layers if model else None,
                             model.total_weight_bytes() if model else None)
    if share is None or share >= 1.0:
        return None
    return measure_local_cpu() if local else find_device(ASSUMED_CPU)


def load_chart(load: LoadEvidence) -> Chart:
    """Throughput against p99 latency, one point a concurrency: batching's trade."""
    levels = [level for level in load.levels if level.itl_p99_s is not None]
    return Chart(
        "load-throughput-latency", "Throughput against p99 ITL (one point a concurrency)",
        "output tokens/s", "p99 ITL (ms)",
        (Series("p99 ITL", tuple(level.output_throughput for level in levels),
                tuple((level.itl_p99_s or 0) * 1000 for level in levels), kind="line"),
         Series("p50 ITL", tuple(level.output_throughput for level in levels),
                tuple((level.itl_p50_s or 0) * 1000 for level in levels), kind="line")),
    )


def previous_interference(folder: Path) -> list[InterferenceEvidence]:
    """Interference runs of an earlier doctor run (``--compare-with``), to set beside this one.
    Raises :class:`InputError` (one line) for a folder whose ``evidence.json`` is not one an
    earlier doctor run wrote."""
    import dataclasses

    path = Path(folder) / "evidence.json"
    hint = Note("give a folder an earlier doctor run wrote (its ", Field("out"), ")")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not JSON"
        raise InputError(f"cannot read {path} ({why}): ", hint) from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a doctor's evidence (a JSON {type(data).__name__},"
                         " not an object): ", hint)
    runs = data.get("interference") or []
    if not isinstance(runs, list):
        raise InputError(f"{path}: interference is not a list: ", hint)
    names = {f.name for f in dataclasses.fields(InterferenceEvidence)}
    required = {f.name for f in dataclasses.fields(InterferenceEvidence)
                if f.default is dataclasses.MISSING}
    out = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise InputError(f"{path}: interference[{i}] is not an object: ", hint)
        unknown = sorted(set(run) - names)
        missing = sorted(required - set(run))
        if unknown or missing:
            what = "; ".join(x for x in (
                f"unknown keys {', '.join(unknown)}" if unknown else "",
                f"missing {', '.join(missing)}" if missing else "") if x)
            raise InputError(f"{path}: interference[{i}] has {what}: ", hint)
        out.append(InterferenceEvidence(**run))
    return out


# ---------------------------------------------------------------------------- the run

# Streams the interference experiment decodes while it injects the long prompt.
INTERFERENCE_STREAMS = 4


def interference_streams(scheduling: str, settings: ServerSettings) -> int:
    """:data:`INTERFERENCE_STREAMS`, or one fewer than a server's slots where it has fewer:
    with every slot decoding, the injected prompt would wait for a slot to free (llama-server
    defers it) and be prefilled after the streams it should interrupt had ended."""
    slots = settings.max_sequences
    if scheduling == "slots" and slots is not None:
        return max(1, min(INTERFERENCE_STREAMS, slots - 1))
    return INTERFERENCE_STREAMS



# The load levels' workload: long prompts (prefill shares the steps with decode) and short
# answers, so that a level takes seconds.
LOAD_INPUT_TOKENS = 1000
LOAD_OUTPUT_TOKENS = 32
SEARCH_LEVEL_S = 15.0  # seconds of load a level of the --thorough search
# Quick: the load levels' prompts sized to the server, so that their prefill takes at most
# QUICK_LOAD_PREFILL_S at the probe's measured rate (the 4 + 8 prompts of the two levels): a
# server that prefills ~200 tokens a second (llama-server on two CPU cores) gets 300-token
# prompts, where 1,000 took a minute of the doctor's four; one that prefills 600 or more keeps
# 1,000. 20 s: on the lab's llama-server here (~320 tokens a second) 500-token prompts, the load
# 36 -> ~22 s of the doctor's two minutes; eight users still wait for its four slots.
QUICK_LOAD_PREFILL_S = 20.0
QUICK_LOAD_MIN_TOKENS = 250


def load_input_tokens(quick: bool, prefill_tok_s: float | None, prompts: int) -> int:
    """The load levels' prompt length: :data:`LOAD_INPUT_TOKENS`, or in ``quick`` what
    ``prompts`` prompts prefill in :data:`QUICK_LOAD_PREFILL_S` at ``prefill_tok_s`` (in steps
    of 50, at least :data:`QUICK_LOAD_MIN_TOKENS`) when that is less."""
    if not quick or not prefill_tok_s or prefill_tok_s <= 0 or prompts < 1:
        return LOAD_INPUT_TOKENS
    fit = prefill_tok_s * QUICK_LOAD_PREFILL_S / prompts
    if fit >= LOAD_INPUT_TOKENS:
        return LOAD_INPUT_TOKENS
    return max(QUICK_LOAD_MIN_TOKENS, int(fit // 50) * 50)


# Quick: the planner calibrated to the load's prompt length, not past it (the 2,048-token prompt
# and the 1,536-token context are a third of the calibration's time; on the lab's llama-server,
# which prefills ~200 tokens a second on two cores, 40 s of the doctor's 245).
QUICK_PREFILL_TOKENS = (128, 512, 1024)
QUICK_DECODE_CONTEXTS = (64, 1024)
# Quick: batches to the load's top level (8 users), not past it, and 48 tokens a stream rather
# than 96. The 4- and 16-stream batches and the longer answers were two thirds of the
# calibration's time: on the lab's vLLM (an AMD EPYC with AVX2 only, two cores) 58 s of a
# 149 s doctor run.
QUICK_LEVELS = (1, 8)  # the quick load's levels, in users
QUICK_BATCH_STREAMS = (2, QUICK_LEVELS[-1])
QUICK_DECODE_TOKENS = 48


async def search_evidence(conn: Connection, bench: BenchConfig, config: DoctorConfig,
                          plan: PlanEvidence | None, folder: Path) -> CapacitySearchEvidence:
    """The most users meeting the doctor's SLO, measured by the search from the planner's
    prediction (from one user where the planner has none), on the load levels' workload."""
    predicted = (None if plan is None or plan.predicted_users is None
                 else Prediction(float(plan.predicted_users), "the planner calibrated in this run"))
    found = await find_capacity(
        conn, bench, Workload(input_len=Lengths("fixed", LOAD_INPUT_TOKENS),
                              output_len=Lengths("fixed", LOAD_OUTPUT_TOKENS)),
        CapacityConfig(slo=config.slo, level_s=SEARCH_LEVEL_S, runs=1, max_levels=8), folder,
        predicted=predicted)
    return CapacitySearchEvidence(
        users=None if found.capacity is None else int(found.capacity),
        first_failing=None if found.first_failing is None else int(found.first_failing),
        held=found.held, predicted_users=None if plan is None else plan.predicted_users,
        levels=len(found.search.levels), stages=len(found.runs), elapsed_s=found.elapsed_s,
        stopped=found.search.stopped)


PROBE_PROMPT_TOKENS = 512


def refused_run(server: ServerInfo, flags: tuple[str, ...], settings: ServerSettings,
                refusal: ContextExceeded) -> DoctorRun:
    """The doctor's answer when the server refuses even the probe's prompt as longer than the
    context a request may have (llama-server's ``-c`` over ``-np``, a small ``--max-model-len``):
    nothing else can be measured, and the prompt-truncated finding says why and what to change,
    where stopping on the error would leave the user with one line and no fix."""
    why = Note("every experiment: the server refused the probe's ", str(PROBE_PROMPT_TOKENS),
               "-token prompt as longer than its context")
    evidence = Evidence(
        server=ServerEvidence(kind=server.kind, version=server.version,
                              model=refusal.record.model or "", url=server.base_url,
                              flags=flags, settings=settings),
        truncation=truncation_evidence([refusal.record], settings),
        notes=(Note("skipped ", why),),
    )
    return DoctorRun(evidence, diagnose(evidence), [], {}, {"all": why}, None)


async def run_doctor(url: str, config: DoctorConfig,
                     progress: StatusFn | None = None) -> DoctorRun:
    """Run what the server allows and diagnose it. Writes nothing; see
    :func:`pdscope.doctor.report.write_run`. The server is detected once and every experiment
    runs on that connection; every experiment's config is composed from this one's client
    options (timeouts and seed included), with the model the probe found."""
    say = progress or (lambda _: None)
    quick = config.quick
    client = config.client
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    charts: list[Chart] = []

    async with connect(url, client) as conn:
        server = conn.info
        flags = lab_flags(server.base_url) if is_loopback(url) else ()
        settings = await read_settings(server, conn.session, flags, api_key=config.api_key)

        say("probe: both phases")
        try:
            probe = await run_probe(conn, ProbeConfig(
                prompt_tokens=PROBE_PROMPT_TOKENS, max_tokens=64 if quick else 128,
                runs=3 if quick else 5, **client.client_fields()))
        except ContextExceeded as exc:
            return refused_run(server, flags, settings, exc)
        model_name = probe.target.model
        common = replace(client, model=model_name).client_fields()

        # A prompt the server refuses as longer than its context skips that experiment (its
        # request goes to the prompt-truncated finding) rather than ending the diagnosis.
        refused: list[RequestRecord] = []

        def skip_refused(name: str, exc: ContextExceeded) -> None:
            skipped[name] = Note("the server refused a prompt as longer than its context: ", exc)
            refused.append(exc.record)

        say("sweep: TTFT against prompt length")
        sweep: SweepResult | None = None
        try:
            sweep = await run_sweep(conn, SweepConfig(
                prompt_tokens=(200, 1000, 2000) if quick else (200, 500, 1000, 2000),
                max_tokens=16 if quick else 32, runs=1 if quick else 2, **common))
        except ContextExceeded as exc:
            skip_refused("sweep", exc)
        else:
            results["sweep"] = sweep.to_json()
            charts.extend(sweep.charts())

        say("prefix: a repeated system prompt, cold and warm")
        prefix: PrefixResult | None = None
        try:
            prefix = await run_prefix(conn, PrefixConfig(
                prefix_tokens=1000 if quick else 1500, suffix_tokens=50 if quick else 100,
                requests=3 if quick else 5, **common))
        except ContextExceeded as exc:
            skip_refused("prefix", exc)
        else:
            results["prefix"] = prefix.to_json()
            charts.extend(prefix.charts())

        interference: list[InterferenceEvidence] = []
        if server.family.serial:
            skipped["interference"] = f"{server.kind} serves one request at a time"
        else:
            say("interference: a long prompt injected into running streams")
            try:
                injected = await run_interference(conn, InterferenceConfig(
                    streams=interference_streams(server.family.scheduling, settings),
                    stream_tokens=160 if quick else 256, inject_tokens=1800, **common))
            except ContextExceeded as exc:
                skip_refused("interference", exc)
            else:
                results["interference"] = injected.to_json()
                charts.extend(injected.charts())
                interference.append(interference_evidence(injected, settings))
        for folder in config.compare_with:
            interference.extend(previous_interference(folder))

        context: ContextResult | None = None
        if quick:
            skipped["context"] = Note("left out of ", Field("quick"))
        else:
            say("context: decode as the context fills")
            try:
                context = await run_context(conn, ContextConfig(
                    prompt_tokens=(200, 2000), max_tokens=256, **common))
            except ContextExceeded as exc:
                skip_refused("context", exc)
            else:
                results["context"] = context.to_json()
                charts.extend(context.charts())

        load: LoadEvidence | None = None
        queue: QueueEvidence | None = None
        sent: list[RequestRecord] = [probe.cold, *probe.runs, *refused,
                                     *(r for p in (sweep.points if sweep else ())
                                       for r in p.records)]
        # Quick: one request a user at the top level (all sent together, the queue at its
        # longest); else two, so the level also runs past its start.
        levels = QUICK_LEVELS if quick else (1, 4, 16)
        stages = [Stage(concurrency=c, num_prompts=max(4, c if quick else 2 * c))
                  for c in levels]
        prefill = probe.prefill
        load_tokens = load_input_tokens(quick, prefill.median if prefill else None,
                                        sum(stage.num_prompts or 0 for stage in stages))
        if server.family.serial:
            skipped["capacity"] = f"{server.kind} serves one request at a time"
        else:
            say("capacity: a short concurrency sweep with /metrics recorded")
            folder = config.out / "capacity"
            bench = await run_bench(
                conn, BenchConfig(**common), stages,
                Workload(input_len=Lengths("fixed", load_tokens),
                         output_len=Lengths("fixed", LOAD_OUTPUT_TOKENS)), folder)
            results["capacity"] = [s.to_json() for s in bench.summaries]
            sent += [f.record for run in bench.runs for f in run.finished]
            load = load_evidence(bench, config.slo)
            queue = queue_evidence(folder / "metrics.jsonl", settings)
            charts.append(load_chart(load))

        plan: PlanEvidence | None = None
        say("plan: calibrating the planner on this server")
        try:
            calibrating = CalibrationConfig(runs=1, **common)
            if quick:
                calibrating = replace(calibrating, prefill_tokens=QUICK_PREFILL_TOKENS,
                                      decode_contexts=QUICK_DECODE_CONTEXTS,
                                      batch_streams=QUICK_BATCH_STREAMS,
                                      decode_tokens=QUICK_DECODE_TOKENS)
            calibration = await run_calibration(conn, calibrating)
        except (RunError, InputError) as exc:
            skipped["plan"] = Note("the planner's calibration failed: ", exc)
            if isinstance(exc, ContextExceeded):
                sent.append(exc.record)
        else:
            results["plan"] = calibration.to_json()
            plan = forecast(calibration, config.slo, load_tokens, LOAD_OUTPUT_TOKENS,
                            [lv.concurrency for lv in load.levels] if load else ())
            charts.append(forecast_chart(plan, load))

        searched: CapacitySearchEvidence | None = None
        if config.thorough and not server.family.serial:
            say("capacity: measured by a search from the planner's prediction")
            searched = await search_evidence(conn, BenchConfig(**common), config, plan,
                                             config.out / "capacity-search")

        say("ceilings: this model on this device")
        ceiling = await find_ceiling_inputs(conn, model_name, device=config.device,
                                            model_config=config.model_config,
                                            api_key=config.api_key)
    probe = replace(probe, device=ceiling.device, model=ceiling.model,
                    model_source=ceiling.model_source)
    offload = offload_evidence(settings, ceiling,
                               offload_cpu(settings, ceiling, is_loopback(url)))
    results["probe"] = probe.to_json()
    # Its timing records stay (pdscope compare tests a change on them), without the text.
    for record in results["probe"].get("requests") or []:
        record.pop("output_text", None)

    evidence = Evidence(
        server=ServerEvidence(kind=server.kind, version=server.version, model=model_name,
                              url=server.base_url, flags=flags, settings=settings),
        hardware=hardware_evidence(ceiling),
        phases=phase_evidence(probe),
        sweep=sweep_evidence(sweep) if sweep is not None else None,
        context=context_evidence(context) if context is not None else None,
        prefix=prefix_evidence(prefix) if prefix is not None else None,
        interference=tuple(interference),
        load=load,
        queue=queue,
        plan=plan,
        capacity_search=searched,
        offload=offload,
        truncation=truncation_evidence(sent, settings),
        notes=tuple(ceiling.notes) + tuple(Note(f"{k} skipped: ", v) for k, v in skipped.items()),
        thinking=thinking_evidence(probe),
    )
    return DoctorRun(evidence, diagnose(evidence), charts, results, skipped, probe)


__all__ = ["DoctorConfig", "DoctorRun", "run_doctor"]
