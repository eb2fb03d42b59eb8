"""Capacity: the most load a server setup carries while it meets a service-level objective.

Two questions, answered by simulation (:func:`pdscope.plan.simulate.simulate`, fast mode):

- :func:`max_rate` — the highest open-loop request rate whose latencies meet the SLO, found by
  bisection on a log scale to 1 %, from a bracket found by doubling (or halving) a first guess
  taken from the step model. It also finds the *saturation* rate, where the server stops keeping
  up: requests are served more slowly than they come, and the queue grows without bound.
- :func:`max_users` — the most closed-loop users that meet the SLO (integer bisection).

Each takes an optional :class:`~pdscope.plan.disaggregation.Disaggregation`: the setup is then
that many prefill and decode instances rather than the scheduler's replicas.

Both assume that more load never makes a latency better. Where even the lightest load (a very
low rate, or one user) misses the SLO, no load meets it: :class:`SloUnreachable` says by how
much.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdscope.errors import InputError
from pdscope.plan.demand import LengthMix, SharedPrefix, closed_loop, open_loop
from pdscope.plan.disaggregation import Disaggregation
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate
from pdscope.plan.stepmodel import StepModel, attention_pairs
from pdscope.slo import SLO

# Bisection stops when the bracket's ends are this close (relative).
RATE_TOLERANCE = 0.01
# The lightest open-loop load, as a share of the first guess at capacity: requests then
# hardly ever meet in the server.
FLOOR_SHARE = 1e-3
# Saturated: requests finish, in the middle of the run, at less than this share of the rate at
# which they arrive.
SATURATION_SHARE = 0.95
# Doublings before giving up on finding a load that misses the SLO.
MAX_DOUBLINGS = 30


class SloUnreachable(InputError):
    """Even the lightest load misses the SLO: no capacity to find."""


@dataclass(frozen=True)
class CapacityPoint:
    """The most load that meets the SLO: ``rate_rps`` (open loop) or ``users`` (closed loop),
    with the ``summary`` of its simulation; ``binding``, the objective the next load up misses
    (``None`` when no load tried missed it); ``saturation_rps``, the rate the server stops
    keeping up at (open loop only); ``tried``, every load simulated and whether it met the
    SLO."""

    summary: dict[str, Any]
    binding: str | None
    rate_rps: float | None = None
    users: int | None = None
    saturation_rps: float | None = None
    tried: tuple[tuple[float, bool], ...] = ()


def estimate_rate(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix,
                  seed: int = 0, disaggregation: Disaggregation | None = None) -> float:
    """A first guess at the rate that saturates the setup: the full batch decoding at the mean
    context, plus each request's prompt computed once, spread over the replicas.

    Disaggregated: the least of what the prefill instances read (as many mean prompts a step
    as the budget holds), what the decode instances decode and what the links carry."""
    p, o = _mean_lengths(lengths, seed)
    n = scheduler.sequences
    step = model.step_time(0, n, n * (p + o / 2), 0)
    prefill = model.per_prompt_token_s * p + model.per_attention_pair_s * attention_pairs(p, 0)
    if disaggregation is None:
        per_request = o * step / n + prefill
        return scheduler.replicas / per_request
    budget = scheduler.step_tokens
    together = max(1, min(n, int(budget // max(p, 1))))
    if together > 1:
        prefill_step = model.step_time(together * p, together, 0,
                                       together * attention_pairs(p, 0))
        reading = disaggregation.prefill_instances * together / prefill_step
    else:
        reading = disaggregation.prefill_instances / model.ttft_s(max(1, round(p)), budget)
    decoding = disaggregation.decode_instances * n / (max(o - 1, 1) * step)
    sending = disaggregation.prefill_instances / max(disaggregation.transfer_s(p), 1e-12)
    return min(reading, decoding, sending)


def request_alone_s(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix,
                    seed: int = 0, disaggregation: Disaggregation | None = None) -> float:
    """Seconds a request of mean lengths takes on an idle server: its prompt's steps, then a
    step a token at its mean context (disaggregated: and its KV cache's transfer)."""
    mean_prompt, o = _mean_lengths(lengths, seed)
    p = max(1, round(mean_prompt))
    decode = model.step_time(0, 1, p + o / 2, 0)
    alone = model.ttft_s(p, scheduler.step_tokens) + (o - 1) * decode
    if disaggregation is not None and o > 1:
        alone += disaggregation.transfer_s(p)
    return alone


def _mean_lengths(lengths: LengthMix, seed: int) -> tuple[float, float]:
    """The mean prompt and output lengths of a thousand draws."""
    prompt, output = lengths.draw(1000, seed)
    return float(np.mean(prompt)), float(np.mean(output))


def saturated(result: SimResult) -> bool:
    """Requests finished, between the first and the last quarter of the run, at less than
    ``SATURATION_SHARE`` of the rate at which they arrived: the queue grows."""
    arrivals = np.sort(result.arrival_s[~np.isnan(result.arrival_s)])
    finishes = np.sort(result.finish_s[~np.isnan(result.finish_s)])
    n = len(arrivals)
    if n < 8 or len(finishes) < n:
        return len(finishes) < n
    lo, hi = n // 4, (3 * n) // 4
    offered_span = arrivals[hi] - arrivals[lo]
    served_span = finishes[hi] - finishes[lo]
    if offered_span <= 0:
        return served_span > 0
    return bool((hi - lo) / served_span < SATURATION_SHARE * (hi - lo) / offered_span)


def max_rate(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix, slo: SLO, *,
             num_requests: int = 2000, seed: int = 0, shared_prefix: SharedPrefix | None = None,
             burstiness: float = 1.0, disaggregation: Disaggregation | None = None
             ) -> CapacityPoint:
    """The highest open-loop rate (requests a second) whose latencies meet ``slo``, to 1 %."""
    if num_requests < 1:
        raise InputError(f"the capacity search needs at least 1 request, got {num_requests}")
    runs, run = _open_loop_runs(model, scheduler, lengths, num_requests, seed, shared_prefix,
                                burstiness, disaggregation)
    guess = estimate_rate(model, scheduler, lengths, seed, disaggregation)
    floor = guess * FLOOR_SHARE
    lightest = run(floor)
    if not slo.met(lightest):
        raise SloUnreachable(_unreachable(
            slo, lightest, f"even at a very low rate ({floor:.3g} requests a second),"))

    def met(rate: float) -> bool:
        return slo.met(run(rate))

    lo, hi = _bracket(met, floor, guess)
    if hi is not None:
        while hi / lo > 1 + RATE_TOLERANCE:
            mid = math.sqrt(lo * hi)
            if met(mid):
                lo = mid
            else:
                hi = mid
    saturation = _saturation(runs, run)
    return CapacityPoint(
        summary=run(lo).summary(), binding=None if hi is None else slo.binding(run(hi)),
        rate_rps=lo, saturation_rps=saturation,
        tried=tuple((rate, slo.met(r)) for rate, r in sorted(runs.items())))


def _bracket(met: Callable[[float], bool], floor: float, guess: float
             ) -> tuple[float, float | None]:
    """A rate that meets the SLO and the next one tried that does not (``None``: every rate
    tried met it), by doubling or halving from ``guess``; ``floor`` is known to meet it."""
    if met(guess):
        lo = guess
        for _ in range(MAX_DOUBLINGS):
            if not met(lo * 2):
                return lo, lo * 2
            lo *= 2
        return lo, None
    hi = guess
    while hi / 2 > floor and not met(hi / 2):
        hi /= 2
    return max(floor, hi / 2), hi


def _saturation(runs: dict[float, SimResult], run: Callable[[float], SimResult]
                ) -> float | None:
    """The rate, to 1 %, where the server stops keeping up (``None``: not within reach)."""
    keeping_up = [rate for rate, r in runs.items() if not saturated(r)]
    behind = [rate for rate, r in runs.items() if saturated(r)]
    lo = max(keeping_up) if keeping_up else min(runs) / 2
    above = [rate for rate in behind if rate > lo]
    hi = min(above) if above else None
    doublings = 0
    while hi is None:
        if doublings == MAX_DOUBLINGS:
            return None
        rate = lo * 2
        if saturated(run(rate)):
            hi = rate
        else:
            lo = rate
        doublings += 1
    while hi / lo > 1 + RATE_TOLERANCE:
        mid = math.sqrt(lo * hi)
        if saturated(run(mid)):
            hi = mid
        else:
            lo = mid
    return lo


def max_users(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix, slo: SLO, *,
              think_s: float = 0.0, num_requests: int = 2000, seed: int = 0,
              shared_prefix: SharedPrefix | None = None,
              stagger_s: float | None = None,
              disaggregation: Disaggregation | None = None) -> CapacityPoint:
    """The most closed-loop users (each sending its next request ``think_s`` after its last
    one ended) whose latencies meet ``slo``. More users than requests add nothing: the search
    stops at ``num_requests``. Users start spread over ``stagger_s`` (default: the time of one
    request alone, :func:`request_alone_s`), as real users never start in lockstep."""
    if num_requests < 1:
        raise InputError(f"the capacity search needs at least 1 request, got {num_requests}")
    runs: dict[int, SimResult] = {}
    stagger = request_alone_s(model, scheduler, lengths, seed, disaggregation) \
        if stagger_s is None else stagger_s

    def run(users: int) -> SimResult:
        if users not in runs:
            demand = closed_loop(num_requests, users, lengths, think_s=think_s, seed=seed,
                                 shared_prefix=shared_prefix, stagger_s=stagger)
            runs[users] = simulate(demand, model, scheduler, disaggregation=disaggregation)
        return runs[users]

    alone = run(1)
    if not slo.met(alone):
        raise SloUnreachable(_unreachable(slo, alone, "with one user alone,"))
    lo, hi = 1, None
    while hi is None and lo < num_requests:
        users = min(lo * 2, num_requests)
        if slo.met(run(users)):
            lo = users
        else:
            hi = users
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if slo.met(run(mid)):
                lo = mid
            else:
                hi = mid
    return CapacityPoint(
        summary=run(lo).summary(), binding=None if hi is None else slo.binding(run(hi)),
        users=lo, tried=tuple((float(u), slo.met(r)) for u, r in sorted(runs.items())))


def _unreachable(slo: SLO, result: SimResult, lead: str) -> str:
    metric = slo.binding(result)
    value = slo.observed(result)[metric]
    limit = slo.limits()[metric]
    what = slo.describe(metric)
    if math.isnan(value):
        return f"{lead} no request has a {what} to judge: the SLO cannot be met"
    return (f"{lead} the {what} is {value:.3g} s, over the {limit:.3g} s objective: no load"
            f" meets the SLO")


def saturation_rate(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix, *,
                    num_requests: int = 2000, seed: int = 0,
                    shared_prefix: SharedPrefix | None = None,
                    disaggregation: Disaggregation | None = None) -> float | None:
    """The open-loop rate, to 1 %, where the setup stops keeping up (``None``: not within
    reach), whatever the latencies."""
    runs, run = _open_loop_runs(model, scheduler, lengths, num_requests, seed, shared_prefix,
                                disaggregation=disaggregation)
    run(estimate_rate(model, scheduler, lengths, seed, disaggregation))
    return _saturation(runs, run)


def _open_loop_runs(model: StepModel, scheduler: SchedulerConfig, lengths: LengthMix,
                    num_requests: int, seed: int, shared_prefix: SharedPrefix | None,
                    burstiness: float = 1.0, disaggregation: Disaggregation | None = None
                    ) -> tuple[dict[float, SimResult], Callable[[float], SimResult]]:
    """The simulations of a search by rate, each made once: the results so far, by rate, and
    the function that gives (and keeps) the one at a rate."""
    runs: dict[float, SimResult] = {}

    def run(rate: float) -> SimResult:
        if rate not in runs:
            demand = open_loop(num_requests, rate, lengths, burstiness=burstiness, seed=seed,
                               shared_prefix=shared_prefix)
            runs[rate] = simulate(demand, model, scheduler, disaggregation=disaggregation)
        return runs[rate]

    return runs, run
