"""Calibration from recorded run folders: which requests and which stretches of time are step
observations (worked out by hand on a small made-up run), what is missing when a part cannot be
fitted, and a fit of runs that `pdscope bench` made against the reference server, whose
schedule is known: first token 10 ms + 0.1 ms a prompt token, then one every 10 ms, whatever
the number of streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdscope import cli
from pdscope.client.record import RequestRecord
from pdscope.errors import InputError, RunError
from pdscope.plan import FixedLengths, SchedulerConfig, load_calibration, open_loop, simulate
from pdscope.plan.fromruns import calibrate_from_runs
from pdscope.selftest import ReferenceConfig, run_in_subprocess

MS = 1_000_000  # ns


def request(send_ms: float, prompt: int, tokens_ms: list[float], **extra: Any
            ) -> dict[str, Any]:
    """A requests.jsonl line: sent at ``send_ms``, a token at each of ``tokens_ms``."""
    ns = [int(t * MS) for t in tokens_ms]
    record = RequestRecord(
        request_id="r", api="openai", model="m", t_send_ns=int(send_ms * MS),
        t_first_token_ns=ns[0] if ns else None, t_last_token_ns=ns[-1] if ns else None,
        t_end_ns=ns[-1] if ns else int(send_ms * MS), token_times_ns=tuple(ns),
        chunk_tokens=(1,) * len(ns), prompt_tokens=prompt, output_tokens=len(ns),
        token_count_source="usage")
    return {"index": 0, "stage": "s", "warmup": False, "client_queue_s": None,
            **record.to_dict(), **extra}


def run_folder(path: Path, requests: list[dict[str, Any]], **meta: Any) -> Path:
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"url": "http://h:1", "server": "vllm",
                                               "model": "m", "api": "openai", **meta}))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def ticks(start: float, stop: float, every: float = 10) -> list[float]:
    n = round((stop - start) / every)
    return [start + every * i for i in range(n + 1)]


# X warms the server up (the run's first request: no observation, but in flight). A is sent
# at 100 ms alone and decodes alone from 150 ms; B is sent at 200 ms, while A decodes, and
# decodes beside A from 230 ms until A's last token at 250 ms, then alone until 300 ms.
X = request(0, 10, [20, 30, 40])
A = request(100, 100, ticks(150, 250))
B = request(200, 50, ticks(230, 300))


def by_part(points: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for p in points:
        out.setdefault(p.part, []).append(p.observation)
    return out


def test_what_a_run_tells_of_its_steps(tmp_path: Path) -> None:
    cal = calibrate_from_runs([run_folder(tmp_path / "run", [X, A, B])])
    parts = by_part(cal.points)
    # A alone from its send to its first token: one prefill of 100 tokens in 50 ms. B was sent
    # while A decoded: its TTFT holds A's steps too, so it is none.
    (prefill,) = parts["prefill"]
    assert (prefill.prompt_tokens, prefill.steps, prefill.duration_s) == (100, 1, 0.05)
    # A alone, 150-200 ms: 5 steps at contexts 101..105 (its prompt and the tokens before
    # each); B alone, 250-300 ms: 5 steps at contexts 53..57.
    first, second = parts["decode"]
    assert (first.steps, first.sequences, first.duration_s) == (5, 5, pytest.approx(0.05))
    assert first.context_tokens == sum(range(101, 106))
    assert (second.steps, second.context_tokens) == (5, sum(range(53, 58)))
    # Both decoding, 230-250 ms: 2 steps of 2 sequences; A had 9 and 10 tokens, B 1 and 2:
    # contexts (109 + 51) + (110 + 52) = 322.
    (batch,) = parts["batch"]
    assert (batch.steps, batch.sequences, batch.context_tokens) == (2, 4, 322)
    assert batch.duration_s == pytest.approx(0.02)
    assert cal.server.runs == (str(tmp_path / "run"),) and cal.server.family == "vllm"
    assert any("sequences at once" in a for a in cal.assumptions)


def test_a_window_with_a_prompt_read_in_it_is_left_out(tmp_path: Path) -> None:
    # C is sent at 170 ms and reads its prompt until 210 ms, while A decodes: A's steps then
    # hold C's prompt. A alone is 150-170 ms only, and both decode from 210 ms.
    c = request(170, 40, ticks(210, 260))
    cal = calibrate_from_runs([run_folder(tmp_path / "run", [X, A, c])])
    decode = by_part(cal.points)["decode"]
    assert decode[0].steps == 2 and decode[0].duration_s == pytest.approx(0.02)
    batch = by_part(cal.points)["batch"]
    assert batch[0].steps == 4  # 210-250 ms, both decoding


def test_a_warm_up_request_counts_as_in_flight_but_is_no_observation(tmp_path: Path) -> None:
    warm = request(100, 100, ticks(150, 250), warmup=True)
    with pytest.raises(RunError, match="prefill part"):
        calibrate_from_runs([run_folder(tmp_path / "run", [X, warm, B])])


def test_a_run_with_shared_prefixes_gives_no_prefill(tmp_path: Path) -> None:
    path = run_folder(tmp_path / "run", [X, A, B], prefix_groups=2, prefix_tokens=80)
    with pytest.raises(RunError, match="the prefill part"):
        calibrate_from_runs([path])


@pytest.mark.parametrize("requests, part", [
    ([X, A], "the batch part"),  # nothing decoded beside anything
    # A gives one token; then two streams decode together, never one alone.
    ([X, request(100, 100, [150]), request(300, 20, ticks(330, 400)),
      request(300, 20, ticks(330, 400))], "the decode part"),
    ([X, request(100, 100, ticks(150, 250)), request(100, 50, ticks(150, 250))],
     "the prefill part"),  # sent together
])
def test_a_part_the_runs_cannot_support_is_named(tmp_path: Path, requests: list[dict[str, Any]],
                                                  part: str) -> None:
    with pytest.raises(RunError, match=part) as info:
        calibrate_from_runs([run_folder(tmp_path / "run", requests)])
    assert "\n" not in str(info.value)


def test_a_server_that_serves_one_at_a_time_needs_no_batch(tmp_path: Path) -> None:
    path = run_folder(tmp_path / "run", [X, A, request(300, 20, ticks(330, 400))],
                      server="llama-cpp-python")
    cal = calibrate_from_runs([path])
    assert "batch" not in by_part(cal.points)


def test_a_doctor_folder_gives_its_load_run(tmp_path: Path) -> None:
    doctor = tmp_path / "doctor"
    run_folder(doctor / "capacity", [X, A, B])
    (doctor / "findings.json").write_text("{}")
    cal = calibrate_from_runs([doctor])
    assert cal.server.runs == (str(doctor / "capacity"),)


def test_what_is_not_a_run_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a readable bench run folder"):
        calibrate_from_runs([tmp_path])
    (tmp_path / "doctor").mkdir()
    (tmp_path / "doctor" / "findings.json").write_text("{}")
    with pytest.raises(InputError, match="without a load run"):
        calibrate_from_runs([tmp_path / "doctor"])
    one = run_folder(tmp_path / "a", [X, A, B])
    other = run_folder(tmp_path / "b", [X, A, B], model="another")
    with pytest.raises(InputError, match="different servers or models"):
        calibrate_from_runs([one, other])


# ----------------------------------------------------------------------------- bench runs


REFERENCE = ReferenceConfig(ttft_base_s=0.01, ttft_per_token_s=1e-4, itl_s=0.01)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A bench run at concurrency 1 over prompt lengths 64-1,024, and one at 4 streams."""
    folder = tmp_path_factory.mktemp("runs")
    with run_in_subprocess(REFERENCE) as url:
        for name, load in (("one", ("--concurrency", "1", "--num-prompts", "8",
                                    "--input-len", "uniform:64:1024")),
                           ("four", ("--concurrency", "4", "--num-prompts", "12",
                                     "--input-len", "256"))):
            code = cli.main(["bench", url, *load, "--output-len", "16", "--seed", "3",
                             "--out", str(folder / name), "--json"])
            assert code == 0
    yield folder / "one", folder / "four"


