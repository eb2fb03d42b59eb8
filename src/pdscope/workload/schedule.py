"""When requests are sent: open-loop arrivals and the closed-loop alternative.

Open loop (a stage's ``request_rate``) fixes every send time in advance, whatever happens to earlier
requests, so a slow server cannot slow the load down and hide its own slowness (coordinated
omission, as wrk2 avoids it). Gaps between arrivals follow a gamma distribution of shape
``burstiness`` and mean ``1 / rate``: burstiness 1 is a Poisson process, below 1 burstier, above
1 more regular (the parametrisation of ``vllm bench serve``). A rate of ``inf`` sends everything
at once.
"""

from __future__ import annotations

import math

import numpy as np

from pdscope.errors import Field, InputError


def arrival_offsets(
    n: int | None,
    rate: float,
    *,
    burstiness: float = 1.0,
    duration_s: float | None = None,
    seed: int = 0,
) -> list[float]:
    """Send times in seconds from the start, for ``n`` requests and/or until ``duration_s``."""
    if rate <= 0:
        raise InputError(Field("request_rate"), f" must be positive, got {rate:g}")
    if burstiness <= 0:
        raise InputError(Field("burstiness"), f" must be positive, got {burstiness:g}")
    if n is None and duration_s is None:
        raise InputError("give ", Field("num_prompts"), " or ", Field("duration_s"), " (or both)")
    if math.isinf(rate):
        if n is None:
            raise InputError("an infinite request rate needs ", Field("num_prompts"))
        return [0.0] * n
    rng = np.random.default_rng(seed)
    theta = 1.0 / (rate * burstiness)
    out: list[float] = []
    t = 0.0
    limit = n if n is not None else 10_000_000
    while len(out) < limit:
        if out:  # the first request goes at once
            t += float(rng.gamma(burstiness, theta))
        if duration_s is not None and t > duration_s:
            break
        out.append(t)
    return out


def parse_rates(text: str) -> list[float]:
    """``4`` or a sweep ``1,2,4,8``; ``inf`` sends all at once."""
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"bad request rate {part!r}: a number a second, or inf") from None
        if not value > 0:
            raise InputError(Field("request_rate"), f" must be positive, got {part}")
        out.append(value)
    return out


def parse_ints(text: str, flag: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise InputError(
                f"bad {flag} {part!r}: a whole number, or a list like 1,4,16"
            ) from None
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {part}")
        out.append(value)
    return out
