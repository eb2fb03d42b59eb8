"""Prefill/decode disaggregation in the simulator, against times worked out by hand: a prompt's
first token comes out on a prefill instance, its KV cache crosses the link in bytes / bandwidth,
and a decode instance decodes the rest without reading the prompt. Most cases use a step model
with a fixed part only (10 ms a step) and a link that takes 0.1 s for a 100-token prompt."""

from __future__ import annotations

import numpy as np
import pytest

from pdscope.errors import InputError
from pdscope.plan import Disaggregation
from pdscope.plan.capacity import estimate_rate, max_users, request_alone_s
from pdscope.plan.demand import (
    Demand,
    FixedLengths,
    LogNormalLengths,
    SharedPrefix,
    SimRequest,
    closed_loop,
    open_loop,
)
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate
from pdscope.plan.stepmodel import HardwareFigures, StepModel
from pdscope.plan.whatif import standard_changes, what_if
from pdscope.slo import SLO
from tests.unit.test_plan_simulate import LAB, SHORT, STEP, assert_same

# 1 MB a token over 1 GB/s: a 100-token prompt's KV cache takes 0.1 s.
SLOW = Disaggregation(1, 1, link_gb_s=1.0, kv_bytes_per_token=1e6)


def demand(*requests: tuple[float, int, int]) -> Demand:
    return Demand.from_requests([SimRequest(a, p, o) for a, p, o in requests])


def both(d: Demand, model: StepModel, scheduler: SchedulerConfig, split: Disaggregation,
         max_sim_s: float | None = None) -> SimResult:
    """Simulate in both modes, check they agree (KV arrivals and decode instances too), and
    give the exact one."""
    fast = simulate(d, model, scheduler, mode="fast", max_sim_s=max_sim_s,
                    disaggregation=split)
    exact = simulate(d, model, scheduler, mode="exact", max_sim_s=max_sim_s,
                     disaggregation=split)
    assert_same(fast, exact)
    assert fast.decode_instance is not None and exact.decode_instance is not None
    np.testing.assert_array_equal(fast.decode_instance, exact.decode_instance)
    np.testing.assert_allclose(fast.kv_transfer_s, exact.kv_transfer_s, rtol=1e-9)
    return exact


# ----------------------------------------------------------------------------- one request


def test_one_request_alone_waits_for_its_kv_cache_once() -> None:
    # Prefill instance: one 10 ms step, the first token at 10 ms. The link: 100 tokens x 1 MB
    # / 1 GB/s = 0.1 s, the KV cache on the decode instance at 110 ms; then four decode steps,
    # the last token at 150 ms — the server alone takes 50 ms, 0.1 s less.
    r = both(demand((0.0, 100, 5)), STEP, SchedulerConfig(), SLOW)
    alone = simulate(demand((0.0, 100, 5)), STEP, SchedulerConfig())
    assert r.first_token_s[0] == pytest.approx(0.010) == alone.first_token_s[0]
    assert r.kv_arrival_s is not None and r.kv_arrival_s[0] == pytest.approx(0.110)
    assert r.finish_s[0] == pytest.approx(0.150)
    assert r.finish_s[0] - alone.finish_s[0] == pytest.approx(SLOW.transfer_s(100))
    # The second token's gap holds the transfer and one step; the others are a step each.
    np.testing.assert_allclose(np.sort(r.itl_s), [0.010, 0.010, 0.010, 0.110])
    s = r.summary()
    assert s["kv_transfer_p50_s"] == pytest.approx(0.1)
    assert s["e2e_p99_s"] == pytest.approx(0.150)
    np.testing.assert_array_equal(r.replica, [0])
    np.testing.assert_array_equal(r.decode_instance, [0])


def test_the_ttft_is_the_prompt_s_steps_on_the_prefill_instance() -> None:
    # The lab's model: the prompt costs what it costs on one server; the decode that follows
    # costs the same steps too, so the end-to-end latency grows by the transfer exactly.
    split = Disaggregation(1, 1, link_gb_s=25.0, kv_bytes_per_token=131_072)
    d = demand((0.0, 3000, 40))
    r = both(d, LAB, SchedulerConfig(), split)
    alone = simulate(d, LAB, SchedulerConfig())
    assert r.first_token_s[0] == pytest.approx(LAB.ttft_s(3000, 2048), rel=1e-12)
    assert r.first_token_s[0] == pytest.approx(alone.first_token_s[0], rel=1e-12)
    # 3,000 tokens x 131,072 bytes / 25 GB/s = 15.73 ms.
    assert split.transfer_s(3000) == pytest.approx(3000 * 131_072 / 25e9)
    assert r.finish_s[0] - alone.finish_s[0] == pytest.approx(split.transfer_s(3000), rel=1e-9)


