"""bench --find-capacity on the lab's llama-server (4 slots): a quick calibration seeds the
search, which reports the bracket it measured beside the planner's figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope import lab

pytestmark = pytest.mark.lab


def test_find_capacity_brackets_the_load_beside_the_planner(llamacpp_server: lab.LabServer,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "capacity"
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", "bench", llamacpp_server.url, "--find-capacity",
         "--slo", "ttft:1500", "--input-len", "64", "--output-len", "16", "--level-s", "4",
         "--capacity-runs", "1", "--max-levels", "6", "--out", str(out)],
        capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((out / "capacity.json").read_text())
    print(json.dumps({k: got[k] for k in ("bracket", "held", "predicted", "levels_measured",
                                          "elapsed_s", "stopped")}))
    # The planner's figure, from the quick calibration made first, stands beside the answer,
    # and the search started from it.
    assert (out / "calibration.json").is_file()
    assert got["predicted"] is not None, got
    assert got["runs"][0]["level"] == max(1, round(got["predicted"]))
    assert got["capacity"] is not None, got["runs"]
    # What each level measured agrees with the bracket: every level up to the capacity met
    # the SLO in the search, every one above it missed it.
    for run in got["runs"]:
        if run["round"] == 0:
            assert run["met"] == (run["level"] <= got["capacity"]), got["runs"]
            ttft = run["observed_s"]["ttft"]
            assert (ttft <= 1.5) == run["met"] or run["failed"] > 0, run
    if got["bracket"][1] is not None:
        assert got["bracket"][1] > got["capacity"]
    assert "capacity at the SLO:" in r.stdout and "the planner predicted" in r.stdout
