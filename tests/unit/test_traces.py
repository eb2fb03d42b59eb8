"""Trace files as the peers publish them: Mooncake's JSONL, BurstGPT's CSV and pdscope's own
JSONL read to their requests (times from the first, in seconds), a bad line named with its
file and line, the time scaled and cut, and shared hash blocks built as byte-identical text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdscope import cli
from pdscope.errors import InputError
from pdscope.load.runner import Stage
from pdscope.plan import Calibration, SchedulerConfig, StepModel
from pdscope.plan.calibrate import CalibratedServer
from pdscope.plan.demand import from_trace
from pdscope.workload.prompts import PromptBuilder
from pdscope.workload.traces import (
    BLOCK_TOKENS,
    TraceEntry,
    detect_format,
    read_trace,
    shared_prefixes,
    trace_items,
)

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures" / "traces"
CONVERSATION = FIXTURES / "mooncake_conversation.jsonl"
README = FIXTURES / "mooncake_readme.jsonl"
BURSTGPT = FIXTURES / "burstgpt.csv"
PDSCOPE = FIXTURES / "pdscope.jsonl"


def common_words(a: str, b: str) -> int:
    """How many leading words two texts share."""
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


async def _words(text: str) -> int:
    """A whitespace tokenizer, as the reference server's."""
    return len(text.split())


def test_mooncake_times_are_milliseconds_from_the_first_request() -> None:
    t = read_trace(CONVERSATION)
    assert t.format == "mooncake" and len(t) == 12
    assert t.offsets == (0, 0, 0, 0, 0, 0, 3.0, 3.0, 3.0, 5.999, 5.999, 9.0)
    first = t.entries[0]
    assert (first.input_tokens, first.output_tokens) == (6758, 500)
    assert first.hash_ids == tuple(range(14)) and first.line == 1
    # ceil(input_length / 512) blocks on every line of the published sample.
    assert all(len(e.hash_ids) == -(-e.input_tokens // BLOCK_TOKENS) for e in t.entries)
    assert t.mean_rate == pytest.approx(11 / 9.0)


def test_burstgpt_times_are_seconds_and_start_at_the_first_request() -> None:
    t = read_trace(BURSTGPT)
    assert t.format == "burstgpt" and t.skipped == 0
    assert t.offsets == (0.0, 40.0, 113.0)  # 5 s, 45 s and 118 s after midnight
    assert [(e.input_tokens, e.output_tokens) for e in t.entries] == [
        (472, 18), (1087, 230), (417, 276)]
    assert all(e.hash_ids == () for e in t.entries)


def test_burstgpt_failures_are_left_out_and_counted(tmp_path: Path) -> None:
    # BurstGPT's README: rows of 0 response tokens are failures; the file also has 0-token
    # requests. Neither can be replayed.
    p = tmp_path / "b.csv"
    p.write_text(BURSTGPT.read_text() + "120,GPT-4,300,0,300,API log\n"
                 "130,ChatGPT,0,0,0,Conversation log\n")
    t = read_trace(p)
    assert len(t) == 3 and t.skipped == 2 and "2 rows left out" in t.describe()


def test_burstgpt_columns_are_found_by_name(tmp_path: Path) -> None:
    # The v2 release inserts Session ID and Elapsed time after Timestamp.
    p = tmp_path / "v2.csv"
    p.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                 "Total tokens,Log Type\n2,abc,1.5,ChatGPT,10,20,30,Conversation log\n"
                 "4,,,GPT-4,11,21,32,API log\n")
    t = read_trace(p)
    assert [(e.offset_s, e.input_tokens, e.output_tokens) for e in t.entries] == [
        (0.0, 10, 20), (2.0, 11, 21)]


def test_pdscope_jsonl_times_are_seconds() -> None:
    t = read_trace(PDSCOPE)
    assert t.format == "jsonl"
    assert t.offsets == (0.0, 0.25, 0.5, 1.75)
    assert [e.input_tokens for e in t.entries] == [120, 300, 40, 600]


def test_the_format_is_told_by_the_suffix_or_the_first_line() -> None:
    assert detect_format(BURSTGPT) == "burstgpt"
    assert detect_format(CONVERSATION) == "mooncake"
    assert detect_format(PDSCOPE) == "jsonl"


def test_requests_out_of_time_order_are_sorted(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 2, "input_tokens": 5, "output_tokens": 1}\n'
                 '{"timestamp": 1, "input_tokens": 6, "output_tokens": 1}\n')
    t = read_trace(p)
    assert t.offsets == (0.0, 1.0) and [e.line for e in t.entries] == [2, 1]


