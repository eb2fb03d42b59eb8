"""Conversations in the planner: every turn sends the whole history, and the prefix cache decides
whether turn k costs its new message or everything said so far. Most cases use a step model of
10 ms a step and 0.1 ms a prompt token computed, so that a lone turn's TTFT is one step of the
tokens it computes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from pdscope import cli
from pdscope.errors import InputError
from pdscope.load.conversations import ConversationResult, TurnRecord, summarize
from pdscope.plan import CalibratedServer, Calibration
from pdscope.plan.conversations import Conversations, per_turn, replayed, turns_of
from pdscope.plan.demand import Demand
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate
from pdscope.plan.stepmodel import StepModel
from pdscope.workload.schedule import arrival_offsets
from tests.unit.test_plan_simulate import LAB, assert_same

PROMPT = StepModel(0.010, 1e-4, 0.0, 0.0, 0.0)  # 10 ms a step, 0.1 ms a prompt token
BUDGET = SchedulerConfig(block_size=16)  # vLLM's defaults, a pool without limit


def both(chats: Conversations | Demand, scheduler: SchedulerConfig,
         model: StepModel = PROMPT, max_sim_s: float | None = None) -> SimResult:
    """Simulate in both modes, check they agree (on the turns too), give the exact one."""
    d = chats.demand() if isinstance(chats, Conversations) else chats
    fast = simulate(d, model, scheduler, mode="fast", max_sim_s=max_sim_s)
    exact = simulate(d, model, scheduler, mode="exact", max_sim_s=max_sim_s)
    assert_same(fast, exact)
    np.testing.assert_array_equal(fast.cached_tokens, exact.cached_tokens)
    for a, b in zip(per_turn(fast), per_turn(exact), strict=True):
        assert (a.turn, a.n, a.prompt_tokens_p50, a.cached_share) == \
            (b.turn, b.n, b.prompt_tokens_p50, b.cached_share)
        for q in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"):
            x, y = getattr(a, q), getattr(b, q)
            assert (x is None and y is None) or x == pytest.approx(y, rel=1e-9)
    return exact


def full_blocks(tokens: int, block: int) -> int:
    return tokens // block * block


# ------------------------------------------------------------------------------ the demand


def test_a_turn_sends_the_history_and_a_new_message() -> None:
    c = Conversations(3, 4, user_len=100, output_len=20, template_tokens=5)
    d = c.demand()
    # turn t: t messages and t - 1 answers, each message with the template's 5 tokens
    assert [c.prompt_tokens(t) for t in (1, 2, 3, 4)] == [105, 235, 365, 495]
    assert d.prompt_tokens.tolist() == [105, 235, 365, 495] * 3
    assert d.follows.tolist() == [-1, 0, 1, 2, -1, 4, 5, 6, -1, 8, 9, 10]
    assert d.prefix_group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    # the prefix of turn t is turn t - 1's KV cache: its prompt and its answer less one token
    assert d.prefix_tokens.tolist() == [0, 124, 254, 384] * 3
    assert turns_of(d.follows).tolist() == [1, 2, 3, 4] * 3


def test_conversations_arrive_on_the_bench_s_schedule() -> None:
    d = Conversations(5, 2, request_rate=2.0, seed=7).demand()
    assert d.arrival_s[d.follows < 0].tolist() == arrival_offsets(5, 2.0, seed=7)
    assert np.isnan(d.arrival_s[d.follows >= 0]).all()
    assert Conversations(3, 2).demand().arrival_s[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"turns": 0}, "turns"), ({"user_len": 0}, "user_len"), ({"think_s": -1.0}, "think_s"),
    ({"think_s": math.inf}, "think_s"), ({"request_rate": 0.0}, "request_rate"),
    ({"output_len": 2.5}, "output_len"), ({"template_tokens": -1}, "template_tokens"),
])
def test_a_bad_conversation_names_its_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InputError) as err:
        Conversations(2, **kwargs)  # type: ignore[arg-type]
    assert err.value.naming(lambda f: f"<{f}>").startswith(f"<{field}>")


def test_a_request_can_follow_only_one_sent_before_it() -> None:
    one = np.array([10, 10])
    kwargs = dict(prompt_tokens=one, output_tokens=one, prefix_group=np.array([-1, -1]),
                  prefix_tokens=np.array([0, 0]), arrival_s=np.array([math.nan, 0.0]))
    with pytest.raises(InputError, match="sent before it"):
        Demand(**kwargs, follows=np.array([1, -1]))  # type: ignore[arg-type]
    kwargs["arrival_s"] = np.array([0.0, math.nan])
    with pytest.raises(InputError, match="known only after simulating"):
        Demand(**kwargs, follows=np.array([-1, 0])).requests()  # type: ignore[arg-type]


# ------------------------------------------------------------------- the prefix cache at work


def test_with_prefix_caching_turn_5_costs_its_new_message_and_without_it_the_history() -> None:
    c = Conversations(1, 5, user_len=256, output_len=16, think_s=0.5)
    on = per_turn(both(c, BUDGET))
    off = per_turn(both(c, replace(BUDGET, prefix_caching=False)))
    for t in range(1, 6):
        prompt = c.prompt_tokens(t)
        cached = full_blocks(c.prompt_tokens(t - 1) + 15, 16) if t > 1 else 0
        assert on[t - 1].ttft_p50_s == pytest.approx(0.010 + 1e-4 * (prompt - cached))
        assert off[t - 1].ttft_p50_s == pytest.approx(0.010 + 1e-4 * prompt)
    # the claim: flat with the cache (within 10% of turn 1), four times turn 1 without it
    assert on[4].ttft_p50_s <= 1.1 * on[0].ttft_p50_s
    assert off[4].ttft_p50_s >= 3 * off[0].ttft_p50_s
    assert all(a.ttft_p50_s < b.ttft_p50_s for a, b in pairwise(off))


@pytest.mark.parametrize("block", [16, 128])
def test_the_cached_share_of_a_turn_is_the_previous_turn_s_full_blocks(block: int) -> None:
    c = Conversations(4, 5, user_len=300, output_len=40, think_s=0.5, request_rate=2.0,
                      template_tokens=3, seed=5)
    turns = per_turn(both(c, replace(BUDGET, block_size=block)))
    assert turns[0].cached_share == 0
    for t in turns[1:]:
        previous = c.prompt_tokens(t.turn - 1) + c.output_len - 1
        assert t.n == 4
        assert t.cached_share == pytest.approx(full_blocks(previous, block)
                                               / c.prompt_tokens(t.turn))
        assert t.prompt_tokens_p50 == c.prompt_tokens(t.turn)
    off = per_turn(both(c, replace(BUDGET, block_size=block, prefix_caching=False)))
    assert all(t.cached_share == 0 for t in off)


def test_a_turn_is_sent_a_think_time_after_the_answer_before_it() -> None:
    c = Conversations(6, 4, user_len=200, output_len=30, think_s=0.7, request_rate=3.0, seed=2)
    r = both(c, BUDGET, model=LAB)
    follows = c.demand().follows
    later = follows >= 0
    np.testing.assert_allclose(r.arrival_s[later], r.finish_s[follows[later]] + 0.7, rtol=1e-12)
    assert (r.first_token_s[later] > r.finish_s[follows[later]] + 0.7).all()
    assert r.arrival_s[~later].tolist() == arrival_offsets(6, 3.0, seed=2)
    assert r.completed == 24


def test_a_conversation_s_history_is_counted_once_in_the_pool() -> None:
    c = Conversations(1, 5, user_len=256, output_len=16)
    r = both(c, replace(BUDGET, kv_pool_tokens=16_000))
    # at the end of turn 5 the pool holds its sequence, in which every earlier turn's is
    assert r.peak_kv_usage == pytest.approx(
        math.ceil((c.prompt_tokens(5) + 15) / 16) / 1000)


def _evicting_demand(filler_s: float) -> Demand:
    """Conversations A and B (two turns of 512 + 16 tokens, think 5 s; B ends last), and a
    600-token request at ``filler_s`` that needs the blocks of one cached history."""
    prompt = np.array([512, 1040, 512, 1040, 600])
    return Demand(
        prompt_tokens=prompt, output_tokens=np.array([16, 16, 16, 16, 1]),
        prefix_group=np.array([0, 0, 1, 1, -1]), prefix_tokens=np.array([0, 527, 0, 527, 0]),
        arrival_s=np.array([0.0, math.nan, 0.3, math.nan, filler_s]), think_s=5.0,
        follows=np.array([-1, 0, -1, 2, -1]))


def test_a_small_pool_evicts_the_least_recent_history_and_its_next_turn_reads_it_again() -> None:
    big = both(_evicting_demand(2.0), replace(BUDGET, kv_pool_tokens=4096))
    small = both(_evicting_demand(2.0), replace(BUDGET, kv_pool_tokens=1600))
    cached = full_blocks(527, 16)
    ttft = small.first_token_s - small.arrival_s
    # a pool of 100 blocks holds both histories (32 full blocks each) but not the filler's 38
    # too: A's, released first, goes; B's stays (A's second turn fits beside it)
    assert big.cached_tokens.tolist() == [0, cached, 0, cached, 0]
    assert small.cached_tokens.tolist() == [0, 0, 0, cached, 0]
    assert ttft[1] == pytest.approx(0.010 + 1e-4 * 1040)  # A's second turn: all of it again
    assert ttft[3] == pytest.approx(0.010 + 1e-4 * (1040 - cached))
    # without the filler nothing is evicted
    quiet = both(_evicting_demand(12.0), replace(BUDGET, kv_pool_tokens=1600))
    assert quiet.cached_tokens.tolist()[:4] == [0, cached, 0, cached]


def test_conversations_under_a_small_pool_lose_their_cache_and_their_ttft_rises_back() -> None:
    c = Conversations(16, 5, user_len=256, output_len=16, think_s=1.0, request_rate=4.0, seed=1)
    roomy = per_turn(both(c, replace(BUDGET, kv_pool_tokens=100_000)))
    tight = per_turn(both(c, replace(BUDGET, kv_pool_tokens=4_000)))
    assert roomy[4].cached_share > 0.7
    assert tight[4].cached_share < roomy[4].cached_share / 2
    assert tight[4].ttft_p50_s > 3 * roomy[4].ttft_p50_s


# ----------------------------------------------------------------------------------- slots


def test_a_slot_serves_the_next_turn_of_its_conversation_from_what_it_holds() -> None:
    c = Conversations(2, 4, user_len=200, output_len=20, think_s=0.3)
    slots = SchedulerConfig(policy="slots", slots=2)
    r = both(c, slots)
    d = c.demand()
    # at token granularity: the whole previous prompt and answer (less the last token)
    assert r.cached_tokens.tolist() == d.prefix_tokens.tolist()
    off = both(c, replace(slots, prefix_caching=False))
    assert off.cached_tokens.tolist() == [0] * 8


def test_one_slot_shared_by_two_conversations_holds_the_other_s_history_each_time() -> None:
    c = Conversations(2, 3, user_len=200, output_len=20, think_s=0.5)
    r = both(c, SchedulerConfig(policy="slots", slots=1))
    assert r.cached_tokens.tolist() == [0] * 6
    alone = both(Conversations(1, 3, user_len=200, output_len=20, think_s=0.5),
                 SchedulerConfig(policy="slots", slots=1))
    assert alone.cached_tokens.tolist()[1:] == Conversations(
        1, 3, user_len=200, output_len=20).demand().prefix_tokens.tolist()[1:]


# ------------------------------------------------------------------------ fast equals exact


@pytest.mark.parametrize(("scheduler", "limit"), [
    (BUDGET, None),
    (replace(BUDGET, prefix_caching=False), None),
    (replace(BUDGET, kv_pool_tokens=4_000), None),  # preempts and evicts
    (replace(BUDGET, max_num_batched_tokens=256), None),  # chunked prompts
    (replace(BUDGET, replicas=2), None),
    (SchedulerConfig(policy="slots", slots=3, n_batch=512), None),
    (BUDGET, 6.0),
])
def test_fast_mode_gives_the_exact_answer_on_conversations(scheduler: SchedulerConfig,
                                                           limit: float | None) -> None:
    c = Conversations(12, 5, user_len=200, output_len=24, think_s=0.8, request_rate=3.0, seed=4)
    r = both(c, scheduler, model=LAB, max_sim_s=limit)
    assert r.completed > 0


# ------------------------------------------------------------------------------------ CLI


def test_plan_predict_conversations_gives_the_library_s_turns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Calibration(LAB, BUDGET, CalibratedServer(family="vllm")).save(tmp_path / "cal")
    argv = ["plan", "predict", str(tmp_path / "cal"), "--conversations", "3", "--turns", "4",
            "--think-s", "0.5", "--user-len", "120", "--output-len", "24", "--request-rate",
            "2", "--seed", "9"]
    assert cli.main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    chats = Conversations(3, 4, user_len=120, output_len=24, think_s=0.5, request_rate=2.0,
                          seed=9)
    expected = per_turn(simulate(chats.demand(), LAB, BUDGET))
    assert [t["turn"] for t in got["per_turn"]] == [1, 2, 3, 4]
    for t, e in zip(got["per_turn"], expected, strict=True):
        assert t["ttft_p50_s"] == pytest.approx(e.ttft_p50_s)
        assert t["ttft_p99_s"] == pytest.approx(e.ttft_p99_s)
        assert t["cached_share"] == pytest.approx(e.cached_share)
        assert t["prompt_tokens_p50"] == chats.prompt_tokens(t["turn"])
    assert got["conversations"]["turns"] == 4 and got["simulated_requests"] == 12
    assert cli.main(argv) == 0
    assert "per turn" in capsys.readouterr().out


# -------------------------------------------------------------- a bench run's conversations


def _run() -> ConversationResult:
    """Two conversations as ``bench --conversations`` records them: the first of three turns,
    the second failed at its second turn (so it ends after its first)."""
    def turn(c: int, t: int, sent: float, prompt: int, cached: int,
             error: str | None = None) -> TurnRecord:
        return TurnRecord(c, t, sent, sent + 0.5, 0.2, prompt, cached, 16, "answer", error)
    records = (turn(0, 1, 1.0, 310, 0), turn(0, 2, 1.8, 650, 320), turn(0, 3, 2.6, 990, 640),
               turn(1, 1, 1.5, 312, 0), turn(1, 2, 2.3, 652, 0, error="failed"))
    config = {"think_s": 0.3, "turns": 3}
    return ConversationResult(config, records, summarize(records), None)


def test_a_bench_run_s_conversations_are_replayed_with_the_server_s_counts() -> None:
    d = replayed(_run())
    assert d.prompt_tokens.tolist() == [310, 650, 990, 312]
    assert d.follows.tolist() == [-1, 0, 1, -1]
    assert d.prefix_tokens.tolist() == [0, 310 + 16 - 1, 650 + 16 - 1, 0]
    assert d.arrival_s[[0, 3]].tolist() == [0.0, 0.5] and d.think_s == 0.3
    r = both(d, BUDGET, model=LAB)
    np.testing.assert_allclose(r.arrival_s[1], r.finish_s[0] + 0.3, rtol=1e-12)


def test_plan_predict_replays_a_conversations_folder_beside_its_measured_turns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Calibration(LAB, BUDGET, CalibratedServer(family="vllm")).save(tmp_path / "cal")
    run = _run()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "conversations.json").write_text(json.dumps(run.to_json()))
    assert cli.main(["plan", "predict", str(tmp_path / "cal"), "--replay",
                     str(tmp_path / "run"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = per_turn(simulate(replayed(run), LAB, BUDGET))
    assert [t["n"] for t in got["per_turn"]] == [e.n for e in expected] == [2, 1, 1]
    assert got["per_turn"][2]["ttft_p50_s"] == pytest.approx(expected[2].ttft_p50_s)
    assert got["measured_per_turn"][1]["cached_share"] == pytest.approx(320 / 650)
    assert "measured" not in got
