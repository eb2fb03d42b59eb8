"""Bad inputs to ``pdscope compare`` and ``pdscope ab``: one line on stderr, ``pdscope: ...``,
exit 2, no traceback (the pattern of test_bad_inputs.py). ``ab`` cases name an unreachable
loopback port: its input is checked before any connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdscope import cli
from pdscope.load import Stage

DOWN = "http://127.0.0.1:9"


def _bench_folder(path: Path, output_len: int) -> Path:
    """A small but real bench run folder: what `bench` writes, as `read_run` reads it."""
    path.mkdir(parents=True)
    meta = {"server": "pdscope-reference", "model": "m", "server_version": "0.1.0",
            "workload": f"synthetic: 32 tokens in, {output_len} out",
            "stages": [Stage(request_rate=10.0, num_prompts=5).to_json()]}
    (path / "run.json").write_text(json.dumps(meta))
    lines = []
    for i in range(5):
        t = 1_000_000_000 * i
        times = [t + 50_000_000 + 10_000_000 * k for k in range(output_len)]
        lines.append(json.dumps({"index": i, "stage": "rate=10", "warmup": False,
                                 "t_send_ns": t, "t_first_token_ns": times[0],
                                 "t_last_token_ns": times[-1], "t_end_ns": times[-1],
                                 "token_times_ns": times, "chunk_tokens": [1] * output_len,
                                 "request_id": str(i), "api": "openai", "model": "m",
                                 "output_tokens": output_len, "prompt_tokens": 32,
                                 "error": None}))
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    (tmp_path / "broken.json").write_text("{nope")
    mixed = tmp_path / "mixed"
    _bench_folder(mixed / "one", 16)
    (mixed / "probe.json").write_text(json.dumps({"decode_tok_s": 1.0,
                                                  "prompt_tokens_requested": 8}))
    return {"a": str(_bench_folder(tmp_path / "a", 16)),
            "b": str(_bench_folder(tmp_path / "b", 16)),
            "longer": str(_bench_folder(tmp_path / "longer", 24)),
            "empty": str(tmp_path / "empty"), "notes": str(tmp_path / "notes.json"),
            "broken": str(tmp_path / "broken.json"), "missing": str(tmp_path / "nowhere"),
            "mixed": str(mixed), "tmp": str(tmp_path)}


CASES = [
    ("one-run", ("compare", "{a}"), "two runs or more"),
    ("not-a-run-folder", ("compare", "{a}", "{empty}"), "is not a run"),
    ("missing", ("compare", "{a}", "{missing}"), "does not exist"),
    ("json-not-a-run", ("compare", "{a}", "{notes}"), "no pdscope command wrote"),
    ("json-broken", ("compare", "{a}", "{broken}"), "not json"),
    ("unlike", ("compare", "{a}", "{longer}"), "unlike runs (workload"),
    ("mixed-kinds", ("compare", "{a}", "{mixed}"), "runs of different kinds"),
    ("fail-on-malformed", ("compare", "{a}", "{b}", "--fail-on", "ttft_p99:10"),
     "METRIC:+N%"),
    ("fail-on-unknown", ("compare", "{a}", "{b}", "--fail-on", "speed:+5%"),
     "unknown metric"),
    ("threshold-negative", ("compare", "{a}", "{b}", "--threshold", "-1"), "--threshold"),
    ("alpha-one", ("compare", "{a}", "{b}", "--alpha", "1"), "--alpha"),
    ("html-folder-missing", ("compare", "{a}", "{b}", "--html", "{missing}/x.html"),
     "does not exist"),
    ("json-and-markdown", ("compare", "{a}", "{b}", "--json", "--markdown"), "not allowed"),
    ("ab-one-round", ("ab", DOWN, DOWN, "--rounds", "1"), "--rounds"),
    ("ab-bad-url", ("ab", DOWN, "http://127.0.0.1:99999"), "not a url"),
    ("ab-rate-and-users", ("ab", DOWN, DOWN, "--request-rate", "1", "--concurrency", "2"),
     "not allowed"),
    ("ab-rate-zero", ("ab", DOWN, DOWN, "--request-rate", "0"), "--request-rate"),
    ("ab-output-1", ("ab", DOWN, DOWN, "--output-len", "1"), "--output-len"),
    ("ab-fail-on", ("ab", DOWN, DOWN, "--fail-on", "itl:+x%"), "METRIC:+N%"),
    ("ab-out-is-file", ("ab", DOWN, DOWN, "--out", "{notes}"), "a file of that name"),
]


@pytest.mark.parametrize("argv, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv: tuple[str, ...], words: str,
                                          folders: dict[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(**folders) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        code = cli.main(args)
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdscope: "), err
    assert words.lower() in lines[0].lower(), err


BENCH_CASES = [
    ("bench-baseline-not-a-run", ("bench", DOWN, "--concurrency", "1", "--num-prompts", "1",
                                  "--baseline", "{empty}"), "is not a run"),
    ("bench-fail-on-alone", ("bench", DOWN, "--concurrency", "1", "--num-prompts", "1",
                             "--fail-on", "ttft_p99:+10%"), "needs --baseline"),
    ("bench-baseline-sweep", ("bench", DOWN, "--concurrency", "1,2", "--num-prompts", "1",
                              "--baseline", "{a}"), "one load level"),
    ("doctor-baseline-not-a-run", ("doctor", DOWN, "--baseline", "{empty}"),
     "holds no evidence.json"),
]


@pytest.mark.parametrize("argv, words", [c[1:] for c in BENCH_CASES],
                         ids=[c[0] for c in BENCH_CASES])
def test_bad_baseline_is_one_line_and_exit_2(argv: tuple[str, ...], words: str,
                                             folders: dict[str, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    test_bad_input_is_one_line_and_exit_2(argv, words, folders, capsys)
