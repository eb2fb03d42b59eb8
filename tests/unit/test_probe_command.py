"""pdscope probe against the reference streaming server: a server whose timing is known, and
which makes on demand the faults a real server will not."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pdscope.errors import RunError
from pdscope.experiments import ProbeConfig, run_probe
from pdscope.selftest import ReferenceConfig, run_in_subprocess

SCHEDULE = ReferenceConfig(ttft_base_s=0.05, ttft_per_token_s=0.0002, itl_s=0.01)


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(SCHEDULE) as url:
        yield url


def pdscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdscope", *args], capture_output=True,
                          text=True, timeout=120)


def test_probe_reports_the_schedule_of_the_reference_server(reference: str) -> None:
    config = ProbeConfig(prompt_tokens=500, max_tokens=30, runs=5, seed=1)
    result = asyncio.run(run_probe(reference, config))
    assert result.server.kind == "pdscope-reference"
    # One prompt a run, each fitted to exactly 500 tokens by the server's tokenizer.
    assert result.prompt_tokens == 500
    assert [(p.tokens, p.exact) for p in result.prompts] == [(500, True)] * 5
    assert result.output_tokens == 30 and result.token_count_source == "usage"
    ttft = result.ttft
    assert ttft is not None
    # TTFT = a + b x prompt tokens = 0.05 + 0.0002 x 500 = 0.15 s, to a few milliseconds.
    assert ttft.median == pytest.approx(0.15, abs=0.004)
    decode = result.decode
    assert decode is not None and decode.median == pytest.approx(100.0, rel=0.03)
    assert len(result.runs) == 5 and result.cold.ok
    # No device or model given and the reference server is no model: no ceiling, said plainly.
    out = result.to_json()
    assert out["decode_fraction_of_ceiling"] is None
    assert "unknown" in out["verdict"]


def test_doubling_the_prompt_doubles_the_scheduled_prefill(reference: str) -> None:
    short = asyncio.run(run_probe(reference, ProbeConfig(prompt_tokens=1000, max_tokens=5, runs=3)))
    long = asyncio.run(run_probe(reference, ProbeConfig(prompt_tokens=2000, max_tokens=5, runs=3)))
    assert short.ttft and long.ttft
    # 0.05 + 0.2 = 0.25 s and 0.05 + 0.4 = 0.45 s
    assert long.ttft.median - short.ttft.median == pytest.approx(0.2, abs=0.006)


def test_probe_json_has_the_documented_keys(reference: str) -> None:
    r = pdscope("probe", reference, "--prompt-tokens", "50", "--max-tokens", "8", "--runs", "2",
                "--device", "h100-sxm", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("ttft_s", "prefill_tok_s", "decode_tok_s", "itl_p50_s", "itl_p99_s",
                "prompt_tokens", "output_tokens", "decode_ceiling_tok_s",
                "decode_fraction_of_ceiling", "server", "cold"):
        assert key in out, key
    assert out["server"] == "pdscope-reference" and out["prompt_tokens"] == 50
    # A device but no model geometry: still no ceiling, and the note says what is missing.
    assert out["decode_ceiling_tok_s"] is None
    assert any("model-config" in n for n in out["notes"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line_failure(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("pdscope: ")
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_a_server_that_is_down(tmp_path: object) -> None:
    port = free_port()
    r = pdscope("probe", f"http://127.0.0.1:{port}", "--runs", "1")
    one_line_failure(r, "cannot connect", str(port))


def test_a_wrong_model_name(reference: str) -> None:
    r = pdscope("probe", reference, "--model", "no-such-model", "--runs", "1")
    one_line_failure(r, "no-such-model", "pdscope-reference")


def test_a_401_names_the_key_and_never_prints_it() -> None:
    with run_in_subprocess(ReferenceConfig(api_key="sekrit-key-123")) as url:
        r = pdscope("probe", url, "--api-key", "wrong-key-456", "--runs", "1")
    one_line_failure(r, "401")
    assert "wrong-key-456" not in r.stderr + r.stdout
    assert "sekrit-key-123" not in r.stderr + r.stdout


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("reset_mid_stream", ("stream",)),
        ("malformed_chunk", ("JSON",)),
        ("http_500", ("500",)),
    ],
)
def test_a_broken_stream_gives_one_line(fault: str, words: tuple[str, ...]) -> None:
    config = ReferenceConfig(faults=(fault,), fault_rate=1.0)
    with run_in_subprocess(config) as url:
        r = pdscope("probe", url, "--runs", "1", "--max-tokens", "20")
    one_line_failure(r, *words)


def test_run_probe_raises_run_error_for_a_fault() -> None:
    config = ReferenceConfig(faults=("reset_mid_stream",), fault_rate=1.0)
    with run_in_subprocess(config) as url, pytest.raises(RunError):
        asyncio.run(run_probe(url, ProbeConfig(runs=1, max_tokens=20)))