@pytest.mark.parametrize("link_gb_s", [0.25, 0.5, 2.0])
def test_a_slower_link_adds_exactly_its_transfer_time(link_gb_s: float) -> None:
    d = demand((0.0, 100, 5))
    fast_link = both(d, STEP, SchedulerConfig(), SLOW)
    slow = Disaggregation(1, 1, link_gb_s=link_gb_s, kv_bytes_per_token=1e6)
    r = both(d, STEP, SchedulerConfig(), slow)
    # 0.1 MB a token... 100 MB in all: 0.1 s at 1 GB/s, 100 MB / link otherwise.
    extra = 0.1 / link_gb_s - 0.1
    assert r.finish_s[0] - fast_link.finish_s[0] == pytest.approx(extra)
    assert r.first_token_s[0] == fast_link.first_token_s[0]


def test_an_answer_of_one_token_never_crosses_the_link() -> None:
    r = both(demand((0.0, 100, 1)), STEP, SchedulerConfig(), SLOW)
    assert r.first_token_s[0] == r.finish_s[0] == pytest.approx(0.010)
    assert r.decode_instance is not None and r.decode_instance[0] == -1
    assert len(r.kv_transfer_s) == 0 and r.summary()["kv_transfer_p50_s"] is None


# ----------------------------------------------------------------------------- the link


def test_a_prefill_instance_sends_one_kv_cache_at_a_time() -> None:
    # Both prompts are read in one step (10 ms). The link sends the first by 110 ms, then the
    # second by 210 ms; two decode instances take one each (the fewest unfinished).
    split = Disaggregation(1, 2, link_gb_s=1.0, kv_bytes_per_token=1e6)
    r = both(demand((0.0, 100, 5), (0.0, 100, 5)), STEP, SchedulerConfig(), split)
    np.testing.assert_allclose(r.first_token_s, [0.010, 0.010])
    assert r.kv_arrival_s is not None
    np.testing.assert_allclose(r.kv_arrival_s, [0.110, 0.210])
    np.testing.assert_allclose(r.finish_s, [0.150, 0.250])
    np.testing.assert_array_equal(r.decode_instance, [0, 1])
    np.testing.assert_array_equal(r.replica, [0, 0])


def test_two_prefill_instances_each_have_their_link() -> None:
    split = Disaggregation(2, 1, link_gb_s=1.0, kv_bytes_per_token=1e6)
    r = both(demand((0.0, 100, 5), (0.0, 100, 5)), STEP, SchedulerConfig(), split)
    np.testing.assert_array_equal(r.replica, [0, 1])
    assert r.kv_arrival_s is not None
    np.testing.assert_allclose(r.kv_arrival_s, [0.110, 0.110])
    # One decode instance decodes both in the same steps.
    np.testing.assert_allclose(r.finish_s, [0.150, 0.150])


def test_the_decode_instance_queues_what_it_cannot_hold() -> None:
    # One sequence at a time. Two prefill instances read both prompts by 10 ms and send both
    # KV caches by 110 ms; the one decode instance decodes the first's four tokens by 150 ms,
    # then admits the second, whose four come by 190 ms.
    scheduler = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=128)
    r = both(demand((0.0, 100, 5), (0.0, 100, 5)), STEP, scheduler,
             Disaggregation(2, 1, link_gb_s=1.0, kv_bytes_per_token=1e6))
    np.testing.assert_allclose(r.first_token_s, [0.010, 0.010])
    np.testing.assert_allclose(r.finish_s, [0.150, 0.190])
    # The second tokens' gaps: 10 ms to 120 ms, and 10 ms to 160 ms (queued 110-150 ms).
    np.testing.assert_allclose(np.sort(r.itl_s), [0.010] * 6 + [0.110, 0.150])
    assert r.max_waiting == 2  # both queued at 110 ms, until the next step starts


