"""The doctor's run: the article's experiments on one server, reduced to evidence.

In order: the probe (both phases, the cold run kept apart), the prompt-length sweep, the
prefix-cache A/B, the prefill-interference experiment, the context sweep (not in ``quick``), and
a short concurrency sweep with the server's ``/metrics`` recorded beside it (capacity and
queueing). Each experiment the server cannot take (llama-cpp-python serves one request at a
time: no interference, no concurrency) is skipped with the reason, and the rules that needed it
say so. Nothing here judges: :func:`pdscope.doctor.rules.diagnose` does.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdscope import lab, roofline
from pdscope.doctor.evidence import (
    ContextEvidence,
    Evidence,
    HardwareEvidence,
    InterferenceEvidence,
    LoadEvidence,
    LoadLevel,
    PhaseEvidence,
    PrefixEvidence,
    QueueEvidence,
    ServerEvidence,
    SweepEvidence,
)
from pdscope.doctor.rules import Finding, diagnose
from pdscope.errors import RunError
from pdscope.experiments.common import CeilingInputs, Chart, Series, find_ceiling_inputs
from pdscope.experiments.context import ContextConfig, ContextResult, run_context
from pdscope.experiments.interference import (
    InterferenceConfig,
    InterferenceResult,
    run_interference,
)
from pdscope.experiments.prefix import PrefixConfig, PrefixResult, run_prefix
from pdscope.experiments.probe import ProbeConfig, ProbeResult, is_loopback, run_probe
from pdscope.experiments.sweep import SweepConfig, SweepResult, run_sweep
from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.runner import Stage
from pdscope.metrics import (
    classify_queueing,
    detect_family,
    load_recording,
    make_window,
    peak_waiting_window,
)
from pdscope.workload.datasets import Lengths

# Servers that answer one request at a time: concurrency experiments would only measure a queue.
SERIAL_SERVERS = {"llama-cpp-python"}


@dataclass(frozen=True)
class DoctorConfig:
    quick: bool = False
    api: str = "auto"
    model: str | None = None
    api_key: str | None = None
    device: str | None = None
    model_config: str | None = None
    slo_ttft_ms: float = 2000.0
    slo_itl_ms: float = 200.0
    out: Path = Path("runs/doctor")
    compare_with: tuple[Path, ...] = ()


@dataclass
class DoctorRun:
    """What the doctor measured and concluded."""

    evidence: Evidence
    findings: list[Finding]
    charts: list[Chart]
    results: dict[str, Any] = field(default_factory=dict)  # each experiment's JSON
    skipped: dict[str, str] = field(default_factory=dict)
    probe: ProbeResult | None = None


ProgressFn = Callable[[str], None]


def budget_label(kind: str, flags: tuple[str, ...]) -> tuple[int | None, str]:
    """The prefill token budget a server runs with, from its flags when known."""
    text = " ".join(flags)
    m = re.search(r"--max-num-batched-tokens[ =](\d+)", text)
    if m:
        return int(m.group(1)), f"--max-num-batched-tokens {m.group(1)}"
    m = re.search(r"--chunked-prefill-size[ =](\d+)", text)
    if m:
        return int(m.group(1)), f"--chunked-prefill-size {m.group(1)}"
    if kind == "vllm":
        # vLLM for CPU schedules 2,048 tokens a step by default (the lab's captures show it).
        return 2048, "default budget (vLLM, 2048 tokens a step)"
    return None, "the server's default budget"


def _lab_flags(url: str) -> tuple[str, ...]:
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for server in lab.recorded():
        if str(server.port) == port and server.alive():
            return tuple(server.extra_args)
    return ()


# ---------------------------------------------------------------------------- reductions


def hardware_evidence(ceiling: CeilingInputs) -> HardwareEvidence | None:
    if ceiling.device is None or ceiling.model is None:
        return None
    d, m = ceiling.device, ceiling.model
    peak = roofline.peak_flops(m, d)
    return HardwareEvidence(
        device=d.name,
        measured=d.measured,
        mem_bandwidth_gb_s=d.mem_bandwidth_gb_s,
        peak_tflops=peak / 1e12 if peak else None,
        weight_bytes_read=m.read_weight_bytes(),
        weight_bytes=m.total_weight_bytes(),
        kv_bytes_per_token=roofline.kv_bytes_per_token(m) if m.has_attention_shape else None,
        parameters=m.parameters,
        active_parameters=m.active_parameters,
        bytes_per_weight=m.bytes_per_weight,
        device_id=d.id,
    )


def phase_evidence(p: ProbeResult) -> PhaseEvidence | None:
    ttft, decode = p.ttft, p.decode
    if ttft is None or decode is None:
        return None
    dc, pc = p.decode_ceiling, p.prefill_ceiling
    itl = p.itl_all
    from pdscope.stats import percentile

    return PhaseEvidence(
        prompt_tokens=p.prompt_tokens or p.config.prompt_tokens,
        output_tokens=p.output_tokens or p.config.max_tokens,
        ttft_s=ttft.median,
        prefill_tok_s=p.prefill.median if p.prefill else None,
        decode_tok_s=decode.median,
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        cold_ttft_s=p.cold.ttft_s,
        decode_ceiling_tok_s=dc.tok_s if dc else None,
        prefill_ceiling_tok_s=pc.tok_s if pc else None,
        ttft_floor_s=pc.ttft_s if pc else None,
        kv_share_of_step=dc.kv_share if dc and dc.context else None,
        context=dc.context if dc else p.mean_context,
        runs=len(p.runs),
    )


def sweep_evidence(s: SweepResult) -> SweepEvidence | None:
    fit = s.fit
    if fit.a is None or fit.b is None:
        return None
    pts = [p for p in s.points if p.ttft is not None]
    return SweepEvidence(
        prompt_tokens=tuple(p.prompt_tokens for p in pts),
        ttft_s=tuple(p.ttft.median for p in pts if p.ttft),
        decode_tok_s=tuple(p.decode.median if p.decode else math.nan for p in pts),
        a_s=max(fit.a, 0.0),
        b_s_per_token=fit.b,
        c_s_per_token2=fit.c,
        r2=fit.r2,
        decode_rate_change=s.decode_rate_change,
    )


def context_evidence(c: ContextResult) -> ContextEvidence:
    bins = c.bins
    fit = c.fit
    return ContextEvidence(
        contexts=tuple(int(b.context) for b in bins),
        decode_tok_s=tuple(b.decode_tok_s for b in bins),
        slope_s_per_token=fit.coef[1] if fit is not None and len(fit.coef) > 1 else None,
        predicted_slope_s_per_token=c.slope_predicted,
    )


def prefix_evidence(p: PrefixResult) -> PrefixEvidence | None:
    warm, unique = p.ttft_warm, p.ttft_unique
    detected = p.prefix_cache_detected
    if warm is None or unique is None or p.cold.ttft_s is None or detected is None:
        return None
    cached = p.cached.warm_median
    return PrefixEvidence(
        prefix_tokens=p.prefix.tokens,
        suffix_tokens=p.prompt_tokens - p.prefix.tokens,
        cold_ttft_s=p.cold.ttft_s,
        warm_ttft_s=warm.median,
        unique_ttft_s=unique.median,
        detected=detected,
        cached_tokens=int(cached) if cached is not None else None,
    )


def interference_evidence(r: InterferenceResult, flags: tuple[str, ...]) -> InterferenceEvidence:
    before, during, _ = r.windows()
    budget, label = budget_label(r.server.kind, flags)
    return InterferenceEvidence(
        streams=len(r.streams),
        inject_tokens=r.inject_tokens,
        p99_before_s=before.itl_p99_s,
        p99_during_s=during.itl_p99_s,
        max_gap_during_s=r.stall_s,
        budget_tokens=budget,
        label=label,
    )


def load_evidence(b: BenchResult, slo_ttft_s: float, slo_itl_s: float) -> LoadEvidence:
    levels = []
    for s in b.summaries:

        def sec(key: str, s: dict[str, Any] = s) -> float | None:
            v = s.get(key)
            return v / 1000 if v is not None else None

        ttft99, itl99 = sec("p99_ttft_ms"), sec("p99_itl_ms")
        meets = (ttft99 is not None and itl99 is not None and s["failed"] == 0
                 and ttft99 <= slo_ttft_s and itl99 <= slo_itl_s)
        levels.append(LoadLevel(
            concurrency=int(s["stage"]["concurrency"] or 0), completed=s["completed"],
            failed=s["failed"], request_throughput=s["request_throughput"],
            output_throughput=s["output_throughput"], ttft_p50_s=sec("median_ttft_ms"),
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
    family = detect_family(snaps[-1].names)
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
    lv = [x for x in load.levels if x.itl_p99_s is not None]
    return Chart(
        "load-throughput-latency", "Throughput against p99 ITL (one point a concurrency)",
        "output tokens/s", "p99 ITL (ms)",
        (Series("p99 ITL", tuple(x.output_throughput for x in lv),
                tuple((x.itl_p99_s or 0) * 1000 for x in lv), kind="line"),
         Series("p50 ITL", tuple(x.output_throughput for x in lv),
                tuple((x.itl_p50_s or 0) * 1000 for x in lv), kind="line")),
    )


def previous_interference(folder: Path) -> list[InterferenceEvidence]:
    """Interference runs of an earlier doctor run (``--compare-with``), to set beside this one."""
    path = folder / "evidence.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        raise RunError(f"cannot read {path}: give a folder an earlier `pdscope doctor --out`"
                       " wrote") from None
    return [InterferenceEvidence(**i) for i in data.get("interference") or []]


# ---------------------------------------------------------------------------- the run


async def run_doctor(url: str, config: DoctorConfig,
                     progress: ProgressFn | None = None) -> DoctorRun:
    """Run what the server allows and diagnose it. Writes nothing; see :func:`write_run`."""
    say = progress or (lambda _: None)
    quick = config.quick
    common: dict[str, Any] = {"api": config.api, "model": config.model,
                              "api_key": config.api_key}
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    charts: list[Chart] = []

    say("probe: both phases")
    probe = await run_probe(url, ProbeConfig(
        prompt_tokens=512, max_tokens=64 if quick else 128, runs=3 if quick else 5,
        api=config.api, model=config.model, api_key=config.api_key))
    model_name = probe.target.model
    kind = probe.server.kind
    flags = _lab_flags(probe.server.base_url) if is_loopback(url) else ()
    serial = kind in SERIAL_SERVERS

    say("sweep: TTFT against prompt length")
    sweep = await run_sweep(url, SweepConfig(
        prompt_tokens=(200, 1000, 2000) if quick else (200, 500, 1000, 2000),
        max_tokens=16 if quick else 32, runs=1 if quick else 2, **common))
    results["sweep"] = sweep.to_json()
    charts.extend(sweep.charts())

    say("prefix: a repeated system prompt, cold and warm")
    prefix = await run_prefix(url, PrefixConfig(
        prefix_tokens=1000 if quick else 1500, suffix_tokens=50 if quick else 100,
        requests=3 if quick else 5, **common))
    results["prefix"] = prefix.to_json()
    charts.extend(prefix.charts())

    interference: list[InterferenceEvidence] = []
    if serial:
        skipped["interference"] = f"{kind} serves one request at a time"
    else:
        say("interference: a long prompt injected into running streams")
        inj = await run_interference(url, InterferenceConfig(
            streams=4, stream_tokens=160 if quick else 256, inject_tokens=1800, **common))
        results["interference"] = inj.to_json()
        charts.extend(inj.charts())
        interference.append(interference_evidence(inj, flags))
    for folder in config.compare_with:
        interference.extend(previous_interference(folder))

    context: ContextResult | None = None
    if quick:
        skipped["context"] = "left out of --quick"
    else:
        say("context: decode as the context fills")
        context = await run_context(url, ContextConfig(
            prompt_tokens=(200, 2000), max_tokens=256, **common))
        results["context"] = context.to_json()
        charts.extend(context.charts())

    load: LoadEvidence | None = None
    queue: QueueEvidence | None = None
    if serial:
        skipped["capacity"] = f"{kind} serves one request at a time"
    else:
        say("capacity: a short concurrency sweep with /metrics recorded")
        levels = (1, 8) if quick else (1, 4, 16)
        stages = [Stage(concurrency=c, num_prompts=max(4, 2 * c)) for c in levels]
        folder = config.out / "capacity"
        bench = await run_bench(url, BenchConfig(model=config.model, api=config.api,
                                                 api_key=config.api_key),
                                stages, Workload(input_len=Lengths("fixed", 1000),
                                                 output_len=Lengths("fixed", 32)), folder)
        results["capacity"] = bench.summaries
        load = load_evidence(bench, config.slo_ttft_ms / 1000, config.slo_itl_ms / 1000)
        queue = queue_evidence(folder / "metrics.jsonl")
        charts.append(load_chart(load))

    say("ceilings: this model on this device")
    ceiling = await find_ceiling_inputs(url, model_name, device=config.device,
                                        model_config=config.model_config,
                                        api_key=config.api_key)
    probe = replace(probe, device=ceiling.device, model=ceiling.model,
                    model_source=ceiling.model_source)
    results["probe"] = probe.to_json()
    results["probe"].pop("requests", None)

    evidence = Evidence(
        server=ServerEvidence(kind=kind, version=probe.server.version, model=model_name,
                              url=probe.server.base_url, flags=flags),
        hardware=hardware_evidence(ceiling),
        phases=phase_evidence(probe),
        sweep=sweep_evidence(sweep),
        context=context_evidence(context) if context is not None else None,
        prefix=prefix_evidence(prefix),
        interference=tuple(interference),
        load=load,
        queue=queue,
        notes=tuple(ceiling.notes) + tuple(f"{k} skipped: {v}" for k, v in skipped.items()),
    )
    return DoctorRun(evidence, diagnose(evidence), charts, results, skipped, probe)


def write_run(run: DoctorRun, folder: Path) -> dict[str, Path]:
    """evidence.json, findings.json and report.html in ``folder``."""
    from pdscope.doctor.report import report_html

    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "evidence": folder / "evidence.json",
        "findings": folder / "findings.json",
        "report": folder / "report.html",
    }
    evidence = run.evidence.to_json()
    evidence["experiments"] = run.results
    evidence["skipped"] = run.skipped
    paths["evidence"].write_text(json.dumps(evidence, indent=2, default=str))
    paths["findings"].write_text(json.dumps([f.to_json() for f in run.findings], indent=2))
    paths["report"].write_text(report_html(run))
    return paths


__all__ = ["DoctorConfig", "DoctorRun", "run_doctor", "write_run"]
