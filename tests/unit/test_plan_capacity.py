"""The capacity search, on setups whose capacity is known by hand: one slot that serves a
request in 0.1 s carries 10 requests a second and, with a 0.35 s end-to-end objective, three
users at once."""

from __future__ import annotations

import pytest

from pdscope.errors import InputError
from pdscope.plan.capacity import SloUnreachable, estimate_rate, max_rate, max_users
from pdscope.plan.demand import FixedLengths, LogNormalLengths
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.stepmodel import StepModel
from pdscope.slo import SLO

STEP = StepModel(0.010, 0.0, 0.0, 0.0, 0.0)  # every step 10 ms
ONE_SLOT = SchedulerConfig(policy="slots", slots=1)
TEN = FixedLengths(10, 10)  # 10 steps a request: 0.1 s alone
LAB = StepModel(base_s=0.012, per_prompt_token_s=0.00045, per_sequence_s=0.0005,
                per_context_token_s=2e-6, per_attention_pair_s=1e-9)


def test_users_are_added_until_the_queue_breaks_the_objective() -> None:
    # With u users and no think time, each request waits for the u - 1 others: e2e = u x 0.1 s.
    point = max_users(STEP, ONE_SLOT, TEN, SLO(e2e_s=0.35), num_requests=60)
    assert point.users == 3
    assert point.binding == "e2e"
    assert point.summary["e2e_p99_s"] == pytest.approx(0.3)
    assert (4.0, False) in point.tried


def test_one_slot_saturates_at_its_service_rate() -> None:
    # 0.1 s a request: the queue grows beyond 10 requests a second.
    point = max_rate(STEP, ONE_SLOT, TEN, SLO(ttft_s=1.0), num_requests=600, seed=1)
    assert point.saturation_rps is not None
    assert 9.0 < point.saturation_rps < 11.5
    assert point.rate_rps is not None and point.rate_rps < point.saturation_rps
    assert point.binding == "ttft"


def test_the_rate_found_meets_the_slo_and_one_percent_more_does_not() -> None:
    slo = SLO(ttft_s=2.0, itl_s=0.3)
    point = max_rate(LAB, SchedulerConfig(), LogNormalLengths(), slo, num_requests=400)
    assert point.rate_rps is not None
    assert slo.met(point.summary)
    failing = [rate for rate, met in point.tried if not met]
    assert min(failing) <= point.rate_rps * 1.0101
    assert point.binding in ("ttft", "itl")
    # A looser objective allows more load.
    looser = max_rate(LAB, SchedulerConfig(), LogNormalLengths(), SLO(ttft_s=4.0, itl_s=0.6),
                      num_requests=400)
    assert looser.rate_rps is not None and looser.rate_rps > point.rate_rps


def test_an_slo_the_lightest_load_misses_is_unreachable() -> None:
    # A request alone takes one 10 ms step to its first token: a 5 ms objective is out of reach.
    with pytest.raises(SloUnreachable, match=r"TTFT p99 is 0.01 s, over the 0.005 s") as info:
        max_users(STEP, ONE_SLOT, TEN, SLO(ttft_s=0.005), num_requests=20)
    assert "one user alone" in str(info.value)
    with pytest.raises(SloUnreachable, match="very low rate"):
        max_rate(STEP, ONE_SLOT, TEN, SLO(ttft_s=0.005), num_requests=20)
    assert issubclass(SloUnreachable, InputError)


def test_the_first_guess_is_the_batch_s_decode_rate_plus_prefill() -> None:
    # One slot: a step of 10 ms gives 10 tokens in 0.1 s; no prompt cost: 10 requests a second,
    # twice that with two replicas.
    assert estimate_rate(STEP, ONE_SLOT, TEN) == pytest.approx(10.0)
    two = SchedulerConfig(policy="slots", slots=1, replicas=2)
    assert estimate_rate(STEP, two, TEN) == pytest.approx(20.0)
