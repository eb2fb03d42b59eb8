"""The scheduler simulator: a demand served by replicas of one engine, step by step.

Each replica is an :class:`~pdscope.plan.engine.Engine` under the policy of the
:class:`~pdscope.plan.scheduler.SchedulerConfig`; a step's duration comes from the
:class:`~pdscope.plan.stepmodel.StepModel`. A router sends each request, when it arrives, to the
replica with the fewest unfinished requests (ties to the first). A closed loop's users send
their next request a think time after their last one ended.

Disaggregated (a :class:`~pdscope.plan.disaggregation.Disaggregation`), the engines are prefill
instances, to which the router sends arrivals, and decode instances, to which each prompt's KV
cache is sent when the prefill instance hands it off: the transfer's end is one more kind of
event, an arrival at the decode instance.

Events at the same instant go in one order: steps that end (and the transfers they begin),
then arrivals (and transfers that end), then steps that start — so a request that arrives when
a step ends is in the next step, and a request that finishes frees its place before the router
counts.

Two modes give the same answer: ``exact`` takes one engine step at a time; ``fast`` takes the
decode steps between two events as one run in closed form (:mod:`pdscope.plan.engine`), which is
what makes a hundred thousand requests a matter of seconds.

What a result keeps: per-request times and counts, and the inter-token gaps in compact form —
each decode run's first step duration, its growth a step, its steps and the sequences decoding
in it (each of them got a token every step, one gap a step), plus the gaps that are not a step
(a preempted request's wait for its recomputation; disaggregated, a request's first gap on its
decode instance, which holds its KV cache's transfer). ITL percentiles weigh each step's
duration by the sequences that decoded in it; with a step model that knows its jitter (measured
by the calibration), the gaps are those durations plus the jitter
(:func:`~pdscope.plan.stepmodel.with_jitter`): the queue and the other figures are the model's
mean steps, where the scatter averages out.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from pdscope.errors import InputError
from pdscope.figures import (
    LATENCIES,
    OUTPUT_THROUGHPUT,
    REQUEST_THROUGHPUT,
    Figures,
    ResultKind,
    number,
    register,
    scalars,
)
from pdscope.plan.demand import Demand
from pdscope.plan.disaggregation import Disaggregation
from pdscope.plan.engine import BudgetEngine, Engine, SlotsEngine, Stats
from pdscope.plan.ledger import Ledger
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.stepmodel import StepModel, with_jitter
from pdscope.slo import METRICS


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``values`` each counted ``weights`` times, as
    ``np.percentile(..., method="inverted_cdf")`` gives it for the values repeated: the
    smallest value whose cumulative weight reaches ``q`` % of the total. ``nan`` when empty."""
    return _inverted_cdf(*_cumulative(values, weights), q)


