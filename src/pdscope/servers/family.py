"""What pdscope knows about one kind of server, in one object: :class:`ServerFamily`.

A family is data and pure functions, no I/O: which answers recognise it, what its API does
differently, its ``/metrics`` names, how to read its settings, where its model files are, and how
each piece of advice is said on it. The client asks the questions a family lists and hands the
answers back (:data:`Answers`); the doctor asks the family how to say an action. Adding a server
means adding one module beside the others and listing its family in :mod:`pdscope.servers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pdscope.servers.advice import Advice
from pdscope.servers.metric_map import MetricMap

ServerKind = Literal[
    "ollama",
    "vllm",
    "sglang",
    "tgi",
    "llama.cpp",
    "llama-cpp-python",
    "pdscope-reference",
    "openai",
]

Answers = Mapping[str, Any]
"""What a server answered, by path: parsed JSON for JSON paths, the text for ``/metrics``. A path
that did not answer (404, refused, not JSON) is absent."""

METRICS_PATH = "/metrics"
MODELS_PATH = "/v1/models"


@dataclass(frozen=True)
class Detected:
    """A family recognised its server: the version it reports, and the models when the family
    lists them somewhere other than ``/v1/models``."""

    version: str | None = None
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Confirm:
    """A POST asked only when no GET answer recognised any family (llama-cpp-python has no
    endpoint of its own to GET): ``path`` with ``payload``; the answer is added to the answers
    under ``path`` before the family's ``recognise`` runs again."""

    path: str
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Tokenizer:
    """A server's tokenizer endpoints and the shapes of their bodies. ``tokenize_body(text,
    model)`` and ``detokenize_body(ids, model)`` build the requests; the ids come back under
    ``"tokens"``, the text under ``text_key``."""

    tokenize_path: str
    tokenize_body: Callable[[str, str | None], dict[str, Any]]
    detokenize_path: str | None = None
    detokenize_body: Callable[[Sequence[int], str | None], dict[str, Any]] | None = None
    text_key: str = "text"


@dataclass(frozen=True)
class WeightPlacement:
    """Where a server keeps the model's weights, as far as it says: in GPU memory, or partly in
    system RAM (offload), where each token reads them at the CPU's bandwidth.

    A family fills what it knows: ``size_bytes`` and ``gpu_bytes``, the loaded model's
    footprint and the part in GPU memory (Ollama's ``/api/ps``); ``gpu_layers``, the layers
    asked on the GPU, with ``extra_layers`` the server counts beyond the model's own
    (llama.cpp counts the output layer: ``-ngl`` of ``n_layer + 1`` is all), or ``all_layers``
    when it was asked for every one; ``cpu_bytes``, bytes asked off the GPU (vLLM and SGLang
    ``--cpu-offload-gb``). ``source`` says where it was read."""

    size_bytes: int | None = None
    gpu_bytes: int | None = None
    gpu_layers: int | None = None
    extra_layers: int = 0
    all_layers: bool = False
    cpu_bytes: float | None = None
    source: str = ""

    def on_gpu(self, num_layers: int | None = None,
               weight_bytes: float | None = None) -> float | None:
        """The share of the weights in GPU memory, 0 to 1, or ``None`` when the server did not
        say enough (a layer count needs the model's ``num_layers``, bytes off the GPU its
        ``weight_bytes``)."""
        if self.size_bytes and self.gpu_bytes is not None:
            return min(1.0, max(0.0, self.gpu_bytes / self.size_bytes))
        if self.all_layers:
            return 1.0
        if self.gpu_layers is not None and num_layers:
            counted = num_layers + self.extra_layers
            return min(max(self.gpu_layers, 0), counted) / counted
        if self.cpu_bytes is not None and weight_bytes:
            return max(0.0, 1.0 - self.cpu_bytes / weight_bytes)
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "gpu_bytes": self.gpu_bytes,
            "gpu_layers": self.gpu_layers,
            "extra_layers": self.extra_layers,
            "all_layers": self.all_layers,
            "cpu_bytes": self.cpu_bytes,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WeightPlacement:
        """The placement :meth:`to_json` wrote; a key it lacks takes its default."""
        return cls(
            size_bytes=_opt(d.get("size_bytes"), int),
            gpu_bytes=_opt(d.get("gpu_bytes"), int),
            gpu_layers=_opt(d.get("gpu_layers"), int),
            extra_layers=int(d.get("extra_layers") or 0),
            all_layers=bool(d.get("all_layers", False)),
            cpu_bytes=_number(d.get("cpu_bytes")),
            source=str(d.get("source") or ""),
        )


