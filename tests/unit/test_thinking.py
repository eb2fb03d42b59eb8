"""A model that thinks before it answers, as the doctor, the bench summary, the probe and
compare see it: "prefill 0.4 s, thinking 18 s", and how to turn the thinking off."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdscope.client import RequestRecord
from pdscope.compare import compare
from pdscope.doctor.evidence import Evidence, ServerEvidence, ThinkingEvidence
from pdscope.doctor.rules import THINKING_NOTICEABLE_S, thinking
from pdscope.doctor.run import thinking_evidence
from pdscope.experiments import ProbeConfig, run_probe
from pdscope.load import Stage, StageRun, summarize_stage
from pdscope.load.runner import Finished
from pdscope.load.summary import StageSummary
from pdscope.selftest import ReferenceConfig, serving
from pdscope.servers import advice_for
from pdscope.units import NS
from tests.unit.test_client_support import run

MS = 1_000_000


def evidence(t: ThinkingEvidence | None, kind: str = "vllm") -> Evidence:
    return Evidence(server=ServerEvidence(kind=kind), thinking=t)


# ---------------------------------------------------------------------------- the finding


def test_eighteen_seconds_of_thinking_after_a_short_prefill_fires_and_says_both() -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=True, runs=5, ttft_s=0.4, ttfo_s=18.4,
                                           thinking_s=18.0, reasoning_tokens=900,
                                           output_tokens=1000, answered=5)))
    assert f.fired and f.severity == "high"
    assert "prefill 0.40 s, thinking 18.0 s" in f.reason
    assert "900 reasoning tokens" in f.reason
    assert f.evidence["thinking_share_of_ttfo"] == pytest.approx(18.0 / 18.4)
    assert "enable_thinking" in f.advice[0]  # vLLM's switch


@pytest.mark.parametrize(("kind", "switch"), [
    ("ollama", '"think": false'),
    ("llama.cpp", "--reasoning-budget 0"),
    ("sglang", "enable_thinking"),
    ("openai", "reasoning_effort"),
])
def test_the_advice_names_each_server_s_switch(kind: str, switch: str) -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=True, runs=3, ttft_s=0.2, ttfo_s=3.2,
                                           thinking_s=3.0, reasoning_tokens=150,
                                           output_tokens=200, answered=3), kind))
    assert f.fired and switch in f.advice[0]


def test_thinking_shorter_than_the_prefill_is_clear() -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=True, runs=3, ttft_s=2.0, ttfo_s=2.9,
                                           thinking_s=0.9, reasoning_tokens=40,
                                           output_tokens=100, answered=3)))
    assert f.status == "clear" and "thinking 0.90 s" in f.reason


def test_a_short_thought_is_clear() -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=True, runs=3, ttft_s=0.05,
                                           ttfo_s=0.05 + THINKING_NOTICEABLE_S / 2,
                                           thinking_s=THINKING_NOTICEABLE_S / 2,
                                           reasoning_tokens=10, output_tokens=50, answered=3)))
    assert f.status == "clear"


def test_a_model_that_does_not_reason_is_clear() -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=False, runs=5, ttft_s=0.3)))
    assert f.status == "clear" and "no stream carried reasoning" in f.reason


def test_without_a_probe_the_finding_is_insufficient() -> None:
    assert thinking(evidence(None)).status == "insufficient"


def test_a_thought_that_outlasts_the_output_cap_fires() -> None:
    f = thinking(evidence(ThinkingEvidence(reasoned=True, runs=5, ttft_s=0.3, ttfo_s=None,
                                           thinking_s=None, reasoning_tokens=128,
                                           output_tokens=128, answered=0)))
    assert f.fired and "128 of 128 output tokens were reasoning" in f.reason


# ---------------------------------------------------------------------------- the probe, live

ITL_S, N_THOUGHT = 0.01, 60


def probe(reasoning_tokens: int):  # type: ignore[no-untyped-def]
    config = ReferenceConfig(ttft_base_s=0.03, ttft_per_token_s=0.0, itl_s=ITL_S,
                             reasoning_tokens=reasoning_tokens)

    async def main():  # type: ignore[no-untyped-def]
        async with serving(config) as url:
            return await run_probe(url, ProbeConfig(model=config.model, api="openai-chat",
                                                    prompt_tokens=32, max_tokens=80, runs=3))

    return run(main())


@pytest.mark.timeout(60)
def test_the_reference_server_s_thinking_reaches_the_doctor() -> None:
    # 60 reasoning tokens at 10 ms: the first answer token 0.6 s after the first token, on
    # a 30 ms prefill. A busy machine delays a token by milliseconds, not by 0.1 s.
    result = probe(N_THOUGHT)
    assert result.reasoned and result.reasoning_tokens == N_THOUGHT
    t = thinking_evidence(result)
    assert t is not None and t.reasoned and t.answered == 3
    assert t.thinking_s is not None and abs(t.thinking_s - N_THOUGHT * ITL_S) < 0.1
    f = thinking(evidence(t, "pdscope-reference"))
    assert f.fired and "prefill" in f.reason and "thinking 0.6" in f.reason
    d = result.to_json()
    assert d["reasoning_tokens"] == N_THOUGHT and d["thinking_s"] == pytest.approx(0.6, abs=0.1)
    assert set(result.figures().series) >= {"ttfo", "reasoning_tokens"}


@pytest.mark.timeout(60)
def test_compare_sets_ttfo_beside_ttft(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(probe(N_THOUGHT).to_json()))
    b.write_text(json.dumps(probe(N_THOUGHT // 3).to_json()))
    rows = {r.metric: r for r in compare(a, b).rows}
    assert {"ttfo_p50_s", "ttfo_p99_s", "reasoning_tokens_p50"} <= rows.keys()
    assert rows["reasoning_tokens_p50"].a == N_THOUGHT
    assert rows["reasoning_tokens_p50"].b == N_THOUGHT // 3
    assert rows["ttfo_p50_s"].b < rows["ttfo_p50_s"].a  # a third of the thought: sooner


def test_a_probe_of_a_model_that_does_not_reason_has_no_thinking_rows() -> None:
    result = probe(0)
    assert not result.reasoned and result.to_json()["ttfo_s"] is None
    assert "ttfo" not in result.figures().series
    t = thinking_evidence(result)
    assert t is not None and not t.reasoned


# ---------------------------------------------------------------------------- the bench summary


def reasoned_record(send_ms: int, ttft_ms: int, n_thought: int, n: int) -> RequestRecord:
    t0 = send_ms * MS
    times = tuple(t0 + (ttft_ms + 10 * i) * MS for i in range(n))
    return RequestRecord(
        request_id=f"r{send_ms}", api="openai-chat", model="m", t_send_ns=t0,
        t_first_token_ns=times[0], t_last_token_ns=times[-1], token_times_ns=times,
        chunk_tokens=(1,) * n, prompt_tokens=100, output_tokens=n, token_count_source="usage",
        reasoning_tokens=n_thought, t_first_answer_ns=times[n_thought])


def summary(records: list[RequestRecord]) -> StageSummary:
    stage_run = StageRun(Stage(concurrency=1, num_prompts=len(records)), 0, 0.0)
    stage_run.finished = [Finished(i, False, None, r) for i, r in enumerate(records)]
    stage_run.t_end_ns = 2 * NS
    return summarize_stage(stage_run)


def test_the_bench_summary_writes_ttfo_beside_vllm_s_keys() -> None:
    # TTFT 50 ms, then 20 tokens of thought 10 ms apart: TTFO 250 ms.
    s = summary([reasoned_record(100 * i, 50, 20, 30) for i in range(5)])
    d = s.to_json()
    assert d["median_ttft_ms"] == pytest.approx(50)
    assert d["mean_ttfo_ms"] == pytest.approx(250) and d["p99_ttfo_ms"] == pytest.approx(250)
    assert d["median_ttfo_ms"] == pytest.approx(250)
    assert d["total_reasoning_tokens"] == 100 and d["total_output_tokens"] == 150
    assert StageSummary.from_json(d) == s


def test_a_bench_of_a_model_that_does_not_reason_has_no_ttfo_keys() -> None:
    plain = [replace(reasoned_record(100 * i, 50, 20, 30), reasoning_tokens=None,
                     t_first_answer_ns=None) for i in range(3)]
    d = summary(plain).to_json()
    assert "median_ttfo_ms" not in d and "total_reasoning_tokens" not in d
    assert StageSummary.from_json(d).ttfo is None


def test_every_family_has_a_way_to_limit_thinking_or_says_it_has_none() -> None:
    assert advice_for("limit_thinking", "ollama").setting == "think"
    assert advice_for("limit_thinking", "llama.cpp").setting == "--reasoning-budget"
    assert advice_for("limit_thinking", "vllm").setting == "chat_template_kwargs"
    assert advice_for("limit_thinking", "tgi").setting is None
