"""How often does ``pdscope compare`` cry wolf, and how often does it see a real change?

Against pdscope's reference server (a known schedule: TTFT 50 ms + 0.1 ms a prompt token, then
one token every ITL, with a random jitter), in this process's event loop for the client and
the servers in their own processes:

- **A/A**: pairs of runs against the *same* server (ITL 10 ms). Any verdict other than ``~``
  is a false alarm. Beside it, what a naive Mann-Whitney test (every request or gap counted as
  independent, no minimum effect) would have said of the same pairs. A tail (p99) is tested
  across runs only, so ``--groups`` more A/A comparisons set 3 runs against 3 (interleaved).
- **Power**: a run against the ITL-10-ms server, one against an ITL-11-ms one (+10 %): the
  ITL p50, TPOT and decode rate must be called worse every time.
- **Too small to matter**: ITL 10 ms against 10.1 ms (+1 %): reported as ``~``.

Each run: ``--requests`` requests (default 100) at ``--rate`` a second (open loop, Poisson),
32 tokens in, 16 out. Usage (from the repository root)::

    .venv/bin/python tools/compare_power.py        # 200 + 20 A/A, 25 + 25 pairs (~15 min)
    .venv/bin/python tools/compare_power.py --aa 20 --groups 2 --pairs 5   # a quick look

Prints a Markdown table (docs/compare.md keeps it) and writes ``results.json`` in the work
folder (``runs/compare-power-DATE``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from pdscope.compare import Side, compare_sides, read_side
from pdscope.load import BenchConfig, Stage, Workload, run_bench
from pdscope.selftest import ReferenceConfig, run_in_subprocess
from pdscope.workload.datasets import Lengths

JITTER_S = 0.001
MAIN = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tpot_p50_s", "e2e_p50_s",
        "decode_tok_s")
SHIFTED = ("itl_p50_s", "tpot_p50_s", "decode_tok_s")


async def one_run(url: str, folder: Path, seed: int, rate: float, requests: int) -> Side:
    stage = Stage(request_rate=rate, num_prompts=requests, seed=seed)
    workload = Workload(input_len=Lengths("fixed", 32), output_len=Lengths("fixed", 16))
    await run_bench(url, BenchConfig(seed=seed, record_metrics=False), [stage], workload,
                    folder)
    side = read_side(folder)
    shutil.rmtree(folder)  # 400 folders add up; the figures are kept in results.json
    return side


def naive_p(a: Side, b: Side, key: str) -> float:
    """Mann-Whitney U counting every sample as independent (no effective size)."""
    xa, xb = np.concatenate(a.series(key)), np.concatenate(b.series(key))
    return float(sps.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)


async def pairs(url_a: str, url_b: str, n: int, work: Path, tag: str, rate: float,
                requests: int, seed0: int, runs: int = 1) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        got: dict[str, list[Side]] = {"a": [], "b": []}
        for k in range(runs):
            # Alternate which server goes first, as pdscope ab does.
            order = ("a", "b") if (i + k) % 2 == 0 else ("b", "a")
            for name in order:
                url = url_a if name == "a" else url_b
                got[name].append(await one_run(url, work / f"{tag}-{i}-{k}-{name}",
                                               seed0 + 10 * i + k, rate, requests))
        sides = {name: Side(name, tuple(r for side in got[name] for r in side.runs))
                 for name in got}
        c = compare_sides(sides["a"], sides["b"], seed=i)
        verdicts = {r.metric: r.verdict for r in c.rows}
        out.append({"verdicts": verdicts,
                    "delta_pct": {r.metric: r.delta_pct for r in c.rows},
                    "p": {r.metric: r.p_value for r in c.rows},
                    "naive_p": {k: naive_p(sides["a"], sides["b"], k)
                                for k in ("ttft", "itl", "tpot")}})
        print(f"  {tag} {i + 1}/{n}: " + " ".join(f"{k}={v}" for k, v in verdicts.items()
                                                   if k in MAIN), flush=True)
    return out


def share(rows: list[dict[str, Any]], test: Any) -> float:
    return sum(1 for r in rows if test(r)) / len(rows) if rows else float("nan")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = args.work
    servers = {"10": 0.010, "11": 0.011, "10.1": 0.0101}
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for name, itl in servers.items():
            config = ReferenceConfig(itl_s=itl, itl_jitter_s=JITTER_S, seed=len(urls))
            urls[name] = stack.enter_context(run_in_subprocess(config))
        t0 = time.monotonic()
        aa = await pairs(urls["10"], urls["10"], args.aa, work, "aa", args.rate, args.requests,
                         1000)
        groups = await pairs(urls["10"], urls["10"], args.groups, work, "aa3", args.rate,
                             args.requests, 3000, runs=3)
        power = await pairs(urls["10"], urls["11"], args.pairs, work, "p10", args.rate,
                            args.requests, 5000)
        small = await pairs(urls["10"], urls["10.1"], args.pairs, work, "p1", args.rate,
                            args.requests, 9000)
        took = time.monotonic() - t0
    by_metric = {m: Counter(r["verdicts"].get(m, "absent") for r in aa) for m in MAIN}
    by_metric_groups = {m: Counter(r["verdicts"].get(m, "absent") for r in groups)
                        for m in MAIN}
    return {
        "requests": args.requests, "rate": args.rate, "jitter_s": JITTER_S, "took_s": took,
        "aa": {"n": len(aa),
               "any_alarm": share(aa, lambda r: any(v != "~" for k, v in r["verdicts"].items()
                                                    if k in MAIN)),
               "by_metric": {m: dict(c) for m, c in by_metric.items()},
               "naive_alarm": {k: share(aa, lambda r, k=k: r["naive_p"][k] < 0.05)
                               for k in ("ttft", "itl", "tpot")}},
        "aa_3_runs": {"n": len(groups),
                      "any_alarm": share(groups, lambda r: any(
                          v != "~" for k, v in r["verdicts"].items() if k in MAIN)),
                      "by_metric": {m: dict(c) for m, c in by_metric_groups.items()}},
        "power_10pct": {"n": len(power),
                        "detected": {m: share(power, lambda r, m=m: r["verdicts"].get(m) == "worse")
                                     for m in SHIFTED},
                        "median_delta_pct": {m: float(np.median([r["delta_pct"][m] for r in power]))
                                             for m in SHIFTED}},
        "small_1pct": {"n": len(small),
                       "reported_as_same": {m: share(small, lambda r, m=m: r["verdicts"].get(m)
                                                     == "~")
                                            for m in SHIFTED},
                       "significant_p": {m: share(small, lambda r, m=m: (r["p"][m] or 1) < 0.05)
                                         for m in SHIFTED}},
        "rows": {"aa": aa, "aa_3_runs": groups, "power": power, "small": small},
    }


def markdown(res: dict[str, Any]) -> str:
    aa, pw, sm, g3 = res["aa"], res["power_10pct"], res["small_1pct"], res["aa_3_runs"]
    lines = [f"{aa['n']} A/A pairs of one run each, {g3['n']} A/A comparisons of 3 runs"
             f" against 3, {pw['n']} pairs at +10 %, {sm['n']} at +1 %; each run"
             f" {res['requests']} requests at {res['rate']:g}/s ({res['took_s'] / 60:.0f} min"
             " in all).", "",
             "| figure | A/A, 1 run a side: not `~` | A/A, 3 runs a side: not `~` |"
             " +10 % ITL: called worse | +1 % ITL: called `~` |",
             "|---|---:|---:|---:|---:|"]

    def alarms(c: dict[str, int], n: int) -> str:
        return f"{100 * sum(v for k, v in c.items() if k not in ('~', 'absent')) / n:.1f}%"

    for m in MAIN:
        row = [m, alarms(aa["by_metric"][m], aa["n"]),
               alarms(g3["by_metric"][m], g3["n"]) if g3["n"] else ""]
        row.append(f"{100 * pw['detected'][m]:.0f}%" if m in SHIFTED else "")
        row.append(f"{100 * sm['reported_as_same'][m]:.0f}%" if m in SHIFTED else "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"Any figure not `~` in an A/A pair: **{100 * aa['any_alarm']:.1f}%** with one"
              f" run a side, **{100 * g3['any_alarm']:.1f}%** with three."
              " A naive Mann-Whitney test on the same pairs (every sample independent, no"
              " minimum effect) finds a difference at p < 0.05 in "
              + ", ".join(f"{k.upper()} {100 * v:.0f}%" for k, v in aa["naive_alarm"].items())
              + " of them."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aa", type=int, default=200, help="A/A pairs (default 200)")
    ap.add_argument("--groups", type=int, default=20,
                    help="A/A comparisons of 3 runs against 3 (default 20)")
    ap.add_argument("--pairs", type=int, default=25, help="pairs at +10%% and at +1%% (25)")
    ap.add_argument("--requests", type=int, default=100, help="requests a run (default 100)")
    ap.add_argument("--rate", type=float, default=100.0,
                    help="requests a second (default 100)")
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    args.work = args.work or Path("runs") / f"compare-power-{time.strftime('%Y%m%d-%H%M%S')}"
    args.work.mkdir(parents=True, exist_ok=True)
    res = asyncio.run(main_async(args))
    (args.work / "results.json").write_text(json.dumps(res, indent=2))
    print()
    print(markdown(res))
    print(f"\nwork folder: {args.work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
