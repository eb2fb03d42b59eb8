"""How right is the planner? Calibrate once on a lab server, then predict loads the calibration
never saw and run each of them for real.

For each configuration: ``pdscope bench`` sends an open-loop Poisson load at a share of the
saturation rate the planner predicts, then ``pdscope plan predict CAL --replay RUN`` simulates
exactly the requests that run sent (their send times and token counts) on the calibrated model,
with the server's settings (``--set``) where the configuration changes them. The table sets the
predicted TTFT and ITL p50/p99 beside the measured ones, with the error.

Usage (from the repository root, with the lab's venv)::

    .venv/bin/python tools/planner_accuracy.py                  # vLLM, 8 configurations
    .venv/bin/python tools/planner_accuracy.py --engine llamacpp
    .venv/bin/python tools/planner_accuracy.py --quick          # 2 configurations
    .venv/bin/python tools/planner_accuracy.py --capacity ttft:1000,itl:500

``--capacity SLO`` asks another question: the highest Poisson rate (256/64 tokens unless
``--input-len`` and ``--output-len`` say otherwise) that meets
the SLO at p99, predicted by ``pdscope plan capacity`` and found on the server by bisection
(``--repeats`` runs of ``--requests`` requests with ``pdscope bench`` at each rate tried, the
median of their p99s against the SLO; the bracket is found by steps of 25 % from the
prediction, then halved until it is narrower than ``--tolerance``). The prediction is made for
runs of the same length: see :func:`capacity`.

Everything (the calibration, each run folder, each prediction, ``results.json``) stays in the
work folder (``runs/planner-accuracy-ENGINE-DATE``). Every server is the lab's, on 127.0.0.1,
started and stopped here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pdscope import lab
from pdscope.cli.plan import measured_figures, parse_settings
from pdscope.plan import DrawnLengths, SharedPrefix, load_calibration
from pdscope.plan.capacity import saturation_rate
from pdscope.slo import parse_slo
from pdscope.workload.datasets import parse_lengths

# Seeds of the planner's capacity for runs as long as the measured ones (their median).
PLANNER_SEEDS = 7
FIGURES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


@dataclass(frozen=True)
class Config:
    """One held-out load: a label, the engine flags of its server, the bench workload flags,
    the load as a share of the predicted saturation rate, and the scheduler settings the
    prediction changes (``--set``)."""

    label: str
    server_flags: tuple[str, ...]
    input_len: str
    output_len: str
    share: float
    sets: tuple[str, ...] = ()
    prefix_groups: int = 0
    prefix_tokens: int = 0


BUDGET_256 = ("--max-num-batched-tokens", "256")
VLLM = (
    Config("fixed 256/64, 20% of saturation", (), "256", "64", 0.2),
    Config("fixed 256/64, 50%", (), "256", "64", 0.5),
    Config("fixed 256/64, 80%", (), "256", "64", 0.8),
    Config("mixed 64-1024/16-128, 40%", (), "uniform:64:1024", "uniform:16:128", 0.4),
    Config("mixed 64-1024/16-128, 70%", (), "uniform:64:1024", "uniform:16:128", 0.7),
    Config("budget 256, fixed 1024/64, 30%", BUDGET_256, "1024", "64", 0.3,
           ("max_num_batched_tokens=256",)),
    Config("budget 256, fixed 1024/64, 60%", BUDGET_256, "1024", "64", 0.6,
           ("max_num_batched_tokens=256",)),
    Config("2 shared 1000-token prefixes + 100/32, 50%", (), "100", "32", 0.5,
           prefix_groups=2, prefix_tokens=1000),
)
# llama-server, 4 slots (the lab's -np 4): at 90% of saturation more requests are in flight
# than there are slots, and the rest wait; a server of 2 slots is a held-out setting (--set).
LLAMACPP = (
    Config("fixed 256/64, 30%", (), "256", "64", 0.3),
    Config("fixed 256/64, 60%", (), "256", "64", 0.6),
    Config("fixed 256/64, 90%", (), "256", "64", 0.9),
    Config("mixed 64-1024/16-128, 50%", (), "uniform:64:1024", "uniform:16:128", 0.5),
    Config("-np 2, fixed 256/64, 60%", ("-np", "2"), "256", "64", 0.6, ("slots=2",)),
)
QUICK = (VLLM[0], VLLM[1])


def pdscope(*args: str, timeout: float = 900) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "pdscope", *args, "--json"], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"pdscope {' '.join(args)} failed ({r.returncode}): {r.stderr[-800:]}")
    return json.loads(r.stdout)


def rate_for(cal_dir: Path, config: Config) -> float:
    """The config's share of the saturation rate the calibrated planner predicts."""
    cal = load_calibration(cal_dir)
    scheduler = replace(cal.scheduler, **parse_settings(config.sets))
    lengths = DrawnLengths(parse_lengths(config.input_len), parse_lengths(config.output_len))
    prefix = (SharedPrefix(1.0, config.prefix_groups, config.prefix_tokens)
              if config.prefix_groups else None)
    saturation = saturation_rate(cal.step_model, scheduler, lengths, num_requests=1000,
                                 shared_prefix=prefix)
    if saturation is None:
        raise SystemExit(f"{config.label}: the planner finds no saturation rate")
    return config.share * saturation


