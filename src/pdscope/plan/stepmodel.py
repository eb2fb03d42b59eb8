"""The step-time model: how long one engine step takes, from what the step does.

An engine step (one forward pass of the batch) costs, in seconds::

    t = base_s                                  a fixed part: weights read once a step, launch
      + per_prompt_token_s   * P                prompt tokens computed in the step (all chunks)
      + per_sequence_s       * S                sequences in the step (decoding and prefilling)
      + per_context_token_s  * C                context tokens the decoding sequences read (KV)
      + per_attention_pair_s * A                attention pairs of the prompt chunks

A chunk of ``p`` prompt tokens after ``c`` tokens already in the cache has
``p·c + p·(p+1)/2`` attention pairs (each token sees the ones before it and itself). The terms
are BLIS's (inference-sim): a step's time is close to linear in them, and each has a roofline
counterpart, which serves as the prior for a term the measurements cannot see
(:func:`roofline_prior`).

A :class:`StepObservation` sums the five features over ``steps`` steps with their total measured
time, so one observation can be one step, a whole TTFT (the sum of a prompt's steps) or a
stream's decode (its gaps, one step each).

The terms give a step's *mean* time. Real steps scatter around it (the operating system, a
Python server's own work, another tenant of the machine): ``jitter_s`` keeps that scatter as
measured, equal-probability quantiles of a decode gap minus the model's step, their mean taken
out, and :func:`with_jitter` adds it to a distribution of step times.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pdscope.errors import InputError
from pdscope.hardware import DeviceSpec
from pdscope.model.geometry import ModelGeometry
from pdscope.roofline import GB, kv_bytes_per_token, peak_flops, prefill_flops

# The five terms, in the order of the coefficients, the features and the standard errors.
TERMS = ("base_s", "per_prompt_token_s", "per_sequence_s", "per_context_token_s",
         "per_attention_pair_s")
FEATURES = ("steps", "prompt_tokens", "sequences", "context_tokens", "attention_pairs")

# The order in which columns are admitted to a fit: a column that adds nothing the earlier ones
# do not already span is taken from the prior. ``sequences`` comes last, because with one stream
# it is the ``steps`` column again, and the fixed part of a step is what a user needs most.
_FIT_ORDER = (0, 1, 3, 4, 2)
# Relative singular-value tolerance below which a column adds no rank.
_RANK_TOL = 1e-9


def attention_pairs(prompt_tokens: float, cached_tokens: float) -> float:
    """Attention pairs of a chunk of ``prompt_tokens`` after ``cached_tokens`` in the cache."""
    p, c = prompt_tokens, cached_tokens
    return p * c + p * (p + 1) / 2


def chunks(prompt_tokens: int, budget: int) -> list[tuple[int, int]]:
    """The prompt's chunks as ``(tokens, tokens already in the cache)``, ``budget`` a step."""
    out = []
    done = 0
    while done < prompt_tokens:
        p = min(budget, prompt_tokens - done)
        out.append((p, done))
        done += p
    return out


@dataclass(frozen=True)
class StepObservation:
    """Measured time of ``steps`` engine steps and the sums of their features: prompt tokens
    computed, sequences in each step (summed over the steps), context tokens read by decoding
    sequences, attention pairs of the prompt chunks. ``duration_s`` is the total, in seconds."""

    steps: float
    prompt_tokens: float
    sequences: float
    context_tokens: float
    attention_pairs: float
    duration_s: float

    def __post_init__(self) -> None:
        if not self.steps > 0:
            raise InputError(f"an observation needs at least one step, got {self.steps!r}")
        for name in (*FEATURES[1:], "duration_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"an observation's {name} must be a finite number of at least"
                                 f" 0, got {value!r}")

    def features(self) -> tuple[float, float, float, float, float]:
        return (float(self.steps), float(self.prompt_tokens), float(self.sequences),
                float(self.context_tokens), float(self.attention_pairs))