def _cumulative(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values with a positive weight, sorted, and their cumulative weights."""
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    order = np.argsort(values, kind="stable")
    return values[order], np.cumsum(weights[order])


def _inverted_cdf(values: np.ndarray, cumulative: np.ndarray, q: float) -> float:
    if not len(values):
        return math.nan
    target = cumulative[-1] * (np.float64(q) / 100)
    i = int(np.searchsorted(cumulative, target, side="left"))
    return float(values[min(i, len(values) - 1)])


@dataclass(frozen=True, eq=False)
class SimResult:
    """What the simulation gave: per-request arrays (in the demand's order; ``nan`` for a time
    that did not come before the simulation stopped), the inter-token gaps in compact form (see
    the module's docstring) and the run's peaks."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    run_first_step_s: np.ndarray
    run_growth_s: np.ndarray
    run_steps: np.ndarray
    run_decoding: np.ndarray
    extra_gaps_s: np.ndarray
    peak_kv_usage: float | None
    max_waiting: int
    mean_running: float
    busy_s: float
    mode: str
    sim_wall_s: float
    label: str = ""
    # Disaggregated: each request's decode instance (-1: none; ``replica`` is its prefill
    # instance) and when its KV cache reached it (``nan``: never sent).
    decode_instance: np.ndarray | None = None
    kv_arrival_s: np.ndarray | None = None
    # The step model's jitter (equal-probability quantiles, seconds): added to every gap.
    jitter_s: tuple[float, ...] = ()
    # Prompt tokens the prefix cache served at each request's first admission (``None``: not
    # recorded), and the demand's ``follows`` (``None``: no request follows another).
    cached_tokens: np.ndarray | None = None
    follows: np.ndarray | None = None

    @property
    def completed(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.finish_s)))

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token of each request that got one."""
        ttft = self.first_token_s - self.arrival_s
        return ttft[~np.isnan(ttft)]

    @property
    def e2e_s(self) -> np.ndarray:
        e2e = self.finish_s - self.arrival_s
        return e2e[~np.isnan(e2e)]

    @property
    def kv_transfer_s(self) -> np.ndarray:
        """Disaggregated: each sent request's time from its first token to its KV cache's
        arrival at the decode instance (the link's queue and the transfer); empty else."""
        if self.kv_arrival_s is None:
            return np.zeros(0)
        wait = self.kv_arrival_s - self.first_token_s
        return wait[~np.isnan(wait)]

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first, of each finished request of 2 or more."""
        many = (self.output_tokens > 1) & ~np.isnan(self.finish_s)
        return ((self.finish_s[many] - self.first_token_s[many])
                / (self.output_tokens[many] - 1))

    @cached_property
    def _itl_steps(self) -> tuple[np.ndarray, np.ndarray]:
        steps = self.run_steps.astype(np.int64)
        total = int(steps.sum())
        run = np.repeat(np.arange(len(steps)), steps)
        starts = np.cumsum(steps) - steps
        j = np.arange(total) - starts[run]
        values = self.run_first_step_s[run] + self.run_growth_s[run] * j
        weights = self.run_decoding[run]
        return (np.concatenate([values, self.extra_gaps_s]),
                np.concatenate([weights, np.ones(len(self.extra_gaps_s), dtype=weights.dtype)]))

    @cached_property
    def _itl_sorted(self) -> tuple[np.ndarray, np.ndarray]:
        return _cumulative(*with_jitter(*self._itl_steps, self.jitter_s))

    def itl_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap as ``(values, counts)``: each decode step's duration (the
        model's, without the jitter) with the sequences that decoded in it, and each longer gap
        once."""
        return self._itl_steps

    @property
    def itl_s(self) -> np.ndarray:
        """Every inter-token gap, one value a gap, without the jitter (as many values as tokens
        after the first: large for a large run; :meth:`itl_steps` is the compact form)."""
        values, counts = self._itl_steps
        return np.repeat(values, counts)

    def percentile(self, metric: str, q: float) -> float:
        """The ``q``-th percentile (0–100, numpy's ``inverted_cdf``) of ``ttft``, ``itl``,
        ``tpot`` or ``e2e``, in seconds; ``nan`` with no value."""
        if metric not in METRICS:
            raise InputError(f"unknown latency metric {metric!r}: use {', '.join(METRICS)}")
        if not 0 <= q <= 100:
            raise InputError(f"a percentile must be between 0 and 100, got {q!r}")
        if metric == "itl":
            return _inverted_cdf(*self._itl_sorted, q)
        values = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}[metric]
        if not len(values):
            return math.nan
        return float(np.percentile(values, q, method="inverted_cdf"))

    def summary(self) -> dict[str, Any]:
        """The figures a plan is judged on (latencies in seconds; ``None`` with no value)."""
        done = ~np.isnan(self.finish_s)
        completed = int(done.sum())
        arrived = self.arrival_s[~np.isnan(self.arrival_s)]
        duration = float(np.max(self.finish_s[done]) - np.min(arrived)) if completed else 0.0
        out: dict[str, Any] = {}
        for metric, qs in (("ttft", (50, 90, 99)), ("itl", (50, 99)), ("tpot", (50, 99)),
                           ("e2e", (50, 99))):
            for q in qs:
                out[f"{metric}_p{q}_s"] = _number(self.percentile(metric, q))
        rate = completed / duration if duration > 0 else None
        out["request_throughput"] = rate
        out["output_throughput"] = (float(self.output_tokens[done].sum()) / duration
                                    if duration > 0 else None)
        out["simulated_requests"] = len(self.finish_s)
        out["completed"] = completed
        out["preemptions"] = int(self.preemptions.sum())
        out["peak_kv_usage"] = self.peak_kv_usage
        out["max_waiting"] = self.max_waiting
        out["mean_running"] = self.mean_running
        out["duration_s"] = duration
        out["sim_wall_s"] = self.sim_wall_s
        if self.kv_arrival_s is not None:
            sent = self.kv_transfer_s
            for q in (50, 99):
                out[f"kv_transfer_p{q}_s"] = (float(np.percentile(sent, q, method="inverted_cdf"))
                                              if len(sent) else None)
        return out

    def figures(self) -> Figures:
        return prediction_figures(self.summary())