def run_config(url: str, cal_dir: Path, work: Path, index: int, config: Config,
               duration_s: float, min_requests: int) -> dict[str, Any]:
    rate = rate_for(cal_dir, config)
    n = max(min_requests, min(400, round(rate * duration_s)))
    folder = work / f"run-{index}"
    bench = ["bench", url, "--request-rate", f"{rate:.4f}", "--num-prompts", str(n),
             "--input-len", config.input_len, "--output-len", config.output_len, "--seed",
             str(11 + index), "--out", str(folder), "--no-metrics"]
    if config.prefix_groups:
        bench += ["--prefix-groups", str(config.prefix_groups), "--prefix-tokens",
                  str(config.prefix_tokens)]
    t0 = time.monotonic()
    pdscope(*bench)
    return predict_config(cal_dir, folder, config, rate, n, time.monotonic() - t0)


def predict_config(cal_dir: Path, folder: Path, config: Config, rate: float, n: int,
                   took: float) -> dict[str, Any]:
    """The calibrated planner's prediction of the requests the run folder holds."""
    predict = ["plan", "predict", str(cal_dir), "--replay", str(folder)]
    for item in config.sets:
        predict += ["--set", item]
    got = pdscope(*predict)
    (folder / "prediction.json").write_text(json.dumps(got, indent=2))
    measured = got["measured"]
    row: dict[str, Any] = {"label": config.label, "rate_rps": rate, "requests": n,
                           "bench_s": took}
    for key in FIGURES:
        p, m = got[key], measured.get(key)
        row[key] = {"predicted": p, "measured": m,
                    "error": None if not m or p is None else p / m - 1}
    print(f"  {config.label}: {rate:.3g} req/s, {n} requests, {took:.0f} s — "
          + ", ".join(f"{k} {row[k]['predicted']:.3f}/{row[k]['measured']:.3f}"
                      for k in FIGURES if row[k]["measured"]), flush=True)
    return row


