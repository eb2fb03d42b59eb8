"""No figure above 100% of its ceiling: a measurement that beats a ceiling proves the ceiling
wrong, and every output says so instead of printing 114% of a physical limit.

The reference server is set far faster than the hardware named beside it (Llama 3.1 70B on
one H100: the roofline allows 24 tok/s of decode and about 7,000 prompt tok/s; the reference
decodes 200 tok/s and prefills 100,000), so every ceiling and floor is beaten, by hand."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdscope import roofline
from pdscope.doctor.evidence import Evidence, HardwareEvidence, PhaseEvidence, ServerEvidence
from pdscope.doctor.report import phase_cards, report_html
from pdscope.doctor.rules import diagnose, gpu_upgrade
from pdscope.doctor.run import DoctorRun, phase_evidence
from pdscope.errors import InputError
from pdscope.experiments import ProbeConfig, run_probe
from pdscope.hardware import find_device
from pdscope.metrics.signals import bandwidth_signal
from pdscope.model import load_model
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from tests.conftest import MODEL_CONFIGS

# 0.02 s + 10 µs a prompt token, 5 ms a token: 200 tok/s of decode, 100,000 prompt tok/s.
FAST = ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0.00001, itl_s=0.005)
BIG = MODEL_CONFIGS / "meta-llama__Llama-3.1-70B-Instruct.json"
CEILING_ARGS = ("--device", "h100-sxm", "--model-config", str(BIG))


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(FAST) as url:
        yield url


def percents(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"(\d[\d,]*(?:\.\d+)?)%", text)]


def assert_nothing_above_100(text: str) -> None:
    over = [p for p in percents(text) if p > 100]
    assert not over, f"shares above 100%: {over} in\n{text}"


def pdscope(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "pdscope", *args], capture_output=True,
                       text=True, timeout=180, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return r


# --- the type itself, by hand ---------------------------------------------------------------


def test_a_measurement_above_its_ceiling_raises_the_ceiling_to_it() -> None:
    h = roofline.hold(1228.5, 1077.0, what="prefill rate", unit="tok/s",
                      spec="the CPU's 0.31 TFLOPS", why="the probe's matmul was slower")
    assert h.beaten and h.share == 1.0
    assert h.limit == h.ceiling == 1228.5 and h.spec_limit == 1077.0
    assert h.mark == "at least "
    assert h.warning is not None
    assert "1,228.5 tok/s" in h.warning and "1,077.0 tok/s" in h.warning
    assert "the CPU's 0.31 TFLOPS" in h.warning and "slower" in h.warning


def test_a_measurement_below_its_ceiling_is_its_share() -> None:
    h = roofline.hold(42.1, 221.0, what="decode rate", unit="tok/s", spec="s", why="w")
    assert not h.beaten and h.mark == "" and h.warning is None
    assert h.share == pytest.approx(42.1 / 221.0) and h.ceiling == 221.0
    # At the ceiling exactly is not beyond it.
    assert roofline.hold(221.0, 221.0, what="d", unit="tok/s", spec="s", why="w").share == 1.0


def test_a_time_below_its_floor_lowers_the_floor_to_it() -> None:
    # The README's first example: a TTFT floor of 475.3 ms above a measured 416.8 ms.
    h = roofline.hold(0.4168, 0.4753, what="TTFT", unit="s", spec="s", why="w", kind="floor")
    assert h.beaten and h.share == 1.0 and h.limit == 0.4168 and h.mark == "at most "
    assert h.warning is not None and "416.8 ms" in h.warning and "475.3 ms" in h.warning
    fine = roofline.hold(0.5, 0.25, what="TTFT", unit="s", spec="s", why="w", kind="floor")
    assert not fine.beaten and fine.share == pytest.approx(0.5)


def test_a_held_share_is_checked() -> None:
    with pytest.raises(InputError):
        roofline.hold(1.0, 0.0, what="d", unit="tok/s", spec="s", why="w")
    with pytest.raises(InputError):
        roofline.hold(1.0, 1.0, what="d", unit="tok/s", spec="s", why="w", kind="roof")


def test_the_warning_names_a_measured_cpu_probe_or_the_device_table() -> None:
    cpu = roofline.hold_rate(2.0, 1.0, phase="prefill", device="AMD EPYC (measured)",
                             measured_device=True, mem_bandwidth_gb_s=60.0, peak_tflops=0.3)
    assert cpu.warning is not None and "matmul probes" in cpu.warning
    table = roofline.hold_rate(2.0, 1.0, phase="decode", device="NVIDIA H100 SXM",
                               measured_device=False, mem_bandwidth_gb_s=3350.0,
                               peak_tflops=989.0)
    assert table.warning is not None and "3,350 GB/s in the device table" in table.warning


# --- every output path on a server faster than its hardware ---------------------------------


def test_probe_output_holds_every_ceiling(reference: str) -> None:
    r = pdscope("probe", reference, "--prompt-tokens", "500", "--max-tokens", "16",
                "--runs", "2", *CEILING_ARGS)
    assert_nothing_above_100(r.stdout)
    assert "at least" in r.stdout and "at most" in r.stdout
    assert "warning: the measured decode rate" in r.stdout
    assert "warning: the measured prefill rate" in r.stdout
    assert "that ceiling is wrong" in r.stdout.replace("\n", " ")
    out = json.loads(pdscope("probe", reference, "--prompt-tokens", "500", "--max-tokens",
                             "16", "--runs", "2", *CEILING_ARGS, "--json").stdout)
    assert out["decode_fraction_of_ceiling"] == 1.0
    assert out["prefill_fraction_of_ceiling"] == 1.0
    assert out["decode_ceiling_tok_s"] == out["decode_tok_s"]
    # 3,350 GB/s over 139 GB of weights read a token (all but the input table) and the KV.
    assert out["held"]["decode"]["spec_limit"] == pytest.approx(24, rel=0.03)
    assert out["ttft_floor_s"] == out["ttft_s"]
    assert len(out["ceiling_warnings"]) == 3


def test_sweep_output_holds_every_ceiling(reference: str) -> None:
    r = pdscope("sweep", reference, "--prompt-tokens", "200,1000", "--max-tokens", "8",
                "--runs", "1", *CEILING_ARGS)
    assert_nothing_above_100(r.stdout)
    assert "at least" in r.stdout and "at most" in r.stdout and "warning:" in r.stdout


def test_context_output_holds_every_ceiling(reference: str) -> None:
    r = pdscope("context", reference, "--prompt-tokens", "100,1000", "--max-tokens", "32",
                "--bin-tokens", "16", *CEILING_ARGS)
    assert_nothing_above_100(r.stdout)
    assert "at least" in r.stdout and "warning:" in r.stdout
    assert "100%" in r.stdout


def test_prefix_output_holds_its_floor(reference: str) -> None:
    r = pdscope("prefix", reference, "--prefix-tokens", "1500", "--suffix-tokens", "100",
                "--requests", "2", "--max-tokens", "4", *CEILING_ARGS)
    assert_nothing_above_100(r.stdout)
    assert "held at a unique prompt's TTFT" in r.stdout and "warning:" in r.stdout


def test_interference_output_holds_its_floors(reference: str) -> None:
    r = pdscope("interference", reference, "--streams", "2", "--stream-tokens", "40",
                "--inject-tokens", "1000", *CEILING_ARGS)
    assert_nothing_above_100(r.stdout)
    assert r.stdout.count("held at the measurement") == 2 and "warning:" in r.stdout


def test_the_doctor_and_its_report_hold_every_ceiling(reference: str) -> None:
    h100, model = find_device("h100-sxm"), load_model(str(BIG))
    probe = asyncio.run(run_probe(reference, ProbeConfig(prompt_tokens=500, max_tokens=16,
                                                         runs=2), device=h100, model=model))
    ph = phase_evidence(probe)
    assert ph is not None
    assert ph.decode_ceiling_beaten and ph.prefill_ceiling_beaten and ph.ttft_floor_beaten
    assert ph.decode_fraction == 1.0 and ph.prefill_fraction == 1.0
    hw = HardwareEvidence(device=h100.name, measured=False, mem_bandwidth_gb_s=3350.0,
                          peak_tflops=989.0, weight_bytes_read=model.read_weight_bytes(),
                          weight_bytes=model.total_weight_bytes(), kv_bytes_per_token=None,
                          parameters=model.parameters, active_parameters=model.parameters,
                          bytes_per_weight=2.0)
    ev = Evidence(ServerEvidence("vllm", "0.32.0", "m", reference), hardware=hw, phases=ph)
    findings = diagnose(ev)
    run = DoctorRun(ev, findings, [])
    cards = phase_cards(run)
    assert all(c.fraction == 1.0 and c.at_least for c in cards)
    assert "TTFT floor on this device: at most" in " ".join(cards[0].lines)
    page = report_html(run)
    assert_nothing_above_100(re.sub(r"width:[\d.]+%", "", page))
    assert "of at least" in page and "warning: the measured" in page
    text = " ".join(f"{f.reason} {' '.join(f.advice)}" for f in findings)
    assert_nothing_above_100(text)
    # The terminal's own lines.
    from pdscope.cli.common import console
    from pdscope.cli.doctor import show

    with console.capture() as cap:
        show(run, {"report": Path("report.html")}, 1.0)
    shown = cap.get()
    assert_nothing_above_100(shown)
    assert "allowed: 100%" in shown and "warning: the measured" in shown


def test_a_compute_bound_finding_says_at_least() -> None:
    ph = PhaseEvidence(prompt_tokens=512, output_tokens=64, ttft_s=0.4168, prefill_tok_s=1228.5,
                       decode_tok_s=42.1, itl_p50_s=0.024, itl_p99_s=0.033, cold_ttft_s=0.45,
                       decode_ceiling_tok_s=221.0, prefill_ceiling_tok_s=1228.5,
                       prefill_ceiling_beaten=True)
    hw = HardwareEvidence(device="AMD EPYC (measured)", measured=True, mem_bandwidth_gb_s=62.4,
                          peak_tflops=0.3, weight_bytes_read=269e6, weight_bytes=269e6,
                          kv_bytes_per_token=None, parameters=134.5e6,
                          active_parameters=134.5e6, bytes_per_weight=2.0)
    from pdscope.doctor.evidence import SweepEvidence

    sweep = SweepEvidence((256, 512), (0.2, 0.4168), (42.0, 42.0), 0.0, 0.00082, None, 0.99,
                          0.0)
    f = gpu_upgrade(Evidence(ServerEvidence("vllm"), hardware=hw, phases=ph, sweep=sweep))
    assert f.id == "faster-gpu-will-help"
    assert "100% of the at least 1,228 tok/s" in f.reason


def test_watch_holds_the_bandwidth_it_sets_beside() -> None:
    from tests.unit.test_metrics_signals import CALM

    # The server's estimate: 1.5e12 bytes/s = 1,500 GB/s, beside a device of 1,000 GB/s.
    s = bandwidth_signal(CALM, 1000.0)
    assert_nothing_above_100(s.meaning)
    assert "100% of the device's at least 1,500 GB/s" in s.meaning
    assert "warning:" in s.meaning
    fine = bandwidth_signal(CALM, 3000.0)
    assert "50% of the device's 3,000 GB/s" in fine.meaning and "warning" not in fine.meaning
