"""The doctor's run as a report: the HTML page, and the run folder (evidence, findings, page)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pdscope.doctor.run import DoctorRun
from pdscope.report.fmt import human_bytes, seconds
from pdscope.report.html import PhaseCard, render


def phase_cards(run: DoctorRun) -> list[PhaseCard]:
    """The two phases side by side, each against its ceiling."""
    ev = run.evidence
    ph, hw = ev.phases, ev.hardware
    if ph is None:
        return []
    prefill_lines = [f"{ph.prompt_tokens:,} prompt tokens, median of {ph.runs} runs"]
    if ph.ttft_floor_s is not None:
        prefill_lines.append(f"TTFT floor on this device: {seconds(ph.ttft_floor_s)}")
    if ph.cold_ttft_s is not None:
        prefill_lines.append(f"first (cold) request: {seconds(ph.cold_ttft_s)}")
    if ev.sweep is not None:
        prefill_lines.append(f"each 1,000 prompt tokens add {ev.sweep.b_s_per_token * 1000:.2f} s;"
                             f" fixed part {seconds(ev.sweep.a_s)}")
    decode_lines = []
    if ph.itl_p50_s is not None and ph.itl_p99_s is not None:
        decode_lines.append(f"ITL p50 {seconds(ph.itl_p50_s)}, p99 {seconds(ph.itl_p99_s)}")
    if hw is not None:
        measured = " (measured)" if hw.measured and "measured" not in hw.device else ""
        decode_lines.append(f"{hw.device}: {hw.mem_bandwidth_gb_s:,.1f} GB/s{measured}, reading"
                            f" {human_bytes(hw.weight_bytes_read)} of weights a token")
    return [
        PhaseCard("Prefill (time to first token)", f"{seconds(ph.ttft_s)} TTFT",
                  ph.prefill_tok_s, ph.prefill_ceiling_tok_s, "prompt tok/s", prefill_lines),
        PhaseCard("Decode (tokens per second)", f"{ph.decode_tok_s:,.1f} tok/s",
                  ph.decode_tok_s, ph.decode_ceiling_tok_s, "tok/s", decode_lines),
    ]


def report_html(run: DoctorRun) -> str:
    ev = run.evidence
    sub = (f"{ev.server.kind} {ev.server.version or ''} at {ev.server.url}, model"
           f" {ev.server.model}" + (f", flags {' '.join(ev.server.flags)}" if ev.server.flags
                                     else "")
           + f" — {time.strftime('%Y-%m-%d %H:%M')}")
    tables = []
    if ev.load is not None:
        rows = [[str(lv.concurrency), f"{lv.completed}/{lv.failed}",
                 f"{lv.output_throughput:,.0f}",
                 seconds(lv.ttft_p50_s), seconds(lv.ttft_p99_s), seconds(lv.itl_p50_s),
                 seconds(lv.itl_p99_s), {True: "yes", False: "no", None: "—"}[lv.meets_slo]]
                for lv in ev.load.levels]
        tables.append(("Load: throughput and latency by concurrency",
                       ["streams", "done/failed", "out tok/s", "TTFT p50", "TTFT p99",
                        "ITL p50", "ITL p99", "meets SLO"], rows))
    raw = {"evidence": ev.to_json(), "skipped": run.skipped}
    return render(title="pdscope doctor", subtitle=sub, phases=phase_cards(run),
                  findings=[f.to_json() for f in run.findings], charts=run.charts,
                  tables=tables, raw=raw)


def write_run(run: DoctorRun, folder: Path) -> dict[str, Path]:
    """evidence.json, findings.json and report.html in ``folder``."""
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
