"""Real lab servers for the integration tests: started once a session, stopped at the end
(even when tests fail), in a state folder of their own so a lab the developer started by hand
is never touched."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pdscope import lab


@pytest.fixture(scope="session")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("lab-state")
    old = os.environ.get("PDSCOPE_LAB_STATE")
    os.environ["PDSCOPE_LAB_STATE"] = str(folder)
    try:
        yield folder
    finally:
        lab.stop()  # whatever a test left running
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


@pytest.fixture(scope="session")
def llamacpp_server(lab_state: Path) -> Iterator[lab.LabServer]:
    with lab.running("llamacpp", port=0) as server:
        yield server
