"""The client's per-chunk cost, alone: a streamed answer's bytes through pdscope's stream parser
and record builder, as ``pdscope bench`` reads them, with no network and no event loop.

Each stream is what vLLM sends with ``continuous_usage_stats`` (the reference server's format,
``pdscope_sent_ns`` included when ``--reference``): one completions chunk a token, each with its
running usage, then the usage chunk and ``[DONE]``, one TCP read an event. The figure is CPU
time (``time.process_time``) per token chunk, parsed and recorded, the record built at the end;
``--runs`` runs after a warm-up, their median and spread (min-max), as hyperfine reports.

    .venv/bin/python tools/bench_parser.py                 # 1,000 streams of 128 tokens, 7 runs
    .venv/bin/python tools/bench_parser.py --reference --streams 200 --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pdscope.client.openai import OpenAIStreamParser
from pdscope.client.record import RecordBuilder


def stream_events(tokens: int, reference: bool) -> list[bytes]:
    """The reads of one streamed answer of ``tokens`` tokens."""
    reads = []
    for i in range(1, tokens + 1):
        chunk = {"id": "cmpl-9f2c1d0e8b7a4c3d", "object": "text_completion",
                 "created": 1796351406, "model": "smollm2",
                 "choices": [{"index": 0, "text": f" w{i}", "logprobs": None,
                              "finish_reason": "length" if i == tokens else None,
                              "stop_reason": None}],
                 "usage": {"prompt_tokens": 64, "total_tokens": 64 + i,
                           "completion_tokens": i}}
        if reference:
            chunk["pdscope_sent_ns"] = 1_000_000_000 + i * 10_000_000
            chunk["pdscope_due_ns"] = 1_000_000_000 + i * 10_000_000 - 20_000
        reads.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    final = {"id": "cmpl-9f2c1d0e8b7a4c3d", "object": "text_completion", "created": 1796351406,
             "model": "smollm2", "choices": [],
             "usage": {"prompt_tokens": 64, "total_tokens": 64 + tokens,
                       "completion_tokens": tokens}}
    reads.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
    reads.append(b"data: [DONE]\n\n")
    return reads


def one_run(reads: list[bytes], streams: int, tokens: int) -> float:
    """CPU microseconds a token chunk over ``streams`` streams."""
    t0 = time.process_time()
    for s in range(streams):
        b = RecordBuilder(request_id=f"r{s}", api="openai", model="smollm2")
        b.t_send_ns = 0
        parser = OpenAIStreamParser(b, chat=False)
        t = 1
        for data in reads:
            t += 10_000_000
            parser.feed(data, t)
        assert b.done and b.error is None, b.error
        record = b.build()
        assert record.output_tokens == tokens
    return (time.process_time() - t0) / (streams * tokens) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--reference", action="store_true",
                   help="chunks carry the reference server's send and due times")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    reads = stream_events(args.tokens, args.reference)
    one_run(reads, max(1, args.streams // 10), args.tokens)  # warm-up
    runs = [one_run(reads, args.streams, args.tokens) for _ in range(args.runs)]
    out = {"streams": args.streams, "tokens": args.tokens, "runs": args.runs,
           "reference": args.reference, "us_per_chunk_median": statistics.median(runs),
           "us_per_chunk_min": min(runs), "us_per_chunk_max": max(runs)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"parse + record: {out['us_per_chunk_median']:.2f} µs a token chunk (median of"
              f" {args.runs} runs, {min(runs):.2f}-{max(runs):.2f}), {args.streams:,} streams"
              f" of {args.tokens} tokens{', reference chunks' if args.reference else ''}")


if __name__ == "__main__":
    main()