@dataclass(frozen=True)
class StepModel:
    """Coefficients of the step time, in seconds (a step, a prompt token, a sequence, a context
    token, an attention pair).

    ``standard_errors`` (same order, ``None`` for a coefficient that was not fitted: taken from
    the prior, or held at 0 by the non-negativity), ``r_squared`` and ``observations`` describe
    the fit; ``fixed`` names the terms the data could not see and that came from the prior;
    ``extrapolation`` says how a model was moved to another device or precision (``None`` for a
    model used where it was measured). ``jitter_s``: the measured scatter of a step around the
    model, as equal-probability quantiles in seconds with mean 0 (empty: none known); a model
    moved to another device keeps it (it is the software's and the machine's, not the chip's)."""

    base_s: float
    per_prompt_token_s: float
    per_sequence_s: float
    per_context_token_s: float
    per_attention_pair_s: float
    standard_errors: tuple[float | None, ...] | None = None
    r_squared: float | None = None
    observations: int = 0
    fixed: tuple[str, ...] = ()
    extrapolation: str | None = None
    jitter_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in self.jitter_s):
            raise InputError("the step model's jitter must be finite numbers of seconds")
        for name in TERMS:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InputError(f"the step model's {name} must be a finite number of at least"
                                 f" 0, got {value!r}")
        if self.standard_errors is not None and len(self.standard_errors) != len(TERMS):
            raise InputError(f"the step model needs {len(TERMS)} standard errors, got"
                             f" {len(self.standard_errors)}")

    @property
    def coefficients(self) -> tuple[float, float, float, float, float]:
        return (self.base_s, self.per_prompt_token_s, self.per_sequence_s,
                self.per_context_token_s, self.per_attention_pair_s)

    def step_time(self, prompt_tokens: float = 0, sequences: float = 0,
                  context_tokens: float = 0, attention_pairs: float = 0) -> float:
        """Seconds one step takes that computes ``prompt_tokens`` (all chunks), holds
        ``sequences`` and reads ``context_tokens`` of decoding context."""
        return (self.base_s + self.per_prompt_token_s * prompt_tokens
                + self.per_sequence_s * sequences + self.per_context_token_s * context_tokens
                + self.per_attention_pair_s * attention_pairs)

    def predict(self, observation: StepObservation) -> float:
        """Seconds the model gives the observation's steps, in all."""
        return float(np.dot(self.coefficients, observation.features()))

    def decode_tok_s(self, context: int = 0) -> float:
        """Single-stream decode rate at ``context`` tokens: one sequence, one step a token."""
        return 1.0 / self.step_time(sequences=1, context_tokens=context)

    def ttft_s(self, prompt_tokens: int, budget: int) -> float:
        """Time to first token of a prompt alone, cut into ``budget``-token chunks."""
        return sum(self.step_time(p, 1, 0, attention_pairs(p, done))
                   for p, done in chunks(prompt_tokens, budget))

    def scaled(self, bandwidth_ratio: float = 1.0, flops_ratio: float = 1.0,
               weights_bytes_ratio: float = 1.0, label: str | None = None) -> StepModel:
        """This model moved to another device or precision: an extrapolation, and marked so.

        Memory-bound terms (the fixed part, which reads the weights, and the context term, which
        reads the KV cache) divide by ``bandwidth_ratio`` (new bandwidth / old); compute-bound
        terms (a prompt token, an attention pair, and a sequence: a decoding sequence's cost is
        its token's arithmetic) divide by ``flops_ratio``. ``weights_bytes_ratio`` (e.g. 0.5 for
        8-bit weights from 16, 0.25 for 4-bit) scales the fixed part: fewer bytes read a step.
        """
        for name, value in (("bandwidth ratio", bandwidth_ratio), ("FLOPS ratio", flops_ratio),
                            ("weight bytes ratio", weights_bytes_ratio)):
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"the {name} must be a positive number, got {value!r}")
        factors = (weights_bytes_ratio / bandwidth_ratio, 1 / flops_ratio, 1 / flops_ratio,
                   1 / bandwidth_ratio, 1 / flops_ratio)
        coefs = [c * f for c, f in zip(self.coefficients, factors, strict=True)]
        errors = None
        if self.standard_errors is not None:
            errors = tuple(None if e is None else e * f
                           for e, f in zip(self.standard_errors, factors, strict=True))
        what = label or (f"bandwidth x{bandwidth_ratio:.3g}, FLOPS x{flops_ratio:.3g}, weight"
                         f" bytes x{weights_bytes_ratio:.3g}")
        note = f"extrapolated from the fitted model: {what}"
        if self.extrapolation:
            note = f"{self.extrapolation}; then {what}"
        return replace(self, base_s=coefs[0], per_prompt_token_s=coefs[1],
                       per_sequence_s=coefs[2], per_context_token_s=coefs[3],
                       per_attention_pair_s=coefs[4], standard_errors=errors,
                       extrapolation=note)

    def to_json(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in TERMS},
            "standard_errors": (None if self.standard_errors is None
                                else dict(zip(TERMS, self.standard_errors, strict=True))),
            "r_squared": self.r_squared, "observations": self.observations,
            "fixed": list(self.fixed), "extrapolation": self.extrapolation,
            "jitter_s": list(self.jitter_s),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepModel:
        errors = d.get("standard_errors")
        return cls(
            **{name: float(d[name]) for name in TERMS},
            standard_errors=(None if errors is None else tuple(
                None if errors.get(name) is None else float(errors[name]) for name in TERMS)),
            r_squared=None if d.get("r_squared") is None else float(d["r_squared"]),
            observations=int(d.get("observations") or 0),
            fixed=tuple(str(f) for f in d.get("fixed") or ()),
            extrapolation=None if d.get("extrapolation") is None else str(d["extrapolation"]),
            jitter_s=tuple(float(x) for x in d.get("jitter_s") or ()),
        )