# ----------------------------------------------------------------------------- under load


def test_decode_steps_no_longer_carry_prompt_chunks() -> None:
    # 1,500-token prompts at 0.8 a second: on one server each new prompt's chunk lands in a
    # step of the decoding streams (0.675 s of prompt tokens and more), so the ITL's tail is
    # a prefill. Apart, a decode instance's steps only decode: well under 100 ms.
    d = open_loop(150, 0.8, FixedLengths(1500, 64), seed=1)
    split = Disaggregation(1, 1, link_gb_s=25.0, kv_bytes_per_token=23_040)
    together = simulate(d, LAB, SchedulerConfig())
    apart = both(d, LAB, SchedulerConfig(), split)
    assert together.percentile("itl", 99) > 0.6
    steps, _ = apart.itl_steps()
    decode_steps = steps[: len(steps) - len(apart.extra_gaps_s)]
    assert decode_steps.max() < 0.1
    assert apart.percentile("itl", 99) < 0.1
    # The first-token times are the prefill instance's alone: no decode shares its steps.
    assert apart.percentile("ttft", 50) <= together.percentile("ttft", 50)


def test_every_token_after_the_first_is_one_gap() -> None:
    split = Disaggregation(2, 2, link_gb_s=0.5, kv_bytes_per_token=2e5)
    d = open_loop(300, 10.0, SHORT, seed=5)
    r = simulate(d, LAB, SchedulerConfig(kv_pool_tokens=2000, max_num_batched_tokens=256),
                 disaggregation=split)
    assert r.preemptions.sum() > 0  # decode instances preempt, and recompute
    _, counts = r.itl_steps()
    assert counts.sum() == (r.output_tokens - 1).sum() == len(r.itl_s)
    assert r.itl_s.sum() == pytest.approx((r.finish_s - r.first_token_s).sum(), rel=1e-9)


