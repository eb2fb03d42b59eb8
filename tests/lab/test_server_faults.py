"""A real server's faults (issue 11, item 5): the lab's llama-server killed with SIGKILL in the
middle of a ``pdscope bench`` run, and ``pdscope watch`` across its restart.

The server here is one of its own (the session's is shared by the other lab tests); it is
killed by its pid, its whole process group at once, as an out-of-memory kill would, and started
again on the same port. llama-server rather than vLLM: the same faults seen by the client and
by watch (its /metrics counters fall back to zero), with two starts of seconds instead of two
of minutes; that vLLM's processes all end with their group is tested in test_lab.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pdscope import lab
from pdscope.client.record import ERROR_KINDS
from pdscope.load import StageSummary, read_run
from tests.lab.conftest import wait_group_empty
from tests.lab.live import collect, pdscope, wait_for

pytestmark = pytest.mark.lab

PROMPTS = 60
KILL_AFTER = 8  # requests completed before the kill


def finished_lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def test_a_killed_server_ends_the_run_and_watch_sees_the_restart(
    lab_state: Path, tmp_path: Path
) -> None:
    server, reused = lab.start("llamacpp", port=0)
    assert not reused
    pids = [server.pid]
    watch = bench = None
    try:
        watch = pdscope("watch", server.url, "--json", "--interval", "1", "--patience", "400")
        windows, watch_err = collect(watch.stdout), collect(watch.stderr)
        wait_for("watch's first window", lambda: len(windows) >= 1, 60)

        run_dir = tmp_path / "run"
        bench = pdscope(
            "bench", server.url, "--concurrency", "4", "--num-prompts", str(PROMPTS),
            "--input-len", "64", "--output-len", "64", "--out", str(run_dir),
            "--max-failed", "0.5", "--json",
        )
        wait_for(f"{KILL_AFTER} finished requests",
                 lambda: finished_lines(run_dir / "requests.jsonl") >= KILL_AFTER, 240)
        os.killpg(server.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        # The run ends by itself, soon: what was in flight breaks off, the rest is refused.
        out, err = bench.communicate(timeout=90)
        ended_after = time.monotonic() - killed_at
        assert ended_after < 60, ended_after
        assert "Traceback" not in err, err
        # Most requests failed, more than the --max-failed 0.5 allowed: a failed run, exit 1,
        # with one line that says so and where the results are.
        assert bench.returncode == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("pdscope: ") and "more than the 50% allowed" in last, err
        assert str(run_dir) in last

        # Every sent request is counted, completed or failed by cause; the folder reads back.
        summary = json.loads(out)
        run = read_run(run_dir)
        assert run.complete and run.summaries[0] == StageSummary.from_json(summary)
        outcomes = run.outcomes()
        assert len(run.requests) == PROMPTS == summary["sent"]
        assert summary["completed"] + summary["failed"] + summary["incomplete"] == PROMPTS
        assert outcomes["ok"] == summary["completed"] >= KILL_AFTER
        failed = {k: v for k, v in outcomes.items() if k not in ("ok", "cancelled")}
        assert failed == summary["failed_by_cause"]
        assert set(failed) <= set(ERROR_KINDS)
        # Requests sent after the kill find nothing listening.
        assert failed.get("connect", 0) >= PROMPTS - summary["completed"] - 4
        assert [r.index for r in sorted(run.requests, key=lambda r: r.index)] == list(
            range(PROMPTS)
        )
        assert wait_group_empty(server.pid), "the server outlived SIGKILL of its group"

        # watch keeps trying while the server is down...
        wait_for("watch's warning", lambda: any("trying again" in line for line in watch_err),
                 30)
        assert watch.poll() is None, "".join(watch_err)
        before = len(windows)

        # ...and, once the server is back on the same port, shows the reset and goes on.
        again, reused = lab.start("llamacpp", port=server.port)
        pids.append(again.pid)
        assert not reused and again.pid != server.pid

        def after_restart() -> list[dict]:
            return [json.loads(line) for line in windows[before:]]

        wait_for("two windows after the restart", lambda: len(after_restart()) >= 2, 120)
        first, second = after_restart()[:2]
        assert first["reset"] is True, first
        assert second["reset"] is False, second
        assert any("answers again after" in line for line in watch_err)
        # Counters went down in the reset window; no rate in it is negative.
        rates = [v for k, v in first.items() if k.endswith("_per_s") and v is not None]
        assert all(v >= 0 for v in rates), first
        assert watch.poll() is None
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=20) == 0
    finally:
        for proc in (bench, watch):
            if proc is not None and proc.poll() is None:
                proc.kill()
        lab.stop("llamacpp", port=server.port)
        for pid in pids:
            assert wait_group_empty(pid)
