"""The client measured against the reference server, whose schedule is known exactly.

The server runs in its own process (as a user's server would), on the same host, so its
``perf_counter_ns`` stamps in each chunk are on the client's clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from pdscope.client import Api, RequestRecord, Target, detect_server, new_session, stream_request
from pdscope.client.detect import tokenize
from pdscope.selftest import ReferenceConfig, run_in_subprocess, serving
from pdscope.selftest.server import parse_args
from tests.unit.test_client_support import run

A_S, B_S, ITL_S, N_OUT, N_PROMPT = 0.050, 0.0001, 0.010, 20, 300
CONFIG = ReferenceConfig(ttft_base_s=A_S, ttft_per_token_s=B_S, itl_s=ITL_S)
PROMPT = " ".join(f"w{i}" for i in range(N_PROMPT))
TOLERANCE_S = 0.002


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    with run_in_subprocess(CONFIG) as url:
        yield url


def measure(url: str, api: Api, n: int = 5) -> list[RequestRecord]:
    """``n`` requests one after another, after a warm-up that opens the connection."""

    async def main() -> list[RequestRecord]:
        async with new_session() as session:
            t = Target(url, api, CONFIG.model, server_kind="pdscope-reference")
            await stream_request(session, t, "warm up", max_tokens=2)
            return [await stream_request(session, t, PROMPT, max_tokens=N_OUT)
                    for _ in range(n)]

    return run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["openai", "openai-chat"])
def test_ttft_and_itl_follow_the_schedule(reference_url: str, api: Api) -> None:
    # Correctness, not fidelity: the client measures what the server scheduled. How close it
    # gets under load is a benchmark (tools/bench_clients.py, docs/benchmarks.md), because a
    # shared two-core machine can delay any single run by milliseconds.
    records = measure(reference_url, api)
    assert all(r.ok for r in records), [r.error for r in records]
    expected_ttft = A_S + B_S * N_PROMPT  # 80 ms
    ttft_err = statistics.median(r.ttft_s - expected_ttft for r in records if r.ttft_s)
    itl = statistics.median(statistics.median(r.itl_s) for r in records)
    tpot = statistics.median(r.tpot_s for r in records if r.tpot_s)
    assert abs(ttft_err) < 5 * TOLERANCE_S
    assert abs(itl - ITL_S) < TOLERANCE_S
    assert abs(tpot - ITL_S) < TOLERANCE_S


@pytest.mark.timeout(60)
def test_a_role_only_first_chunk_is_not_counted_as_a_token(reference_url: str) -> None:
    r = measure(reference_url, "openai-chat", n=1)[0]
    assert len(r.token_times_ns) == N_OUT  # the role chunk came at once, and is not among them
    assert r.ttft_s is not None and r.ttft_s > A_S


@pytest.mark.timeout(60)
def test_usage_is_read_from_the_last_chunk(reference_url: str) -> None:
    r = measure(reference_url, "openai", n=1)[0]
    assert (r.prompt_tokens, r.output_tokens, r.token_count_source) == (N_PROMPT, N_OUT, "usage")
    assert r.finish_reason == "length"
    assert len(r.output_text.split()) == N_OUT


@pytest.mark.timeout(60)
def test_the_client_sees_each_token_soon_after_the_server_sent_it(reference_url: str) -> None:
    records = measure(reference_url, "openai")
    lateness = [x for r in records for x in r.client_lateness_ns or ()]
    assert len(lateness) == 5 * N_OUT
    assert min(lateness) >= 0  # one clock: nothing arrives before it was sent
    assert statistics.median(lateness) < 2_000_000
    server_late = [s - d for r in records
                   for s, d in zip(r.server_sent_ns or (), r.server_due_ns or (), strict=True)]
    assert statistics.median(server_late) < 1_000_000


@pytest.mark.timeout(60)
def test_a_pooled_connection_has_no_connect_time(reference_url: str) -> None:
    records = measure(reference_url, "openai", n=2)
    assert [r.connect_s for r in records] == [None, None]  # the warm-up opened it


@pytest.mark.timeout(60)
def test_the_reference_tokenizer_counts_words(reference_url: str) -> None:
    async def main() -> list[int] | None:
        async with new_session() as session:
            info = await detect_server(reference_url, session)
            return await tokenize(info, session, PROMPT)

    tokens = run(main())
    assert tokens is not None and len(tokens) == N_PROMPT


@pytest.mark.timeout(60)
def test_chunks_of_several_tokens_are_split_per_token() -> None:
    with run_in_subprocess(ReferenceConfig(ttft_base_s=0.02, ttft_per_token_s=0, itl_s=0.005,
                                           tokens_per_chunk=4)) as url:
        records = measure(url, "openai", n=3)
    r = records[-1]
    assert r.chunk_tokens == (4, 4, 4, 4, 4)
    assert len(r.itl_s) == N_OUT - 4  # the first chunk's 4 tokens came with the first token
    # TPOT spreads the 4 chunk gaps over n_out - 1 tokens: the first chunk's extra 3 were free
    tpot = statistics.median(x.tpot_s or 0 for x in records)
    assert abs(tpot - 4 * 0.020 / (N_OUT - 1)) < TOLERANCE_S
    assert abs(statistics.median(statistics.median(x.itl_s) for x in records) - 0.005) \
        < TOLERANCE_S


@pytest.mark.timeout(20)
def test_the_reference_server_answers_models_health_tokenize_and_plain_requests() -> None:
    async def main() -> dict[str, Any]:
        async with (
            serving(ReferenceConfig(ttft_base_s=0.01, itl_s=0.001)) as url,
            aiohttp.ClientSession() as s,
        ):
            out: dict[str, Any] = {}
            async with s.get(url + "/v1/models") as r:
                out["models"] = await r.json()
            async with s.get(url + "/health") as r:
                out["health"] = r.status
            async with s.post(url + "/tokenize", json={"prompt": "a b c d"}) as r:
                out["tokenize"] = await r.json()
            body = {"model": CONFIG.model, "prompt": "a b", "max_tokens": 5}
            async with s.post(url + "/v1/completions", json=body) as r:
                out["plain"] = await r.json()
            return out

    out = run(main())
    assert out["models"]["data"][0]["id"] == "pdscope-reference"
    assert out["health"] == 200
    assert out["tokenize"]["count"] == 4 and len(out["tokenize"]["tokens"]) == 4
    assert out["plain"]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5,
                                     "total_tokens": 7, "prompt_tokens_details": None}
    assert len(out["plain"]["choices"][0]["text"].split()) == 5


def test_a_config_travels_to_the_subprocess_on_its_command_line() -> None:
    cfg = ReferenceConfig(port=1234, itl_s=0.02, faults=("stall", "refuse"), api_key="k")
    argv = cfg.to_argv()
    assert "k" not in argv  # the key goes through the environment
    back = parse_args(argv)
    assert back == ReferenceConfig(port=1234, itl_s=0.02, faults=("stall", "refuse"))