def test_runs_of_the_reference_server_give_back_its_schedule(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = cli.main(["plan", "calibrate", "--from", *map(str, runs), "--out",
                     str(tmp_path / "cal"), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    cal = load_calibration(tmp_path / "cal")
    assert json.loads(out.out)["step_model"] == cal.step_model.to_json()
    m = cal.step_model
    # A step is 10 ms whatever it holds; a prompt token 0.1 ms more (and the client's time
    # to the first byte, a few percent).
    assert m.base_s == pytest.approx(0.010, rel=0.1)
    assert m.per_prompt_token_s == pytest.approx(1e-4, rel=0.2)
    assert m.per_sequence_s < 0.0005 and m.per_context_token_s < 1e-6
    assert {p.part for p in cal.points} == {"prefill", "decode", "batch"}
    assert cal.server.family == "pdscope-reference" and len(cal.server.runs) == 2
    # The fitted server, alone, answers a 500-token prompt as the reference server does.
    alone = simulate(open_loop(1, 1.0, FixedLengths(500, 16)), m, SchedulerConfig())
    assert alone.ttft_s[0] == pytest.approx(REFERENCE.ttft_s(500), rel=0.15)
    assert alone.percentile("itl", 50) == pytest.approx(0.010, rel=0.1)


def test_runs_that_miss_a_part_write_nothing(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, four = runs
    for folder, part in ((one, "the batch part"), (four, "the prefill part")):
        code = cli.main(["plan", "calibrate", "--from", str(folder), "--out",
                         str(tmp_path / "cal")])
        err = capsys.readouterr().err
        assert code == 1
        assert err.count("\n") == 1 and err.startswith("pdscope: ") and part in err
        assert not (tmp_path / "cal").exists()
