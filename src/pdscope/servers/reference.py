"""pdscope's own reference streaming server (:mod:`pdscope.selftest.server`): a server with a
known timing schedule, for the client's self-test. ``GET /version`` →
``{"server": "pdscope-reference", "version": ...}``; it speaks vLLM's tokenizer API and its
per-chunk usage, and writes its send and scheduled times into each chunk."""

from __future__ import annotations

from typing import Any

from pdscope.servers import openai
from pdscope.servers.family import (
    Answers,
    Detected,
    ServerFamily,
    ServerKind,
    Tokenizer,
    str_or_none,
)

NAME: ServerKind = "pdscope-reference"


def recognise(answers: Answers) -> Detected | None:
    version = answers.get("/version")
    if isinstance(version, dict) and version.get("server") == NAME:
        return Detected(str_or_none(version.get("version")))
    return None


def fixed_output(max_tokens: int) -> dict[str, Any]:
    return {"ignore_eos": True, "min_tokens": max_tokens}


FAMILY = ServerFamily(
    name=NAME,
    display="pdscope's reference server",
    advice=openai.ADVICE,
    advice_family="openai",
    probes=("/version",),
    recognise=recognise,
    fixed_output=fixed_output,
    per_chunk_usage=True,
    tokenizer=Tokenizer(
        tokenize_path="/tokenize",
        tokenize_body=lambda text, model: {"model": model, "prompt": text},
    ),
)
