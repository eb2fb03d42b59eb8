"""pdscope doctor end to end on the reference server, and its report opened in Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from pdscope.report.svg import PALETTE
from pdscope.selftest import ReferenceConfig, run_in_subprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def doctor_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("doctor")
    config = ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0.00005, itl_s=0.005)
    with run_in_subprocess(config) as url:
        r = subprocess.run([sys.executable, "-m", "pdscope", "doctor", url, "--quick",
                            "--device", "h100-sxm", "--out", str(out), "--json"],
                           capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (out / "stdout.json").write_text(r.stdout)
    yield out


def test_doctor_writes_evidence_findings_and_report(doctor_out: Path) -> None:
    findings = json.loads((doctor_out / "findings.json").read_text())
    ids = {f["id"] for f in findings}
    for rid in ("decode-near-ceiling", "prefix-cache-off", "long-prompt", "queueing-capacity",
                "prefill-interference", "tail-latency-batching", "cold-start", "disaggregation"):
        assert rid in ids
    for f in findings:
        assert set(f) >= {"id", "severity", "title", "evidence", "advice", "status"}
    by_id = {f["id"]: f for f in findings}
    # The reference server has no prefix cache: a repeated prefix costs as much as a new one.
    assert by_id["prefix-cache-off"]["status"] == "fired"
    # What a cache would save: the 1,000-token prefix (--quick) at 0.05 ms a token, 0.05 s.
    assert by_id["prefix-cache-off"]["evidence"]["missing_saving_s"] == pytest.approx(
        0.00005 * 1000, rel=0.3)
    # It streams every request on its own schedule: no stall when a long prompt arrives.
    assert by_id["prefill-interference"]["status"] == "clear"
    # Every prompt it was sent it reports whole (its tokenizer is the client's).
    assert by_id["prompt-truncated"]["status"] == "clear"
    # It is no model: the ceiling rules say what they lack instead of guessing.
    assert by_id["decode-near-ceiling"]["status"] == "insufficient"
    evidence = json.loads((doctor_out / "evidence.json").read_text())
    assert evidence["server"]["kind"] == "pdscope-reference"
    assert evidence["sweep"]["b_s_per_token"] == pytest.approx(0.00005, rel=0.3)
    assert set(evidence["experiments"]) >= {"probe", "sweep", "prefix", "interference",
                                            "capacity"}
    # The planner, calibrated during the run, says how many users the server holds at the SLO
    # and draws its curve with the measured load levels on it.
    assert by_id["capacity"]["status"] == "fired"
    assert by_id["capacity"]["evidence"]["predicted_users"] >= 1
    assert by_id["capacity"]["evidence"]["levels"] == [1, 8]
    assert evidence["plan"]["curve"][0][0] == 1
    html = (doctor_out / "report.html").read_text()
    assert "plan-capacity" in html
    # The library's notes name fields; the doctor's files, written by the CLI, its flags.
    assert evidence["skipped"]["context"] == "left out of --quick"
    assert "context skipped: left out of --quick" in evidence["notes"]
    assert any(" --slo ttft:" in a and "--input-len" in a for a in by_id["capacity"]["advice"])
    assert "left out of --quick" in html and "left out of quick" not in html
    stdout = json.loads((doctor_out / "stdout.json").read_text())
    assert stdout["skipped"]["context"] == "left out of --quick"
    assert html.count("<svg") >= 5
    assert "<script" not in html  # self-contained and static: nothing to fetch or run


@pytest.mark.browser
def test_report_opens_in_headless_chromium_and_shows_its_charts(doctor_out: Path) -> None:
    assert CHROMIUM, "Chromium is not installed: .ci/run installs it (apt-get install chromium)"
    shot = doctor_out / "report.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={doctor_out / 'chromium'}"]
    dom = subprocess.run([*common, "--dump-dom", (doctor_out / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # Parsed and laid out as a document: every chart is an svg element with drawn marks.
    assert dom.stdout.count('class="chart"') >= 5
    assert dom.stdout.count('class="point"') + dom.stdout.count('class="series"') > 20
    r = subprocess.run([*common, "--hide-scrollbars", "--window-size=1100,2600",
                        f"--screenshot={shot}", (doctor_out / "report.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20) or []
    seen = {c for _, c in colors}
    # The series colours were painted: charts rendered, not blank boxes.
    palette = {tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in PALETTE[:3]}
    assert len(palette & seen) >= 2, "chart colours missing from the screenshot"
    painted = sum(n for n, c in colors if c in palette)
    assert painted > 2000