WORKLOADS = {
    "1P:1D": (SchedulerConfig(), Disaggregation(1, 1, 10.0, 1e5), None),
    "1P:3D, small pools, prefixes": (
        SchedulerConfig(kv_pool_tokens=2000, max_num_batched_tokens=256, max_num_seqs=32),
        Disaggregation(1, 3, 2.0, 2e5), SharedPrefix(0.5, 3, 200)),
    "2P:2D, slow link": (SchedulerConfig(kv_pool_tokens=3000, max_num_batched_tokens=512),
                         Disaggregation(2, 2, 0.2, 1e5), None),
    "slots 1P:2D": (SchedulerConfig(policy="slots", slots=4, n_batch=128),
                    Disaggregation(1, 2, 5.0, 1e5), SharedPrefix(0.5, 3, 200)),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_mode_gives_the_exact_answer_open_loop(name: str, seed: int) -> None:
    scheduler, split, shared = WORKLOADS[name]
    rate = 8.0 if scheduler.policy == "budget" else 2.0
    r = both(open_loop(300, rate, SHORT, seed=seed, shared_prefix=shared), LAB, scheduler,
             split)
    assert r.completed == 300
    if name == "1P:3D, small pools, prefixes" and seed == 0:
        assert r.preemptions.sum() > 0  # the case covers a decode instance's preemption


@pytest.mark.parametrize("think_s", [0.0, 0.5])
def test_fast_mode_gives_the_exact_answer_closed_loop(think_s: float) -> None:
    d = closed_loop(200, 12, SHORT, think_s=think_s, seed=2, shared_prefix=SharedPrefix(0.5))
    scheduler = SchedulerConfig(kv_pool_tokens=3000, max_num_seqs=16, max_num_batched_tokens=512)
    r = both(d, LAB, scheduler, Disaggregation(1, 2, 1.0, 1e5))
    assert r.completed == 200


def test_fast_mode_gives_the_exact_answer_under_a_time_limit() -> None:
    d = open_loop(300, 8.0, SHORT, seed=4)
    r = both(d, LAB, SchedulerConfig(kv_pool_tokens=3000), Disaggregation(1, 1, 1.0, 1e5),
             max_sim_s=20.0)
    assert 0 < r.completed < 300


# ----------------------------------------------------------------------------- capacity


def test_the_capacity_search_takes_the_split() -> None:
    # 10 ms steps, 10 tokens: a request alone takes 0.1 s, and 0.1 s more apart (the link).
    lengths = FixedLengths(100, 10)
    one_slot = SchedulerConfig(policy="slots")
    assert request_alone_s(STEP, one_slot, lengths, disaggregation=SLOW) == \
        pytest.approx(request_alone_s(STEP, one_slot, lengths) + 0.1)
    # The link carries ten prompts a second, and bounds the first guess.
    assert estimate_rate(STEP, SchedulerConfig(), lengths, disaggregation=SLOW) == \
        pytest.approx(10.0)
    slo = SLO(e2e_s=0.45)
    point = max_users(STEP, one_slot, lengths, slo, num_requests=60, disaggregation=SLOW)
    stagger = request_alone_s(STEP, one_slot, lengths, disaggregation=SLOW)

    def at(users: int) -> SimResult:
        return simulate(closed_loop(60, users, lengths, stagger_s=stagger), STEP, one_slot,
                        disaggregation=SLOW)

    assert point.users is not None and point.users >= 2
    assert slo.met(at(point.users)) and not slo.met(at(point.users + 1))
    assert point.summary["e2e_p99_s"] == at(point.users).summary()["e2e_p99_s"]
    # One server without the link's 0.1 s holds 4 (e2e = users x 0.1 s).
    assert max_users(STEP, one_slot, lengths, slo, num_requests=60).users == 4


def test_whatif_sets_the_splits_beside_as_many_replicas() -> None:
    changes, notes = standard_changes(LAB, SchedulerConfig(), HardwareFigures(), (),
                                      kv_bytes_per_token=23_040)
    split = {c.label: c for c in changes if c.disaggregation is not None}
    assert sorted(split) == ["1P:1D disaggregated, KV over 25 GB/s (2 devices)",
                             "1P:3D disaggregated, KV over 25 GB/s (4 devices)"]
    assert [c.devices for c in split.values()] == [2, 4]
    assert {c.label: c.devices for c in changes}["2 replicas"] == 2
    _, notes = standard_changes(LAB, SchedulerConfig(), HardwareFigures(), ())
    assert any("no disaggregation" in n for n in notes)
    rows = what_if([changes[0], *split.values()], FixedLengths(1500, 64),
                   SLO(ttft_s=3.0, itl_s=0.1), num_requests=100)
    # On one server a second user's prompt lands in the first's decode steps: its ITL p99 is
    # a prompt's step. Apart, the decode steps meet 100 ms with more users.
    assert rows[0].users is not None and rows[1].users is not None
    assert rows[1].users > rows[0].users and rows[2].users >= rows[1].users
    assert rows[1].to_json()["devices"] == 2
    assert rows[1].to_json()["disaggregation"]["link_gb_s"] == 25.0


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, words", [
    ({"prefill_instances": 0, "decode_instances": 1}, "prefill instances must be at least 1"),
    ({"prefill_instances": 1, "decode_instances": 0}, "decode instances must be at least 1"),
    ({"prefill_instances": 1.5, "decode_instances": 1}, "whole number"),
    ({"prefill_instances": 1, "decode_instances": 1, "link_gb_s": 0}, "bandwidth"),
    ({"prefill_instances": 1, "decode_instances": 1, "link_gb_s": float("nan")}, "bandwidth"),
    ({"prefill_instances": 1, "decode_instances": 1, "kv_bytes_per_token": -1},
     "KV bytes a token"),
])
def test_a_bad_split_is_refused_in_plain_words(kwargs: dict, words: str) -> None:
    kwargs.setdefault("kv_bytes_per_token", 1e5)
    with pytest.raises(InputError, match=words) as info:
        Disaggregation(**kwargs)
    assert "--" not in str(info.value)


def test_a_split_does_not_take_replicas_as_well() -> None:
    with pytest.raises(InputError, match="replicas must be 1"):
        simulate(demand((0.0, 10, 2)), STEP, SchedulerConfig(replicas=2), disaggregation=SLOW)


def test_the_demand_is_not_changed_by_a_split() -> None:
    d = open_loop(50, 4.0, LogNormalLengths(), seed=3)
    r = simulate(d, LAB, SchedulerConfig(), disaggregation=SLOW)
    np.testing.assert_array_equal(r.prompt_tokens, d.prompt_tokens)
    np.testing.assert_array_equal(r.output_tokens, d.output_tokens)
