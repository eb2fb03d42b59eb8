"""The fields a user adds to every request (issue 23, point 3): ``--extra-body`` reaches the
server, sampling settings go where each API takes them, a header arrives and its value is
nowhere pdscope prints or writes, and what the measurement depends on cannot be overridden."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pdscope.cli import build_parser
from pdscope.cli.server_args import client_kwargs, request_fields
from pdscope.client import ClientOptions, Target, Timeouts, new_session, stream_request
from pdscope.client.fields import REDACTED, RequestFields
from pdscope.client.ollama import build_body as ollama_body
from pdscope.client.openai import build_body as openai_body
from pdscope.errors import InputError
from pdscope.load.results import RunMeta
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.selftest.server import RECEIVED_PATH
from tests.unit.test_client_support import app_server, run

SECRET = "pdscope-proxy-token-5c1e9d07"
THINKING_OFF = '{"chat_template_kwargs": {"enable_thinking": false}}'
FIELDS = ("--extra-body", THINKING_OFF, "--header", f"X-Proxy-Auth:{SECRET}",
          "--header", "X-Team:perf", "--temperature", "0.3", "--top-p", "0.9",
          "--sampling-seed", "7")
WANT = RequestFields(extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                     headers=(("X-Proxy-Auth", SECRET), ("X-Team", "perf")),
                     temperature=0.3, top_p=0.9, seed=7)


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(ttft_base_s=0.01, ttft_per_token_s=0.0,
                                           itl_s=0.002)) as url:
        yield url


def received(url: str) -> list[dict[str, Any]]:
    """What the reference server got: its last generation requests, oldest first."""
    with urllib.request.urlopen(url + RECEIVED_PATH, timeout=10) as resp:
        text = resp.read().decode()
    assert SECRET not in text  # the server keeps each header's value as a hash only
    requests: list[dict[str, Any]] = json.loads(text)["requests"]
    return requests


def pdscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdscope", *args], capture_output=True,
                          text=True, timeout=120)


def assert_nowhere(secret: str, *texts: str, folder: Path | None = None) -> None:
    for text in texts:
        assert secret not in text
    for path in (folder.rglob("*") if folder is not None else ()):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def assert_carried(request: dict[str, Any]) -> None:
    """One request the server got carries every field of FIELDS."""
    body = request["body"]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.3, 0.9, 7)
    # pdscope's own fields stay as the measurement needs them.
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True
    headers = request["headers"]
    assert headers["x-proxy-auth"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert headers["x-team"] == hashlib.sha256(b"perf").hexdigest()


# ------------------------------------------------------------------ the acceptance


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [(), ("--workers", "2")], ids=["in-process", "workers"])
def test_bench_extra_body_reaches_the_server_and_the_header_value_is_nowhere(
        reference: str, tmp_path: Path, workers: tuple[str, ...]) -> None:
    out = tmp_path / "run"
    r = pdscope("bench", reference, "--concurrency", "2", "--num-prompts", "6",
                "--input-len", "10", "--output-len", "4", "--api", "openai-chat",
                "--out", str(out), "--json", *workers, *FIELDS)
    assert r.returncode == 0, r.stderr
    got = [x for x in received(reference) if x["path"] == "/v1/chat/completions"][-6:]
    assert len(got) == 6
    for request in got:
        assert_carried(request)
    assert_nowhere(SECRET, r.stdout, r.stderr, folder=out)
    # run.json records what was added, the header by name with its value redacted.
    recorded = json.loads((out / "run.json").read_text())["request_fields"]
    assert recorded["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    assert recorded["headers"] == {"X-Proxy-Auth": REDACTED, "X-Team": REDACTED}
    assert (recorded["temperature"], recorded["top_p"], recorded["seed"]) == (0.3, 0.9, 7)


@pytest.mark.timeout(120)
def test_probe_and_sweep_send_the_fields_too(reference: str, tmp_path: Path) -> None:
    for argv in (("probe", reference, "--prompt-tokens", "10", "--max-tokens", "4",
                  "--runs", "2"),
                 ("sweep", reference, "--prompt-tokens", "10,20", "--max-tokens", "4",
                  "--runs", "1")):
        out = tmp_path / f"{argv[0]}.json"
        r = pdscope(*argv, "--json", "--raw", "--out", str(out), *FIELDS)
        assert r.returncode == 0, r.stderr
        assert_carried(received(reference)[-1])
        assert_nowhere(SECRET, r.stdout, r.stderr, folder=tmp_path)
        saved = json.loads(out.read_text())  # written, with no secret in it
        recorded = saved.get("request_fields") or saved["config"]["request_fields"]
        assert recorded["headers"]["X-Proxy-Auth"] == REDACTED
        assert recorded["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}


def _commands_with_server_flags() -> dict[str, argparse.ArgumentParser]:
    """Every command (and ``plan`` subcommand) whose parser takes ``--api``: those that send
    requests."""
    def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    found = {}
    for name, parser in subparsers(build_parser()).items():
        for sub, child in {name: parser, **{f"{name} {k}": v for k, v in
                                            subparsers(parser).items()}}.items():
            if any("--api" in a.option_strings for a in child._actions):
                found[sub] = child
    return found


# A command line each command parses (URLs never contacted: only the flags are read).
ARGV = {
    "probe": ["probe", "http://127.0.0.1:9"],
    "sweep": ["sweep", "http://127.0.0.1:9"],
    "context": ["context", "http://127.0.0.1:9"],
    "prefix": ["prefix", "http://127.0.0.1:9"],
    "interference": ["interference", "http://127.0.0.1:9"],
    "bench": ["bench", "http://127.0.0.1:9", "--concurrency", "1"],
    "doctor": ["doctor", "http://127.0.0.1:9"],
    "plan calibrate": ["plan", "calibrate", "http://127.0.0.1:9"],
    "ab": ["ab", "http://127.0.0.1:9", "http://127.0.0.1:10"],
}


def test_every_command_that_sends_requests_takes_the_request_fields() -> None:
    commands = _commands_with_server_flags()
    assert set(commands) == set(ARGV), "a command sends requests: list it in ARGV"
    for name, argv in ARGV.items():
        args = build_parser().parse_args([*argv, *FIELDS, "--option", "num_ctx=8192"])
        fields = client_kwargs(args)["request_fields"]
        assert fields == RequestFields(**{**vars(WANT), "options": (("num_ctx", 8192),)}), name
        assert request_fields(args) == fields


# ------------------------------------------------------------------ where each field goes


def test_an_openai_body_takes_sampling_at_the_top_and_keeps_pdscope_s_own_fields() -> None:
    t = Target("http://h:8000", "openai-chat", "m", fixed_output=True, server_kind="vllm",
               fields=WANT)
    body = openai_body(t, 64, "hi")
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.3, 0.9, 7)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["max_tokens"] == 64 and body["stream"] is True and body["model"] == "m"
    assert body["ignore_eos"] is True  # vLLM's fixed output length is still asked for


def test_an_ollama_body_takes_sampling_and_options_in_options() -> None:
    fields = RequestFields(temperature=0.0, seed=3, options=(("num_ctx", 8192), ("stop", ["\n"])),
                           extra_body={"keep_alive": "5m", "options": {"top_k": 20}})
    body = ollama_body(Target("http://h:11434", "ollama", "m", fields=fields), 32, "Why?")
    assert body["options"] == {"temperature": 0.0, "seed": 3, "num_ctx": 8192, "stop": ["\n"],
                               "top_k": 20, "num_predict": 32}
    assert body["keep_alive"] == "5m" and "temperature" not in body


@pytest.mark.parametrize("kwargs, words", [
    ({"extra_body": {"stream": False}}, "extra_body cannot set 'stream'"),
    ({"extra_body": {"max_tokens": 5}}, "extra_body cannot set 'max_tokens'"),
    ({"extra_body": {"ignore_eos": False}}, "extra_body cannot set 'ignore_eos'"),
    ({"extra_body": {"min_tokens": 1}}, "extra_body cannot set 'min_tokens'"),
    ({"extra_body": {"messages": []}}, "extra_body cannot set 'messages'"),
    ({"extra_body": {"stream_options": {}}}, "extra_body cannot set 'stream_options'"),
    ({"extra_body": {"options": {"num_predict": 5}}}, "cannot set options.num_predict"),
    ({"extra_body": [1]}, "extra_body must be a JSON object"),
    ({"extra_body": {"x": float("nan")}}, "extra_body is not plain JSON"),
    ({"options": (("num_predict", 5),)}, "options cannot set num_predict"),
    ({"options": (("num_ctx", 1), ("num_ctx", 2))}, "options names num_ctx twice"),
    ({"headers": (("Content-Type", "text/plain"),)}, "headers cannot set Content-Type"),
    ({"headers": (("Accept", "*/*"),)}, "headers cannot set Accept"),
    ({"headers": (("X Bad", "v"),)}, "is not a header name"),
    ({"headers": (("X-A", "1"), ("x-a", "2"))}, "headers names x-a twice"),
    ({"temperature": -0.5}, "temperature must be a number of at least 0"),
    ({"temperature": float("inf")}, "temperature must be a number of at least 0"),
    ({"temperature": True}, "temperature must be a number of at least 0"),
    ({"top_p": 0}, "top_p must be above 0 and at most 1"),
    ({"top_p": 1.5}, "top_p must be above 0 and at most 1"),
    ({"seed": 1.5}, "sampling_seed must be a whole number"),
])
def test_what_the_measurement_depends_on_is_refused_in_one_line(kwargs: dict[str, Any],
                                                                words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        RequestFields(**kwargs)
    assert "\n" not in str(info.value)


def test_a_header_value_is_never_named_by_its_error() -> None:
    with pytest.raises(InputError) as info:
        RequestFields(headers=(("X-Token", f"{SECRET}\r\nX-Evil: 1"),))
    assert "line break" in str(info.value) and SECRET not in str(info.value)


def test_ollama_options_on_another_api_and_two_authorizations_are_refused() -> None:
    fields = RequestFields(options=(("num_ctx", 8192),))
    with pytest.raises(InputError, match="go to its native API only"):
        Target("http://h:8000", "openai", "m", fields=fields)
    with pytest.raises(InputError, match="go to its native API only"):
        ClientOptions(api="openai-chat", request_fields=fields)
    ClientOptions(api="ollama", request_fields=fields)  # where they belong
    auth = RequestFields(headers=(("Authorization", f"Bearer {SECRET}"),))
    with pytest.raises(InputError, match="give one of them"):
        ClientOptions(api_key="sk-1", request_fields=auth)


# ------------------------------------------------------------------ a secret stays one


def test_a_header_value_is_in_no_repr_json_or_run_meta() -> None:
    options = ClientOptions(request_fields=WANT)
    assert SECRET not in repr(options) and SECRET not in repr(WANT)
    assert SECRET not in json.dumps(options.to_json())
    assert options.to_json()["request_fields"]["headers"]["X-Proxy-Auth"] == REDACTED
    meta = RunMeta(url="http://h", request_fields=WANT)
    text = json.dumps(meta.to_json())
    assert SECRET not in text
    back = RunMeta.from_json(json.loads(text))
    assert back.request_fields is not None
    assert back.request_fields.extra_body == WANT.extra_body
    assert back.request_fields.headers == (("X-Proxy-Auth", REDACTED), ("X-Team", REDACTED))
    assert ClientOptions().to_json().get("request_fields") is None  # none given: none written


@pytest.mark.timeout(30)
def test_a_server_that_echoes_the_header_gets_it_redacted_from_errors_and_text() -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        token = request.headers.get("X-Proxy-Auth", "")
        return web.json_response({"error": {"message": f"proxy says no to {token}"}},
                                 status=403)

    async def echo(request: web.Request) -> web.StreamResponse:
        token = request.headers.get("X-Proxy-Auth", "")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f'data: {{"choices":[{{"delta":{{"content":"hi {token}"}}}}]}}\n\n'
                         .encode())
        await resp.write(b'data: {"choices":[{"delta":{"content":" there"},'
                         b'"finish_reason":"length"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> tuple[Any, Any]:
        routes = {("POST", "/v1/completions"): refuse, ("POST", "/v1/chat/completions"): echo}
        async with app_server(routes) as url, new_session() as session:
            fields = RequestFields(headers=(("X-Proxy-Auth", SECRET),))
            a = await stream_request(session, Target(url, "openai", "m", fields=fields), "hi",
                                     timeouts=Timeouts(total=5))
            b = await stream_request(session, Target(url, "openai-chat", "m", fields=fields),
                                     "hi", timeouts=Timeouts(total=5))
            return a, b

    refused, echoed = run(main())
    assert refused.error is not None and "proxy says no to ***" in refused.error
    assert echoed.ok and echoed.output_text == "hi *** there"
    for record in (refused, echoed):
        assert SECRET not in json.dumps(record.to_json()) and SECRET not in repr(record)
