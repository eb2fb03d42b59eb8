"""What the simulated clients send: arrival schedules, length mixes and shared prefixes."""

from __future__ import annotations

import numpy as np
import pytest

from pdscope.errors import InputError
from pdscope.plan.demand import (
    Demand,
    DrawnLengths,
    FixedLengths,
    LogNormalLengths,
    SampledLengths,
    SharedPrefix,
    SimRequest,
    closed_loop,
    open_loop,
)
from pdscope.workload.datasets import WorkItem, parse_lengths
from pdscope.workload.schedule import arrival_offsets


def test_an_open_loop_sends_on_pdscope_bench_s_schedule() -> None:
    d = open_loop(500, 4.0, FixedLengths(100, 20), seed=7)
    assert d.arrival_s is not None and not d.closed
    np.testing.assert_array_equal(d.arrival_s, arrival_offsets(500, 4.0, seed=7))
    assert d.arrival_s[0] == 0.0
    assert np.mean(np.diff(d.arrival_s)) == pytest.approx(0.25, rel=0.15)
    assert len(d) == 500 and set(d.prompt_tokens) == {100} and set(d.output_tokens) == {20}


def test_a_closed_loop_leaves_arrivals_to_the_simulator() -> None:
    d = closed_loop(10, 3, FixedLengths(5, 5), think_s=0.5)
    assert d.closed and d.arrival_s is None and d.users == 3 and d.think_s == 0.5
    with pytest.raises(InputError, match="only after simulating"):
        d.requests()


def test_the_same_seed_draws_the_same_lengths() -> None:
    mix = LogNormalLengths()
    a, b = mix.draw(1000, 3), mix.draw(1000, 3)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], mix.draw(1000, 4)[0])


def test_log_normal_lengths_sit_around_their_medians_within_their_range() -> None:
    prompt, output = LogNormalLengths().draw(20_000, 0)
    assert np.median(prompt) == pytest.approx(200, rel=0.05)
    assert np.median(output) == pytest.approx(250, rel=0.05)
    assert prompt.min() >= 4 and prompt.max() <= 2048
    assert output.min() >= 1 and output.max() <= 1024
    assert prompt.max() == 2048  # sigma 1.0: the tail reaches the clip


def test_drawn_lengths_follow_pdscope_s_distributions() -> None:
    mix = DrawnLengths(parse_lengths("uniform:10:20"), parse_lengths("7"))
    prompt, output = mix.draw(500, 1)
    assert prompt.min() >= 10 and prompt.max() <= 20 and set(output) == {7}


def test_sampled_lengths_come_from_the_given_pairs() -> None:
    mix = SampledLengths(((10, 1), (20, 2)))
    prompt, output = mix.draw(200, 0)
    assert set(zip(prompt.tolist(), output.tolist(), strict=True)) == {(10, 1), (20, 2)}
    items = [WorkItem(max_tokens=8, prompt="one two three four five six seven eight nine ten"),
             WorkItem(max_tokens=4, prompt_tokens=33)]
    # Ten words x 1.3 = 13 tokens.
    assert SampledLengths.from_items(items).pairs == ((13, 8), (33, 4))
    with pytest.raises(InputError, match="no request lengths"):
        SampledLengths(())


def test_a_shared_prefix_comes_before_the_drawn_prompt() -> None:
    d = open_loop(300, 1.0, FixedLengths(50, 5), shared_prefix=SharedPrefix(1.0, 3, 100))
    assert set(d.prompt_tokens) == {150} and set(d.prefix_tokens) == {100}
    assert set(d.prefix_group) == {0, 1, 2}
    half = open_loop(2000, 1.0, FixedLengths(50, 5), shared_prefix=SharedPrefix(0.5))
    members = half.prefix_group >= 0
    assert members.mean() == pytest.approx(0.5, abs=0.05)
    assert set(half.prompt_tokens[~members]) == {50} and set(half.prefix_tokens[~members]) == {0}
    none = open_loop(100, 1.0, FixedLengths(50, 5), shared_prefix=SharedPrefix(0.0))
    assert set(none.prefix_group) == {-1}


def test_requests_are_put_in_arrival_order() -> None:
    d = Demand.from_requests([SimRequest(2.0, 10, 1), SimRequest(1.0, 20, 2, 4, 5)])
    np.testing.assert_array_equal(d.arrival_s, [1.0, 2.0])
    np.testing.assert_array_equal(d.prompt_tokens, [20, 10])
    assert d.requests()[0] == SimRequest(1.0, 20, 2, 4, 5)


@pytest.mark.parametrize("make, words", [
    (lambda: SimRequest(0.0, 0, 1), "at least 1 token"),
    (lambda: SimRequest(0.0, 10, 0), "at least 1 output"),
    (lambda: SimRequest(-1.0, 10, 1), "arrival"),
    (lambda: SimRequest(0.0, 10, 1, 0, 10), "shorter than the prompt"),
    (lambda: SimRequest(0.0, 10, 1, None, 3), "no prefix tokens"),
    (lambda: SharedPrefix(1.5), "between 0 and 1"),
    (lambda: LogNormalLengths(prompt_median=0.5), "median"),
    (lambda: open_loop(10, 0.0, FixedLengths(1, 1)), "positive"),
    (lambda: closed_loop(10, 0, FixedLengths(1, 1)), "at least 1 user"),
    (lambda: Demand(np.array([1]), np.array([1]), np.array([-1]), np.array([0])),
     "one of the two"),
    (lambda: Demand(np.array([5]), np.array([1]), np.array([0]), np.array([5]), users=1),
     "shorter than its prompt"),
])
def test_bad_demands_are_refused_in_plain_words(make, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=words) as info:
        make()
    assert "--" not in str(info.value)
