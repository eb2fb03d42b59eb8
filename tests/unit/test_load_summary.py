"""Load-run statistics on hand-made records with known times."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdscope.client import RequestRecord
from pdscope.errors import InputError
from pdscope.load import Stage, StageRun, parse_slo, summarize_stage
from pdscope.load.runner import Finished
from pdscope.load.summary import StageSummary, peak_output_rate, read_summaries, write_summaries
from pdscope.units import NS
from pdscope.workload.datasets import parse_lengths
from pdscope.workload.schedule import arrival_offsets

MS = 1_000_000


def record(send_ms: float, ttft_ms: float, itl_ms: float, n: int, *, error: str | None = None,
           prompt: int = 100) -> RequestRecord:
    t0 = int(send_ms * MS)
    times = tuple(t0 + int((ttft_ms + i * itl_ms) * MS) for i in range(n)) if not error else ()
    return RequestRecord(
        request_id=f"r{send_ms}", api="openai", model="m", t_send_ns=t0,
        t_first_token_ns=times[0] if times else None, t_last_token_ns=times[-1] if times else None,
        token_times_ns=times, chunk_tokens=(1,) * len(times), prompt_tokens=prompt,
        output_tokens=n if not error else None, token_count_source="usage",
        error=error, error_kind=error,  # type: ignore[arg-type]
    )


def stage_run(records: list[RequestRecord], warmup: int = 0, duration_s: float = 2.0) -> StageRun:
    run = StageRun(Stage(concurrency=2, num_prompts=len(records), warmup=warmup), 0, 0.0)
    run.finished = [Finished(i, i < warmup, None, r) for i, r in enumerate(records)]
    run.t_end_ns = int(duration_s * NS)
    return run


def test_percentiles_come_from_completed_requests_only() -> None:
    ok = [record(i * 100, ttft_ms=50 + i, itl_ms=10, n=11) for i in range(10)]
    bad = [record(5000 + i, 0, 0, 0, error="http_5xx") for i in range(3)]
    s = summarize_stage(stage_run(ok + bad)).to_json()
    assert (s["sent"], s["completed"], s["failed"], s["incomplete"]) == (13, 10, 3, 0)
    assert s["failed_by_cause"] == {"http_5xx": 3}
    assert s["median_ttft_ms"] == pytest.approx(54.5, abs=1e-6)  # 50..59
    assert s["mean_tpot_ms"] == pytest.approx(10.0, abs=1e-6)
    assert s["p99_itl_ms"] == pytest.approx(10.0, abs=1e-6)
    assert s["total_output_tokens"] == 110
    assert s["output_throughput"] == pytest.approx(110 / 2.0)
    assert s["request_throughput"] == pytest.approx(10 / 2.0)


def test_warmup_requests_are_left_out_of_the_statistics() -> None:
    records = [record(0, ttft_ms=900, itl_ms=10, n=5)] + [
        record(100 * i, ttft_ms=50, itl_ms=10, n=5) for i in range(1, 5)
    ]
    s = summarize_stage(stage_run(records, warmup=1)).to_json()
    assert s["warmup_requests"] == 1 and s["sent"] == 4
    assert s["max_ttft_ms"] == pytest.approx(50.0)


def test_goodput_counts_requests_within_every_objective() -> None:
    records = [record(0, 100, 10, 5), record(0, 600, 10, 5), record(0, 100, 80, 5)]
    s = summarize_stage(stage_run(records), parse_slo("ttft:500,tpot:50")).to_json()
    assert s["good_requests"] == 1
    assert s["request_goodput"] == pytest.approx(1 / 2.0)


def test_goodput_writes_its_objectives_in_the_milliseconds_given() -> None:
    s = summarize_stage(stage_run([record(0, 100, 10, 5)]),
                        parse_slo("ttft:4.35,e2e:5000")).to_json()
    assert s["goodput_slo_ms"] == {"ttft": 4.35, "e2el": 5000.0}  # vllm bench serve's names
    assert s["good_requests"] == 0


def test_the_summary_holds_seconds_and_writes_vllm_bench_serves_milliseconds() -> None:
    ok = [record(i * 100, ttft_ms=50 + i, itl_ms=10, n=11) for i in range(10)]
    bad = [record(5000, 0, 0, 0, error="http_5xx")]
    summary = summarize_stage(stage_run(ok + bad), parse_slo("ttft:500,tpot:50"))
    assert summary.ttft.median_s == pytest.approx(0.0545)
    assert summary.itl.p99_s == pytest.approx(0.010)
    assert summary.name == "concurrency=2" and summary.failed_by_cause == {"http_5xx": 1}
    data = summary.to_json()
    assert list(data)[:3] == ["stage", "started_at", "duration_s"]
    assert [k for k in data if k.endswith("_ttft_ms")] == [
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms",
        "p99_ttft_ms", "max_ttft_ms"]
    assert list(data)[-3:] == ["goodput_slo_ms", "good_requests", "request_goodput"]
    # Read back, it is the same summary, and writes the same JSON.
    again = StageSummary.from_json(json.loads(json.dumps(data)))
    assert again.goodput == summary.goodput and again.stage == summary.stage
    assert again.ttft.median_s == pytest.approx(summary.ttft.median_s, rel=1e-15)
    assert again.to_json().keys() == data.keys()


def test_a_summary_json_reads_back_as_one_summary_or_a_sweeps(tmp_path: Path) -> None:
    one = summarize_stage(stage_run([record(0, 100, 10, 5)]))
    two = replace(one, stage=Stage(request_rate=float("inf"), num_prompts=1))
    write_summaries(tmp_path / "one.json", [one], sweep=False)
    write_summaries(tmp_path / "two.json", [one, two], sweep=True)
    write_summaries(tmp_path / "none.json", [], sweep=False)
    assert [s.name for s in read_summaries(tmp_path / "one.json")] == ["concurrency=2"]
    assert [s.name for s in read_summaries(tmp_path / "two.json")] == ["concurrency=2",
                                                                       "rate=inf"]
    assert read_summaries(tmp_path / "none.json") == ()
    (tmp_path / "bad.json").write_text('{"stage": 3}')
    with pytest.raises(InputError, match="not a stage summary"):
        read_summaries(tmp_path / "bad.json")


def test_bad_goodput_spec_is_an_input_error() -> None:
    with pytest.raises(InputError):
        parse_slo("latency:5")
    with pytest.raises(InputError):
        parse_slo("ttft:fast")


def test_peak_output_rate_over_one_second_windows() -> None:
    # Two streams of 100 tokens 10 ms apart: 200 tokens in the first second.
    recs = [record(0, 0, 10, 100), record(0, 0, 10, 100), record(3000, 0, 10, 20)]
    finished = [Finished(i, False, None, r) for i, r in enumerate(recs)]
    assert peak_output_rate(finished) == pytest.approx(200.0)
    short = [Finished(0, False, None, record(0, 0, 10, 20))]
    assert peak_output_rate(short) is None  # spans less than a window


def test_poisson_arrivals_have_the_asked_rate_and_are_seeded() -> None:
    offsets = arrival_offsets(4000, 8.0, seed=1)
    assert offsets[0] == 0.0 and offsets == arrival_offsets(4000, 8.0, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 8.0, rel=0.05)
    # Poisson: the gaps' coefficient of variation is 1; burstiness 4 makes them regular.
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv == pytest.approx(1.0, abs=0.08)
    regular = arrival_offsets(4000, 8.0, burstiness=4.0, seed=1)
    g2 = [b - a for a, b in itertools.pairwise(regular)]
    m2 = sum(g2) / len(g2)
    cv2 = (sum((g - m2) ** 2 for g in g2) / len(g2)) ** 0.5 / m2
    assert cv2 == pytest.approx(0.5, abs=0.05)  # 1 / sqrt(shape)


def test_duration_bounds_arrivals_and_inf_sends_all_at_once() -> None:
    offsets = arrival_offsets(None, 10.0, duration_s=5.0, seed=2)
    assert max(offsets) <= 5.0 and 35 < len(offsets) < 70
    assert arrival_offsets(5, float("inf")) == [0.0] * 5


def test_length_distributions() -> None:
    import random

    rng = random.Random(0)
    assert parse_lengths("512").draw(rng) == 512
    u = parse_lengths("uniform:100:200")
    draws = [u.draw(rng) for _ in range(500)]
    assert min(draws) >= 100 and max(draws) <= 200 and 140 < sum(draws) / 500 < 160
    nrm = parse_lengths("normal:300:50")
    draws = [nrm.draw(rng) for _ in range(2000)]
    assert 290 < sum(draws) / 2000 < 310
    for bad in ("0", "uniform:5:1", "gauss:1:2", "x"):
        with pytest.raises(InputError):
            parse_lengths(bad)