def capacity(url: str, cal_dir: Path, work: Path, slo: str, input_len: str, output_len: str,
             requests: int, repeats: int, tolerance: float) -> dict[str, Any]:
    """The predicted capacity at the SLO, and the measured one by bisection on the server.

    A p99 depends on how long the run is: a queue needs time to build, so a short run's tail
    is lighter than a long one's, and a short run "holds" more. Both sides therefore answer for
    runs of ``requests`` requests: the server runs each rate ``repeats`` times (other seeds)
    and meets the SLO when the median of the runs' p99s does; the planner, for runs of that
    length, gives the median over seeds of its capacity — the rate at which half the runs meet
    it, since each run's p99 grows with the rate. Its default answer (2,000 requests: what the
    server sustains) is recorded beside."""
    limits = parse_slo(slo).limits()
    common = ("plan", "capacity", str(cal_dir), "--slo", slo, "--input-len", input_len,
              "--output-len", output_len)
    sustained = pdscope(*common)
    runs = [pdscope(*common, "--num-requests", str(requests), "--seed", str(seed))
            for seed in range(PLANNER_SEEDS)]
    guess = statistics.median(float(r["max_rate_rps"]) for r in runs)
    print(f"  predicted for runs of {requests} requests: {guess:.3f} req/s (median of"
          f" {PLANNER_SEEDS} seeds: "
          + ", ".join(f"{float(r['max_rate_rps']):.2f}" for r in runs)
          + f"); sustained (2,000 requests): {float(sustained['max_rate_rps']):.3f} req/s"
          f" ({sustained['binding']} binds)", flush=True)
    tried: list[dict[str, Any]] = []

    def met(rate: float) -> bool:
        i = len(tried)
        p99s: dict[str, list[float]] = {k: [] for k in limits}
        for j in range(repeats):
            folder = work / f"capacity-{i}-{j}"
            pdscope("bench", url, "--request-rate", f"{rate:.4f}", "--num-prompts",
                    str(requests), "--input-len", input_len, "--output-len", output_len,
                    "--seed", str(31 + 10 * i + j), "--out", str(folder), "--no-metrics")
            got = measured_figures(str(folder))
            for k in limits:
                v = got.get(f"{k}_p99_s")
                p99s[k].append(float("inf") if v is None else float(v))
        figures = {k: statistics.median(v) for k, v in p99s.items()}
        ok = all(v <= limits[k] for k, v in figures.items())
        tried.append({"rate_rps": rate, "requests": requests, "met": ok,
                      **{f"{k}_p99_s": v for k, v in figures.items()},
                      **{f"{k}_p99_s_runs": v for k, v in p99s.items()}})
        print(f"  {rate:.3f} req/s, {repeats} x {requests} requests: "
              + ", ".join(f"{k} p99 " + "/".join(f"{x * 1000:.0f}" for x in p99s[k]) + " ms"
                          for k in limits)
              + (" — meets" if ok else " — misses"), flush=True)
        return ok

    step = 1.25
    if met(guess):
        lo, hi = guess, guess * step
        while met(hi):
            lo, hi = hi, hi * step
    else:
        lo, hi = guess / step, guess
        while not met(lo):
            lo, hi = lo / step, lo
    while hi / lo - 1 > tolerance:
        mid = (lo * hi) ** 0.5
        if met(mid):
            lo = mid
        else:
            hi = mid
    measured = (lo * hi) ** 0.5
    print(f"  measured: {measured:.3f} req/s (between {lo:.3f} and {hi:.3f});"
          f" predicted {guess:.3f}: error {guess / measured - 1:+.0%}", flush=True)
    return {"slo": slo, "input_len": input_len, "output_len": output_len,
            "requests": requests, "repeats": repeats,
            "predicted": runs, "predicted_sustained": sustained, "predicted_rps": guess,
            "measured_rps": measured, "bracket_rps": [lo, hi],
            "error": guess / measured - 1, "tried": tried}


