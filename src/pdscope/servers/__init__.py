"""What pdscope knows about each kind of server, one module a family.

Every fact about a server family — how to recognise it, its API's quirks, its ``/metrics``
names, how to read its settings, where its model files are, how to say each piece of advice on
it — is in that family's module, as a :class:`ServerFamily`. No other module of pdscope compares
a server's kind with a family's name; it asks the family::

    from pdscope.servers import family
    family("vllm").advise("smaller_prefill_chunks").setting   # '--max-num-batched-tokens'

To add a family: write its module (see ``vllm.py``), capture its real answers under
``tests/data/``, and list it in :data:`FAMILIES` at the place where its detection should be
tried (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdscope.errors import InputError
from pdscope.servers import llamacpp, ollama, openai, reference, sglang, tgi, vllm
from pdscope.servers.advice import ACTIONS, Advice
from pdscope.servers.family import (
    Answers,
    Confirm,
    Detected,
    ServerFamily,
    ServerKind,
    ServerSettings,
    Tokenizer,
    WeightPlacement,
)
from pdscope.servers.metric_map import ROLES, MetricMap

# In the order detection tries them: the most specific answer first, the generic one last.
FAMILIES: tuple[ServerFamily, ...] = (
    reference.FAMILY,
    ollama.FAMILY,
    llamacpp.LLAMA_CPP,
    vllm.FAMILY,
    sglang.FAMILY,
    tgi.FAMILY,
    llamacpp.LLAMA_CPP_PYTHON,
    openai.FAMILY,
)
GENERIC = openai.FAMILY
REFERENCE_KIND: ServerKind = reference.FAMILY.name

_BY_NAME: dict[str, ServerFamily] = {f.name: f for f in FAMILIES}


def _metric_maps() -> tuple[MetricMap, ...]:
    """Each family's /metrics map, in the order of :data:`FAMILIES`; a map two families share
    is listed once."""
    maps: dict[str, MetricMap] = {}
    for f in FAMILIES:
        if f.metric_map is not None:
            maps.setdefault(f.metric_map.name, f.metric_map)
    return tuple(maps.values())


def _metric_map_of(kind: ServerKind) -> MetricMap:
    m = _BY_NAME[kind].metric_map
    if m is None:
        raise ValueError(f"the {kind} family has no /metrics map")
    return m


# The families with a /metrics map, in the order their names are matched. A new family with a
# map joins by being listed in FAMILIES; the names below are kept for their callers.
METRIC_MAPS: tuple[MetricMap, ...] = _metric_maps()
VLLM_METRICS = _metric_map_of("vllm")
SGLANG_METRICS = _metric_map_of("sglang")
LLAMACPP_METRICS = _metric_map_of("llama.cpp")
TGI_METRICS = _metric_map_of("tgi")
OLLAMA_NO_METRICS = ollama.NO_METRICS


def family(kind: str | None) -> ServerFamily:
    """The family of a detected server kind; the generic OpenAI-compatible one for anything
    pdscope does not know (or ``None``)."""
    return _BY_NAME.get((kind or "").strip().lower(), GENERIC)


def advice_families() -> tuple[str, ...]:
    """The names advice is kept under: each family that has its own flags, and the generic."""
    return (*(f.name for f in openai.KNOWN), GENERIC.name)


def advice_for(action: str, family_name: str) -> Advice:
    """How to carry out ``action`` on the family named ``family_name`` (an advice family, see
    :func:`advice_families`). An unknown action or family is a programming error."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
    for f in FAMILIES:
        if f.advice_name == family_name:
            return f.advise(action)
    raise ValueError(f"unknown server family {family_name!r}; known:"
                     f" {', '.join(advice_families())}")


def detect_metric_map(names: Iterable[str]) -> MetricMap | None:
    """The metric map whose names are present, by prefix; ``None`` when none is.

    ``names`` are the metric or sample names of one scrape. When names of several families are
    present (a proxy that merges them), the family with the most wins."""
    counts = {m.name: 0 for m in METRIC_MAPS}
    for name in names:
        for m in METRIC_MAPS:
            if name.startswith(m.prefix):
                counts[m.name] += 1
    best = max(METRIC_MAPS, key=lambda m: counts[m.name])
    return best if counts[best.name] > 0 else None


def metric_map_named(name: str) -> MetricMap:
    """The metric map named ``name`` (``vllm``, ``sglang``, ``llama.cpp``, ``tgi``)."""
    for m in METRIC_MAPS:
        if m.name == name.lower():
            return m
    known = ", ".join(m.name for m in METRIC_MAPS)
    raise InputError(f"unknown server family {name!r}: use one of {known}")


def fixed_output_fields(kind: str | None, max_tokens: int) -> dict[str, Any]:
    """The request fields that make a server of ``kind`` generate exactly ``max_tokens``
    tokens. A server not detected at all (``None``) is asked as vLLM is."""
    if kind is None:
        return vllm.fixed_output(max_tokens)
    return family(kind).fixed_output(max_tokens)


__all__ = [
    "ACTIONS",
    "FAMILIES",
    "GENERIC",
    "METRIC_MAPS",
    "OLLAMA_NO_METRICS",
    "REFERENCE_KIND",
    "ROLES",
    "Advice",
    "Answers",
    "Confirm",
    "Detected",
    "MetricMap",
    "ServerFamily",
    "ServerKind",
    "ServerSettings",
    "Tokenizer",
    "WeightPlacement",
    "advice_families",
    "advice_for",
    "detect_metric_map",
    "family",
    "fixed_output_fields",
    "metric_map_named",
]
