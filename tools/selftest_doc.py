"""Run `pdscope selftest` with streams spread out and all at once, and write both tables into
docs/benchmarks.md between the selftest markers (reruns replace them).

    .venv/bin/python tools/selftest_doc.py            # about two minutes on two cores
    .venv/bin/python tools/selftest_doc.py --runs 1 --no-doc   # one run a mode, printed only
                                                               # (CI's `make bench-quick`)
    .venv/bin/python tools/selftest_doc.py --workers  # scale-out: about five minutes

``--workers`` measures the load split between worker processes instead (`selftest --workers`
at 200, 500 and 1,000 streams, in the client's own process and with 1 and 2 workers; and one
300-request Poisson schedule sent by `bench --workers 1` and `--workers 2`, each repeated), and
writes it between the selftest-workers markers.

``--pin`` measures the reference server's own schedule against the client's, each on a core of
its own (`selftest --pin --levels 200,500,1000,2000 --all-levels`, three runs, about three
minutes), for two trees of pdscope, before and after a change to the server:

    PYTHONPATH=OLD/src .venv/bin/python tools/selftest_doc.py --pin-run before.json
    PYTHONPATH=NEW/src .venv/bin/python tools/selftest_doc.py --pin-run after.json
    .venv/bin/python tools/selftest_doc.py --pin-write before.json after.json

The first two save the runs (with the commit of the tree that ran, the machine and its load
average); the last writes the table of both between the selftest-pin markers, inside the
selftest block (the default mode keeps it when it rewrites the block). ``--server-loop asyncio``
after ``--pin-run FILE`` measures the server on asyncio's own loop instead of uvloop.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- selftest:start -->", "<!-- selftest:end -->"
LEVELS = "1,10,50,100,200"
RUNS = 3  # each mode is run this many times; the table shows the median of each figure


def run(burst: bool, levels: str = LEVELS, workers: int | None = None,
        extra: tuple[str, ...] = ()) -> dict:
    args = [sys.executable, "-m", "pdscope", "selftest", "--levels", levels, "--all-levels",
            "--json", *extra] + (["--burst"] if burst else [])
    if workers is not None:
        args += ["--workers", str(workers)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(r.stdout)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def table(results: list[dict]) -> str:
    keys = ("ttft_err_p50_ms", "ttft_err_p99_ms", "itl_err_p50_ms", "itl_err_p99_ms",
            "transit_p50_ms", "server_late_p50_ms", "client_late_p50_ms", "client_late_p99_ms",
            "output_tok_s")
    out = ["| streams | TTFT err p50 | p99 | ITL err p50 | p99 | transit p50 | server late p50"
           " | client late p50 | p99 | tok/s (ideal) |", "|" + "---|" * 10]
    levels = [lv["concurrency"] for lv in results[0]["levels"]]
    for i, c in enumerate(levels):
        vals = {k: median([r["levels"][i][k] for r in results]) for k in keys}
        ideal = results[0]["levels"][i]["ideal_tok_s"]
        out.append(f"| {c} | " + " | ".join(f"{vals[k]:+.2f}" for k in keys[:-1])
                   + f" | {vals['output_tok_s']:,.0f} ({ideal:,.0f}) |")
    sustained = [r["max_sustained_concurrency"] for r in results]
    out.append("")
    out.append(f"Highest concurrency with median TTFT and ITL errors under 1 ms, per run:"
               f" {', '.join(str(s) for s in sustained)}.")
    return "\n".join(out)


W_START, W_END = "<!-- selftest-workers:start -->", "<!-- selftest-workers:end -->"
W_LEVELS = "200,500,1000"
W_RUNS = 3
POISSON = ("--request-rate", "30", "--num-prompts", "300", "--seed", "14", "--input-len", "16",
           "--output-len", "100", "--no-metrics")
POISSON_KEYS = ("completed", "failed", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                "p99_itl_ms", "median_e2el_ms", "output_throughput", "p99_schedule_lag_ms")


def poisson(url: str, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([sys.executable, "-m", "pdscope", "bench", url, *POISSON, "--workers",
                            str(workers), "--model", "pdscope-reference", "--out", out,
                            "--json"], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(r.stdout)


def spread(xs: list[float]) -> str:
    if all(float(x).is_integer() for x in xs):  # counts
        return f"{median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"
    return f"{median(xs):,.2f} ({min(xs):,.2f}–{max(xs):,.2f})"


def workers_block() -> str:
    from pdscope.selftest import ReferenceConfig, run_in_subprocess

    modes: list[tuple[str, int | None]] = [("own process", None), ("1 worker", 1),
                                           ("2 workers", 2)]
    load0 = os.getloadavg()[0]
    results = {name: [run(False, W_LEVELS, w) for _ in range(W_RUNS)] for name, w in modes}
    config = ReferenceConfig(ttft_base_s=0.05, ttft_per_token_s=0.0, itl_s=0.01)
    with run_in_subprocess(config) as url:
        benches = {w: [] for w in (1, 2)}  # type: dict[int, list[dict]]
        for _ in range(W_RUNS):  # interleaved, so that a busy minute hits both
            for w in (1, 2):
                benches[w].append(poisson(url, w))
    load1 = os.getloadavg()[0]
    keys = ("ttft_err_p50_ms", "ttft_err_p99_ms", "itl_err_p50_ms", "itl_err_p99_ms",
            "server_late_p50_ms", "client_late_p50_ms", "client_late_p99_ms")
    out = [
        W_START,
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores"
        f" ({platform.processor() or platform.machine()}), load average {load0:.1f} before,"
        f" {load1:.1f} after (the machine was shared); medians of {W_RUNS} runs; errors in ms."
        " Reference server: TTFT 50 ms, then a token every 10 ms, 100 tokens a request; streams"
        " spread over one request's length (`pdscope selftest --levels 200,500,1000"
        " [--workers N]`).",
        "",
        "| client | streams | TTFT err p50 | p99 | ITL err p50 | p99 | server late p50"
        " | client late p50 | p99 | tok/s (ideal) | of ideal |",
        "|" + "---|" * 11,
    ]
    for name, _ in modes:
        runs = results[name]
        for i, lv in enumerate(runs[0]["levels"]):
            vals = {k: median([r["levels"][i][k] for r in runs]) for k in keys}
            tok = median([r["levels"][i]["output_tok_s"] for r in runs])
            ideal = lv["ideal_tok_s"]
            out.append(f"| {name} | {lv['concurrency']:,} | "
                       + " | ".join(f"{vals[k]:+.2f}" for k in keys)
                       + f" | {tok:,.0f} ({ideal:,.0f}) | {tok / ideal:.0%} |")
    out += [
        "",
        "The same 300-request Poisson schedule (30 requests/s, seed 14, 100 tokens each) sent by"
        f" `bench --workers 1` and `--workers 2`, {W_RUNS} runs each, interleaved: median"
        " (min–max) of the runs.",
        "",
        "| figure | --workers 1 | --workers 2 |",
        "|---|---|---|",
    ]
    for k in POISSON_KEYS:
        out.append(f"| {k} | {spread([b[k] for b in benches[1]])} |"
                   f" {spread([b[k] for b in benches[2]])} |")
    out.append(W_END)
    return "\n".join(out)


P_START, P_END = "<!-- selftest-pin:start -->", "<!-- selftest-pin:end -->"
P_LEVELS = "200,500,1000,2000"
P_RUNS = 3
P_KEYS = ("server_late_p50_ms", "server_late_p99_ms", "client_late_p50_ms",
          "client_late_p99_ms")


def cpu_model() -> str:
    """The CPU's model name, as `lscpu` prints it (from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tree_commit() -> str:
    """The commit of the pdscope tree the subprocesses import (``PYTHONPATH`` wins)."""
    import pdscope

    where = Path(pdscope.__file__).resolve().parent
    r = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--", "."],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+changes" if dirty else "") if r.returncode == 0 else "?"


