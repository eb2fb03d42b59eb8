"""Run `pdscope selftest` with streams spread out and all at once, and write both tables into
docs/benchmarks.md between the selftest markers (reruns replace them).

    .venv/bin/python tools/selftest_doc.py            # about a minute on two cores
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- selftest:start -->", "<!-- selftest:end -->"
LEVELS = "1,10,50,100,200"
RUNS = 3  # each mode is run this many times; the table shows the median of each figure


def run(burst: bool) -> dict:
    args = [sys.executable, "-m", "pdscope", "selftest", "--levels", LEVELS, "--all-levels",
            "--json"] + (["--burst"] if burst else [])
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


def main() -> None:
    ramped = [run(False) for _ in range(RUNS)]
    burst = [run(True) for _ in range(RUNS)]
    load = os.getloadavg()
    block = "\n".join([
        START,
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores"
        f" ({platform.processor() or platform.machine()}), load average {load[0]:.1f};"
        f" client event loop {ramped[0]['loop']}; medians of {RUNS} runs; errors in ms"
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
        END,
    ])
    text = DOC.read_text() if DOC.exists() else ""
    if START in text and END in text:
        text = text[: text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        heading = "\n\n## The client's own timing: `pdscope selftest`\n\n"
        text = text.rstrip() + heading + block + "\n"
    DOC.write_text(text)
    print(block)


if __name__ == "__main__":
    main()