BAD = [
    ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,',
     "mooncake", ":2: not JSON"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
     '{"timestamp": 5, "input_length": 0, "output_length": 1}\n', "mooncake",
     ":2: input_length must be at least 1"),
    ("t.jsonl", '{"timestamp": -1, "input_length": 5, "output_length": 1}\n', "mooncake",
     ":1: timestamp must be a time of at least 0 ms"),
    ("t.jsonl", '\n\n{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
     "mooncake", ":3: hash_ids must be a list"),
    ("t.jsonl", '{"timestamp": 0, "input_tokens": 5, "output_tokens": 2.5}\n', "jsonl",
     ":1: output_tokens must be a whole number"),
    ("t.jsonl", '[1, 2]\n', "jsonl", ":1: each line must be a JSON object"),
    ("t.jsonl", '{"prompt": "hello"}\n', "auto", ":1: not a trace line of a known format"),
    ("t.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
     "5,ChatGPT,472,18,490,Conversation log\n6,ChatGPT,many,18,490,Conversation log\n",
     "burstgpt", ":3: Request tokens must be a whole number"),
    ("t.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
     "5,ChatGPT,472,18\n", "burstgpt", ":2: 6 columns expected"),
    ("t.csv", "Time,Model,Request tokens,Response tokens\n5,ChatGPT,472,18\n", "burstgpt",
     ":1: BurstGPT's CSV needs the columns"),
]


@pytest.mark.parametrize(("name", "text", "fmt", "says"), BAD)
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path: Path, name: str, text: str,
                                                    fmt: str, says: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputError) as exc:
        read_trace(p, fmt)
    assert f"{p}{says}" in str(exc.value)


@pytest.mark.parametrize(("name", "text", "fmt", "says"), BAD[:3])
def test_a_bad_line_is_one_line_and_exit_2_from_bench_and_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, fmt: str,
        says: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    cal = _calibration(tmp_path)
    # The trace is read before anything connects: no server at this address is needed.
    for argv in (["bench", "http://127.0.0.1:9", "--trace", str(p), "--trace-format", fmt],
                 ["plan", "predict", cal, "--trace", str(p), "--trace-format", fmt]):
        code = cli.main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{p}{says}" in err, err


def _calibration(folder: Path) -> str:
    Calibration(StepModel(0.012, 0.00045, 0.0005, 2e-6, 1e-9),
                SchedulerConfig(kv_pool_tokens=60_000),
                CalibratedServer(family="vllm")).save(folder / "cal")
    return str(folder / "cal" / "calibration.json")


