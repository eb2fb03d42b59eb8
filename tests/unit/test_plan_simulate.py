"""The scheduler simulator against times worked out by hand, and its fast mode against its
exact mode. Most cases use a step model with a fixed part only (10 ms a step), so that a
request's times are counts of steps."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdscope.errors import InputError
from pdscope.plan.demand import (
    Demand,
    LogNormalLengths,
    SharedPrefix,
    SimRequest,
    closed_loop,
    open_loop,
)
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate, weighted_percentile
from pdscope.plan.stepmodel import StepModel
from pdscope.slo import SLO

STEP = StepModel(0.010, 0.0, 0.0, 0.0, 0.0)  # every step 10 ms
# A model of the lab's vLLM on a 2-core CPU (tools/bench_planner.py).
LAB = StepModel(base_s=0.012, per_prompt_token_s=0.00045, per_sequence_s=0.0005,
                per_context_token_s=2e-6, per_attention_pair_s=1e-9)


def demand(*requests: tuple[float, int, int]) -> Demand:
    return Demand.from_requests([SimRequest(a, p, o) for a, p, o in requests])


def grouped(*requests: tuple[float, int, int, int, int]) -> Demand:
    return Demand.from_requests([SimRequest(a, p, o, g, k) for a, p, o, g, k in requests])


def both(d: Demand, model: StepModel, scheduler: SchedulerConfig,
         max_sim_s: float | None = None) -> SimResult:
    """Simulate in both modes, check they agree, and give the exact one."""
    fast = simulate(d, model, scheduler, mode="fast", max_sim_s=max_sim_s)
    exact = simulate(d, model, scheduler, mode="exact", max_sim_s=max_sim_s)
    assert_same(fast, exact)
    return exact


def assert_same(a: SimResult, b: SimResult) -> None:
    for name in ("arrival_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=0,
                                   err_msg=name)
    for name in ("preemptions", "replica"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_allclose(np.sort(a.extra_gaps_s), np.sort(b.extra_gaps_s), rtol=1e-9)
    assert a.max_waiting == b.max_waiting
    assert a.peak_kv_usage == b.peak_kv_usage
    assert math.isclose(a.mean_running, b.mean_running, rel_tol=1e-9)
    sa, sb = a.summary(), b.summary()
    for key in ("itl_p50_s", "itl_p99_s", "ttft_p99_s", "tpot_p99_s", "e2e_p50_s"):
        if sa[key] is None:
            assert sb[key] is None
        else:
            assert math.isclose(sa[key], sb[key], rel_tol=1e-9), key


# ----------------------------------------------------------------------------- one request


def test_one_request_alone_takes_one_step_a_token() -> None:
    r = both(demand((0.0, 100, 5)), STEP, SchedulerConfig())
    assert r.first_token_s[0] == pytest.approx(0.010)
    assert r.finish_s[0] == pytest.approx(0.050)  # 5 tokens, 5 steps
    np.testing.assert_allclose(r.itl_s, [0.010] * 4)
    s = r.summary()
    assert s["ttft_p99_s"] == pytest.approx(0.010)
    assert s["tpot_p50_s"] == pytest.approx(0.010)
    assert s["e2e_p99_s"] == pytest.approx(0.050)
    assert s["mean_running"] == 1.0
    assert s["completed"] == 1 and s["preemptions"] == 0 and s["peak_kv_usage"] is None


def test_a_step_model_s_jitter_spreads_the_gaps_and_nothing_else() -> None:
    # 10 ms steps, half of them 1 ms early and half 1 ms late: the gaps' median and p99 move
    # by the jitter; the first token, the TPOT (the mean) and the queue do not.
    jittery = replace(STEP, jitter_s=(-0.001,) * 50 + (0.001,) * 50)
    d = demand((0.0, 100, 101), (0.5, 100, 101))
    plain, r = both(d, STEP, SchedulerConfig()), both(d, jittery, SchedulerConfig())
    assert plain.summary()["itl_p99_s"] == pytest.approx(0.010)
    s = r.summary()
    assert s["itl_p50_s"] == pytest.approx(0.009) and s["itl_p99_s"] == pytest.approx(0.011)
    for key in ("ttft_p99_s", "tpot_p50_s", "e2e_p99_s"):
        assert s[key] == pytest.approx(plain.summary()[key]), key
    np.testing.assert_allclose(r.itl_s, plain.itl_s)  # the model's steps, as before


def test_a_long_prompt_is_read_in_budget_sized_chunks() -> None:
    # 5,000 tokens, 2,048 a step: 2,048 + 2,048 + 904, three steps to the first token.
    r = both(demand((0.0, 5000, 2)), STEP, SchedulerConfig(max_num_batched_tokens=2048))
    assert r.first_token_s[0] == pytest.approx(0.030)
    assert r.finish_s[0] == pytest.approx(0.040)


def test_a_decode_step_grows_with_the_context() -> None:
    # 10 ms + 0.1 ms a context token. Prompt 100: the prefill step is 10 ms; the next two
    # steps decode at contexts 101 and 102: 20.1 and 20.2 ms.
    model = StepModel(0.010, 0.0, 0.0, 1e-4, 0.0)
    r = both(demand((0.0, 100, 3)), model, SchedulerConfig())
    assert r.first_token_s[0] == pytest.approx(0.010)
    assert r.finish_s[0] == pytest.approx(0.010 + 0.0201 + 0.0202)
    np.testing.assert_allclose(np.sort(r.itl_s), [0.0201, 0.0202])


def test_two_prompts_share_the_budget_first_come_first_served() -> None:
    # Budget 2,048, two prompts of 1,500 at once: step 1 reads the first whole and 548 of the
    # second; step 2 decodes the first and reads the second's last 952.
    model = StepModel(0.010, 1e-5, 0.0, 0.0, 1e-9)
    r = both(demand((0.0, 1500, 2), (0.0, 1500, 2)), model, SchedulerConfig())
    # Step 1: 2,048 prompt tokens; pairs 1500·1501/2 + 548·549/2 = 1,125,750 + 150,426.
    step1 = 0.010 + 2048e-5 + 1_276_176e-9
    # Step 2: 952 prompt tokens after 548 in the cache: 952·548 + 952·953/2 = 975,324 pairs.
    step2 = 0.010 + 952e-5 + 975_324e-9
    assert r.first_token_s[0] == pytest.approx(step1)
    assert r.first_token_s[1] == pytest.approx(step1 + step2)
    # The first finishes in step 2 (its second token); the second in step 3, alone.
    assert r.finish_s[0] == pytest.approx(step1 + step2)
    assert r.finish_s[1] == pytest.approx(step1 + step2 + 0.010)


def test_a_request_arriving_mid_step_waits_for_the_next_step() -> None:
    # The first decodes from 10 ms; the second arrives at 25 ms, in the step 20-30 ms, and is
    # read in the step that starts at 30 ms.
    r = both(demand((0.0, 10, 20), (0.025, 10, 2)), STEP, SchedulerConfig())
    assert r.first_token_s[1] == pytest.approx(0.040)
    assert r.finish_s[1] == pytest.approx(0.050)
    assert r.finish_s[0] == pytest.approx(0.200)  # 20 steps, undisturbed


def test_an_answer_of_one_token_ends_with_its_prompt() -> None:
    r = both(demand((0.0, 10, 1)), STEP, SchedulerConfig())
    assert r.first_token_s[0] == r.finish_s[0] == pytest.approx(0.010)
    assert len(r.itl_s) == 0
    assert r.summary()["tpot_p50_s"] is None


def test_the_sequence_cap_queues_the_rest() -> None:
    # One sequence at a time: the second waits for the first's 3 steps.
    r = both(demand((0.0, 10, 3), (0.0, 10, 3)), STEP,
             SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=16))
    assert r.first_token_s[1] == pytest.approx(0.040)
    assert r.finish_s[1] == pytest.approx(0.060)
    assert r.max_waiting == 2


# ----------------------------------------------------------------------------- KV pool


def test_a_full_pool_preempts_the_last_admitted_and_recomputes_it() -> None:
    # Pool of 64 tokens in blocks of 16 (4 blocks); prompts of 16, answers of 33: each needs
    # 16 + 33 - 1 = 48 tokens (3 blocks), both together 6.
    # Step 1 reads both prompts (1 block each): first tokens at 10 ms. Decoding, each takes a
    # second block at its 17th token, the pool is full; at 170 ms the first needs a third:
    # the second is preempted, having 17 tokens. The first finishes its 33 at 330 ms; the
    # second is then recomputed (16 + 17 = 33 tokens in one step, its 18th token at 340 ms)
    # and decodes its last 15 by 490 ms.
    scheduler = SchedulerConfig(kv_pool_tokens=64, block_size=16, max_num_seqs=2,
                                max_num_batched_tokens=64)
    r = both(demand((0.0, 16, 33), (0.0, 16, 33)), STEP, scheduler)
    np.testing.assert_allclose(r.first_token_s, [0.010, 0.010])
    np.testing.assert_allclose(r.finish_s, [0.330, 0.490])
    np.testing.assert_array_equal(r.preemptions, [0, 1])
    np.testing.assert_allclose(r.extra_gaps_s, [0.340 - 0.170])
    assert len(r.itl_s) == 2 * 32  # every token after the first, once
    s = r.summary()
    assert s["preemptions"] == 1 and s["peak_kv_usage"] == 1.0 and s["completed"] == 2


def test_a_request_larger_than_the_pool_is_refused() -> None:
    with pytest.raises(InputError, match="more than the pool"):
        simulate(demand((0.0, 100, 10)), STEP, SchedulerConfig(kv_pool_tokens=64))


def test_a_cached_prefix_is_skipped_but_one_token_is_always_computed() -> None:
    # 1e-4 s a prompt token. A group's prefix of 100 tokens is 6 full blocks (96 tokens).
    model = StepModel(0.010, 1e-4, 0.0, 0.0, 0.0)
    r = both(grouped((0.0, 150, 2, 0, 100), (1.0, 150, 2, 0, 100), (2.0, 97, 2, 0, 96)),
             model, SchedulerConfig())
    assert r.first_token_s[0] == pytest.approx(0.010 + 150e-4)  # the first reads it all
    assert r.first_token_s[1] - 1.0 == pytest.approx(0.010 + 54e-4)  # 150 - 96
    assert r.first_token_s[2] - 2.0 == pytest.approx(0.010 + 1e-4)  # 97 - 96: one token
    uncached = both(grouped((0.0, 150, 2, 0, 100), (1.0, 150, 2, 0, 100)), model,
                    SchedulerConfig(prefix_caching=False))
    assert uncached.first_token_s[1] - 1.0 == pytest.approx(0.010 + 150e-4)


def test_an_evicted_prefix_is_read_again() -> None:
    # Pool of 8 blocks of 16. Group 0's prefix (96 tokens, 6 blocks) is cached by the first
    # request, then evictable; the second (no group, 112 tokens + 8 answer = 7 blocks) takes
    # it back; the third, of group 0, must read its whole prompt again.
    model = StepModel(0.010, 1e-4, 0.0, 0.0, 0.0)
    scheduler = SchedulerConfig(kv_pool_tokens=128, block_size=16, max_num_seqs=4,
                                max_num_batched_tokens=256)
    r = both(Demand.from_requests([SimRequest(0.0, 100, 2, 0, 96), SimRequest(1.0, 112, 8),
                                   SimRequest(2.0, 100, 2, 0, 96)]), model, scheduler)
    assert r.first_token_s[2] - 2.0 == pytest.approx(0.010 + 100e-4)


# ----------------------------------------------------------------------------- slots


def test_one_slot_serves_requests_one_after_another() -> None:
    r = both(demand((0.0, 10, 5), (0.0, 10, 5)), STEP, SchedulerConfig(policy="slots"))
    np.testing.assert_allclose(r.finish_s, [0.050, 0.100])
    # The second's TTFT is the first's whole end-to-end latency and its own prompt step.
    assert r.first_token_s[1] - r.arrival_s[1] == pytest.approx(0.050 + 0.010)


def test_slots_read_prompts_in_slot_order_within_the_batch() -> None:
    # Two slots, a batch of 100 tokens, prompts of 80: step 1 reads 80 + 20, step 2 decodes
    # the first and reads the second's last 60.
    model = StepModel(0.010, 1e-4, 0.0, 0.0, 0.0)
    r = both(demand((0.0, 80, 2), (0.0, 80, 2)), model,
             SchedulerConfig(policy="slots", slots=2, n_batch=100))
    assert r.first_token_s[0] == pytest.approx(0.010 + 100e-4)
    assert r.first_token_s[1] == pytest.approx(0.020 + 160e-4)


def test_a_slot_keeps_its_prefix_for_its_group() -> None:
    model = StepModel(0.010, 1e-4, 0.0, 0.0, 0.0)
    r = both(grouped((0.0, 150, 2, 0, 100), (1.0, 150, 2, 0, 100)), model,
             SchedulerConfig(policy="slots", slots=2))
    assert r.first_token_s[1] - 1.0 == pytest.approx(0.010 + 50e-4)  # token granularity


# ----------------------------------------------------------------------------- load


def test_two_replicas_halve_the_queue() -> None:
    d = demand(*[(0.0, 10, 5)] * 4)
    one = both(d, STEP, SchedulerConfig(policy="slots"))
    two = both(d, STEP, SchedulerConfig(policy="slots", replicas=2))
    np.testing.assert_allclose(one.finish_s, [0.05, 0.10, 0.15, 0.20])
    np.testing.assert_allclose(two.finish_s, [0.05, 0.05, 0.10, 0.10])
    np.testing.assert_array_equal(two.replica, [0, 1, 0, 1])
    assert one.max_waiting == 4


def test_one_user_without_think_time_sends_when_its_last_request_ends() -> None:
    d = closed_loop(5, 1, LogNormalLengths(prompt_median=50, output_median=20), seed=3)
    r = both(d, STEP, SchedulerConfig())
    assert r.arrival_s[0] == 0.0
    np.testing.assert_array_equal(r.arrival_s[1:], r.finish_s[:-1])
    thinking = closed_loop(5, 1, LogNormalLengths(prompt_median=50, output_median=20),
                           seed=3, think_s=0.5)
    r = both(thinking, STEP, SchedulerConfig())
    np.testing.assert_allclose(r.arrival_s[1:], r.finish_s[:-1] + 0.5)


def test_the_time_limit_stops_the_simulation() -> None:
    d = demand((0.0, 10, 5), (0.0, 10, 5))
    r = both(d, STEP, SchedulerConfig(policy="slots"), max_sim_s=0.075)
    assert r.finish_s[0] == pytest.approx(0.05)
    assert math.isnan(r.finish_s[1]) and r.first_token_s[1] == pytest.approx(0.06)
    assert r.summary()["completed"] == 1


WORKLOADS = {
    "budget": (SchedulerConfig(), None),
    "small pool, prefixes": (SchedulerConfig(kv_pool_tokens=4000, max_num_batched_tokens=256,
                                             max_num_seqs=32), SharedPrefix(0.5, 3, 200)),
    "replicas": (SchedulerConfig(kv_pool_tokens=2000, max_num_batched_tokens=256,
                                 max_num_seqs=32, replicas=3), SharedPrefix(0.5, 3, 200)),
    "slots": (SchedulerConfig(policy="slots", slots=4, n_batch=128), SharedPrefix(0.5, 3, 200)),
    "slots, replicas": (SchedulerConfig(policy="slots", slots=2, n_batch=64, replicas=2), None),
}
SHORT = LogNormalLengths(prompt_median=100, output_median=60, prompt_range=(4, 600),
                         output_range=(1, 400))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_mode_gives_the_exact_answer_open_loop(name: str, seed: int) -> None:
    scheduler, shared = WORKLOADS[name]
    rate = 6.0 * scheduler.replicas if scheduler.policy == "budget" else 1.5
    d = open_loop(300, rate, SHORT, seed=seed, shared_prefix=shared)
    r = both(d, LAB, scheduler)
    assert r.completed == 300
    if name == "small pool, prefixes" and seed == 0:
        assert r.preemptions.sum() > 0  # the case covers preemption


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("think_s", [0.0, 0.5])
def test_fast_mode_gives_the_exact_answer_closed_loop(replicas: int, think_s: float) -> None:
    d = closed_loop(200, 10, SHORT, think_s=think_s, seed=2, shared_prefix=SharedPrefix(0.5))
    scheduler = SchedulerConfig(kv_pool_tokens=3000, max_num_seqs=16,
                                max_num_batched_tokens=512, replicas=replicas)
    r = both(d, LAB, scheduler)
    assert r.completed == 200 and r.preemptions.sum() > 0


def test_fast_mode_gives_the_exact_answer_under_a_time_limit() -> None:
    d = open_loop(300, 8.0, SHORT, seed=4)
    r = both(d, LAB, SchedulerConfig(kv_pool_tokens=3000), max_sim_s=20.0)
    assert 0 < r.completed < 300


def test_every_token_after_the_first_is_one_gap() -> None:
    d = open_loop(300, 6.0, SHORT, seed=5)
    r = simulate(d, LAB, SchedulerConfig(kv_pool_tokens=3000, max_num_batched_tokens=256))
    assert r.preemptions.sum() > 0
    _, counts = r.itl_steps()
    assert counts.sum() == (r.output_tokens - 1).sum() == len(r.itl_s)
    # A request's gaps add up to its time from first token to last.
    assert r.itl_s.sum() == pytest.approx((r.finish_s - r.first_token_s).sum(), rel=1e-9)


# ----------------------------------------------------------------------------- percentiles


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.floats(0, 100))
def test_the_weighted_percentile_is_numpy_s_inverted_cdf(values: list[float],
                                                          q: float) -> None:
    a = np.array(values)
    expected = np.percentile(a, q, method="inverted_cdf")
    assert weighted_percentile(a, np.ones(len(a), dtype=int), q) == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5)), min_size=1, max_size=30),
       st.sampled_from([1, 10, 50, 90, 99, 99.9, 100]))
def test_a_weight_counts_as_that_many_copies(pairs: list[tuple[float, int]], q: float) -> None:
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    if weights.sum() == 0:
        assert math.isnan(weighted_percentile(values, weights, q))
        return
    expected = np.percentile(np.repeat(values, weights), q, method="inverted_cdf")
    assert weighted_percentile(values, weights, q) == expected


def test_the_summary_has_exactly_its_keys() -> None:
    r = simulate(demand((0.0, 100, 5)), STEP, SchedulerConfig())
    assert list(r.summary()) == [
        "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tpot_p50_s",
        "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "request_throughput", "output_throughput",
        "simulated_requests", "completed", "preemptions", "peak_kv_usage", "max_waiting",
        "mean_running", "duration_s", "sim_wall_s"]
    s = r.summary()
    assert s["request_throughput"] == pytest.approx(1 / 0.05)
    assert s["output_throughput"] == pytest.approx(5 / 0.05)


# ----------------------------------------------------------------------------- the SLO


def test_an_slo_judges_the_objective_furthest_over() -> None:
    slo = SLO(ttft_s=0.2, itl_s=0.05)
    summary = {"ttft_p99_s": 0.1, "itl_p99_s": 0.06}
    assert not slo.met(summary)
    assert slo.binding(summary) == "itl"  # 0.06 / 0.05 = 1.2 > 0.1 / 0.2
    assert slo.met({"ttft_p99_s": 0.2, "itl_p99_s": 0.05})
    assert not slo.met({"ttft_p99_s": None, "itl_p99_s": 0.01})  # nothing to judge


def test_an_slo_at_another_percentile_reads_the_result() -> None:
    r = simulate(demand((0.0, 100, 5), (0.0, 100, 5)), STEP, SchedulerConfig(max_num_seqs=1,
                                                                           ))
    slo = SLO(ttft_s=0.05, percentile=75)
    # TTFTs 10 ms and 60 ms: the 75th percentile is the second.
    assert slo.observed(r) == {"ttft": pytest.approx(0.06)}
    assert not slo.met(r)
    with pytest.raises(InputError, match="percentile 75"):
        slo.met(r.summary())


@pytest.mark.parametrize("kwargs, words", [
    ({}, "at least one objective"),
    ({"ttft_s": 0.0}, "positive number"),
    ({"itl_s": math.inf}, "positive number"),
    ({"ttft_s": 1.0, "percentile": 0}, "above 0"),
    ({"ttft_s": 1.0, "percentile": 100.5}, "at most 100"),
])
def test_a_bad_slo_is_refused_in_plain_words(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        SLO(**kwargs)
    assert "\n" not in str(info.value) and "--" not in str(info.value)


def test_bad_simulation_inputs_are_refused() -> None:
    d = demand((0.0, 10, 2))
    with pytest.raises(InputError, match="mode"):
        simulate(d, STEP, SchedulerConfig(), mode="slow")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="never advance"):
        simulate(d, StepModel(0.0, 1e-4, 0.0, 0.0, 0.0), SchedulerConfig())
    with pytest.raises(InputError, match="time limit"):
        simulate(d, STEP, SchedulerConfig(), max_sim_s=0)


# ----------------------------------------------------------------------------- a reference


def reference_budget(d: Demand, model: StepModel, cfg: SchedulerConfig
                     ) -> tuple[list[float], list[float], list[int]]:
    """The budget policy written the plain way — every running request looked at in every
    step, no sums, no runs — for one replica, an open loop and no prefix cache: the engine must
    agree with it."""
    n = len(d)
    prompt, output = d.prompt_tokens.tolist(), d.output_tokens.tolist()
    arrival = d.arrival_s.tolist() if d.arrival_s is not None else []
    bs = cfg.block_size
    free = cfg.kv_blocks if cfg.kv_blocks is not None else 1 << 60
    kv, target, gen, blocks = [0] * n, list(prompt), [0] * n, [0] * n
    first, finish, preempted = [math.nan] * n, [math.nan] * n, [0] * n
    waiting: list[int] = []
    running: list[int] = []
    t, nxt, done = 0.0, 0, 0
    while done < n:
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            t = arrival[nxt]
            continue
        budget, step, any_preempted, idx = cfg.max_num_batched_tokens, [], False, 0
        while idx < len(running):
            r = running[idx]
            num = 1 if kv[r] >= target[r] else min(target[r] - kv[r], budget)
            need = -(-(kv[r] + num) // bs) - blocks[r]
            victim = -1
            while need > free:
                victim = running.pop()
                any_preempted = True
                free += blocks[victim]
                blocks[victim] = kv[victim] = 0
                target[victim] = prompt[victim] + gen[victim]
                preempted[victim] += 1
                waiting.insert(0, victim)
                if victim == r:
                    break
            if victim == r:
                break
            free -= need
            blocks[r] += need
            step.append((r, num, kv[r] >= target[r]))
            budget -= num
            idx += 1
        while not any_preempted and waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            num = min(target[r], budget)
            need = -(-num // bs)
            if need > free:
                break
            waiting.pop(0)
            free -= need
            blocks[r] = need
            running.append(r)
            step.append((r, num, False))
            budget -= num
        tokens = sum(num for _, num, decoding in step if not decoding)
        context = sum(prompt[r] + gen[r] for r, _, decoding in step if decoding)
        pairs = sum(num * kv[r] + num * (num + 1) / 2 for r, num, decoding in step
                    if not decoding)
        t += model.step_time(tokens, len(step), context, pairs)
        for r, num, decoding in step:
            kv[r] += num
            if decoding:
                target[r] = kv[r]
            if kv[r] < target[r]:
                continue
            if gen[r] == 0:
                first[r] = t
            gen[r] += 1
            if gen[r] == output[r]:
                finish[r] = t
                running.remove(r)
                free += blocks[r]
                done += 1
    return first, finish, preempted


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pool", [None, 2500])
def test_the_engine_agrees_with_the_plain_reference(seed: int, pool: int | None) -> None:
    d = open_loop(150, 6.0, SHORT, seed=seed)
    cfg = SchedulerConfig(kv_pool_tokens=pool, max_num_batched_tokens=256, max_num_seqs=24,
                          prefix_caching=False)
    first, finish, preempted = reference_budget(d, LAB, cfg)
    for mode in ("exact", "fast"):
        r = simulate(d, LAB, cfg, mode=mode)  # type: ignore[arg-type]
        np.testing.assert_allclose(r.first_token_s, first, rtol=1e-9)
        np.testing.assert_allclose(r.finish_s, finish, rtol=1e-9)
        np.testing.assert_array_equal(r.preemptions, preempted)
    if pool:
        assert sum(preempted) > 0
