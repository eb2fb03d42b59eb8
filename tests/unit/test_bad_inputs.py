"""Bad inputs to every command, run in-process: each ends as one line on stderr,
``pdscope: ...``, with the exit status a script can trust (2: bad input, 1: a run that failed),
and no traceback. The input checks come before any connection: a case that must fail on its
input names an unreachable loopback port (``http://127.0.0.1:9``), so a check that came after
connecting would end in "cannot connect" and exit 1 instead.

Placeholders in a case: ``{tmp}`` an empty folder, ``{file}`` a regular file, ``{cfg:NAME}`` a
model config with one field changed, ``{ev:NAME}`` an earlier doctor folder with a bad
``evidence.json``, ``{ref}`` a reference server, ``{faulty}`` one where half the requests fail,
``{busy}`` a port something listens on.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdscope import cli
from pdscope.cli import build_parser
from pdscope.cli import demo as demo_cmd
from pdscope.cli.common import write_result
from pdscope.cli.lab import check_exposure
from pdscope.client.session import connect_reason
from pdscope.doctor.evidence import InterferenceEvidence
from pdscope.doctor.run import previous_interference
from pdscope.errors import InputError
from pdscope.lab import check_engine_args
from pdscope.load import Stage, StageRun, summarize_stage
from pdscope.load.results import RunFolder, RunMeta
from pdscope.plan import CalibratedServer, Calibration, SchedulerConfig, StepModel
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from tests.conftest import MODEL_CONFIGS

DOWN = "http://127.0.0.1:9"  # nothing listens on the discard port: connecting fails at once
BENCH = ("bench", DOWN, "--concurrency", "1", "--num-prompts", "1")
KV_SHAPE = ("--layers", "2", "--kv-heads", "2", "--head-dim", "2")
PREDICT = ("plan", "predict", "{cal}", "--rate", "1", "--num-requests", "20")
CHATS = ("plan", "predict", "{cal}", "--conversations", "2")

# (id, argv, exit status, text the one line must hold (case-insensitive))
CASES: list[tuple[str, tuple[str, ...], int, str]] = [
    # ---- the command line itself
    ("unknown-command", ("nope",), 2, "invalid choice"),
    # ---- ceiling
    ("ceiling-params-1e999-json", ("ceiling", "--params", "1e999", "--json"), 2, "finite"),
    ("ceiling-params-1e999", ("ceiling", "--params", "1e999"), 2, "finite"),
    ("ceiling-params-inf", ("ceiling", "--params", "inf"), 2, "not a number"),
    ("ceiling-params-nan", ("ceiling", "--params", "nan"), 2, "not a number"),
    ("ceiling-params-0", ("ceiling", "--params", "0"), 2, "must be positive"),
    ("ceiling-params-huge", ("ceiling", "--params", "1e300"), 2, "at most 1e+15"),
    ("ceiling-params-word", ("ceiling", "--params", "eight"), 2, "not a number"),
    ("ceiling-active-1e999", ("ceiling", "--params", "8e9", "--active-params", "1e999"), 2,
     "finite"),
    ("ceiling-batch-0", ("ceiling", "--params", "8e9", "--batch", "0"), 2, "from 1 to"),
    ("ceiling-batch-1e999", ("ceiling", "--params", "8e9", "--batch", "1e999"), 2, "finite"),
    ("ceiling-batch-half", ("ceiling", "--params", "8e9", "--batch", "1.5"), 2,
     "not a whole number"),
    ("ceiling-prompt-0", ("ceiling", "--params", "8e9", "--prompt-tokens", "0"), 2, "from 1 to"),
    ("ceiling-context-negative", ("ceiling", "--params", "8e9", "--context=-5"), 2, "from 0 to"),
    ("ceiling-device-unknown", ("ceiling", "--params", "8e9", "--device", "h1OO sxm"), 2,
     "did you mean"),
    ("ceiling-dtype-unknown", ("ceiling", "--params", "8e9", "--dtype", "fp7"), 2,
     "unknown dtype"),
    ("ceiling-no-model", ("ceiling",), 2, "say which model"),
    ("ceiling-model-and-params", ("ceiling", "--params", "8e9", "--model", "{file}"), 2,
     "not both"),
    ("ceiling-kv-heads-0", ("ceiling", "--model", "{cfg:num_key_value_heads=0}"), 2,
     "num_key_value_heads"),
    ("ceiling-layers-1e30", ("ceiling", "--model", "{cfg:num_hidden_layers=1e30}", "--json"), 2,
     "num_hidden_layers"),
    ("ceiling-on-gpu-1.5", ("ceiling", "--params", "8e9", "--on-gpu", "1.5"), 2,
     "from 0 to 1"),
    ("ceiling-on-gpu-negative", ("ceiling", "--params", "8e9", "--on-gpu=-0.1"), 2,
     "from 0 to 1"),
    ("ceiling-on-gpu-nan", ("ceiling", "--params", "8e9", "--on-gpu", "nan"), 2, "finite"),
    ("ceiling-cpu-device-alone", ("ceiling", "--params", "8e9", "--cpu-device",
                                  "ddr5-5600-2ch"), 2, "goes with --on-gpu"),
    ("ceiling-cpu-device-a-gpu", ("ceiling", "--params", "8e9", "--on-gpu", "0.5",
                                  "--cpu-device", "rtx-4090"), 2, "must name a cpu"),
    ("ceiling-cpu-device-unknown", ("ceiling", "--params", "8e9", "--on-gpu", "0.5",
                                    "--cpu-device", "ddr9"), 2, "device"),
    ("ceiling-on-gpu-no-gpu", ("ceiling", "--params", "8e9", "--on-gpu", "0.5", "--device",
                               "m2-max", "--cpu-device", "ddr5-5600-2ch"), 2,
     "needs a gpu among the devices"),
    # ---- kv
    ("kv-slots-0", ("kv", *KV_SHAPE, "--slots", "0"), 2, "from 1 to"),
    ("kv-parallel-half", ("kv", *KV_SHAPE, "--parallel", "1.5"), 2, "not a whole number"),
    ("kv-reserve-negative", ("kv", *KV_SHAPE, "--reserve-gb=-100", "--device", "h100-sxm"), 2,
     "from 0 to"),
    ("kv-reserve-nan", ("kv", *KV_SHAPE, "--reserve-gb", "nan"), 2, "finite"),
    ("kv-mem-util-0", ("kv", *KV_SHAPE, "--mem-util", "0"), 2, "above 0 and at most 1"),
    ("kv-mem-util-1.5", ("kv", *KV_SHAPE, "--mem-util", "1.5"), 2, "above 0 and at most 1"),
    ("kv-mem-util-inf", ("kv", *KV_SHAPE, "--mem-util", "inf"), 2, "finite"),
    ("kv-context-negative", ("kv", *KV_SHAPE, "--context=-1"), 2, "from 0 to"),
    ("kv-context-1e999", ("kv", *KV_SHAPE, "--context", "1e999"), 2, "finite"),
    ("kv-layers-0", ("kv", "--layers", "0", "--kv-heads", "2", "--head-dim", "2"), 2,
     "from 1 to"),
    ("kv-shape-incomplete", ("kv", "--layers", "2"), 2, "go together"),
    ("kv-kv-dtype-unknown", ("kv", *KV_SHAPE, "--kv-dtype", "fp7"), 2, "dtype"),
    ("kv-params-no-shape", ("kv", "--params", "8e9"), 2, "needs the model's shape"),
    ("kv-model-missing", ("kv", "--model", "/no/such/config.json"), 2, "no such file"),
    ("kv-config-not-json", ("kv", "--model", "{file}"), 2, "config"),
    ("kv-kv-heads-0", ("kv", "--model", "{cfg:num_key_value_heads=0}"), 2,
     "num_key_value_heads"),
    ("kv-kv-heads-negative", ("kv", "--model", "{cfg:num_key_value_heads=-8}", "--device",
                              "h100-sxm"), 2, "num_key_value_heads"),
    ("kv-head-dim-0", ("kv", "--model", "{cfg:head_dim=0}"), 2, "head_dim"),
    ("kv-layers-1e30", ("kv", "--model", "{cfg:num_hidden_layers=1e30}"), 2,
     "num_hidden_layers"),
    # ---- devices
    ("devices-extra-argument", ("devices", "extra"), 2, "unrecognized arguments"),
    ("devices-unknown-flag", ("devices", "--probe-gpu"), 2, "unrecognized arguments"),
    # ---- probe
    ("probe-runs-1e999", ("probe", DOWN, "--runs", "1e999"), 2, "finite"),
    ("probe-runs-inf", ("probe", DOWN, "--runs", "inf"), 2, "finite"),
    ("probe-runs-nan", ("probe", DOWN, "--runs", "nan"), 2, "finite"),
    ("probe-runs-0", ("probe", DOWN, "--runs", "0"), 2, "from 1 to"),
    ("probe-runs-half", ("probe", DOWN, "--runs", "2.5"), 2, "not a whole number"),
    ("probe-runs-word", ("probe", DOWN, "--runs", "five"), 2, "not a whole number"),
    ("probe-runs-too-many", ("probe", DOWN, "--runs", "1e12"), 2, "to 1,000,000,000"),
    ("probe-max-tokens-1", ("probe", DOWN, "--max-tokens", "1"), 2,
     "--max-tokens must be at least 2"),
    ("probe-prompt-negative", ("probe", DOWN, "--prompt-tokens=-1"), 2, "from 1 to"),
    ("probe-url-bad-port", ("probe", "http://127.0.0.1:notaport"), 2, "not a URL"),
    ("probe-url-open-bracket", ("probe", "http://[::1"), 2, "not a URL"),
    ("probe-url-port-99999", ("probe", "http://127.0.0.1:99999"), 2, "not a URL"),
    ("probe-url-port-0", ("probe", "http://127.0.0.1:0"), 2, "from 1 to 65535"),
    ("probe-url-no-host", ("probe", "http://"), 2, "no host"),
    ("probe-url-scheme", ("probe", "ftp://127.0.0.1:21"), 2, "not an http(s) URL"),
    ("probe-url-no-scheme", ("probe", "127.0.0.1:8000"), 2, "URL"),
    ("probe-out-no-parent", ("probe", DOWN, "--out", "/nonexistent/dir/x.json"), 2,
     "/nonexistent does not exist"),
    ("probe-out-is-folder", ("probe", DOWN, "--out", "{tmp}"), 2, "is a folder"),
    ("probe-out-under-file", ("probe", DOWN, "--out", "{file}/x.json"), 2, "is not a folder"),
    ("probe-out-proc", ("probe", DOWN, "--out", "/proc/pdscope-bad-input.json"), 2,
     "cannot write a file there"),
    ("probe-api-unknown", ("probe", DOWN, "--api", "grpc"), 2, "invalid choice"),
    ("probe-model-empty", ("probe", DOWN, "--model", " "), 2, "model name is empty"),
    ("probe-api-key-env-unset", ("probe", DOWN, "--api-key-env", "PDSCOPE_TEST_UNSET_VAR"), 2,
     "not set"),
    ("probe-device-unknown", ("probe", DOWN, "--device", "h1OO sxm"), 2, "did you mean"),
    ("probe-model-config-missing", ("probe", DOWN, "--model-config", "/no/such/config.json"), 2,
     "no such file"),
    ("probe-model-config-bad", ("probe", DOWN, "--model-config", "{cfg:head_dim=0}"), 2,
     "head_dim"),
    ("probe-server-down", ("probe", DOWN), 1, "cannot connect"),
    # ---- sweep, context, prefix, interference
    ("sweep-lengths-0", ("sweep", DOWN, "--prompt-tokens", "0,100"), 2, "--prompt-tokens"),
    ("sweep-lengths-1e999", ("sweep", DOWN, "--prompt-tokens", "1e999"), 2, "--prompt-tokens"),
    ("sweep-lengths-words", ("sweep", DOWN, "--prompt-tokens", "a,b"), 2, "--prompt-tokens"),
    ("sweep-runs-0", ("sweep", DOWN, "--runs", "0"), 2, "from 1 to"),
    ("sweep-max-tokens-1", ("sweep", DOWN, "--max-tokens", "1"), 2, "--max-tokens"),
    ("sweep-out-no-parent", ("sweep", DOWN, "--out", "/nonexistent/dir/x.json"), 2,
     "does not exist"),
    ("sweep-server-down", ("sweep", DOWN, "--prompt-tokens", "10", "--runs", "1"), 1,
     "cannot connect"),
    ("context-bin-0", ("context", DOWN, "--bin-tokens", "0"), 2, "from 1 to"),
    ("context-two-bins", ("context", DOWN, "--max-tokens", "10", "--bin-tokens", "32"), 2,
     "--max-tokens must be at least two bins"),
    ("context-out-under-file", ("context", DOWN, "--out", "{file}/x.json"), 2,
     "is not a folder"),
    ("prefix-tokens-0", ("prefix", DOWN, "--prefix-tokens", "0"), 2, "from 1 to"),
    ("prefix-requests-1e999", ("prefix", DOWN, "--requests", "1e999"), 2, "finite"),
    ("prefix-out-proc", ("prefix", DOWN, "--out", "/proc/pdscope-bad-input.json"), 2,
     "cannot write a file there"),
    ("interference-streams-0", ("interference", DOWN, "--streams", "0"), 2, "from 1 to"),
    ("interference-settle", ("interference", DOWN, "--stream-tokens", "20", "--settle-tokens",
                             "16"), 2, "at least twice --settle-tokens"),
    ("interference-out-folder", ("interference", DOWN, "--out", "{tmp}"), 2, "is a folder"),
    # ---- bench: numbers
    ("bench-timeout-total-negative", (*BENCH, "--timeout-total=-5"), 2, "above 0"),
    ("bench-timeout-connect-inf", (*BENCH, "--timeout-connect", "inf"), 2, "finite"),
    ("bench-max-concurrency-0", ("bench", DOWN, "--request-rate", "inf", "--num-prompts", "4",
                                 "--max-concurrency", "0"), 2, "from 1 to"),
    ("bench-warmup-negative", (*BENCH, "--warmup=-3"), 2, "from 0 to"),
    ("bench-prefix-groups-0", (*BENCH, "--prefix-groups", "0"), 2, "from 1 to"),
    ("bench-prefix-tokens-negative", (*BENCH, "--prefix-groups", "2", "--prefix-tokens=-5"), 2,
     "from 1 to"),
    ("bench-prefix-groups-and-dataset", (*BENCH, "--prefix-groups", "2", "--dataset",
                                         "{file}"), 2, "exclude each other"),
    ("bench-rate-negative", ("bench", DOWN, "--request-rate=-1", "--num-prompts", "1"), 2,
     "--request-rate"),
    ("bench-rate-nan", ("bench", DOWN, "--request-rate", "nan", "--num-prompts", "1"), 2,
     "--request-rate"),
    ("bench-rate-word", ("bench", DOWN, "--request-rate", "fast", "--num-prompts", "1"), 2,
     "--request-rate"),
    ("bench-concurrency-0", ("bench", DOWN, "--concurrency", "0", "--num-prompts", "1"), 2,
     "--concurrency"),
    ("bench-neither-loop", ("bench", DOWN, "--num-prompts", "1"), 2,
     "--request-rate or --concurrency"),
    ("bench-both-loops", ("bench", DOWN, "--request-rate", "1", "--concurrency", "1",
                          "--num-prompts", "1"), 2, "one of them"),
    ("bench-no-end", ("bench", DOWN, "--concurrency", "1"), 2, "--num-prompts or --duration"),
    ("bench-num-prompts-0", ("bench", DOWN, "--concurrency", "1", "--num-prompts", "0"), 2,
     "from 1 to"),
    ("bench-duration-0", ("bench", DOWN, "--concurrency", "1", "--duration", "0"), 2,
     "above 0"),
    ("bench-duration-inf", ("bench", DOWN, "--concurrency", "1", "--duration", "inf"), 2,
     "finite"),
    ("bench-ramp-negative", (*BENCH, "--ramp=-1"), 2, "from 0 to"),
    ("bench-burstiness-0", ("bench", DOWN, "--request-rate", "1", "--num-prompts", "1",
                            "--burstiness", "0"), 2, "above 0"),
    ("bench-drain-negative", (*BENCH, "--drain=-1"), 2, "from 0 to"),
    ("bench-input-len-range", (*BENCH, "--input-len", "uniform:50:10"), 2, "--input-len"),
    ("bench-input-len-negative", (*BENCH, "--input-len=-5"), 2, "--input-len"),
    ("bench-output-len-word", (*BENCH, "--output-len", "long"), 2, "--output-len"),
    ("bench-goodput-bad", (*BENCH, "--goodput", "ttft:soon"), 2, "goodput"),
    ("bench-goodput-itl", (*BENCH, "--goodput", "itl:50"), 2, "use ttft:MS,tpot:MS,e2e:MS"),
    ("bench-dataset-missing", (*BENCH, "--dataset", "/no/such/prompts.jsonl"), 2,
     "no such file"),
    ("bench-conversations-0", ("bench", DOWN, "--conversations", "0"), 2,
     "--conversations must be at least 1"),
    ("bench-turns-0", ("bench", DOWN, "--conversations", "2", "--turns", "0"), 2,
     "--turns must be at least 1"),
    ("bench-think-negative", ("bench", DOWN, "--conversations", "2", "--think-s=-1"), 2,
     "--think-s must be from 0"),
    ("bench-conversations-bad-line", ("bench", DOWN, "--conversations", "1", "--dataset",
                                      "{file}"), 2, ":1: not JSON"),
    ("bench-capacity-no-slo", ("bench", DOWN, "--find-capacity"), 2,
     "--find-capacity needs --slo"),
    ("bench-capacity-slo-alone", ("bench", DOWN, "--slo", "ttft:500"), 2,
     "add --find-capacity"),
    ("bench-capacity-negative-slo", ("bench", DOWN, "--find-capacity", "--slo", "ttft:-5"), 2,
     "positive number of milliseconds"),
    ("bench-capacity-unknown-slo", ("bench", DOWN, "--find-capacity", "--slo", "speed:5"), 2,
     "--slo: bad objective"),
    ("bench-capacity-with-load", ("bench", DOWN, "--find-capacity", "--slo", "ttft:500",
                                  "--concurrency", "4"), 2, "leave out --concurrency"),
    ("bench-capacity-no-calibration", ("bench", DOWN, "--find-capacity", "--slo", "ttft:500",
                                       "--calibration", "/no/such/calibration.json"), 2,
     "no such file"),
    ("bench-capacity-tolerance-0", ("bench", DOWN, "--find-capacity", "--slo", "ttft:500",
                                    "--capacity-tolerance", "0"), 2, "above 0"),
    ("bench-max-failed-1.5", (*BENCH, "--max-failed", "1.5"), 2, "from 0 to 1"),
    ("bench-max-failed-negative", (*BENCH, "--max-failed=-0.1"), 2, "from 0 to 1"),
    ("bench-goodput-negative", (*BENCH, "--goodput", "ttft:-5"), 2, "positive"),
    ("bench-goodput-unknown", (*BENCH, "--goodput", "speed:5"), 2, "use ttft:MS"),
    # ---- the request fields every request-sending command takes (client/fields.py)
    ("bench-extra-body-list", (*BENCH, "--extra-body", "[1, 2]"), 2,
     "--extra-body: must be a JSON object"),
    ("bench-extra-body-string", (*BENCH, "--extra-body", '"thinking off"'), 2,
     "must be a JSON object"),
    ("bench-extra-body-not-json", (*BENCH, "--extra-body", "{thinking=off}"), 2, "not JSON"),
    ("bench-extra-body-nan", (*BENCH, "--extra-body", '{"x": NaN}'), 2, "not JSON"),
    ("bench-extra-body-stream", (*BENCH, "--extra-body", '{"stream": false}'), 2,
     "--extra-body cannot set 'stream'"),
    ("probe-extra-body-max-tokens", ("probe", DOWN, "--extra-body", '{"max_tokens": 9}'), 2,
     "--extra-body cannot set 'max_tokens'"),
    ("sweep-extra-body-ignore-eos", ("sweep", DOWN, "--extra-body", '{"ignore_eos": false}'),
     2, "--extra-body cannot set 'ignore_eos'"),
    ("bench-header-no-colon", (*BENCH, "--header", "X-Token"), 2, "NAME:VALUE"),
    ("bench-header-no-value", (*BENCH, "--header", "X-Token:"), 2, "has no value"),
    ("bench-header-bad-name", (*BENCH, "--header", "X Token:v"), 2, "not a header name"),
    ("doctor-header-content-type", ("doctor", DOWN, "--header", "Content-Type:text/plain"), 2,
     "--header cannot set Content-Type"),
    ("bench-header-twice", (*BENCH, "--header", "X-A:1", "--header", "x-a:2"), 2,
     "--header names x-a twice"),
    ("bench-header-and-key", (*BENCH, "--header", "Authorization:Bearer a", "--api-key", "b"),
     2, "give one of them"),
    ("bench-option-no-equals", (*BENCH, "--option", "num_ctx"), 2, "KEY=VALUE"),
    ("bench-option-num-predict", (*BENCH, "--api", "ollama", "--option", "num_predict=5"), 2,
     "--option cannot set num_predict"),
    ("bench-option-openai", (*BENCH, "--api", "openai", "--option", "num_ctx=8192"), 2,
     "Ollama's options (--option) go to its native API only"),
    ("bench-temperature-negative", (*BENCH, "--temperature=-1"), 2,
     "--temperature must be a number of at least 0"),
    ("bench-temperature-nan", (*BENCH, "--temperature", "nan"), 2, "finite"),
    ("bench-top-p-0", (*BENCH, "--top-p", "0"), 2, "--top-p must be above 0"),
    ("bench-sampling-seed-word", (*BENCH, "--sampling-seed", "lucky"), 2, "--sampling-seed"),
    ("plan-calibrate-extra-body-list", ("plan", "calibrate", DOWN, "--extra-body", "[]"), 2,
     "JSON object"),
    # ---- bench: scale-out
    ("bench-workers-0", (*BENCH, "--workers", "0"), 2, "from 1 to"),
    ("bench-workers-word", (*BENCH, "--workers", "many"), 2, "or auto"),
    ("bench-workers-half", (*BENCH, "--workers", "1.5"), 2, "not a whole number"),
    ("bench-workers-and-ray", (*BENCH, "--workers", "2", "--ray", "local"), 2,
     "--workers and --ray exclude each other"),
    ("bench-ray-http-address", (*BENCH, "--ray", "http://head:8265"), 2, "not a Ray address"),
    ("bench-ray-no-port", (*BENCH, "--ray", "head"), 2, "not a Ray address"),
    # ---- bench: the run folder, checked before the first request
    ("bench-out-proc", (*BENCH, "--out", "/proc/pdscope-bad-input"), 2,
     "cannot create that folder"),
    ("bench-out-under-file", (*BENCH, "--out", "{file}/run"), 2, "is a file"),
    ("bench-out-is-file", (*BENCH, "--out", "{file}"), 2, "a file of that name exists"),
    # ---- bench: runs that failed exit 1
    ("bench-server-down", (*BENCH,), 1, "cannot connect"),
    ("bench-wrong-api", ("bench", "{ref}", "--api", "ollama", "--concurrency", "2",
                         "--num-prompts", "4", "--input-len", "8", "--output-len", "4",
                         "--out", "{tmp}/run"), 1, "no request completed"),
    ("bench-timeout-tiny", ("bench", "{ref}", "--concurrency", "2", "--num-prompts", "4",
                            "--input-len", "8", "--output-len", "50", "--timeout-total",
                            "0.001", "--out", "{tmp}/run"), 1, "no request completed"),
    ("bench-max-failed-exceeded", ("bench", "{faulty}", "--concurrency", "4", "--num-prompts",
                                   "24", "--input-len", "8", "--output-len", "4",
                                   "--max-failed", "0.05", "--out", "{tmp}/run"), 1,
     "more than the 5% allowed"),
    # ---- watch
    ("watch-no-url", ("watch",), 2, "give the server's URL"),
    ("watch-url-bad-port", ("watch", "http://127.0.0.1:notaport", "--once"), 2, "not a URL"),
    ("watch-interval-0", ("watch", DOWN, "--interval", "0"), 2, "above 0"),
    ("watch-interval-inf", ("watch", DOWN, "--interval", "inf"), 2, "finite"),
    ("watch-count-0", ("watch", DOWN, "--count", "0"), 2, "from 1 to"),
    ("watch-once-and-count", ("watch", DOWN, "--once", "--count", "3"), 2, "exclude each other"),
    ("watch-family-unknown", ("watch", DOWN, "--family", "nope"), 2, "invalid choice"),
    ("watch-device-unknown", ("watch", DOWN, "--device", "h1OO sxm"), 2, "did you mean"),
    ("watch-timeout-negative", ("watch", DOWN, "--timeout=-1"), 2, "above 0"),
    ("watch-server-down", ("watch", DOWN, "--once"), 1, "127.0.0.1:9"),
    # ---- doctor
    ("doctor-compare-missing", ("doctor", DOWN, "--compare-with", "/nonexistent"), 2,
     "no evidence.json"),
    ("doctor-compare-list", ("doctor", DOWN, "--compare-with", "{ev:list}"), 2,
     "not an object"),
    ("doctor-compare-unknown-keys", ("doctor", DOWN, "--compare-with", "{ev:unknown}"), 2,
     "unknown keys"),
    ("doctor-compare-not-json", ("doctor", DOWN, "--compare-with", "{ev:garbage}"), 2,
     "not JSON"),
    ("doctor-compare-runs-not-list", ("doctor", DOWN, "--compare-with", "{ev:dict}"), 2,
     "not a list"),
    ("doctor-compare-missing-keys", ("doctor", DOWN, "--compare-with", "{ev:missing}"), 2,
     "missing"),
    ("doctor-out-is-file", ("doctor", DOWN, "--out", "{file}"), 2, "a file of that name exists"),
    ("doctor-out-proc", ("doctor", DOWN, "--out", "/proc/pdscope-bad-input"), 2,
     "cannot create that folder"),
    ("doctor-slo-word", ("doctor", DOWN, "--slo", "ttft:soon"), 2, "milliseconds"),
    ("doctor-slo-negative", ("doctor", DOWN, "--slo", "ttft:-1"), 2, "positive"),
    ("doctor-slo-inf", ("doctor", DOWN, "--slo", "itl:inf"), 2, "positive"),
    ("doctor-slo-unknown", ("doctor", DOWN, "--slo", "tpot:50"), 2, "use ttft:MS,itl:MS"),
    ("doctor-url-bad", ("doctor", "http://[::1"), 2, "not a URL"),
    ("doctor-device-unknown", ("doctor", DOWN, "--device", "h1OO sxm"), 2, "did you mean"),
    ("doctor-server-down", ("doctor", DOWN, "--out", "{tmp}/doc"), 1, "cannot connect"),
    # ---- selftest (never runs its load here: every case fails on its input)
    ("selftest-serve-port-99999", ("selftest", "--serve", "--port", "99999"), 2,
     "from 0 to 65,535"),
    ("selftest-itl-negative", ("selftest", "--itl-ms=-5"), 2, "above 0"),
    ("selftest-itl-nan", ("selftest", "--itl-ms", "nan"), 2, "finite"),
    ("selftest-ttft-negative", ("selftest", "--ttft-ms=-1"), 2, "from 0 to"),
    ("selftest-output-tokens-0", ("selftest", "--output-tokens", "0"), 2, "from 2 to"),
    ("selftest-fault-rate-2", ("selftest", "--serve", "--fault-rate", "2"), 2, "from 0 to 1"),
    ("selftest-levels-0", ("selftest", "--levels", "0,4"), 2, "--levels"),
    ("selftest-levels-words", ("selftest", "--levels", "a,b"), 2, "--levels"),
    ("selftest-port-without-serve", ("selftest", "--port", "8300"), 2, "go with --serve"),
    ("selftest-serve-port-taken", ("selftest", "--serve", "--port", "{busy}"), 1,
     "address already in use"),
    # ---- lab (no server is ever started here: every case fails first)
    ("lab-no-action", ("lab",), 2, "required"),
    ("lab-engine-unknown", ("lab", "start", "--engine", "tgi"), 2, "invalid choice"),
    ("lab-port-99999", ("lab", "start", "--port", "99999"), 2, "from 0 to 65,535"),
    ("lab-port-negative", ("lab", "start", "--port=-1"), 2, "from 0 to 65,535"),
    ("lab-timeout-negative", ("lab", "start", "--timeout=-5"), 2, "above 0"),
    ("lab-stop-port-bad", ("lab", "stop", "--port", "70000"), 2, "from 0 to 65,535"),
    ("lab-host-passthrough", ("lab", "start", "--", "--host", "0.0.0.0"), 2, "--expose"),
    ("lab-host-eq-passthrough", ("lab", "start", "--", "--host=0.0.0.0"), 2, "--expose"),
    ("lab-port-passthrough", ("lab", "start", "--engine", "llamacpp", "--", "--port", "9999"), 2,
     "--expose"),
    ("lab-expose-host-no-value", ("lab", "start", "--expose", "--", "--host"), 2, "no value"),
    ("lab-expose-port-word", ("lab", "start", "--expose", "--", "--port", "http"), 2,
     "not a port number"),
    # ---- demo (fails before the lab starts)
    ("demo-engine-unknown", ("demo", "--engine", "tgi"), 2, "invalid choice"),
    ("demo-out-is-file", ("demo", "--out", "{file}"), 2, "a file of that name exists"),
    ("demo-out-proc", ("demo", "--out", "/proc/pdscope-bad-input"), 2, "cannot create"),
    # ---- plan ({cal}: a calibration folder)
    ("plan-no-action", ("plan",), 2, "required"),
    ("plan-set-unknown", (*PREDICT, "--set", "budget=512"), 2, "known: max_num_batched_tokens"),
    ("plan-set-no-value", (*PREDICT, "--set", "max_num_seqs"), 2, "unknown setting"),
    ("plan-set-word", (*PREDICT, "--set", "max_num_seqs=many"), 2, "whole number"),
    ("plan-set-zero", (*PREDICT, "--set", "max_num_seqs=0"), 2, "at least 1"),
    ("plan-set-budget-below-seqs", (*PREDICT, "--set", "max_num_batched_tokens=8"), 2,
     "at least the number of sequences"),
    ("plan-set-prefix-word", (*PREDICT, "--set", "prefix_caching=maybe"), 2, "on or off"),
    ("plan-replicas-0", (*PREDICT, "--replicas", "0"), 2, "from 1 to"),
    ("plan-no-load", ("plan", "predict", "{cal}"), 2, "one of the arguments"),
    ("plan-rate-and-users", (*PREDICT, "--users", "2"), 2, "not allowed with"),
    ("plan-rate-0", ("plan", "predict", "{cal}", "--rate", "0"), 2, "above 0"),
    ("plan-rate-inf", ("plan", "predict", "{cal}", "--rate", "inf"), 2, "finite"),
    ("plan-input-len-bad", (*PREDICT, "--input-len", "lots"), 2, "bad length"),
    ("plan-shared-prefix-2", (*PREDICT, "--shared-prefix", "2"), 2, "0 to 1"),
    ("plan-cal-missing", ("plan", "predict", "{tmp}/nowhere", "--rate", "1"), 2,
     "cannot read the calibration"),
    ("plan-cal-not-json", ("plan", "predict", "{file}", "--rate", "1"), 2, "not JSON"),
    ("plan-cal-other-json", ("plan", "predict", "{cfg:num_key_value_heads=8}", "--rate", "1"),
     2, "not a pdscope calibration"),
    ("plan-device-unknown", (*PREDICT, "--device", "nope-9000"), 2, "nope-9000"),
    ("plan-lengths-twice", (*PREDICT, "--lengths", "sharegpt", "--from-run", "{tmp}"), 2,
     "exclude each other"),
    ("plan-dataset-missing", (*PREDICT, "--dataset", "{tmp}/none.jsonl"), 2, "no such file"),
    ("plan-from-run-empty", (*PREDICT, "--from-run", "{tmp}"), 2,
     "not a readable bench run folder"),
    ("plan-conversations-turns-0", (*CHATS, "--turns", "0"), 2, "--turns must be at least 1"),
    ("plan-conversations-think-negative", (*CHATS, "--think-s", "-1"), 2,
     "--think-s must be at least 0"),
    ("plan-conversations-think-inf", (*CHATS, "--think-s", "inf"), 2, "--think-s must be a"),
    ("plan-conversations-0", ("plan", "predict", "{cal}", "--conversations", "0"), 2,
     "--conversations must be at least 1"),
    ("plan-conversations-user-len-0", (*CHATS, "--user-len", "0"), 2, "--user-len must be"),
    ("plan-conversations-rate-0", (*CHATS, "--request-rate", "0"), 2, "--request-rate must"),
    ("plan-conversations-rate-list", (*CHATS, "--request-rate", "1,2"), 2, "one --request-rate"),
    ("plan-conversations-output-drawn", (*CHATS, "--output-len", "uniform:8:16"), 2,
     "fixed --output-len"),
    ("plan-conversations-input-len", (*CHATS, "--input-len", "100"), 2,
     "--input-len does not apply to --conversations"),
    ("plan-conversations-with-rate", (*CHATS, "--rate", "1"), 2, "not allowed with"),
    ("plan-turns-without-conversations", (*PREDICT, "--turns", "3"), 2,
     "--turns applies to --conversations"),
    ("plan-slo-missing", ("plan", "capacity", "{cal}"), 2, "--slo"),
    ("plan-slo-no-limit", ("plan", "capacity", "{cal}", "--slo", "ttft"), 2, "ttft:MS"),
    ("plan-slo-unknown", ("plan", "capacity", "{cal}", "--slo", "speed:5"), 2, "ttft:MS"),
    ("plan-slo-word", ("plan", "capacity", "{cal}", "--slo", "ttft:soon"), 2, "milliseconds"),
    ("plan-slo-negative", ("plan", "capacity", "{cal}", "--slo", "ttft:-5"), 2,
     "positive number"),
    ("plan-slo-unreachable", ("plan", "capacity", "{cal}", "--slo", "ttft:1"), 2,
     "no load meets the SLO"),
    ("plan-percentile-0", ("plan", "capacity", "{cal}", "--slo", "ttft:500", "--percentile",
                           "0"), 2, "above 0"),
    ("plan-whatif-device-unknown", ("plan", "whatif", "{cal}", "--slo", "ttft:500",
                                    "--devices", "h100-sxm,nope-9000"), 2, "nope-9000"),
    ("plan-calibrate-down", ("plan", "calibrate", DOWN, "--out", "{tmp}/cal"), 1,
     "127.0.0.1:9"),
    ("plan-calibrate-out-proc", ("plan", "calibrate", DOWN, "--out", "/proc/pdscope-cal"), 2,
     "cannot create"),
    ("plan-calibrate-runs-0", ("plan", "calibrate", DOWN, "--runs", "0"), 2, "from 1 to"),
]

# The cases the issue lists, by id: each must be in the table.
LISTED = {
    "probe-runs-1e999", "ceiling-params-1e999-json", "ceiling-params-1e999", "kv-kv-heads-0",
    "kv-head-dim-0", "kv-layers-1e30", "bench-out-proc", "bench-out-under-file",
    "bench-out-is-file", "probe-out-no-parent", "bench-prefix-tokens-negative",
    "doctor-compare-unknown-keys", "doctor-compare-list", "selftest-serve-port-99999",
    "kv-reserve-negative", "kv-kv-heads-negative", "selftest-itl-negative",
    "bench-timeout-total-negative", "bench-max-concurrency-0", "bench-warmup-negative",
    "bench-prefix-groups-0", "doctor-compare-missing", "probe-url-bad-port",
    "probe-url-open-bracket", "bench-wrong-api", "lab-host-passthrough",
}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-inputs")
    a_file = root / "a-file.txt"
    a_file.write_text("not a config, not a folder\n")
    return {"root": root, "file": a_file}


def _config(root: Path, spec: str) -> str:
    """``num_key_value_heads=0``: Llama-3.1-8B's config.json with that field changed."""
    name, value = spec.split("=")
    cfg = json.loads((MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    cfg[name] = int(float(value)) if "e" not in value else 10 ** int(value.split("e")[1])
    path = root / f"config-{name}-{value}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _evidence(root: Path, kind: str) -> str:
    folder = root / f"evidence-{kind}"
    folder.mkdir(exist_ok=True)
    good = {"streams": 4, "inject_tokens": 1800, "p99_before_s": 0.02, "p99_during_s": 0.5,
            "max_gap_during_s": 1.5}
    text = {
        "list": json.dumps([good]),
        "unknown": json.dumps({"interference": [{**good, "stall_ms": 1500}]}),
        "garbage": "{not json",
        "dict": json.dumps({"interference": {"streams": 4}}),
        "missing": json.dumps({"interference": [{"streams": 4}]}),
    }[kind]
    (folder / "evidence.json").write_text(text)
    return str(folder)


@pytest.fixture(scope="module")
def ref() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(ttft_base_s=0.01, ttft_per_token_s=0.0,
                                           itl_s=0.002)) as url:
        yield url


@pytest.fixture(scope="module")
def cal(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A calibration folder: a step model like the lab's vLLM, vLLM's default scheduler."""
    folder = tmp_path_factory.mktemp("calibration")
    Calibration(StepModel(0.012, 0.00045, 0.0005, 2e-6, 1e-9), SchedulerConfig(),
                CalibratedServer(family="vllm")).save(folder)
    return str(folder)


@pytest.fixture(scope="module")
def busy() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def faulty() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(ttft_base_s=0.01, ttft_per_token_s=0.0, itl_s=0.002,
                                           faults=("http_500",), fault_rate=0.5,
                                           seed=5)) as url:
        yield url


def _fill(arg: str, place: dict[str, Path], tmp: Path, request: pytest.FixtureRequest) -> str:
    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "tmp":
            return str(tmp)
        if key == "file":
            return str(place["file"])
        if key.startswith("cfg:"):
            return _config(place["root"], key[4:])
        if key.startswith("ev:"):
            return _evidence(place["root"], key[3:])
        return str(request.getfixturevalue(key))  # ref, faulty, busy: made only when needed

    return re.sub(r"\{([a-z]+(?::[^}]*)?)\}", one, arg)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``pdscope ARGV`` in this process: (exit status, stdout, stderr). Anything but a clean
    exit (a traceback) fails the test with the exception."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:
        out = capsys.readouterr()
        pytest.fail(f"pdscope {' '.join(argv)} raised {type(exc).__name__}: {exc}\n{out.err}")
    out = capsys.readouterr()
    return code, out.out, out.err


def error_lines(stderr: str) -> list[str]:
    """stderr's lines, warnings aside; a blank line counts (it is what a stray progress bar
    leaves)."""
    return [line for line in stderr.splitlines() if not line.startswith("pdscope: warning:")]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache (rescue folder, lab records, saved self-test) in a folder of the test's own;
    no key from the environment; a run folder by default under the test's folder."""
    monkeypatch.setenv("PDSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PDSCOPE_LAB_STATE", str(tmp_path / "cache" / "lab"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("PDSCOPE_TEST_UNSET_VAR", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "code", "needle"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_its_exit_status(
    argv: tuple[str, ...], code: int, needle: str, place: dict[str, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:
    args = [_fill(a, place, tmp_path, request) for a in argv]
    got, _, err = run_cli(args, capsys)
    lines = error_lines(err)
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"stderr is not one line: {err!r}"
    assert lines[0].startswith("pdscope: "), lines[0]
    assert needle.lower() in lines[0].lower(), lines[0]
    assert got == code, f"exit {got}, not {code}: {lines[0]}"


def test_the_table_is_large_and_holds_every_listed_case() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 80
    assert set(ids) >= LISTED, LISTED - set(ids)
    commands = {c[1][0] for c in CASES}
    assert {"ceiling", "kv", "devices", "probe", "sweep", "context", "prefix", "interference",
            "bench", "watch", "doctor", "selftest", "lab", "demo", "plan"} <= commands


# ------------------------------------------------------------- what the table cannot show


def test_a_bad_input_leaves_no_run_folder_behind(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A folder made for the run is removed again when the run fails before writing to it."""
    out = tmp_path / "new" / "run"
    code, _, _ = run_cli([*BENCH, "--out", str(out)], capsys)
    assert code == 1 and not (tmp_path / "new").exists()


def test_bench_without_max_failed_passes_a_partly_failed_run(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Half the requests failed: exit 0 by default (some completed), and the run folder holds
    every one of them; --max-failed 0.9 lets it pass too."""
    for extra in ([], ["--max-failed", "0.9"]):
        out = tmp_path / f"run{len(extra)}"
        code, stdout, err = run_cli(
            ["bench", faulty, "--concurrency", "4", "--num-prompts", "24", "--input-len", "8",
             "--output-len", "4", "--out", str(out), "--json", *extra], capsys)
        assert code == 0, err
        summary = json.loads(stdout)
        assert 0 < summary["failed"] < 24 and summary["completed"] + summary["failed"] == 24
        assert len((out / "requests.jsonl").read_text().splitlines()) == 24


def test_bench_on_ray_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what a core install without Ray has
    got, _, err = run_cli([*BENCH, "--ray", "local"], capsys)
    lines = error_lines(err)
    assert got == 2 and len(lines) == 1, err
    assert lines[0] == "pdscope: Ray is not installed: pip install 'pdscope[ray]'"


def test_a_host_name_that_does_not_resolve_says_so() -> None:
    err = socket.gaierror(-2, "Name or service not known")
    exc: Any = SimpleNamespace(os_error=err, host="gpu-box.invalid")
    reason = connect_reason(exc)
    assert "Unknown error" not in reason
    assert reason == "the host name 'gpu-box.invalid' could not be resolved (Name or service" \
                     " not known)"
    refused: Any = SimpleNamespace(os_error=ConnectionRefusedError(111, "refused"), host="h")
    assert connect_reason(refused) == "Connection refused"


def test_the_lab_refuses_host_and_port_flags_unless_exposed(
    capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InputError, match="expose"):
        check_engine_args(["--max-num-batched-tokens", "256", "--host", "0.0.0.0"])
    assert check_engine_args(["--max-num-batched-tokens", "256"]) == ("127.0.0.1", None)
    assert check_engine_args(["--host=0.0.0.0", "--port", "9000"], expose=True) == ("0.0.0.0",
                                                                                   9000)
    check_exposure("vllm", None, ["--host", "0.0.0.0"], expose=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pdscope: warning: --expose")
    assert "0.0.0.0:28100" in err[0] and "no API key" in err[0]


def test_demo_ends_by_saying_the_lab_still_runs(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    server = SimpleNamespace(url="http://127.0.0.1:28100", pid=4242, engine="vllm",
                             model="smollm2", log_path="/tmp/log", extra_args=())
    monkeypatch.setattr(demo_cmd, "start_with_progress", lambda *a, **k: (server, True, 0.0))
    given: list[argparse.Namespace] = []
    monkeypatch.setattr(demo_cmd.doctor_cmd, "run", lambda args: given.append(args) or 0)
    folder = str(tmp_path / "demo")
    code, out, _ = run_cli(["demo", "--quick", "--out", folder], capsys)
    assert code == 0
    last = out.strip().splitlines()[-1]
    assert "still running at http://127.0.0.1:28100" in last and "pdscope lab stop" in last
    # The doctor is given what `pdscope doctor URL --quick --out DIR` gives it, every flag there.
    typed = build_parser().parse_args(["doctor", server.url, "--quick", "--out", folder])
    assert [vars(a) for a in given] == [vars(typed)]


def test_a_result_that_cannot_be_written_goes_to_the_rescue_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone"
    where = write_result(gone / "probe.json", '{"ok": true}')
    assert where.parent == tmp_path / "cache" / "rescued" and where.name.endswith("probe.json")
    assert json.loads(where.read_text()) == {"ok": True}
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("pdscope: warning: could not write") and str(where) in warning


def test_a_run_folder_removed_mid_run_is_rescued(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run", RunMeta(url="http://x"))
    (tmp_path / "run" / "requests.jsonl").unlink()
    (tmp_path / "run" / "run.json").unlink()
    (tmp_path / "run").rmdir()
    stage = summarize_stage(StageRun(Stage(concurrency=1, num_prompts=1), 0, 0.0))
    folder.finish([replace(stage, completed=1)], sweep=False)
    assert folder.path.parent == tmp_path / "cache" / "rescued"
    assert json.loads((folder.path / "summary.json").read_text())["completed"] == 1
    assert folder.warnings and "could not write the run folder" in folder.warnings[0]


def test_an_earlier_doctors_evidence_still_reads(tmp_path: Path) -> None:
    """The strict reading of --compare-with accepts what a doctor writes (``asdict``)."""
    run = InterferenceEvidence(streams=4, inject_tokens=1800, p99_before_s=0.02,
                               p99_during_s=0.4, max_gap_during_s=1.5, budget_tokens=2048,
                               label="--max-num-batched-tokens 2048")
    (tmp_path / "evidence.json").write_text(json.dumps({"interference": [asdict(run)],
                                                        "server": {"kind": "vllm"}}))
    assert previous_interference(tmp_path) == [run]


def test_no_config_shows_the_api_key() -> None:
    from pdscope.doctor.run import DoctorConfig
    from pdscope.experiments.probe import ProbeConfig
    from pdscope.load.bench import BenchConfig

    for config in (ProbeConfig(api_key="sk-secret-1"), BenchConfig(api_key="sk-secret-1"),
                   DoctorConfig(api_key="sk-secret-1")):
        assert "sk-secret-1" not in repr(config) and "sk-secret-1" not in str(config.to_json())
