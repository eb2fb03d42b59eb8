"""What to change, as actions, and how each is said on a server family.

The doctor's rules decide *what* to change (an action such as ``smaller_prefill_chunks``); each
server family's module says *how* on that server: the flag, environment variable or request
option, by its exact name, with the place where that name was checked (an :class:`Advice` a
pair). A family that has no knob for an action gets an honest sentence instead of an invented
flag (``setting`` is ``None``); a server pdscope could not identify gets the names the known
families use (:func:`generic_advice`), so its user knows what to look for in its documentation.
docs/advice.md has the whole table with the full commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ACTIONS: tuple[str, ...] = (
    "enable_prefix_cache",
    "smaller_prefill_chunks",
    "larger_prefill_chunks",
    "more_concurrent_sequences",
    "more_kv_memory",
    "fp8_kv_cache",
    "shorter_max_context",
    "quantize_weights",
    "keep_model_loaded",
    "add_replicas",
    "shorten_prompt",
    "more_bandwidth",
    "faster_compute",
    "disaggregate",
    "weights_on_gpu",
    "longer_context",
    "limit_thinking",
)

@dataclass(frozen=True)
class Advice:
    """How to carry out one action on one server family.

    ``how`` is one imperative sentence a person can follow. ``setting`` is the bare name of the
    one flag, environment variable or request option that matters (``--max-num-batched-tokens``,
    ``OLLAMA_KV_CACHE_TYPE``, ``num_batch``), without a value; the value, where there is a
    sensible one, is in ``how``. It is ``None`` when the family has no such knob (hardware, a
    model file, a feature the server lacks). ``source`` is where the name was checked, or says
    what was not.
    """

    action: str
    family: str  # the family's name, as in ServerFamily.name
    how: str
    setting: str | None
    source: str


_ARTICLE = (
    "pdscope's article 'Prefill frente a decode: por qué el token uno tarda', section "
    "'Qué cambiar cuando el valor no es bueno' (no server setting involved)"
)

# Actions that are the same sentence on every server: no setting, the article says why.
_NEUTRAL: dict[str, str] = {
    "shorten_prompt": (
        "Shorten the prompt: prefill cost grows with its tokens, and the system prompt is "
        "prefilled on every request unless a prefix cache holds it."
    ),
    "more_bandwidth": (
        "Move decode to a device with more memory bandwidth (published GB/s), or read fewer "
        "bytes a token with quantized weights: no server setting raises the decode ceiling."
    ),
    "faster_compute": (
        "Move prefill to a device with more compute (dense FP16/BF16 TFLOPS): prefill is "
        "bound by compute, so a faster card shortens TTFT on long prompts, and no server "
        "setting adds compute."
    ),
}

# What the knob of an action is, for a server pdscope could not identify.
_WHAT: dict[str, str] = {
    "enable_prefix_cache": "prefix caching and its on/off switch",
    "smaller_prefill_chunks": "a lower prefill token budget a step (chunked prefill)",
    "larger_prefill_chunks": "a higher prefill token budget a step (chunked prefill)",
    "more_concurrent_sequences": "a higher limit on the requests running at once",
    "more_kv_memory": "more memory for the KV cache",
    "fp8_kv_cache": "an 8-bit KV cache type",
    "shorter_max_context": "a lower maximum context length",
    "quantize_weights": "a quantized model (fewer bytes a weight)",
    "add_replicas": "data parallelism (several engine copies behind one endpoint)",
    "disaggregate": "prefill/decode disaggregation (separate prefill and decode workers)",
    "weights_on_gpu": "the layers (or GB of weights) it keeps in GPU memory rather than in system"
    " RAM",
    "longer_context": "the context a request may have (prompt and output tokens together)",
    "limit_thinking": "a way to turn a reasoning model's thinking off or cap it",
}

GENERIC_SOURCE = "family-neutral: the names of the known families, each checked where its row says"


def family_advice(family: str, rows: Iterable[Advice]) -> dict[str, Advice]:
    """A family's whole advice table: its own ``rows`` and the family-neutral sentences. Every
    action a rule can ask for but :data:`_NEUTRAL`'s must have a row (checked here, at import)."""
    table = {row.action: row for row in rows}
    wrong = [row.action for row in table.values() if row.family != family]
    if wrong:
        raise ValueError(f"{family}: rows of another family for {wrong}")
    for action, how in _NEUTRAL.items():
        table[action] = Advice(action, family, how, None, _ARTICLE)
    missing = [a for a in ACTIONS if a not in table]
    if missing:
        raise ValueError(f"{family}: no advice for {missing}")
    unknown = [a for a in table if a not in ACTIONS]
    if unknown:
        raise ValueError(f"{family}: advice for unknown actions {unknown}")
    return table


def generic_advice(family: str, known: Mapping[str, Mapping[str, Advice]]) -> dict[str, Advice]:
    """The table for a server pdscope could not identify: for each action, where to look, with
    the names the ``known`` families (display name → table) use for it."""
    table: dict[str, Advice] = {}
    for action in ACTIONS:
        if action in _NEUTRAL:
            table[action] = Advice(action, family, _NEUTRAL[action], None, _ARTICLE)
        elif action == "limit_thinking":
            names = [f"{display} `{rows[action].setting}`" for display, rows in known.items()
                     if rows[action].setting is not None]
            table[action] = Advice(action, family, (
                "pdscope could not tell which server this is: an OpenAI-style API takes "
                "`reasoning_effort` (`low`, or `none`/`minimal` where the model allows it) to "
                f"shorten the thinking; the known servers call their switch {'; '.join(names)}."
            ), None, GENERIC_SOURCE + "; `reasoning_effort`: OpenAI's API reference, as "
                "mirrored in Azure's ReasoningEffort (\"Constrains effort on reasoning for "
                "reasoning models\"; none, minimal, low, medium, high, xhigh)")
        elif action == "keep_model_loaded":
            table[action] = Advice(action, family, (
                "If the server unloads idle models, find its keep-alive setting (Ollama calls it "
                "OLLAMA_KEEP_ALIVE); otherwise send one warm-up request after each start before "
                "taking traffic."), None, GENERIC_SOURCE)
        else:
            names = [f"{display} `{rows[action].setting}`" for display, rows in known.items()
                     if rows[action].setting is not None]
            table[action] = Advice(action, family, (
                f"pdscope could not tell which server this is, so look in its documentation for "
                f"{_WHAT[action]} ({'; '.join(names)}); a hosted API does not let you change it."
            ), None, GENERIC_SOURCE)
    return table