def test_plan_predict_simulates_the_traces_requests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = _calibration(tmp_path)
    assert cli.main(["plan", "predict", cal, "--trace", str(CONVERSATION), "--time-scale", "2",
                     "--max-duration", "12", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["simulated_requests"] == 11  # 9 s at half speed is 18 s: the last is cut
    assert got["load"].startswith(f"trace {CONVERSATION} (mooncake, 11 requests")
    assert cli.main(["plan", "predict", cal, "--rate", "1", "--time-scale", "2"]) == 2
    assert "need --trace" in capsys.readouterr().err


def test_bench_trace_flags_say_what_they_need(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["--trace", str(PDSCOPE), "--request-rate", "2"], "--trace and --request-rate"),
        (["--trace", str(PDSCOPE), "--duration", "5"], "--trace and --duration"),
        (["--time-scale", "2", "--request-rate", "1", "--num-prompts", "3"],
         "--time-scale needs --trace"),
        (["--trace", str(tmp := FIXTURES / "missing.jsonl")], f"cannot read trace {tmp}"),
    ]
    for args, says in cases:
        assert cli.main(["bench", "http://127.0.0.1:9", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err


def test_time_scale_multiplies_the_times_and_max_duration_cuts_them() -> None:
    t = read_trace(CONVERSATION)
    fast = t.replayed(0.5)
    assert fast.offsets == tuple(x * 0.5 for x in t.offsets)
    assert fast.mean_rate == pytest.approx(2 * t.mean_rate)
    assert "time x0.5" in fast.describe()
    cut = t.replayed(1.0, max_duration_s=4.0)
    assert cut.offsets == (0, 0, 0, 0, 0, 0, 3.0, 3.0, 3.0)
    # The cut is taken after the scale: the first 4 s of a replay twice as slow.
    assert len(t.replayed(2.0, max_duration_s=4.0)) == 6
    assert len(t.replayed(1.0, max_requests=5)) == 5
    with pytest.raises(InputError, match="time_scale must be a positive number"):
        t.replayed(0.0)
    with pytest.raises(InputError, match="max_duration_s must be a positive number"):
        t.replayed(1.0, max_duration_s=-1)


def test_a_trace_stage_sends_at_the_traces_times_and_keeps_its_name_in_run_json() -> None:
    t = read_trace(CONVERSATION).replayed(0.5)
    stage = Stage.of_trace(t, warmup=2)
    assert stage.name == "trace" and stage.mode == "open-loop"
    assert stage.arrivals == t.offsets and stage.num_prompts == 12
    back = Stage.from_json(json.loads(json.dumps(stage.to_json())))
    assert back.name == "trace" and back.trace == t.describe() and back.warmup == 2


def test_shared_blocks_are_the_longest_chain_another_request_starts_with() -> None:
    entries = [TraceEntry(0, 3 * 512, 1, (1, 2, 3)), TraceEntry(0, 3 * 512, 1, (1, 2, 4)),
               TraceEntry(0, 2 * 512 + 7, 1, (1, 5, 6)), TraceEntry(0, 100, 1, (9,)),
               TraceEntry(0, 2 * 512, 1, (1, 2))]
    got = [(s.group, s.tokens) for s in shared_prefixes(entries)]
    assert got[0] == got[1] == (got[0][0], 1024)
    assert got[2] == (got[2][0], 512) and got[2][0] != got[0][0]
    assert got[3] == (None, 0)
    # All of its prompt is shared: the prefix stays one token short of it.
    assert got[4] == (got[0][0], 1023)
    readme = [(s.group, s.tokens) for s in shared_prefixes(read_trace(README).entries)]
    assert readme == [(0, 12 * 512), (0, 12 * 512)]  # 12 of the samples' ids are the same


def test_shared_hash_blocks_are_byte_identical_prompt_text() -> None:
    t = read_trace(README)
    a, b = asyncio.run(trace_items(t, PromptBuilder(_words, base_seed=3)))
    # Fitted to the tokenizer: each prompt has the trace's length, exactly.
    assert (a.prompt_tokens, b.prompt_tokens) == (6955, 6472)
    assert a.prompt is not None and b.prompt is not None
    assert (len(a.prompt.split()), len(b.prompt.split())) == (6955, 6472)
    assert (a.max_tokens, b.max_tokens) == (52, 26)
    # The 12 shared blocks are the same bytes; the 13th (2353 against 2366) is not.
    assert a.prompt[:len(b.prompt)] != b.prompt
    shared = common_words(a.prompt, b.prompt)
    assert 12 * 512 <= shared < 13 * 512
    cut = len(" ".join(a.prompt.split()[:12 * 512]))
    assert a.prompt[:cut].encode() == b.prompt[:cut].encode()


def test_requests_without_hash_ids_share_no_text() -> None:
    items = asyncio.run(trace_items(read_trace(PDSCOPE), PromptBuilder(_words)))
    assert [i.prompt_tokens for i in items] == [120, 300, 40, 600]
    assert [i.max_tokens for i in items] == [16, 8, 32, 4]
    shared = [common_words(x.prompt or "", y.prompt or "")
              for x in items for y in items if x is not y]
    assert max(shared) < 5


def test_the_planners_demand_of_a_trace_is_its_times_lengths_and_prefixes() -> None:
    t = read_trace(README)
    d = from_trace(t)
    assert d.arrival_s is not None and d.arrival_s.tolist() == [0.0, pytest.approx(3.053)]
    assert d.prompt_tokens.tolist() == [6955, 6472] and d.output_tokens.tolist() == [52, 26]
    assert d.prefix_group.tolist() == [0, 0] and d.prefix_tokens.tolist() == [6144, 6144]
    b = from_trace(read_trace(BURSTGPT).replayed(0.1))
    assert b.arrival_s is not None and b.arrival_s.tolist() == pytest.approx([0, 4.0, 11.3])
    assert b.prefix_group.tolist() == [-1, -1, -1]


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from([CONVERSATION, README, BURSTGPT, PDSCOPE]),
       cuts=st.lists(st.tuples(st.integers(0, 10_000), st.binary(max_size=6)), max_size=4))
def test_a_mangled_trace_is_read_or_refused_in_one_input_error(
        tmp_path: Path, which: Path, cuts: list[tuple[int, bytes]]) -> None:
    data = which.read_bytes()
    for at, junk in cuts:
        at %= len(data) + 1
        data = data[:at] + junk + data[at + len(junk):]
    p = tmp_path / which.name
    p.write_bytes(data)
    try:
        t = read_trace(p)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert len(t) >= 1 and t.offsets[0] == 0 and list(t.offsets) == sorted(t.offsets)