PREDICTION_METRICS = (*LATENCIES, REQUEST_THROUGHPUT, OUTPUT_THROUGHPUT)


def prediction_figures(d: Mapping[str, Any]) -> Figures:
    """A prediction's figures from its summary (``plan predict --json``): its latencies and
    throughputs, the figures a bench run of the same load measures."""
    return Figures("prediction", PREDICTION_METRICS,
                   scalars=scalars(**{m.name: number(d.get(m.name)) for m in PREDICTION_METRICS}))


PREDICTION = register(ResultKind(
    "prediction", PREDICTION_METRICS, from_json=prediction_figures,
    recognise=lambda d: "simulated_requests" in d, compares_with=frozenset({"bench"})))


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x


def simulate(demand: Demand, model: StepModel, scheduler: SchedulerConfig, *,
             mode: Literal["fast", "exact"] = "fast", max_sim_s: float | None = None,
             disaggregation: Disaggregation | None = None) -> SimResult:
    """Serve ``demand`` with ``scheduler.replicas`` servers whose steps take ``model``'s time.

    ``max_sim_s`` stops the simulation at that simulated time (requests not finished by then
    keep ``nan`` times); without it, every request is served. ``mode`` is ``fast`` (decode runs
    in closed form) or ``exact`` (one step at a time); both give the same result.

    ``disaggregation``: serve with that many prefill and decode instances of the server instead
    (``scheduler.replicas`` must then be 1), the KV cache sent between them over its link."""
    if mode not in ("fast", "exact"):
        raise InputError(f"the simulation mode must be fast or exact, got {mode!r}")
    if max_sim_s is not None and not (max_sim_s > 0):
        raise InputError(f"the simulated time limit must be a positive number of seconds,"
                         f" got {max_sim_s!r}")
    if model.base_s + model.per_sequence_s <= 0:
        raise InputError("the step model gives a step no fixed time (its base and its cost a"
                         " sequence are both 0): a simulation would never advance")
    if disaggregation is not None and scheduler.replicas != 1:
        raise InputError(f"a disaggregated setup counts its own instances"
                         f" ({disaggregation.label}): replicas must be 1, got"
                         f" {scheduler.replicas}")
    _check_fits(demand, scheduler)
    began = time.perf_counter()
    run = _Run(demand, model, scheduler, mode == "fast",
               math.inf if max_sim_s is None else float(max_sim_s), disaggregation)
    run.run()
    return run.result(time.perf_counter() - began, mode)


