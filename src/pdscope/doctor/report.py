"""The doctor's run as a report: the HTML page, and the run folder (evidence, findings, page)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pdscope.doctor.run import DOCTOR_METRICS, DoctorRun, doctor_figures
from pdscope.errors import InputError, worded
from pdscope.figures import Figures, ResultKind, register
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
        most = "at most " if ph.ttft_floor_beaten else ""
        prefill_lines.append(f"TTFT floor on this device: {most}{seconds(ph.ttft_floor_s)}")
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
                  ph.prefill_tok_s, ph.prefill_ceiling_tok_s, "prompt tok/s", prefill_lines,
                  at_least=ph.prefill_ceiling_beaten),
        PhaseCard("Decode (tokens per second)", f"{ph.decode_tok_s:,.1f} tok/s",
                  ph.decode_tok_s, ph.decode_ceiling_tok_s, "tok/s", decode_lines,
                  at_least=ph.decode_ceiling_beaten),
    ]


def _own_name(field: str) -> str:
    return field


def report_html(run: DoctorRun, naming: Callable[[str], str] = _own_name) -> str:
    """The report page; each field a note names called ``naming(field)`` (as
    :func:`write_run`)."""
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
    raw = worded({"evidence": ev.to_json(), "skipped": run.skipped}, naming)
    return render(title="pdscope doctor", subtitle=sub, phases=phase_cards(run),
                  findings=worded([f.to_json() for f in run.findings], naming),
                  charts=run.charts, tables=tables, raw=raw,
                  warnings=ev.phases.ceiling_warnings if ev.phases else ())


def write_run(run: DoctorRun, folder: Path,
              naming: Callable[[str], str] = _own_name) -> dict[str, Path]:
    """evidence.json, findings.json and report.html in ``folder``. A note that names a field
    (an :class:`~pdscope.errors.Note`: a hint, a reason a part was skipped) calls it
    ``naming(field)``: its own name by default, the flag a person typed from the CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "evidence": folder / "evidence.json",
        "findings": folder / "findings.json",
        "report": folder / "report.html",
    }
    paths["evidence"].write_text(json.dumps(worded(run.saved_evidence(), naming), indent=2,
                                            default=str))
    paths["findings"].write_text(json.dumps(worded([f.to_json() for f in run.findings],
                                                   naming), indent=2))
    paths["report"].write_text(report_html(run, naming))
    return paths


def read_doctor_folder(path: Path) -> Figures:
    """The figures of a folder :func:`write_run` wrote. :class:`InputError` when it cannot."""
    try:
        evidence = json.loads((path / "evidence.json").read_text(encoding="utf-8"))
        findings = json.loads((path / "findings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable doctor folder: {exc}") from None
    return doctor_figures(evidence, findings)


DOCTOR = register(ResultKind("doctor", DOCTOR_METRICS, marker="findings.json",
                             read_folder=read_doctor_folder))
