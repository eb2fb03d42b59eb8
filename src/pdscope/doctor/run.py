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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdscope import roofline
from pdscope.charts import Chart, Series
from pdscope.client import ClientOptions, is_loopback
from pdscope.doctor.evidence import (
    ContextEvidence,
    Evidence,
    HardwareEvidence,
    InterferenceEvidence,
    LoadEvidence,
    LoadLevel,
    PhaseEvidence,
    PlanEvidence,
    PrefixEvidence,
    QueueEvidence,
    ServerEvidence,
    SweepEvidence,
)
from pdscope.doctor.forecast import forecast, forecast_chart
from pdscope.doctor.rules import Finding, diagnose
from pdscope.errors import InputError, RunError
from pdscope.experiments.common import CeilingInputs, connect, find_ceiling_inputs
from pdscope.experiments.context import ContextConfig, ContextResult, run_context
from pdscope.experiments.interference import (
    InterferenceConfig,
    InterferenceResult,
    run_interference,
)
from pdscope.experiments.prefix import PrefixConfig, PrefixResult, run_prefix
from pdscope.experiments.probe import ProbeConfig, ProbeResult, run_probe
from pdscope.experiments.setup import lab_flags, read_settings
from pdscope.experiments.sweep import SweepConfig, SweepResult, run_sweep
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
from pdscope.servers import ServerSettings
from pdscope.slo import SLO
from pdscope.stats import percentile
from pdscope.workload.datasets import Lengths

# The objectives the load levels and the forecast are judged by unless the caller gives others.
DEFAULT_SLO = SLO(ttft_s=2.0, itl_s=0.2)


@dataclass(frozen=True, kw_only=True)
class DoctorConfig(ClientOptions):
    """A doctor run: ``quick`` leaves out the context sweep and shortens the rest; the SLO the
    load levels are judged by; where the run folder goes; earlier runs to set beside this one."""

    quick: bool = False
    device: str | None = None
    model_config: str | None = None
    slo: SLO = DEFAULT_SLO
    out: Path = Path("runs/doctor")
    compare_with: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
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
        decode_ceiling_tok_s=decode_ceiling.tok_s if decode_ceiling else None,
        prefill_ceiling_tok_s=prefill_ceiling.tok_s if prefill_ceiling else None,
        ttft_floor_s=prefill_ceiling.ttft_s if prefill_ceiling else None,
        kv_share_of_step=decode_ceiling.kv_share if decode_ceiling and decode_ceiling.context
        else None,
        context=decode_ceiling.context if decode_ceiling else probe.mean_context,
        runs=len(probe.runs),
    )


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

        def sec(key: str, summary: dict[str, Any] = summary) -> float | None:
            value = summary.get(key)
            return value / 1000 if value is not None else None

        ttft99, itl99 = sec("p99_ttft_ms"), sec("p99_itl_ms")
        meets = (ttft99 is not None and itl99 is not None and summary["failed"] == 0
                 and ttft99 <= slo_ttft_s and itl99 <= slo_itl_s)
        levels.append(LoadLevel(
            concurrency=int(summary["stage"]["concurrency"] or 0),
            completed=summary["completed"], failed=summary["failed"],
            request_throughput=summary["request_throughput"],
            output_throughput=summary["output_throughput"], ttft_p50_s=sec("median_ttft_ms"),
            ttft_p99_s=ttft99, itl_p50_s=sec("median_itl_ms"), itl_p99_s=itl99,
            meets_slo=meets,
        ))
    return LoadEvidence(tuple(levels), slo_ttft_s, slo_itl_s)


def queue_evidence(metrics_path: Path) -> QueueEvidence | None:
    """The worst window (most requests waiting) of the /metrics recorded beside the load."""
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
    return QueueEvidence(
        max_waiting=worst.num_requests_waiting,
        kv_usage_at_max_waiting=worst.kv_cache_usage,
        waiting_for_capacity=worst.waiting_capacity,
        preemptions=whole.preemptions,
        queueing=classify_queueing(worst),
        kv_usage_exported=worst.kv_cache_usage is not None,
        windows=len(snaps) - 1,
    )


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
    hint = "give a folder an earlier `pdscope doctor --out` wrote"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not JSON"
        raise InputError(f"cannot read {path} ({why}): {hint}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a doctor's evidence (a JSON {type(data).__name__},"
                         f" not an object): {hint}")
    runs = data.get("interference") or []
    if not isinstance(runs, list):
        raise InputError(f"{path}: interference is not a list: {hint}")
    names = {f.name for f in dataclasses.fields(InterferenceEvidence)}
    required = {f.name for f in dataclasses.fields(InterferenceEvidence)
                if f.default is dataclasses.MISSING}
    out = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise InputError(f"{path}: interference[{i}] is not an object: {hint}")
        unknown = sorted(set(run) - names)
        missing = sorted(required - set(run))
        if unknown or missing:
            what = "; ".join(x for x in (
                f"unknown keys {', '.join(unknown)}" if unknown else "",
                f"missing {', '.join(missing)}" if missing else "") if x)
            raise InputError(f"{path}: interference[{i}] has {what}: {hint}")
        out.append(InterferenceEvidence(**run))
    return out


# ---------------------------------------------------------------------------- the run


