"""How fast the planner's simulator is: simulated requests a second of wall time.

The workload: ShareGPT-like lengths (``LogNormalLengths``' defaults: prompts around 200 tokens,
answers around 250, long tails), an open loop at 80 % of the rate where the server stops keeping
up (the saturation rate :func:`pdscope.plan.capacity.max_rate` finds), one server with vLLM's
default scheduling (budget 2,048, 256 sequences, no KV limit). The step model is the lab's
calibration when ``docs/lab-calibration.json`` exists, else a model of the lab's vLLM on a
2-core CPU (12 ms a step, 0.45 ms a prompt token, 0.5 ms a sequence, 2 µs a context token,
1 ns an attention pair).

It prints: the fast mode on 100,000 requests (median of 3 runs), the exact mode on 10,000 (one
run), each as simulated requests a second, and whether the two modes agree on a 2,000-request
run (with and without a small KV pool, which preempts). The target is 100,000 requests in 2 s
or less in the fast mode. The exit status is 0 whatever the figures.

Usage (from the repository root)::

    .venv/bin/python tools/bench_planner.py
    .venv/bin/python tools/bench_planner.py --requests 20000 --runs 1     # quicker
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pdscope.plan.calibrate import load_calibration
from pdscope.plan.capacity import max_rate
from pdscope.plan.demand import LogNormalLengths, open_loop
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate
from pdscope.plan.stepmodel import StepModel
from pdscope.slo import SLO

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "docs" / "lab-calibration.json"
# A model of the lab's vLLM on a 2-core CPU.
LAB_MODEL = StepModel(base_s=0.012, per_prompt_token_s=0.00045, per_sequence_s=0.0005,
                      per_context_token_s=2e-6, per_attention_pair_s=1e-9)
LOOSE = SLO(ttft_s=60.0, itl_s=10.0)


def step_model() -> tuple[StepModel, str]:
    if CALIBRATION.exists():
        return load_calibration(CALIBRATION).step_model, str(CALIBRATION.relative_to(ROOT))
    return LAB_MODEL, "a model of the lab's vLLM on a 2-core CPU"


def timed(n: int, rate: float, model: StepModel, scheduler: SchedulerConfig, mode: str,
          seed: int = 0) -> tuple[float, SimResult]:
    demand = open_loop(n, rate, LogNormalLengths(), seed=seed)
    began = time.perf_counter()
    result = simulate(demand, model, scheduler, mode=mode)  # type: ignore[arg-type]
    return time.perf_counter() - began, result


def same(a: SimResult, b: SimResult) -> bool:
    return (np.allclose(a.first_token_s, b.first_token_s, rtol=1e-9, atol=0, equal_nan=True)
            and np.allclose(a.finish_s, b.finish_s, rtol=1e-9, atol=0, equal_nan=True)
            and np.array_equal(a.preemptions, b.preemptions))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--exact-requests", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)

    model, source = step_model()
    scheduler = SchedulerConfig()
    began = time.perf_counter()
    capacity = max_rate(model, scheduler, LogNormalLengths(), LOOSE)
    search_s = time.perf_counter() - began
    saturation = capacity.saturation_rps or capacity.rate_rps or 1.0
    rate = 0.8 * saturation
    print(f"step model: {source}")
    print(f"saturation: {saturation:.3f} req/s (found in {search_s:.2f} s);"
          f" load: {rate:.3f} req/s (80 %)")

    fast = [timed(args.requests, rate, model, scheduler, "fast")
            for _ in range(max(1, args.runs))]
    walls = [w for w, _ in fast]
    fast_s = statistics.median(walls)
    result = fast[0][1]
    summary_began = time.perf_counter()
    summary = result.summary()
    summary_s = time.perf_counter() - summary_began
    exact_s, _ = timed(args.exact_requests, rate, model, scheduler, "exact")

    checks = []
    for pool in (None, 20_000):
        config = SchedulerConfig(kv_pool_tokens=pool)
        checks.append(same(timed(2000, rate, model, config, "fast")[1],
                           timed(2000, rate, model, config, "exact")[1]))

    rows = [
        ("fast", f"{args.requests:,}", f"{fast_s:.2f}", f"{args.requests / fast_s:,.0f}",
         f"median of {len(walls)} (spread {min(walls):.2f}-{max(walls):.2f} s)"),
        ("exact", f"{args.exact_requests:,}", f"{exact_s:.2f}",
         f"{args.exact_requests / exact_s:,.0f}", "one run"),
    ]
    print()
    print("| mode | requests | wall s | simulated req/s | note |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"summary of the fast run: {summary_s:.2f} s (ITL percentiles over"
          f" {int(result.run_steps.sum()):,} steps in {len(result.run_steps):,} decode runs)")
    print(f"simulated {summary['duration_s']:.0f} s of serving; TTFT p99"
          f" {summary['ttft_p99_s']:.3f} s, ITL p99 {summary['itl_p99_s']:.3f} s, mean running"
          f" {summary['mean_running']:.1f}")
    print(f"target: 100,000 requests in 2 s or less: "
          f"{'met' if args.requests / fast_s >= 50_000 else 'not met'}")
    print(f"fast = exact: {'yes' if all(checks) else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
