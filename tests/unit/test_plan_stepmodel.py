"""The step-time model: its arithmetic, its fit on synthetic steps drawn from a known model,
its roofline prior and its file form."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pdscope.errors import InputError
from pdscope.hardware import find_device
from pdscope.model import from_parameter_count
from pdscope.plan.stepmodel import (
    TERMS,
    StepModel,
    StepObservation,
    attention_pairs,
    fit_step_model,
    jitter_quantiles,
    roofline_prior,
    with_jitter,
)

TRUE = StepModel(base_s=0.012, per_prompt_token_s=0.00045, per_sequence_s=0.0005,
                 per_context_token_s=2e-6, per_attention_pair_s=1e-9)


def observations(model: StepModel, *, noise: float, seed: int = 0, prompts: bool = True,
                 n: int = 120) -> list[StepObservation]:
    """Steps of every kind (prefill chunks, decode batches, mixed), timed by ``model`` with a
    relative noise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        steps = int(rng.integers(1, 20))
        p = int(rng.integers(0, 2048)) * steps if prompts and rng.random() < 0.6 else 0
        seqs = int(rng.integers(1, 64)) * steps
        ctx = int(rng.integers(0, 4000)) * seqs
        pairs = attention_pairs(p / steps, float(rng.integers(0, 32_000))) * steps if p else 0.0
        t = (model.base_s * steps + model.per_prompt_token_s * p + model.per_sequence_s * seqs
             + model.per_context_token_s * ctx + model.per_attention_pair_s * pairs)
        out.append(StepObservation(steps, p, seqs, ctx, pairs,
                                   t * (1 + noise * rng.standard_normal())))
    return out


def test_a_step_s_time_is_the_sum_of_its_terms() -> None:
    # 12 ms + 100 x 0.45 ms + 3 x 0.5 ms + 1000 x 2 µs + 5050 pairs x 1 ns.
    t = TRUE.step_time(100, 3, 1000, attention_pairs(100, 0))
    assert attention_pairs(100, 0) == 5050
    assert t == pytest.approx(0.012 + 0.045 + 0.0015 + 0.002 + 5.05e-6)
    # A prompt of 5,000 in chunks of 2,048: three steps of one sequence.
    expected = sum(TRUE.step_time(p, 1, 0, attention_pairs(p, c))
                   for p, c in ((2048, 0), (2048, 2048), (904, 4096)))
    assert TRUE.ttft_s(5000, 2048) == pytest.approx(expected)
    assert TRUE.decode_tok_s(0) == pytest.approx(1 / 0.0125)


def test_the_fit_recovers_a_known_model_from_noisy_steps() -> None:
    fitted = fit_step_model(observations(TRUE, noise=0.005))
    for name in TERMS:
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.15), name
    assert fitted.fixed == ()
    assert fitted.r_squared is not None and fitted.r_squared > 0.99
    assert fitted.standard_errors is not None and all(e is not None for e in
                                                      fitted.standard_errors)


def test_without_noise_the_fit_is_exact() -> None:
    fitted = fit_step_model(observations(TRUE, noise=0.0, seed=1))
    np.testing.assert_allclose(fitted.coefficients, TRUE.coefficients, rtol=1e-6)


def test_a_term_the_data_cannot_see_comes_from_the_prior() -> None:
    # Decode only: no prompt tokens and no attention pairs in any step.
    prior = StepModel(0.5, 7e-4, 0.0, 0.0, 3e-9)
    fitted = fit_step_model(observations(TRUE, noise=0.005, prompts=False), prior)
    assert set(fitted.fixed) == {"per_prompt_token_s", "per_attention_pair_s"}
    assert fitted.per_prompt_token_s == 7e-4 and fitted.per_attention_pair_s == 3e-9
    assert fitted.base_s == pytest.approx(TRUE.base_s, rel=0.1)
    assert fitted.standard_errors is not None and fitted.standard_errors[1] is None
    # Without a prior, an unseen term is 0.
    assert fit_step_model(observations(TRUE, noise=0.0, prompts=False)).per_prompt_token_s == 0


