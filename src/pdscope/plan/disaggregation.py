"""Prefill/decode disaggregation: prompts read on some instances, answers decoded on others, and
the KV cache sent from the one to the other over a link.

A disaggregated setup runs ``prefill_instances`` instances that only read prompts and
``decode_instances`` that only decode, each the calibrated server (its step model, its
scheduling policy and settings). A request is routed to the prefill instance with the fewest
unfinished requests; its first token comes out there, at the end of its prompt's last chunk
(so its TTFT is its wait and its prompt's steps there, as on one server). Its prompt's KV cache
then leaves the prefill instance's pool and crosses the link: ``prompt tokens x KV bytes a
token / link bandwidth`` seconds. Each prefill instance sends over its own link, one transfer
at a time, in the order the prompts finished. The decode instance (the one with the fewest
unfinished requests when the transfer starts) queues the request like any other; admitted, it
takes the KV blocks of its prompt and its first token, and decodes its remaining tokens, one a
step, without computing its prompt. Its second token's gap is the transfer, its wait on the
decode instance and one step.

The design vLLM's disaggregated prefill follows (``docs/features/disagg_prefill.md``: a prefill
instance and a decode instance joined by a KV connector, the prefill instance producing the
first token). Simplifications, stated in ``docs/planner.md``: the prefill instance frees the
prompt's blocks when its first token comes out (a real connector holds them until the decode
instance has pulled them); the whole prompt is sent (no prefix cache on the decode side); a
decode instance that preempts a request recomputes it there, prompt and all; the link's time is
bytes over bandwidth, with no latency of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pdscope.checks import at_least
from pdscope.errors import InputError
from pdscope.roofline import GB

# One 200 Gb/s network port (InfiniBand HDR, 200 GbE): 25 GB/s. The link most GPU servers give
# one instance to another node; NVLink inside a node is an order of magnitude faster.
DEFAULT_LINK_GB_S = 25.0


@dataclass(frozen=True)
class Disaggregation:
    """``prefill_instances`` and ``decode_instances`` copies of the calibrated server, the KV
    cache sent from the first to the second over a link of ``link_gb_s`` GB/s (10⁹ bytes a
    second) at ``kv_bytes_per_token`` bytes a prompt token."""

    prefill_instances: int
    decode_instances: int
    link_gb_s: float = DEFAULT_LINK_GB_S
    kv_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        for name, words in (("prefill_instances", "prefill instances"),
                            ("decode_instances", "decode instances")):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(f"{words} must be a whole number, got {value!r}")
            at_least(value, 1, words)
        for value, words in ((self.link_gb_s, "the KV link's bandwidth (GB/s)"),
                             (self.kv_bytes_per_token, "the KV bytes a token")):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InputError(f"{words} must be a positive number, got {value!r}")

    @property
    def devices(self) -> int:
        """Instances in all: what the setup costs, to set beside as many replicas."""
        return self.prefill_instances + self.decode_instances

    @property
    def label(self) -> str:
        return f"{self.prefill_instances}P:{self.decode_instances}D"

    def transfer_s(self, prompt_tokens: float) -> float:
        """Seconds the link takes to send a prompt's KV cache."""
        return prompt_tokens * self.kv_bytes_per_token / (self.link_gb_s * GB)

    def to_json(self) -> dict[str, Any]:
        return {"prefill_instances": self.prefill_instances,
                "decode_instances": self.decode_instances, "link_gb_s": self.link_gb_s,
                "kv_bytes_per_token": self.kv_bytes_per_token, "devices": self.devices}
