"""The arithmetic of the experiments, with plain numbers: fits, the article's checks, bins,
windows and thresholds."""

from __future__ import annotations

import random
import re

import pytest

from pdscope.client.record import RecordBuilder
from pdscope.errors import InputError
from pdscope.experiments.common import parse_counts, polyfit
from pdscope.experiments.context import context_bins
from pdscope.experiments.interference import Gap, split_windows, window_stats
from pdscope.experiments.prefix import detection_threshold
from pdscope.experiments.sweep import doubling_checks, fit_ttft


def noisy(values: list[float], sd: float, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [v + rng.gauss(0, sd) for v in values]


LENGTHS = [200, 500, 1000, 2000, 4000, 8000]


def test_polyfit_recovers_a_quadratic_in_tokens_and_its_errors() -> None:
    xs = [float(n) for n in LENGTHS for _ in range(3)]
    ys = [0.05 + 2e-4 * x + 3e-8 * x * x for x in xs]
    fit = polyfit(xs, ys, 2)
    assert fit.coef == pytest.approx((0.05, 2e-4, 3e-8), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.dof == len(xs) - 3
    assert fit.stderr is not None and max(fit.stderr) < 1e-9
    assert fit(1000) == pytest.approx(0.05 + 0.2 + 0.03)


def test_polyfit_with_no_degrees_of_freedom_has_no_errors() -> None:
    fit = polyfit([1.0, 2.0], [3.0, 5.0], 1)
    assert fit.coef == pytest.approx((1.0, 2.0))
    assert fit.stderr is None and fit.t(1) is None


def test_a_linear_prefill_fits_a_plus_b_n_and_leaves_c_unresolved() -> None:
    xs = [n for n in LENGTHS for _ in range(3)]
    ys = noisy([0.05 + 2e-4 * n for n in xs], 0.002)
    fit = fit_ttft(xs, ys)
    assert fit.kind == "linear" and fit.c is None and not fit.c_resolved
    assert fit.a == pytest.approx(0.05, abs=0.003)
    assert fit.b == pytest.approx(2e-4, rel=0.02)
    assert fit.prefill_tok_s == pytest.approx(5000, rel=0.02)
    assert fit.quadratic_matters_tokens is None
    # c is still reported, near zero, with why it was set aside. A real c of 1e-9 would add
    # 1e-9 x 8000^2 = 0.064 s at 8,000 tokens, 32 times the 2 ms noise: this one is far below.
    assert fit.c_fitted is not None and abs(fit.c_fitted) < 1e-9
    # With this seed the noise bends the fit the other way (c < 0), which is said as such.
    assert re.fullmatch(r"c came out negative \(-\d\.\d+e-\d+\): the TTFT grows no faster than"
                        r" linearly over these lengths", fit.c_note), fit.c_note


def test_attention_shows_as_a_resolved_quadratic_and_where_it_matters() -> None:
    # c·n² = 10 % of the prefill part at n = b / (9c) = 2e-4 / 9e-8 = 2,222 tokens.
    xs = [n for n in LENGTHS for _ in range(3)]
    ys = noisy([0.05 + 2e-4 * n + 1e-8 * n * n for n in xs], 0.002)
    fit = fit_ttft(xs, ys)
    assert fit.kind == "quadratic" and fit.c_resolved
    assert fit.c == pytest.approx(1e-8, rel=0.05)
    assert fit.quadratic_matters_tokens == pytest.approx(2222, rel=0.06)
    assert not fit.to_json()["quadratic_10pct_extrapolated"]


def test_a_negative_c_is_said_not_invented() -> None:
    # Prefill that gets cheaper a token at length (a GPU filling up): concave, c < 0.
    xs = [n for n in LENGTHS for _ in range(2)]
    ys = noisy([0.05 + 3e-4 * n - 1e-8 * n * n for n in xs], 0.001)
    fit = fit_ttft(xs, ys)
    assert fit.kind == "linear" and fit.c is None
    assert "negative" in fit.c_note


def test_two_lengths_fit_a_line_only_and_one_length_nothing() -> None:
    two = fit_ttft([200, 200, 2000, 2000], [0.09, 0.091, 0.45, 0.452])
    assert two.kind == "linear" and "fewer than 3" in two.c_note
    assert two.b == pytest.approx((0.451 - 0.0905) / 1800)
    one = fit_ttft([500, 500], [0.15, 0.16])
    assert one.kind == "none" and one.a is None and one.ttft(100) is None


def test_three_single_runs_cannot_tell_c_from_noise() -> None:
    fit = fit_ttft([200, 1000, 2000], [0.1, 0.5, 1.3])
    assert fit.kind == "linear" and "noise is unknown" in fit.c_note


def test_doubling_the_prompt_more_than_doubles_a_quadratic_prefill() -> None:
    a = 0.05
    ttft = {n: a + 2e-4 * n + 1e-7 * n * n for n in (500, 1000, 2000)}
    checks = doubling_checks([500, 1000, 2000], [[ttft[n]] * 3 for n in (500, 1000, 2000)], a)
    assert [(c.n, c.n2) for c in checks] == [(500, 1000), (1000, 2000)]
    # (0.2 + 0.1) / (0.1 + 0.025) = 2.4 and (0.4 + 0.4) / (0.2 + 0.1) = 2.67
    assert checks[0].ratio == pytest.approx(2.4)
    assert checks[1].ratio == pytest.approx(0.8 / 0.3)
    assert all(c.holds for c in checks)


def test_a_prefill_that_grows_slower_than_the_prompt_fails_the_check() -> None:
    # 1,000 → 2,000 tokens only 1.5 times the prefill part: the article's claim is contradicted.
    checks = doubling_checks([1000, 2000], [[0.45, 0.46, 0.44], [0.65, 0.66, 0.64]], 0.05)
    assert checks[0].ratio == pytest.approx(0.6 / 0.4)
    assert checks[0].holds is False


def test_exactly_linear_prefill_doubles_within_the_noise() -> None:
    checks = doubling_checks([1000, 2000], [[0.25, 0.251], [0.447, 0.449]], 0.05)
    assert checks[0].ratio == pytest.approx(0.398 / 0.2005, rel=1e-6)  # 1.985: below 2
    assert checks[0].holds is True


def test_the_overhead_is_never_taken_below_zero() -> None:
    checks = doubling_checks([100, 200], [[0.1], [0.2]], -0.03)
    assert checks[0].overhead_s == 0 and checks[0].ratio == pytest.approx(2.0)


def test_context_bins_stand_at_prompt_plus_position() -> None:
    itl = tuple(0.01 + 1e-6 * j for j in range(64))  # gap j after token j
    bins = context_bins([(1000, itl, 0)], 32)
    assert [(b.first_position, b.last_position, b.samples) for b in bins] == [
        (0, 31, 32), (32, 63, 32)]
    assert bins[0].context == pytest.approx(1000 + 15.5 + 1)
    assert bins[1].itl_median_s == pytest.approx(0.01 + 1e-6 * 47.5)
    assert bins[0].decode_tok_s == pytest.approx(1 / (0.01 + 1e-6 * 15.5))


def test_a_first_chunk_of_many_tokens_moves_the_gaps_to_their_positions() -> None:
    # A server short of CPU sent the first 40 tokens in one write, then one a chunk: 128
    # tokens, 88 gaps, the first of them gap 39 (between tokens 39 and 40).
    b = RecordBuilder(request_id="r", api="openai", model="m")
    b.add_tokens(0, "x" * 40, 40)
    for i in range(1, 89):
        b.add_tokens(i * 10_000_000, "x", 1)
    rec = b.build()
    assert rec.first_gap_index == 39 and len(rec.itl_s) == 88
    bins = context_bins([(1000, rec.itl_s, rec.first_gap_index)], 32)
    # Positions 39..126: bin 1 holds 25 gaps (39..63), bins 2 and 3 hold 32 and 31.
    assert [(b.first_position, b.last_position, b.samples) for b in bins] == [
        (39, 63, 25), (64, 95, 32), (96, 126, 31)]
    assert bins[0].context == pytest.approx(1000 + 51 + 1)


def test_tokens_read_at_one_instant_are_one_write_spread_over_its_steps() -> None:
    # A 10 ms step; the API server, short of CPU, lets tokens pile up and sends them in one
    # write, each chunk saying one token: the first three tokens at once, then bursts of 1, 2
    # and 5 tokens after gaps of 10, 20 and 50 ms, over and over.
    b = RecordBuilder(request_id="r", api="openai", model="m")
    t = 0
    for _ in range(3):
        b.add_tokens(t, "x", 1)
    for _ in range(12):
        for burst in (1, 2, 5):
            t += burst * 10_000_000
            for _ in range(burst):
                b.add_tokens(t, "x", 1)
    rec = b.build()
    # Per chunk, most gaps read 0 and the rest 10 to 50 ms; per write, every gap is the step.
    assert sum(g == 0 for g in rec.itl_s) == 2 + 12 * 5 and max(rec.itl_s) == pytest.approx(0.05)
    assert len(rec.step_gaps_s) == 12 * 8 and rec.first_step_index == 2
    assert rec.step_gaps_s == pytest.approx([0.01] * 96)
    assert [w[1] for w in rec.writes[:4]] == [3, 1, 2, 5]
    bins = context_bins([(100, rec.step_gaps_s, rec.first_step_index)], 32)
    assert [(b.first_position, b.itl_median_s) for b in bins] == [
        (2, pytest.approx(0.01)), (32, pytest.approx(0.01)), (64, pytest.approx(0.01))]


def test_a_ragged_last_bin_is_left_out_and_runs_pool_by_position() -> None:
    runs = [(500, (0.02,) * 35, 0), (500, (0.04,) * 35, 0)]
    bins = context_bins(runs, 32)
    assert len(bins) == 1  # positions 32..34: 6 gaps of the two runs, under a quarter of 32
    assert bins[0].samples == 64 and bins[0].itl_median_s == pytest.approx(0.03)


def test_gaps_fall_before_during_and_after_the_injected_prefill() -> None:
    gaps = [Gap(0, -0.50, -0.49, 1), Gap(0, -0.03, -0.02, 1),  # before decoding_from, before
            Gap(0, -0.02, 1.20, 1),  # the stall: it spans the prefill
            Gap(1, 0.99, 1.25, 2),  # ends after the first token, but overlaps: during
            Gap(0, 1.20, 1.21, 1), Gap(1, 1.25, 1.26, 1)]  # after
    before, during, after = split_windows(gaps, -0.1, 1.0)
    assert before == [gaps[1]]
    assert during == [gaps[2], gaps[3]]
    assert after == gaps[4:]
    stats = window_stats(during)
    assert stats.max_gap_s == pytest.approx(1.22)
    assert stats.gaps == 2
    # Per-token ITL: 1.22, and 0.13 twice (a chunk of two tokens after 0.26 s).
    assert stats.itl_p50_s == pytest.approx(0.13)


def test_the_prefix_threshold_scales_with_the_prefix_share() -> None:
    assert detection_threshold(1500 / 1600) == pytest.approx(1 - 0.5 * 1500 / 1600)
    assert detection_threshold(0.5) == pytest.approx(0.75)
    assert detection_threshold(0.2) is None


def test_count_lists_are_parsed_sorted_and_checked() -> None:
    assert parse_counts("2000, 200,1k,200") == (200, 1000, 2000)
    with pytest.raises(InputError, match="not a number"):
        parse_counts("200,abc")
    with pytest.raises(InputError, match="whole count"):
        parse_counts("0.5")