# Quantiles kept of a measured jitter, and the grid a step-time distribution is read on when
# the jitter is added to it.
JITTER_QUANTILES = 100
_STEP_GRID = 1000


def jitter_quantiles(residuals_s: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    """The scatter of measured steps around the model: ``JITTER_QUANTILES`` equal-probability
    quantiles of ``residuals_s`` (a measured step minus the model's), their mean taken out so
    that the model keeps the mean step; empty with fewer than 20 residuals."""
    r = np.asarray(residuals_s, dtype=float)
    r = r[np.isfinite(r)]
    if r.size < 20:
        return ()
    q = np.quantile(r - r.mean(), (np.arange(JITTER_QUANTILES) + 0.5) / JITTER_QUANTILES)
    return tuple(float(x) for x in q - q.mean())


def with_jitter(values: np.ndarray, weights: np.ndarray,
                jitter_s: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A weighted distribution of step times with the jitter added (a step is the model's time
    plus an independent draw of the jitter, never below 0): the distribution is read on a grid
    of ``_STEP_GRID`` equal-probability points, each added to every jitter quantile. Returns
    ``(values, weights)``; unchanged without a jitter or a value."""
    if not len(jitter_s) or not len(values):
        return values, weights
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order], dtype=float)
    grid = (np.arange(_STEP_GRID) + 0.5) / _STEP_GRID * cum[-1]
    steps = v[np.minimum(np.searchsorted(cum, grid, side="left"), len(v) - 1)]
    sums = np.maximum(steps[:, None] + np.asarray(jitter_s, dtype=float)[None, :], 0.0).ravel()
    return sums, np.ones(sums.size, dtype=np.int64)


def fit_step_model(observations: Sequence[StepObservation], prior: StepModel | None = None,
                   *, weighting: str = "relative") -> StepModel:
    """Non-negative least squares of the five coefficients on the observations.

    A term whose column adds nothing the others do not already span (all zeros: no prompt in
    the data; or a copy of another: one stream only, so sequences = steps) cannot be seen: it
    takes the prior's coefficient (0 without a prior) and is named in ``fixed``. The others are
    the best non-negative fit: every subset of them is solved by least squares and the best one
    whose coefficients are all non-negative is kept (at most 2^5 small solves).

    ``weighting="relative"`` (the default) fits relative errors, so a TTFT of seconds and a gap
    of milliseconds count alike; ``"absolute"`` fits seconds. Standard errors come from the
    residual variance (``RSS / (n - k)``) and ``(XᵀX)⁻¹`` of the fitted columns; ``None`` where
    there are no more observations than fitted terms."""
    if weighting not in ("relative", "absolute"):
        raise InputError(f"weighting must be relative or absolute, got {weighting!r}")
    if not observations:
        raise InputError("the step model needs at least one observation to fit")
    x = np.array([o.features() for o in observations], dtype=float)
    y = np.array([o.duration_s for o in observations], dtype=float)
    if weighting == "relative":
        if np.any(y <= 0):
            raise InputError("a relative fit needs every observation's duration to be positive")
        w = 1.0 / y
    else:
        w = np.ones_like(y)
    prior_coefs = np.array(prior.coefficients if prior else (0.0,) * 5)

    # Which columns the data can see, in _FIT_ORDER.
    norms = np.linalg.norm(x * w[:, None], axis=0)
    seen: list[int] = []
    for j in _FIT_ORDER:
        if norms[j] == 0:
            continue
        cols = (x * w[:, None])[:, [*seen, j]] / norms[[*seen, j]]
        sv = np.linalg.svd(cols, compute_uv=False)
        if sv[-1] > _RANK_TOL * sv[0]:
            seen.append(j)
    fixed = [j for j in range(5) if j not in seen]
    coefs = prior_coefs.copy()
    target = (y - x[:, fixed] @ prior_coefs[fixed]) * w
    xw = x * w[:, None]

    best: tuple[float, list[int], np.ndarray] | None = None
    for size in range(len(seen), -1, -1):
        for subset in itertools.combinations(sorted(seen), size):
            cols = list(subset)
            if cols:
                scale = norms[cols]
                sol, *_ = np.linalg.lstsq(xw[:, cols] / scale, target, rcond=None)
                sol = sol / scale
                if np.any(sol < 0):
                    continue
                resid = target - xw[:, cols] @ sol
            else:
                sol = np.zeros(0)
                resid = target
            rss = float(resid @ resid)
            if best is None or rss < best[0] * (1 - 1e-12):
                best = (rss, cols, sol)
    assert best is not None  # the empty subset is always feasible
    rss, active, sol = best
    for j in seen:
        coefs[j] = 0.0
    for j, value in zip(active, sol, strict=True):
        coefs[j] = value

    n, k = len(y), len(active)
    errors: list[float | None] = [None] * 5
    if n > k and k:
        sigma2 = rss / (n - k)
        cov = sigma2 * np.linalg.pinv(xw[:, active].T @ xw[:, active])
        for idx, j in enumerate(active):
            errors[j] = float(math.sqrt(max(cov[idx, idx], 0.0)))
    resid_y = y - x @ coefs
    tss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(resid_y @ resid_y) / tss if tss > 0 else None
    b0, b1, b2, b3, b4 = (float(c) for c in coefs)
    return StepModel(b0, b1, b2, b3, b4, standard_errors=tuple(errors), r_squared=r2,
                     observations=n, fixed=tuple(TERMS[j] for j in fixed))


def roofline_prior(model: ModelGeometry, device: DeviceSpec, kv_dtype: str = "fp16") -> StepModel:
    """The roofline's figures as a step model: what the hardware allows, no overhead.

    - base: the weights read once a step, over the bandwidth;
    - a prompt token: ``2 x parameters`` FLOPs (the linear part of a prefill) over the peak;
    - a context token: its KV bytes over the bandwidth (0 when the KV shape is unknown);
    - an attention pair: the attention FLOPs of one query-key pair over the peak;
    - a sequence: 0 (a sequence's own overhead is software, which no roofline sees).

    The compute terms are 0 where the device table has no FLOPS figure."""
    bandwidth = device.mem_bandwidth_gb_s * GB
    base = model.read_weight_bytes() / bandwidth
    per_context = (kv_bytes_per_token(model, kv_dtype) / bandwidth
                   if model.has_attention_shape else 0.0)
    peak = peak_flops(model, device)
    per_prompt = per_pair = 0.0
    if peak:
        # One token is one prompt token and one attention pair (with itself).
        linear, attention = prefill_flops(model, 1)
        per_prompt, per_pair = linear / peak, attention / peak
    return StepModel(base, per_prompt, 0.0, per_context, per_pair,
                     extrapolation=f"roofline of {model.name} on {device.name}")


@dataclass(frozen=True)
class HardwareFigures:
    """What a what-if needs to move a calibrated model to other hardware or precision: the
    calibrated device's bandwidth (GB/s) and 16-bit compute (TFLOPS), the weights' bytes
    each, and, for a disaggregated setup, the bytes of KV cache a token sends (16-bit
    elements: vLLM's and llama.cpp's default cache type). ``None`` where it is not known."""

    device_bandwidth_gb_s: float | None = None
    device_bf16_tflops: float | None = None
    bytes_per_weight: float | None = None
    kv_bytes_per_token: float | None = None

    @classmethod
    def of(cls, model: ModelGeometry | None, device: DeviceSpec | None) -> HardwareFigures:
        """The figures of ``model`` on ``device``, as far as each is known."""
        kv = (kv_bytes_per_token(model) if model is not None and model.has_attention_shape
              else None)
        return cls(
            device_bandwidth_gb_s=device.mem_bandwidth_gb_s if device else None,
            device_bf16_tflops=device.bf16_tflops if device else None,
            bytes_per_weight=model.bytes_per_weight if model else None,
            kv_bytes_per_token=kv,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "device_bandwidth_gb_s": self.device_bandwidth_gb_s,
            "device_bf16_tflops": self.device_bf16_tflops,
            "bytes_per_weight": self.bytes_per_weight,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HardwareFigures:
        """The figures from a mapping that holds them (a calibration's ``server``); a figure
        it lacks is ``None``. A number is kept as written (``23040`` stays an int)."""
        return cls(**{name: _number(d.get(name)) for name in
                      ("device_bandwidth_gb_s", "device_bf16_tflops", "bytes_per_weight",
                       "kv_bytes_per_token")})


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {value!r}")
    return value