def test_the_fit_never_gives_a_negative_coefficient() -> None:
    # Steps whose time falls with the context: the best non-negative fit holds it at 0.
    obs = [StepObservation(1, 0, 1, c, 0, 0.02 - 1e-6 * c) for c in range(0, 5000, 250)]
    fitted = fit_step_model(obs, weighting="absolute")
    assert all(c >= 0 for c in fitted.coefficients)
    assert fitted.per_context_token_s == 0


def test_the_roofline_prior_reads_the_weights_once_a_step() -> None:
    model = from_parameter_count(8e9, "fp16")
    prior = roofline_prior(model, find_device("h100-sxm"))
    # 16 GB of weights over 3.35 TB/s: about 4.8 ms.
    assert prior.base_s == pytest.approx(16e9 / 3.35e12, rel=0.05)
    assert prior.base_s > 0 and prior.per_sequence_s == 0
    assert prior.extrapolation is not None and "roofline" in prior.extrapolation


def test_a_model_survives_its_file_form() -> None:
    fitted = fit_step_model(observations(TRUE, noise=0.01, seed=2))
    again = StepModel.from_json(fitted.to_json())
    assert again == fitted
    scaled = TRUE.scaled(bandwidth_ratio=2.0, flops_ratio=4.0)
    assert StepModel.from_json(scaled.to_json()) == scaled
    assert scaled.base_s == pytest.approx(TRUE.base_s / 2)
    assert scaled.per_prompt_token_s == pytest.approx(TRUE.per_prompt_token_s / 4)


def test_bad_coefficients_are_refused() -> None:
    with pytest.raises(InputError, match="at least 0"):
        StepModel(-1.0, 0, 0, 0, 0)
    with pytest.raises(InputError, match="at least one observation"):
        fit_step_model([])
    with pytest.raises(InputError, match="at least one step"):
        StepObservation(0, 0, 0, 0, 0, 1.0)


def test_a_measured_jitter_keeps_the_mean_and_its_shape() -> None:
    # Gaps of a server with a hiccup: 95 steps on time, 5 of them 8 ms late.
    residuals = np.array([0.0] * 95 + [0.008] * 5)
    q = jitter_quantiles(residuals)
    assert len(q) == 100
    assert np.mean(q) == pytest.approx(0.0, abs=1e-12)  # the model keeps the mean step
    assert max(q) - min(q) == pytest.approx(0.008)  # the hiccup, above the rest
    assert jitter_quantiles(residuals[:19]) == ()  # too few to say
    fitted = replace(TRUE, jitter_s=q)
    assert StepModel.from_json(fitted.to_json()) == fitted
    assert TRUE.scaled(bandwidth_ratio=2.0).jitter_s == ()
    assert fitted.scaled(bandwidth_ratio=2.0).jitter_s == q  # the software's, not the chip's
    with pytest.raises(InputError, match="jitter"):
        replace(TRUE, jitter_s=(math.nan,))


def test_the_jitter_is_added_to_every_step() -> None:
    # Steps of 10 ms (weight 3) and 20 ms (weight 1); jitter -1 or +1 ms, as often.
    values, weights = np.array([0.010, 0.020]), np.array([3, 1])
    sums, counts = with_jitter(values, weights, (-0.001, 0.001))
    assert counts.sum() == sums.size == 2000
    got = sorted(set(np.round(sums * 1000, 6)))
    assert got == [9.0, 11.0, 19.0, 21.0]
    share_21 = np.count_nonzero(np.isclose(sums, 0.021)) / sums.size
    assert share_21 == pytest.approx(0.125)  # a quarter of the steps, half of the jitter
    assert np.mean(sums) == pytest.approx(np.average(values, weights=weights))
    # Never below 0; no jitter, nothing changes.
    assert with_jitter(np.array([0.0005]), np.array([1]), (-0.001, 0.001))[0].min() == 0
    same = with_jitter(values, weights, ())
    assert same[0] is values and same[1] is weights
