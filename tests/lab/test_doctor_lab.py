"""pdscope doctor on the lab's vLLM and llama-server: the findings follow the server's flags,
and are said in that server's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def doctor(url: str, out: Path, *extra: str) -> dict[str, dict]:
    return run_doctor(url, out, *extra)[0]


def run_doctor(url: str, out: Path, *extra: str) -> tuple[dict[str, dict], str]:
    """The findings by id, and what the doctor printed."""
    r = subprocess.run([sys.executable, "-m", "pdscope", "doctor", url, "--quick", "--out",
                        str(out), *extra], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "What to change" in r.stdout and "report:" in r.stdout
    return {f["id"]: f for f in json.loads((out / "findings.json").read_text())}, r.stdout


@pytest.fixture(scope="module")
def default_run(vllm_server: lab.LabServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("doctor-default")
    doctor(vllm_server.url, out)
    return out


def test_default_vllm_caches_prefixes_and_queues_for_the_scheduler(default_run: Path) -> None:
    findings = {f["id"]: f for f in json.loads((default_run / "findings.json").read_text())}
    # Prefix caching is on by default: the doctor finds it and raises nothing.
    assert findings["prefix-cache-off"]["status"] == "clear"
    # Eight streams of 1,000-token prompts against a 2,048-token step budget: requests wait
    # while the KV pool is nearly empty, which is the scheduler's queue, not a full pool.
    assert findings["queueing-scheduler"]["status"] == "fired"
    assert findings["queueing-scheduler"]["evidence"]["kv_usage"] < 0.9
    assert findings["queueing-capacity"]["status"] == "clear"
    # The decode rate is set beside this machine's measured bandwidth.
    near, far = findings["decode-near-ceiling"], findings["decode-far-below-ceiling"]
    assert "insufficient" not in (near["status"], far["status"])
    assert (default_run / "report.html").stat().st_size > 10_000


def test_without_prefix_caching_and_with_a_small_budget(
    default_run: Path, small_budget_vllm: lab.LabServer, tmp_path: Path
) -> None:
    # The compare tests' server B: prefix caching off, a 64-token step budget.
    findings = doctor(small_budget_vllm.url, tmp_path, "--compare-with", str(default_run))
    off = findings["prefix-cache-off"]
    assert off["status"] == "fired"
    # It says what the cache would save, from the measured TTFTs: most of the unseen prompt's
    # TTFT, as the prefix is 1,000 of its 1,050 tokens. Half of it leaves room for the fixed
    # overhead and the noise; a bound in seconds would hold on one machine's speed only.
    evidence = off["evidence"]
    assert evidence["missing_saving_s"] > 0.5 * evidence["unique_ttft_s"], evidence
    assert "--enable-prefix-caching" in " ".join(off["advice"])
    # Prefill interference, this server beside the default one: the small budget stalled the
    # running streams for less, and the finding says so with both numbers.
    inter = findings["prefill-interference"]
    runs = {r["label"]: r["max_gap_s"] for r in inter["evidence"]["runs"]}
    small = runs["--max-num-batched-tokens 64"]
    large = runs["default budget (vLLM, 2048 tokens a step)"]
    assert small < large
    assert "--max-num-batched-tokens 64" in inter["reason"]
    assert "smaller prefill budget did better" in inter["reason"]
    assert f"{small:.2f} s" in inter["reason"] and f"{large:.2f} s" in inter["reason"]


def test_llama_server_s_findings_are_in_its_own_flags_with_the_numbers(
    llamacpp_server: lab.LabServer, tmp_path: Path
) -> None:
    findings, printed = run_doctor(llamacpp_server.url, tmp_path)
    evidence = json.loads((tmp_path / "evidence.json").read_text())
    assert evidence["server"]["kind"] == "llama.cpp"
    # Eight users on four slots: four wait, for a slot (llama-server defers a request only when
    # none is free), and the advice doubles the slots with the context that keeps each one's.
    queued = findings["queueing-scheduler"]
    assert queued["status"] == "fired", queued
    assert queued["evidence"]["slots"] == 4 and queued["evidence"]["max_waiting"] >= 1
    more = "Raise --parallel from 4 to 8 and --ctx-size from 16,384 to 32,768"
    assert queued["advice"][0].startswith(more)
    assert more in " ".join(printed.split())
    assert findings["queueing-capacity"]["status"] == "clear"
    # The prompt cache is on by default: nothing to change there.
    assert findings["prefix-cache-off"]["status"] == "clear"
    # An 1,800-token prompt in one 2,048-token batch stalls the slots decoding beside it; the
    # advice is llama-server's batch size, with the number.
    stall = findings["prefill-interference"]
    assert stall["status"] == "fired", stall
    assert "(--batch-size 512)" in " ".join(stall["advice"])
    # The planner was calibrated with llama-server's own scheduler: slots, n_batch read.
    plan = evidence["plan"]
    assert plan is not None and not any("token budget" in a for a in plan["assumptions"])
    # On a CPU every weight is in the one memory there is: nothing spilled.
    assert findings["weights-offloaded"]["status"] == "clear"
    # No finding names another server's flags.
    said = json.dumps(findings)
    assert "--max-num" not in said and "--enable-prefix-caching" not in said