def summarize(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    def median_error(keys: tuple[str, ...]) -> float | None:
        errors = [abs(r[k]["error"]) for r in rows for k in keys if r[k]["error"] is not None]
        return statistics.median(errors) if errors else None

    return {"median_abs_error_p50": median_error(("ttft_p50_s", "itl_p50_s")),
            "median_abs_error_p99": median_error(("ttft_p99_s", "itl_p99_s")),
            **{f"median_abs_error_{k}": median_error((k,)) for k in FIGURES}}


def markdown(engine: str, cal: dict[str, Any], rows: list[dict[str, Any]],
             summary: dict[str, float | None]) -> str:
    def ms(x: float | None) -> str:
        return "—" if x is None else f"{x * 1000:.1f}"

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{x:+.0%}"

    out = [f"Calibrated on the lab's {engine} in {cal['duration_s']:.0f} s"
           f" ({len(cal['points'])} observations, R² {cal['step_model']['r_squared']:.3f}).", "",
           "| load | req/s | n | TTFT p50 ms pred / meas (err) | TTFT p99 | ITL p50 | ITL p99 |",
           "|---|---:|---:|---|---|---|---|"]
    for r in rows:
        cells = [f"{ms(r[k]['predicted'])} / {ms(r[k]['measured'])} ({pct(r[k]['error'])})"
                 for k in FIGURES]
        out.append(f"| {r['label']} | {r['rate_rps']:.3g} | {r['requests']} | "
                   + " | ".join(cells) + " |")
    out += ["", f"Median absolute error: p50s {summary['median_abs_error_p50'] or 0:.0%},"
                f" p99s {summary['median_abs_error_p99'] or 0:.0%}."]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm")
    ap.add_argument("--quick", action="store_true", help="two configurations only")
    ap.add_argument("--duration", type=float, default=45.0,
                    help="seconds of load a configuration (default 45)")
    ap.add_argument("--min-requests", type=int, default=40)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--predict-only", metavar="CAL", type=Path,
                    help="run nothing: predict the work folder's runs again with this"
                    " calibration (calibrated once, on another start of the same lab)")
    ap.add_argument("--capacity", metavar="SLO",
                    help="measure the capacity at this SLO (ttft:MS,itl:MS) by bisection"
                    " instead of the held-out loads")
    ap.add_argument("--tolerance", type=float, default=0.1,
                    help="--capacity: stop when the bracket is this narrow (default 0.1)")
    ap.add_argument("--requests", type=int, default=300,
                    help="--capacity: requests a run (default 300)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="--capacity: runs at each rate, other seeds (default 2)")
    ap.add_argument("--input-len", default="256", help="--capacity: prompt tokens (256)")
    ap.add_argument("--output-len", default="64", help="--capacity: output tokens (64)")
    args = ap.parse_args()
    if args.capacity:
        return main_capacity(args)
    configs = QUICK if args.quick else (VLLM if args.engine == "vllm" else LLAMACPP)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.work or Path("runs") / f"planner-accuracy-{args.engine}-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    cal_dir = work / "calibration"
    cal: dict[str, Any] = {}
    by_server: dict[tuple[str, ...], list[tuple[int, Config]]] = {}
    for i, c in enumerate(configs):
        by_server.setdefault(c.server_flags, []).append((i, c))
    results: dict[int, dict[str, Any]] = {}
    if args.predict_only:
        cal_dir = args.predict_only
        cal = json.loads((cal_dir / "calibration.json").read_text())
        old = json.loads((work / "results.json").read_text())["rows"]
        for i, c in enumerate(configs):
            row = old[i]
            results[i] = predict_config(cal_dir, work / f"run-{i}", c, row["rate_rps"],
                                        row["requests"], row["bench_s"])
        by_server = {}
    for flags, items in by_server.items():
        print(f"starting the lab's {args.engine} {' '.join(flags)}", flush=True)
        with lab.running(args.engine, port=0, extra_args=list(flags)) as server:
            if not cal:
                t0 = time.monotonic()
                cal = pdscope("plan", "calibrate", server.url, "--out", str(cal_dir))
                print(f"  calibrated in {time.monotonic() - t0:.0f} s: R²"
                      f" {cal['step_model']['r_squared']:.4f},"
                      f" fit error by part {cal['fit_error_by_part']}", flush=True)
            for i, c in items:
                results[i] = run_config(server.url, cal_dir, work, i, c, args.duration,
                                        args.min_requests)
    rows = [results[i] for i in sorted(results)]
    summary = summarize(rows)
    name = "results-predict-only.json" if args.predict_only else "results.json"
    (work / name).write_text(json.dumps(
        {"engine": args.engine, "calibration": cal, "rows": rows, "summary": summary},
        indent=2))
    print()
    print(markdown(args.engine, cal, rows, summary))
    print(f"\nwork folder: {work}")
    return 0


def main_capacity(args: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.work or Path("runs") / f"planner-capacity-{args.engine}-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    cal_dir = work / "calibration"
    print(f"starting the lab's {args.engine}", flush=True)
    with lab.running(args.engine, port=0) as server:
        t0 = time.monotonic()
        cal = pdscope("plan", "calibrate", server.url, "--out", str(cal_dir))
        print(f"  calibrated in {time.monotonic() - t0:.0f} s", flush=True)
        result = capacity(server.url, cal_dir, work, args.capacity, args.input_len,
                          args.output_len, args.requests, args.repeats, args.tolerance)
    result["engine"] = args.engine
    result["calibration"] = cal
    (work / "capacity.json").write_text(json.dumps(result, indent=2))
    print(f"\nwork folder: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
