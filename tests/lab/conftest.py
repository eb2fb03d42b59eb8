"""Real lab servers for the integration tests: started once a session, stopped at the end
(even when tests fail), in a state folder of their own so a lab the developer started by hand
is never touched."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pdscope import lab


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("lab-state")
    # A run stopped with SIGTERM (a CI timeout, `kill`) tears its fixtures down as Ctrl-C does:
    # the servers the session started are stopped, not left serving.
    old_handler = signal.signal(signal.SIGTERM, _interrupted)
    old = os.environ.get("PDSCOPE_LAB_STATE")
    os.environ["PDSCOPE_LAB_STATE"] = str(folder)
    try:
        yield folder
    finally:
        lab.stop()  # whatever a test left running
        signal.signal(signal.SIGTERM, old_handler)
        if old is None:
            os.environ.pop("PDSCOPE_LAB_STATE", None)
        else:
            os.environ["PDSCOPE_LAB_STATE"] = old


@pytest.fixture(scope="session")
def vllm_server(lab_state: Path) -> Iterator[lab.LabServer]:
    with lab.running("vllm", port=0) as server:
        yield server
    # Stopping ends the API server, its engine core and the worker: nothing is left running.
    assert wait_group_empty(server.pid), "vLLM processes outlived `stop`"


def wait_group_empty(pgid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (not zombie) processes in a process group."""
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


# The lab's vLLM with a 64-token step budget (chunked prefill in small chunks) and prefix
# caching off: the compare tests' server B and the doctor's second server, started once (a vLLM
# start is 2-3.5 minutes on a busy 2-core machine). vLLM asks for --max-num-seqs no larger than
# the step budget. ab sends new prompts every round, so the cache's absence changes nothing in
# the compare tests; the doctor finds it.
SMALL_BUDGET_FLAGS = ("--no-enable-prefix-caching", "--max-num-batched-tokens", "64",
                      "--max-num-seqs", "64")


@pytest.fixture(scope="session")
def small_budget_vllm(lab_state: Path) -> Iterator[lab.LabServer]:
    with lab.running("vllm", port=0, extra_args=list(SMALL_BUDGET_FLAGS)) as server:
        yield server


@pytest.fixture(scope="session")
def llamacpp_server(lab_state: Path) -> Iterator[lab.LabServer]:
    with lab.running("llamacpp", port=0) as server:
        yield server
