"""The reference server runs without uvloop: on asyncio's own loop, asked for or by default."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest

from pdscope.selftest.server import (
    ReferenceConfig,
    _await_ready,
    resolve_loop,
    run_in_subprocess,
    stop_process,
)

BODY = {"model": "pdscope-reference", "prompt": "a b c", "max_tokens": 4, "stream": True}
FAST = ReferenceConfig(ttft_base_s=0.005, ttft_per_token_s=0.0, itl_s=0.002)


async def _stream(url: str) -> list[dict[str, object]]:
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/v1/completions", json=BODY) as resp:
        text = (await resp.read()).decode()
    return [json.loads(b[len("data: "):]) for b in text.split("\n\n") if b and "DONE" not in b]


@pytest.mark.timeout(60)
def test_the_server_streams_on_asyncio_s_own_loop() -> None:
    with run_in_subprocess(FAST, loop="asyncio") as url:
        chunks = asyncio.run(_stream(url))
    assert len(chunks) == 4
    assert all(c["pdscope_sent_ns"] >= c["pdscope_due_ns"] for c in chunks)  # type: ignore[operator]


@pytest.mark.timeout(60)
def test_without_uvloop_auto_falls_back_to_asyncio() -> None:
    # uvloop made unimportable in the server's own process (None in sys.modules: ImportError).
    code = ("import sys; sys.modules['uvloop'] = None\n"
            "from pdscope.selftest.server import main, resolve_loop\n"
            "assert resolve_loop('auto') == 'asyncio'\n"
            "main(sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", code, *FAST.to_argv()],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = _await_ready(proc, 20)
        assert len(asyncio.run(_stream(url))) == 4
    finally:
        stop_process(proc)


def test_loop_names() -> None:
    assert resolve_loop("asyncio") == "asyncio" and resolve_loop("uvloop") == "uvloop"
    assert resolve_loop("auto") in ("uvloop", "asyncio")


@pytest.mark.timeout(60)
def test_the_selftest_says_which_loop_its_server_ran() -> None:
    from pdscope.selftest.check import run_selftest

    result = asyncio.run(run_selftest((1,), itl_s=0.005, ttft_s=0.005, output_tokens=4, rounds=1,
                                      server_loop="asyncio"))
    assert result.server_loop == "asyncio" and result.to_json()["server_loop"] == "asyncio"
    assert result.levels[0].failed == 0