def pin_run(out: Path, extra: tuple[str, ...] = ()) -> None:
    """``P_RUNS`` pinned self-tests of the tree on ``PYTHONPATH``, saved to ``out``."""
    load0 = os.getloadavg()
    runs = []
    for i in range(P_RUNS):
        started = time.time()
        runs.append(run(False, P_LEVELS, extra=("--pin", *extra)))
        print(f"run {i + 1}/{P_RUNS}: {time.time() - started:.0f} s", file=sys.stderr)
    load1 = os.getloadavg()
    out.write_text(json.dumps({
        "commit": tree_commit(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                              time.gmtime()),
        "cores": os.cpu_count(), "cpu": cpu_model(), "load_before": load0,
        "load_after": load1, "extra": list(extra), "runs": runs,
    }, indent=1))


def pin_block(before: dict, after: dict) -> str:
    """The before/after table of two saved ``--pin-run`` files."""
    out = [
        P_START,
        f"**Each side on its own core** (`pdscope selftest --pin --levels {P_LEVELS}"
        " --all-levels`: the reference server on one core, the client on the other, so each"
        " side's lateness is its own). Medians of"
        f" {P_RUNS} runs each, in ms (the server's to the µs); before: pdscope at"
        f" {before['commit']} (measured {before['measured_at']}, load average"
        f" {before['load_before'][0]:.1f} before the runs, {before['load_after'][0]:.1f} after),"
        f" after: {after['commit']} ({after['measured_at']}, load average"
        f" {after['load_before'][0]:.1f}, {after['load_after'][0]:.1f}); {after['cores']} cores"
        f" ({after['cpu']}); server event"
        f" loop {after['runs'][0].get('server_loop', 'uvloop')}, client event loop"
        f" {after['runs'][0]['loop']}.",
        "",
        "| streams | server late p50 before | after | server late p99 before | after"
        " | client late p50 before | after | client late p99 before | after"
        " | tok/s before | after (ideal) |",
        "|" + "---:|" * 11,
    ]
    levels = [lv["concurrency"] for lv in after["runs"][0]["levels"]]
    for i, c in enumerate(levels):
        cells = []
        for k in P_KEYS:
            for side in (before, after):
                value = median([r["levels"][i][k] for r in side["runs"]])
                cells.append(f"{value:+.3f}" if k.startswith("server") else f"{value:+.2f}")
        tok = [median([r["levels"][i]["output_tok_s"] for r in side["runs"]])
               for side in (before, after)]
        ideal = after["runs"][0]["levels"][i]["ideal_tok_s"]
        out.append(f"| {c:,} | " + " | ".join(cells)
                   + f" | {tok[0]:,.0f} | {tok[1]:,.0f} ({ideal:,.0f}) |")
    out.append(P_END)
    return "\n".join(out)


