"""tools/bench_clients.py's wrapped reference server reads its own lateness back from every
chunk it sends, on the fast path (what vLLM's, AIPerf's and inference-perf's requests get) as
on the slow one (per-chunk usage: pdscope's and GuideLLM's)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_clients", TOOLS / "bench_clients.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_clients"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


async def _stream(url: str, tokens: int, per_chunk_usage: bool) -> int:
    body = {"model": "pdscope-reference", "prompt": "one two three", "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True,
                                               "continuous_usage_stats": per_chunk_usage}}
    events = 0
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
        async for line in r.content:
            events += line.startswith(b"data: {")
    return events


@pytest.mark.timeout(60)
def test_the_wrapped_server_reads_its_lateness_on_both_paths(tmp_path: Path) -> None:
    bc = _load()
    with bc.ReferenceProcess(bc.Workload(ttft_ms=10, itl_ms=5), tmp_path, None) as ref:
        for per_chunk in (False, True):
            events = asyncio.run(_stream(ref.url, 12, per_chunk))
            assert events == 12 + 1  # the tokens and the usage chunk
            late = ref.lateness()
            assert late is not None, per_chunk
            # Every token chunk was read back: the first (TTFT) apart from the other 11.
            assert late.chunks == 12, (per_chunk, json.dumps(late.__dict__))
            assert late.first_sent_ns is not None and late.last_sent_ns is not None
            assert late.last_sent_ns - late.first_sent_ns >= 11 * 5_000_000 * 0.9
            assert late.token_p50_ms is not None and 0 <= late.token_p50_ms < 50
