"""The scheduler's settings: which policy decides what goes into each engine step.

Two policies, named after their mechanism (the simulator does not know server families; the
calibration maps a family to a policy):

``budget`` — vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``), read in its source:

- every step has a token budget (``max_num_batched_tokens``) and at most ``max_num_seqs``
  running requests;
- running requests are scheduled first, in the order they were admitted: one token for each
  decoding sequence, then the next chunk of the (at most one) partial prefill; then waiting
  requests are admitted first come, first served, each with as much of its prompt as the budget
  left allows (chunked prefill), while the budget, the sequence cap and the KV pool last; the
  first one that does not fit stops admission (head of line);
- the KV pool is ``kv_pool_tokens`` tokens in blocks of ``block_size``; when a running request
  cannot get a block, the most recently admitted running request is preempted (its blocks freed,
  put back at the front of the waiting queue, recomputed from its prompt and the tokens it had
  produced when admitted again); no request is admitted in a step that preempted;
- prefix caching: a request of a prefix group whose prefix is cached skips its prefix's full
  blocks (never the whole prompt: at least one token is computed,
  ``max_cache_hit_length = num_tokens - 1`` in ``vllm/v1/core/kv_cache_manager.py``); a prefix
  becomes cached when the blocks that hold it are allocated, and stays cached until the pool,
  short of free blocks, evicts it (least recently used first).

``slots`` — llama.cpp's server and Ollama: ``slots`` parallel sequences (``--parallel``,
``OLLAMA_NUM_PARALLEL``); a new request takes a free slot (the one that last served its prefix
group if free, else the least recently used), and waits while none is free; each batch holds
the decoding slots' tokens, then prompt tokens of the slots still reading their prompts, in
slot order, up to ``n_batch`` tokens. A slot keeps its last prompt, so a request of the same
prefix group on the same slot skips the prefix (at token granularity). Each slot has its own
context, so there is no shared pool to run out of and no preemption. Read in llama-server's
source (llama.cpp 0c1e570, the tree the lab builds), ``tools/server/server-context.cpp``:
``get_available_slot`` takes the idle slot whose cached prompt shares the longest prefix with
the new one, above ``slot_prompt_similarity`` (0.1 by default, ``common/common.h``), else the
idle slot with the oldest ``t_last_used``; with no idle slot the task is deferred
(``queue_tasks.defer``, counted by ``llamacpp:requests_deferred``). ``update_slots`` clears the
batch, adds one sampled token for every generating slot, then, with continuous batching on (the
default), walks the slots in order adding prompt tokens while ``batch.size() < n_batch``; the
batch is decoded in one ``llama_decode`` (split into ``n_ubatch`` micro-batches inside it), so
every slot's next token waits for the whole batch.

Simplifications, both policies: no speculative decoding, no context limit, a request's output
length is known; eviction removes a cached prefix whole; a preempted request's own blocks are not
found again in the cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pdscope.checks import at_least
from pdscope.errors import InputError

POLICIES = ("budget", "slots")

# vLLM's defaults (vllm/config/scheduler.py: DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048, the budget
# where chunked prefill is on; vllm/config/cache.py: block_size 16). max_num_seqs: 256 is the
# engine-argument default for online serving (SchedulerConfig's class default is 128).
DEFAULT_BUDGET = 2048
DEFAULT_MAX_SEQS = 256
DEFAULT_BLOCK_SIZE = 16
# llama.cpp server: --batch-size (n_batch) default 2048; --parallel 1 slot by default in its
# README (recent builds start 4 where -np is not given; Ollama's OLLAMA_NUM_PARALLEL is 1).
DEFAULT_N_BATCH = 2048
DEFAULT_SLOTS = 1


@dataclass(frozen=True)
class SchedulerConfig:
    """A server's scheduling settings, as the simulator needs them.

    ``budget`` policy: ``max_num_batched_tokens`` (tokens a step), ``max_num_seqs`` (running
    requests), ``kv_pool_tokens`` (``None``: a pool without limit), ``block_size`` (tokens a KV
    block), ``prefix_caching``. ``slots`` policy: ``slots`` and ``n_batch`` (tokens a batch), and
    ``prefix_caching`` (a slot's reuse of its last prompt). ``replicas``: identical servers behind
    a router that sends each request, when it arrives, to the one with the fewest unfinished
    requests (ties to the first)."""

    policy: str = "budget"
    max_num_batched_tokens: int = DEFAULT_BUDGET
    max_num_seqs: int = DEFAULT_MAX_SEQS
    kv_pool_tokens: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    prefix_caching: bool = True
    slots: int = DEFAULT_SLOTS
    n_batch: int = DEFAULT_N_BATCH
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InputError(f"unknown scheduling policy {self.policy!r}: use"
                             f" {' or '.join(POLICIES)}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size", "slots",
                     "n_batch", "replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(f"{_words(name)} must be a whole number, got {value!r}")
            at_least(value, 1, _words(name))
        if self.kv_pool_tokens is not None:
            at_least(self.kv_pool_tokens, 1, "the KV pool")
        # vLLM refuses it too (SchedulerConfig: "max_num_batched_tokens must be greater than or
        # equal to max_num_seqs"): every running sequence's token must fit a step.
        if self.policy == "budget" and self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(f"the token budget ({self.max_num_batched_tokens}) must be at least"
                             f" the number of sequences ({self.max_num_seqs})")
        if self.policy == "slots" and self.n_batch < self.slots:
            raise InputError(f"the batch ({self.n_batch} tokens) must hold a token of every"
                             f" slot ({self.slots})")
        if self.policy == "budget" and self.kv_pool_tokens is not None \
                and self.kv_pool_tokens < self.block_size:
            raise InputError(f"the KV pool ({self.kv_pool_tokens} tokens) must hold at least one"
                             f" block of {self.block_size} tokens")

    @property
    def step_tokens(self) -> int:
        """Tokens one step may compute: the budget, or the batch."""
        return self.max_num_batched_tokens if self.policy == "budget" else self.n_batch

    @property
    def sequences(self) -> int:
        """Sequences one server runs at once: max sequences, or slots."""
        return self.max_num_seqs if self.policy == "budget" else self.slots

    @property
    def kv_blocks(self) -> int | None:
        """Blocks in the KV pool (``None``: no limit, or a policy without a shared pool)."""
        if self.policy != "budget" or self.kv_pool_tokens is None:
            return None
        return self.kv_pool_tokens // self.block_size

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SchedulerConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown scheduler settings {', '.join(unknown)}; known:"
                             f" {', '.join(sorted(known))}")
        return cls(**d)


def _words(name: str) -> str:
    return {"max_num_batched_tokens": "the token budget", "max_num_seqs": "max sequences",
            "block_size": "the block size", "slots": "slots", "n_batch": "the batch size",
            "replicas": "replicas"}[name]