def write_block(start: str, end: str, block: str, heading: str) -> None:
    text = DOC.read_text() if DOC.exists() else ""
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + heading + block + "\n"
    DOC.write_text(text)


def main() -> None:
    argv = sys.argv[1:]
    if "--pin-run" in argv:
        i = argv.index("--pin-run")
        pin_run(Path(argv[i + 1]), tuple(argv[i + 2:]))
        return
    if "--pin-write" in argv:
        i = argv.index("--pin-write")
        before, after = (json.loads(Path(p).read_text()) for p in argv[i + 1:i + 3])
        block = pin_block(before, after)
        text = DOC.read_text()
        if P_START in text:
            text = text[: text.index(P_START)] + block + text[text.index(P_END) + len(P_END):]
        else:  # into the selftest block, at its end
            text = text[: text.index(END)] + "\n" + block + "\n" + text[text.index(END):]
        DOC.write_text(text)
        print(block)
        return
    if "--workers" in argv:
        block = workers_block()
        write_block(W_START, W_END, block,
                    "\n\n## Past one process: `selftest --workers`\n\n")
        print(block)
        return
    runs = RUNS
    if "--runs" in argv:  # `make bench-quick` (CI): one run a mode
        runs = int(argv[argv.index("--runs") + 1])
    ramped = [run(False) for _ in range(runs)]
    burst = [run(True) for _ in range(runs)]
    load = os.getloadavg()
    block = "\n".join([
        START,
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores"
        f" ({platform.processor() or platform.machine()}), load average {load[0]:.1f};"
        f" client event loop {ramped[0]['loop']}; medians of {runs} runs; errors in ms"
        " (reported minus scheduled). Reference server: TTFT 50 ms, then a token every 10 ms,"
        " 100 tokens a request.",
        "",
        "**Streams spread over one request's length** (`pdscope selftest`, the default: new",
        "requests reach the server at a steady rate, as independent users would):",
        "",
        table(ramped),
        "",
        "**All streams at once** (`pdscope selftest --burst`: every stream's requests stay in",
        "step, so the server receives them in waves of C; the wave's backlog shows up as",
        "transit time, which is the reference server's, not the client's):",
        "",
        table(burst),
    ])
    if "--no-doc" in argv:  # a quick run prints its tables; the doc keeps its medians of RUNS
        print(block.removeprefix(START + "\n"))
        return
    text = DOC.read_text() if DOC.exists() else ""
    if P_START in text:  # the pinned table is measured apart (--pin-write): kept
        block += "\n\n" + text[text.index(P_START): text.index(P_END) + len(P_END)]
    block += "\n" + END
    if START in text and END in text:
        text = text[: text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        heading = "\n\n## The client's own timing: `pdscope selftest`\n\n"
        text = text.rstrip() + heading + block + "\n"
    DOC.write_text(text)
    print(block)


if __name__ == "__main__":
    main()