def _check_fits(demand: Demand, scheduler: SchedulerConfig) -> None:
    """Every request must fit the KV pool alone, else it would wait for ever."""
    blocks = scheduler.kv_blocks
    if blocks is None:
        return
    tokens = demand.prompt_tokens + demand.output_tokens - 1
    worst = int(np.argmax(tokens))
    need = -(-int(tokens[worst]) // scheduler.block_size)
    if need > blocks:
        raise InputError(
            f"a request of {int(demand.prompt_tokens[worst])} prompt and"
            f" {int(demand.output_tokens[worst])} output tokens needs {need} KV blocks, more"
            f" than the pool's {blocks}: it could never be served")


class _Arrivals:
    """When each request is sent. Requests whose times are known in advance (an open loop, a
    closed loop's first requests, a conversation's first turns) come in order of time; the rest
    are sent when a request ends: a closed loop's next request (``k``-th sent, whichever user
    is free), or the requests that follow the one that ended (a conversation's next turn), each
    a think time later. Requests due at one instant go in the order they are sent (the demand's
    index breaks ties), whichever way their times became known."""

    def __init__(self, demand: Demand, arrival: list[float]) -> None:
        n = len(demand)
        self.arrival = arrival
        self.think = demand.think_s
        self.closed = demand.closed
        self.sent = n
        self.n = n
        self.followers: dict[int, list[int]] = {}
        if demand.closed:
            users = min(n, demand.users or 1)
            starts_s = demand.start_s
            for k in range(users):
                arrival[k] = 0.0 if starts_s is None else float(starts_s[k])
            known = list(range(users))
            self.sent = users
        elif demand.follows is None:
            known = list(range(n))
        else:
            follows = demand.follows.tolist()
            known = [r for r in range(n) if follows[r] < 0]
            for f, r in enumerate(follows):
                if r >= 0:
                    self.followers.setdefault(r, []).append(f)
        times = np.asarray([arrival[r] for r in known], dtype=float)
        order = np.argsort(times, kind="stable")
        self.known = [known[i] for i in order.tolist()]
        self.known_s = [*times[order].tolist(), math.inf]  # their times, and a sentinel
        self.at = 0
        self.later: list[tuple[float, int]] = []  # (send time, request): known from a finish
        self.waiting = self.closed or bool(self.followers)  # some send waits for a finish

    def next_s(self) -> float:
        """When the next request is due (``inf``: none is known)."""
        known = self.known_s[self.at]
        later = self.later
        return later[0][0] if later and later[0][0] < known else known

    def pop(self) -> tuple[int, float]:
        """The next request due and its time."""
        at, later = self.at, self.later
        t = self.known_s[at]
        if t < math.inf and (not later or (t, self.known[at]) < later[0]):
            self.at = at + 1
            return self.known[at], t
        t, r = heapq.heappop(later)
        return r, t

    def finished(self, r: int, t: float) -> None:
        """Request ``r`` ended at ``t``: whatever waited for it is sent a think time later."""
        due = t + self.think
        if self.closed:
            if self.sent < self.n:
                self.arrival[self.sent] = due
                heapq.heappush(self.later, (due, self.sent))
                self.sent += 1
            return
        for f in self.followers.get(r, ()):
            self.arrival[f] = due
            heapq.heappush(self.later, (due, f))


@dataclass
class _Run:
    """One simulation: the ledger, the replicas and the arrivals still to come."""

    demand: Demand
    model: StepModel
    scheduler: SchedulerConfig
    fast: bool
    limit_s: float
    disaggregation: Disaggregation | None = None
    ledger: Ledger = field(init=False)
    stats: Stats = field(init=False)
    engines: list[Engine] = field(init=False)
    # Where arrivals go, and (disaggregated) where the KV caches go: engine indices.
    front: list[int] = field(init=False)
    back: list[int] = field(init=False)
    decode_instance: list[int] = field(init=False)
    kv_arrival: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.demand)
        self.stats = Stats()
        kind = BudgetEngine if self.scheduler.policy == "budget" else SlotsEngine
        split = self.disaggregation
        count = (self.scheduler.replicas if split is None
                 else split.prefill_instances + split.decode_instances)
        self.engines = [kind(i, self.ledger, self.model, self.scheduler, self.stats, self.fast)
                        for i in range(count)]
        if split is None:
            self.front, self.back = list(range(count)), []
        else:
            self.front = list(range(split.prefill_instances))
            self.back = list(range(split.prefill_instances, count))
            for i in self.front:
                self.engines[i].hands_off = True
        n = self.ledger.n
        self.decode_instance = [-1] * n
        self.kv_arrival = [math.nan] * n

    def run(self) -> None:
        ledger, stats, engines = self.ledger, self.stats, self.engines
        limit = self.limit_s
        arrivals = _Arrivals(self.demand, ledger.arrival)
        finished = stats.finished
        handed = stats.handed_off
        heap: list[tuple[float, int, int]] = []  # (step end, replica, version)
        front, back = self.front, self.back
        replicas = len(front)
        # Disaggregated: KV caches on their way, (arrival at the decode instance, request), and
        # when each prefill instance's link is free.
        transfers: list[tuple[float, int]] = []
        link_free = [0.0] * replicas
        split = self.disaggregation
        inf = math.inf
        while True:
            te = heap[0][0] if heap else inf
            ta = arrivals.next_s()
            now = ta if ta < te else te
            if transfers and transfers[0][0] < now:
                now = transfers[0][0]
            if now == inf or now > limit:
                break
            starts: list[int] = []
            while heap and heap[0][0] == now:
                _, i, version = heapq.heappop(heap)
                engine = engines[i]
                if version != engine.version or not engine.busy:
                    continue
                engine.complete()
                starts.append(i)
            if handed:
                assert split is not None
                for r, t in handed:
                    self._send(r, t, split, link_free, transfers)
                handed.clear()
            if finished:
                if arrivals.waiting:
                    for r, t in finished:
                        arrivals.finished(r, t)
                    ta = arrivals.next_s()
                finished.clear()
            # Arrivals up to now.
            while ta <= now:
                r, t = arrivals.pop()
                ta = arrivals.next_s()
                i = 0 if replicas == 1 else min(front, key=lambda j: engines[j].unfinished)
                ledger.replica[r] = i
                engine = engines[i]
                if engine.arrive(r, t):
                    heapq.heappush(heap, (engine.end_s, i, engine.version))
                elif not engine.busy and i not in starts:
                    starts.append(i)
            # KV caches that reached their decode instance by now.
            while transfers and transfers[0][0] <= now:
                t, r = heapq.heappop(transfers)
                self.kv_arrival[r] = t
                i = back[self.decode_instance[r]]
                engine = engines[i]
                if engine.receive(r, t):
                    heapq.heappush(heap, (engine.end_s, i, engine.version))
                elif not engine.busy and i not in starts:
                    starts.append(i)
            if len(starts) > 1:
                starts.sort()
            for i in starts:
                engine = engines[i]
                end = engine.start(now, limit)
                if end is not None:
                    heapq.heappush(heap, (end, i, engine.version))

    def _send(self, r: int, t: float, split: Disaggregation, link_free: list[float],
              transfers: list[tuple[float, int]]) -> None:
        """``r``'s first token came out at ``t`` on its prefill instance: its KV cache goes,
        after those before it on that instance's link, to the decode instance with the fewest
        unfinished requests (counted from now on)."""
        engines = self.engines
        j = min(range(len(self.back)), key=lambda k: engines[self.back[k]].unfinished)
        engines[self.back[j]].unfinished += 1
        self.decode_instance[r] = j
        p = self.ledger.replica[r]
        begin = link_free[p] if link_free[p] > t else t
        end = link_free[p] = begin + split.transfer_s(self.ledger.prompt[r])
        heapq.heappush(transfers, (end, r))

    def result(self, wall_s: float, mode: str) -> SimResult:
        ledger, stats = self.ledger, self.stats
        peaks = [e.peak_kv_usage for e in self.engines]
        peak = None if peaks[0] is None else max(p for p in peaks if p is not None)
        return SimResult(
            arrival_s=np.array(ledger.arrival, dtype=float),
            first_token_s=np.array(ledger.first, dtype=float),
            finish_s=np.array(ledger.finish, dtype=float),
            prompt_tokens=np.array(ledger.prompt, dtype=np.int64),
            output_tokens=np.array(ledger.output, dtype=np.int64),
            preemptions=np.array(ledger.preemptions, dtype=np.int64),
            replica=np.array(ledger.replica, dtype=np.int64),
            run_first_step_s=np.array(stats.run_first_s, dtype=float),
            run_growth_s=np.array(stats.run_growth_s, dtype=float),
            run_steps=np.array(stats.run_steps, dtype=np.int64),
            run_decoding=np.array(stats.run_decoding, dtype=np.int64),
            extra_gaps_s=np.array(ledger.gaps, dtype=float),
            peak_kv_usage=peak,
            max_waiting=stats.max_waiting,
            mean_running=stats.sequence_s / stats.busy_s if stats.busy_s > 0 else 0.0,
            busy_s=stats.busy_s,
            mode=mode,
            sim_wall_s=wall_s,
            label=self.demand.label,
            decode_instance=(None if self.disaggregation is None
                             else np.array(self.decode_instance, dtype=np.int64)),
            kv_arrival_s=(None if self.disaggregation is None
                          else np.array(self.kv_arrival, dtype=float)),
            jitter_s=self.model.jitter_s,
            cached_tokens=np.array(ledger.cached, dtype=np.int64),
            follows=self.demand.follows,
        )
