"""Any other OpenAI-compatible server: a proxy, a hosted API, an engine pdscope has no module
for. It lists its models on ``GET /v1/models`` and streams ``/v1/completions``; pdscope asks for
no field beyond OpenAI's (a strict server rejects unknown ones), and its advice names what the
known families call each setting, so its user knows what to look for in its documentation."""

from __future__ import annotations

from pdscope.servers import llamacpp, ollama, sglang, tgi, vllm
from pdscope.servers.advice import generic_advice
from pdscope.servers.family import Answers, Detected, ServerFamily

# The families whose flags the generic advice names, with the name a person calls them by.
KNOWN = (vllm.FAMILY, sglang.FAMILY, llamacpp.LLAMA_CPP, ollama.FAMILY, tgi.FAMILY)

ADVICE = generic_advice("openai", {family.display: family.advice for family in KNOWN})


def recognise(answers: Answers) -> Detected | None:
    return Detected()  # the fallback: whatever answered


FAMILY = ServerFamily(
    name="openai",
    display="an OpenAI-compatible server",
    advice=ADVICE,
    recognise=recognise,
)