@dataclass(frozen=True)
class ServerSettings:
    """The settings that shape a server's scheduling, as far as it tells.

    ``prefill_budget_tokens``: prompt tokens one engine step may compute (vLLM
    ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``, llama.cpp ``n_batch``).
    ``max_sequences``: requests decoding at once (vLLM ``--max-num-seqs``, SGLang
    ``max_running_requests``, llama.cpp slots). ``kv_pool_tokens`` and ``block_size``: the KV
    pool. ``context_tokens``: the longest sequence one request may have (llama.cpp: a slot's
    context). ``kv_unified``: whether all sequences share one KV pool (``False``: llama.cpp
    without ``--kv-unified`` splits its ``-c`` between the slots). ``ubatch_tokens``: the
    tokens of one physical pass, where the server says (llama.cpp ``-ub``). ``weights``: where
    the model's weights are (GPU memory, or partly system RAM), where the server says.
    ``sources`` says where each figure came from, or that it is a stated default."""

    prefill_budget_tokens: int | None = None
    budget_label: str = "the server's default budget"
    max_sequences: int | None = None
    kv_pool_tokens: int | None = None
    block_size: int | None = None
    prefix_caching: bool | None = None
    context_tokens: int | None = None
    kv_unified: bool | None = None
    ubatch_tokens: int | None = None
    weights: WeightPlacement | None = None
    sources: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill_budget_tokens": self.prefill_budget_tokens,
            "budget_label": self.budget_label,
            "max_sequences": self.max_sequences,
            "kv_pool_tokens": self.kv_pool_tokens,
            "block_size": self.block_size,
            "prefix_caching": self.prefix_caching,
            "context_tokens": self.context_tokens,
            "kv_unified": self.kv_unified,
            "ubatch_tokens": self.ubatch_tokens,
            "weights": self.weights.to_json() if self.weights is not None else None,
            "sources": list(self.sources),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerSettings:
        """The settings :meth:`to_json` wrote (a calibration's, a doctor's evidence); a key
        it lacks takes its default."""
        weights = d.get("weights")
        return cls(
            prefill_budget_tokens=_opt(d.get("prefill_budget_tokens"), int),
            budget_label=str(d.get("budget_label") or cls.budget_label),
            max_sequences=_opt(d.get("max_sequences"), int),
            kv_pool_tokens=_opt(d.get("kv_pool_tokens"), int),
            block_size=_opt(d.get("block_size"), int),
            prefix_caching=_opt(d.get("prefix_caching"), bool),
            context_tokens=_opt(d.get("context_tokens"), int),
            kv_unified=_opt(d.get("kv_unified"), bool),
            ubatch_tokens=_opt(d.get("ubatch_tokens"), int),
            weights=WeightPlacement.from_json(weights) if weights is not None else None,
            sources=tuple(str(s) for s in d.get("sources") or ()),
        )


_T = TypeVar("_T", int, bool)


def _opt(value: Any, kind: type[_T]) -> _T | None:
    """``value`` as ``kind``, ``None`` kept."""
    return None if value is None else kind(value)


def _number(value: Any) -> float | None:
    """A number as written (an int stays one, so the file reads back the same), or ``None``."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise TypeError(f"not a number: {value!r}")


def _no_recognise(answers: Answers) -> Detected | None:
    return None


def _no_fields(max_tokens: int) -> dict[str, Any]:
    return {}


def _no_settings(answers: Answers, info: Mapping[str, str] | None,
                 flags: Sequence[str]) -> ServerSettings:
    return ServerSettings()


def models_root_paths(answers: Answers, model: str) -> tuple[str, ...]:
    """The local folder ``/v1/models`` names as a model's ``root`` (vLLM and others)."""
    data = answers.get(MODELS_PATH)
    out = []
    if isinstance(data, dict):
        for m in data.get("data") or []:
            if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("root"), str):
                out.append(m["root"])
    return tuple(out)


