"""tests/noise.py: the bounds the lab tests read against their own spread. Expected values are
worked by hand (shown) or published (F tables; the sweep's figures in docs/experiments.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.noise import (
    Runs,
    betainc,
    change_range,
    f_cdf,
    f_quantile,
    lack_of_fit,
    ratio_range,
)


def test_runs_read_median_and_half_the_range() -> None:
    r = Runs.of([4.0, 1.0, None, 2.0])
    assert (r.median, r.half_range, r.n) == (2.0, 1.5, 3)
    assert (r.lo, r.hi) == (0.5, 3.5)
    s = Runs.from_spread({"n": 3, "median": 0.705, "min": 0.700, "max": 0.717, "mean": 0.707})
    assert s.median == 0.705 and s.half_range == pytest.approx(0.0085)
    with pytest.raises(ValueError):
        Runs.of([None])


def test_ratio_range_takes_the_offset_off_both() -> None:
    # num 10 ± 1, den 4 ± 0.5, offset 1: (8 .. 10) / (2.5 .. 3.5).
    lowest, highest = ratio_range(Runs(10.0, 1.0, 3), Runs(4.0, 0.5, 3), offset=1.0)
    assert lowest == pytest.approx(8 / 3.5) and highest == pytest.approx(10 / 2.5)
    # docs/experiments.md's sweep: TTFT(1,000) 0.705 s, TTFT(2,000) 1.80 s, a = 0.024 s,
    # "1,000→2,000 ×2.61"; with no spread both ends are that ratio.
    lo, hi = ratio_range(Runs(1.80, 0.0, 3), Runs(0.705, 0.0, 3), offset=0.024)
    assert round(lo, 2) == round(hi, 2) == 2.61
    # A denominator whose lowest reading is the offset allows any ratio.
    assert ratio_range(Runs(2.0, 0.0, 3), Runs(1.0, 0.5, 3), offset=0.5)[1] == math.inf
    with pytest.raises(ValueError):
        ratio_range(Runs(2.0, 0.0, 3), Runs(1.0, 0.0, 3), offset=1.0)


def test_change_range_is_zero_where_the_ranges_overlap() -> None:
    # base 100 ± 5, new 70 ± 5: the closest readings are 95 and 75 (20 / 105), the farthest
    # 105 and 65 (40 / 95).
    lowest, highest = change_range(Runs(70.0, 5.0, 3), Runs(100.0, 5.0, 3))
    assert lowest == pytest.approx(20 / 105) and highest == pytest.approx(40 / 95)
    assert change_range(Runs(95.0, 10.0, 3), Runs(100.0, 10.0, 3))[0] == 0.0
    # docs/experiments.md's sweep: decode 63.7 tok/s at 200 tokens, 45.1 at 2,000: 29 %.
    assert round(change_range(Runs(45.1, 0.0, 3), Runs(63.7, 0.0, 3))[0], 2) == 0.29


def group(mean: float, stdev: float, n: int = 3) -> dict[str, float]:
    return {"n": n, "mean": mean, "stdev": stdev}


def test_a_line_through_the_group_means_misses_nothing_beyond_the_noise() -> None:
    # x = 1, 2, 3, means 1, 2, 3, three runs each with stdev 0.2: pure error 3 x 2 x 0.04 =
    # 0.24, between 3 x (1 + 0 + 1) = 6; the line through the means leaves the pure error.
    lof = lack_of_fit([group(1, 0.2), group(2, 0.2), group(3, 0.2)], r2=1 - 0.24 / 6.24,
                      params=2)
    assert lof.noise_share == pytest.approx(0.24 / 6.24)
    assert lof.lack_share == pytest.approx(0.0, abs=1e-12)
    assert (lof.df_lack, lof.df_noise) == (1, 6)
    assert lof.fits()


def test_a_line_that_misses_the_means_fails_unless_the_noise_covers_it() -> None:
    # Means 1, 3, 3 at x = 1, 2, 3: the least-squares line is 1/3 + x, fitted 4/3, 7/3, 10/3,
    # missing by -1/3, 2/3, -1/3: lack of fit 3 x (1 + 4 + 1) / 9 = 2. Between 3 x 24/9 = 8.
    tight = [group(1, 0.2), group(3, 0.2), group(3, 0.2)]  # pure error 0.24, total 8.24
    lof = lack_of_fit(tight, r2=1 - 2.24 / 8.24, params=2)
    assert lof.lack_share == pytest.approx(2 / 8.24)
    assert lof.f == pytest.approx(2 / (0.24 / 6))  # 50, beyond F(0.999; 1, 6) = 35.5
    assert not lof.fits()
    assert "misses the group means by 24.27%" in str(lof)
    noisy = [group(1, 1.0), group(3, 1.0), group(3, 1.0)]  # pure error 6, total 14
    lof = lack_of_fit(noisy, r2=1 - 8 / 14, params=2)
    assert lof.lack_share == pytest.approx(2 / 14) and lof.f == pytest.approx(2.0)
    assert lof.fits()  # 14 % of the variance, but F = 2: the runs' scatter explains it


def test_a_quadratic_through_three_lengths_is_judged_by_nothing_but_the_noise() -> None:
    # The fresh machine's R² 0.914 over three lengths: a quadratic goes through three means,
    # so all that is missing is the runs' own scatter.
    lof = lack_of_fit([group(0.12, 0.01), group(0.70, 0.08), group(1.8, 0.15)], r2=0.914,
                      params=3)
    assert lof.df_lack == 0 and lof.f is None
    assert lof.fits()
    with pytest.raises(ValueError):
        lack_of_fit([group(1, 0.0, n=1), group(2, 0.0, n=1)], r2=1.0, params=2)


def test_the_lab_sweeps_readings_on_the_captured_sweep() -> None:
    # The doctor's sweep on the lab's vLLM (captured from an earlier docs/example/evidence.json:
    # 4 lengths, 2 runs each), read as tests/lab/test_exp_sweep.py reads its own.
    captured = Path(__file__).parents[1] / "data" / "captured" / "lab-doctor-sweep.json"
    out = json.loads(captured.read_text())["sweep"]
    points = {p["prompt_tokens"]: p for p in out["points"]}
    ttft = {n: Runs.from_spread(p["spread"]["ttft_s"]) for n, p in points.items()}
    decode = {n: Runs.from_spread(p["spread"]["decode_tok_s"]) for n, p in points.items()}
    # TTFT(1,000) 0.6708-0.6823 s, TTFT(2,000) 1.6606-1.6750 s, a = 5.7 ms: the highest
    # reading is (1.6750 - 0.0057) / (0.6708 - 0.0057) = 2.51.
    lowest, highest = ratio_range(ttft[2000], ttft[1000], offset=out["fit"]["a_s"])
    assert round(highest, 2) == 2.51 and round(lowest, 2) == 2.45
    assert round(ratio_range(ttft[2000], ttft[200])[1], 1) == 14.8  # 1.6750 / 0.1132
    # Decode 75.6 tok/s at 200 tokens, 54.3 at 2,000: 28 % (the sweep's decode_rate_change).
    assert out["checks"]["decode_rate_change"] == pytest.approx(0.2824, abs=1e-4)
    assert change_range(decode[2000], decode[200])[0] < 0.2824 < change_range(
        decode[2000], decode[200])[1]
    lof = lack_of_fit([p["spread"]["ttft_s"] for p in out["points"]], out["fit"]["r2"],
                      params=3)
    assert (lof.df_lack, lof.df_noise) == (1, 4)  # four lengths, a quadratic; 8 runs
    assert lof.lack_share < 1e-4 and lof.fits()


def test_incomplete_beta_in_closed_form() -> None:
    for x in (0.1, 0.5, 0.9):
        assert betainc(1, 1, x) == pytest.approx(x)  # uniform
        assert betainc(3, 1, x) == pytest.approx(x**3)
        assert betainc(1, 4, x) == pytest.approx(1 - (1 - x) ** 4)
    assert betainc(2.5, 2.5, 0.5) == pytest.approx(0.5)  # symmetric
    assert (betainc(2, 3, 0.0), betainc(2, 3, 1.0)) == (0.0, 1.0)


@pytest.mark.parametrize(("q", "d1", "d2", "table"), [
    # Published upper critical values of F (α = 0.05 and 0.01 tables), printed to 3 decimals.
    (0.95, 1, 6, 5.987),
    (0.95, 2, 10, 4.103),
    (0.99, 1, 6, 13.745),
    (0.99, 3, 20, 4.938),
    # F(1, d) is Student's t squared: the t table's 0.9995 quantile for 6 degrees, 5.959.
    (0.999, 1, 6, 5.959**2),
])  # fmt: skip
def test_f_quantiles_match_the_tables(q: float, d1: int, d2: int, table: float) -> None:
    f = f_quantile(q, d1, d2)
    assert f == pytest.approx(table, abs=0.001 if q < 0.999 else 0.01)
    assert f_cdf(f, d1, d2) == pytest.approx(q, abs=1e-9)
