"""bench --find-capacity on the reference server with a known capacity: 4 slots (a fifth
stream waits for a whole request before its schedule starts, as llama-server defers a request
past its --parallel slots), so a TTFT objective between one TTFT and one request's time is met
by 4 streams and missed by 5."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdscope.selftest import ReferenceConfig, run_in_subprocess

ROOT = Path(__file__).resolve().parents[2]
# TTFT 50 ms, then 15 gaps of 10 ms: 200 ms a request. The objective, 150 ms at p99, is 100 ms
# above the TTFT of a stream that never waits and 100 ms under one that waits a whole request.
SLOTS = 4
SCHEDULE = dict(ttft_base_s=0.05, ttft_per_token_s=0.0, itl_s=0.01, slots=SLOTS)


@pytest.fixture(scope="module")
def four_slots() -> Iterator[str]:
    with run_in_subprocess(ReferenceConfig(**SCHEDULE)) as url:  # type: ignore[arg-type]
        yield url


def test_the_search_brackets_the_slots_and_sets_the_planner_beside(four_slots: str,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "capacity"
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "bench", four_slots, "--find-capacity", "--slo",
         "ttft:150", "--calibration", str(ROOT / "docs" / "lab-calibration.json"),
         "--input-len", "16", "--output-len", "16", "--level-s", "1.5", "--capacity-runs", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads((out / "capacity.json").read_text())
    assert got["bracket"] == [SLOTS, SLOTS + 1], got["runs"]
    assert got["held"] is True, got["runs"]
    met = {run["level"]: run["met"] for run in got["runs"] if run["round"] == 0}
    assert all(ok == (level <= SLOTS) for level, ok in met.items()), met
    # The planner's figure (from the lab's vLLM calibration: it knows nothing of these slots)
    # stands beside the measured one, and the search started from it.
    assert got["predicted"] is not None and got["runs"][0]["level"] == max(1, round(
        got["predicted"]))
    assert f"capacity at the SLO: {SLOTS} streams ({SLOTS + 1} streams missed it)" in r.stdout
    assert f"the planner predicted {int(got['predicted'])} streams" in r.stdout
    # Every stage measured is a run folder of its own; the bracket's ends once more each.
    assert all((Path(run["folder"]) / "run.json").is_file() for run in got["runs"])
    assert got["stages_measured"] == got["levels_measured"] + 2