def flag_value(flags: Sequence[str], *names: str) -> str | None:
    """The value of the first of ``names`` in a server's command-line ``flags`` (``--x 5`` or
    ``--x=5``); ``None`` when absent."""
    for i, flag in enumerate(flags):
        for name in names:
            if flag == name and i + 1 < len(flags):
                return flags[i + 1]
            if flag.startswith(name + "="):
                return flag.split("=", 1)[1]
    return None


def int_or_none(value: Any) -> int | None:
    """An int from a JSON or label value (``"128"``, ``128``, ``128.0``); ``None`` otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value)) if value.strip() else None
        except ValueError:
            return None
    return None


def str_or_none(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, int, float)) and value != "" else None


@dataclass(frozen=True)
class ServerFamily:
    """Everything pdscope knows about one kind of server.

    Detection: ``probes`` are the GET paths whose answers ``recognise`` reads; ``confirm`` is a
    POST asked only when no family recognised the GET answers. ``models_path`` lists the models
    where ``/v1/models`` does not (Ollama's ``/api/tags``), read by ``models_from``.

    API quirks: ``native_api`` (Ollama's NDJSON API instead of OpenAI's SSE), ``fixed_output``
    (the body fields that make it generate exactly ``max_tokens``), ``per_chunk_usage`` (it
    accepts ``stream_options.continuous_usage_stats``), ``tokenizer``, and
    ``cached_tokens_flag`` (the flag without which it leaves ``cached_tokens`` out of usage).
    ``serial``: it serves one request at a time. ``scheduling``: how its engine batches, for
    the planner's simulator: ``budget`` (continuous batching under a token budget a step,
    prompts in chunks, running decodes first) or ``slots`` (a fixed number of sequences, each
    prompt processed in batches of ``n_batch`` tokens).

    Settings: ``settings_paths`` are GET paths whose answers ``read_settings(answers,
    info_labels, flags)`` reads, with the labels of its ``cache_config_info`` gauge on
    ``/metrics`` and its command-line flags when known. Model files: ``model_paths(answers,
    model)`` are local paths the server names for a model; ``model_info_path`` is a POST that
    describes the model (Ollama's ``/api/show``). ``advice`` maps each action to its
    :class:`Advice`; ``advice_family`` names the family whose flags those are.
    """

    name: ServerKind
    display: str
    advice: Mapping[str, Advice] = field(repr=False)
    probes: tuple[str, ...] = ()
    recognise: Callable[[Answers], Detected | None] = _no_recognise
    confirm: Confirm | None = None
    models_path: str | None = None
    models_from: Callable[[Any], tuple[str, ...]] | None = None
    native_api: bool = False
    fixed_output: Callable[[int], dict[str, Any]] = _no_fields
    per_chunk_usage: bool = False
    tokenizer: Tokenizer | None = None
    cached_tokens_flag: str | None = None
    serial: bool = False
    scheduling: Literal["budget", "slots"] = "budget"
    metric_map: MetricMap | None = None
    no_metrics_reason: str | None = None
    settings_paths: tuple[str, ...] = ()
    read_settings: Callable[[Answers, Mapping[str, str] | None, Sequence[str]],
                            ServerSettings] = _no_settings
    model_paths: Callable[[Answers, str], tuple[str, ...]] = models_root_paths
    model_info_path: str | None = None
    advice_family: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def advice_name(self) -> str:
        """The family whose flags its advice names (llama-cpp-python's are llama.cpp's)."""
        return self.advice_family or self.name

    @property
    def api_default(self) -> Literal["openai", "ollama"]:
        return "ollama" if self.native_api else "openai"

    def advise(self, action: str) -> Advice:
        """How to carry out ``action`` on this server; an unknown action is a programming
        error (``KeyError``)."""
        return self.advice[action]