# The load levels' workload: long prompts (prefill shares the steps with decode) and short
# answers, so that a level takes seconds.
LOAD_INPUT_TOKENS = 1000
LOAD_OUTPUT_TOKENS = 32


async def run_doctor(url: str, config: DoctorConfig,
                     progress: StatusFn | None = None) -> DoctorRun:
    """Run what the server allows and diagnose it. Writes nothing; see
    :func:`pdscope.doctor.report.write_run`. The server is detected once and every experiment
    runs on that connection."""
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
        probe = await run_probe(conn, ProbeConfig(
            prompt_tokens=512, max_tokens=64 if quick else 128, runs=3 if quick else 5,
            api=config.api, model=config.model, api_key=config.api_key))
        model_name = probe.target.model
        common: dict[str, Any] = {"api": config.api, "model": model_name,
                                  "api_key": config.api_key}

        say("sweep: TTFT against prompt length")
        sweep = await run_sweep(conn, SweepConfig(
            prompt_tokens=(200, 1000, 2000) if quick else (200, 500, 1000, 2000),
            max_tokens=16 if quick else 32, runs=1 if quick else 2, **common))
        results["sweep"] = sweep.to_json()
        charts.extend(sweep.charts())

        say("prefix: a repeated system prompt, cold and warm")
        prefix = await run_prefix(conn, PrefixConfig(
            prefix_tokens=1000 if quick else 1500, suffix_tokens=50 if quick else 100,
            requests=3 if quick else 5, **common))
        results["prefix"] = prefix.to_json()
        charts.extend(prefix.charts())

        interference: list[InterferenceEvidence] = []
        if server.family.serial:
            skipped["interference"] = f"{server.kind} serves one request at a time"
        else:
            say("interference: a long prompt injected into running streams")
            injected = await run_interference(conn, InterferenceConfig(
                streams=4, stream_tokens=160 if quick else 256, inject_tokens=1800, **common))
            results["interference"] = injected.to_json()
            charts.extend(injected.charts())
            interference.append(interference_evidence(injected, settings))
        for folder in config.compare_with:
            interference.extend(previous_interference(folder))

        context: ContextResult | None = None
        if quick:
            skipped["context"] = "left out of --quick"
        else:
            say("context: decode as the context fills")
            context = await run_context(conn, ContextConfig(
                prompt_tokens=(200, 2000), max_tokens=256, **common))
            results["context"] = context.to_json()
            charts.extend(context.charts())

        load: LoadEvidence | None = None
        queue: QueueEvidence | None = None
        if server.family.serial:
            skipped["capacity"] = f"{server.kind} serves one request at a time"
        else:
            say("capacity: a short concurrency sweep with /metrics recorded")
            levels = (1, 8) if quick else (1, 4, 16)
            stages = [Stage(concurrency=c, num_prompts=max(4, 2 * c)) for c in levels]
            folder = config.out / "capacity"
            bench = await run_bench(
                url, BenchConfig(model=model_name, api=config.api, api_key=config.api_key),
                stages, Workload(input_len=Lengths("fixed", LOAD_INPUT_TOKENS),
                                 output_len=Lengths("fixed", LOAD_OUTPUT_TOKENS)), folder,
                server=server)
            results["capacity"] = bench.summaries
            load = load_evidence(bench, config.slo)
            queue = queue_evidence(folder / "metrics.jsonl")
            charts.append(load_chart(load))

        plan: PlanEvidence | None = None
        say("plan: calibrating the planner on this server")
        try:
            calibration = await run_calibration(conn, CalibrationConfig(
                runs=1, api=config.api, model=model_name, api_key=config.api_key))
        except (RunError, InputError) as exc:
            skipped["plan"] = f"the planner's calibration failed: {exc}"
        else:
            results["plan"] = calibration.to_json()
            plan = forecast(calibration, config.slo, LOAD_INPUT_TOKENS, LOAD_OUTPUT_TOKENS,
                            [lv.concurrency for lv in load.levels] if load else ())
            charts.append(forecast_chart(plan, load))

        say("ceilings: this model on this device")
        ceiling = await find_ceiling_inputs(conn, model_name, device=config.device,
                                            model_config=config.model_config,
                                            api_key=config.api_key)
    probe = replace(probe, device=ceiling.device, model=ceiling.model,
                    model_source=ceiling.model_source)
    results["probe"] = probe.to_json()
    # Its timing records stay (pdscope compare tests a change on them), without the text.
    for record in results["probe"].get("requests") or []:
        record.pop("output_text", None)

    evidence = Evidence(
        server=ServerEvidence(kind=server.kind, version=server.version, model=model_name,
                              url=server.base_url, flags=flags, settings=settings.to_json()),
        hardware=hardware_evidence(ceiling),
        phases=phase_evidence(probe),
        sweep=sweep_evidence(sweep),
        context=context_evidence(context) if context is not None else None,
        prefix=prefix_evidence(prefix),
        interference=tuple(interference),
        load=load,
        queue=queue,
        plan=plan,
        notes=tuple(ceiling.notes) + tuple(f"{k} skipped: {v}" for k, v in skipped.items()),
    )
    return DoctorRun(evidence, diagnose(evidence), charts, results, skipped, probe)


__all__ = ["DoctorConfig", "DoctorRun", "run_doctor"]
