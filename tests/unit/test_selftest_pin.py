"""`pdscope selftest --pin`: the reference server on one core, the client on another."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdscope.errors import InputError
from pdscope.selftest.check import run_selftest
from pdscope.selftest.pin import Pinning, choose, pinned
from pdscope.selftest.server import ReferenceConfig, run_in_subprocess

TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


def _reference_children(what: str = "pdscope.selftest.server") -> list[int]:
    """The reference servers (or other children whose command line holds ``what``) this process
    started (read from /proc: their parent is us)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ppid == os.getpid() and what in cmdline:
            out.append(int(entry))
    return out


def test_choose_puts_the_server_on_the_last_core_and_the_client_on_the_first() -> None:
    assert choose([3, 1, 2]) == Pinning(server_cpu=3, client_cpu=1)
    with pytest.raises(InputError) as err:
        choose([0])
    assert err.value.fields == ("pin",) and "two cores" in str(err.value)


@TWO_CORES
def test_the_server_process_is_pinned_to_its_core() -> None:
    cpu = choose().server_cpu
    with run_in_subprocess(ReferenceConfig(), cpu=cpu):
        (pid,) = _reference_children()
        assert os.sched_getaffinity(pid) == {cpu}


@TWO_CORES
def test_pinned_gives_the_cores_back() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with pinned(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


@TWO_CORES
@pytest.mark.timeout(60)
def test_selftest_pin_runs_each_side_on_its_own_core() -> None:
    before = os.sched_getaffinity(0)
    seen: list[tuple[set[int], list[set[int]]]] = []

    def progress(_: int) -> None:  # called inside the run, with the server up
        seen.append((os.sched_getaffinity(0),
                     [os.sched_getaffinity(pid) for pid in _reference_children()]))

    result = asyncio.run(run_selftest((2,), itl_s=0.01, ttft_s=0.01, output_tokens=5, rounds=1,
                                      progress=progress, pin=True))
    pinning = choose()
    assert result.pinning == pinning
    assert seen == [({pinning.client_cpu}, [{pinning.server_cpu}])]
    assert os.sched_getaffinity(0) == before  # the caller's cores given back
    assert result.to_json()["pinning"] == {"server_cpu": pinning.server_cpu,
                                           "client_cpu": pinning.client_cpu}
    assert result.levels[0].failed == 0


@TWO_CORES
@pytest.mark.timeout(60)
def test_load_workers_run_on_the_client_s_core() -> None:
    seen: list[list[set[int]]] = []

    def progress(_: int) -> None:
        seen.append([os.sched_getaffinity(pid) for pid in _reference_children("load.workers")])

    asyncio.run(run_selftest((2,), itl_s=0.01, ttft_s=0.01, output_tokens=5, rounds=1,
                             progress=progress, pin=True, workers=1))
    assert seen == [[{choose().client_cpu}]]


def _cli(*argv: str, cpus: set[int] | None = None) -> subprocess.CompletedProcess[str]:
    """``pdscope selftest ARGV`` in a process allowed ``cpus`` only (as ``taskset`` would; set
    in the child's own code: a ``preexec_fn`` can deadlock in a process with threads)."""
    allowed = sorted(cpus) if cpus else None
    code = ("import os, sys\n"
            f"if {allowed!r}: os.sched_setaffinity(0, {allowed!r})\n"
            "from pdscope.cli import main\n"
            "sys.exit(main(['selftest', *sys.argv[1:]]))")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=60)


def test_pin_on_one_core_is_one_line_and_exit_2() -> None:
    r = _cli("--pin", "--levels", "1", cpus={min(os.sched_getaffinity(0))})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "--pin needs two cores" in r.stderr


@TWO_CORES
@pytest.mark.parametrize("argv, words", [
    (("--pin", "--levels", "200,x"), "bad --levels 'x'"),
    (("--pin", "--levels", "0"), "--levels must be at least 1"),
    (("--pin", "--port", "8000"), "--port and --fault-rate go with --serve"),
    (("--pin", "--server-loop", "trio"), "--server-loop: invalid choice: 'trio'"),
])
def test_bad_input_is_one_line_and_exit_2(argv: tuple[str, ...], words: str) -> None:
    r = _cli(*argv)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and words in r.stderr


@TWO_CORES
@pytest.mark.timeout(120)
def test_the_pinned_cli_reports_its_cores(tmp_path: Path) -> None:
    env = {**os.environ, "PDSCOPE_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pdscope", "selftest", "--pin", "--levels", "1",
                        "--output-tokens", "5", "--ttft-ms", "10", "--json"],
                       capture_output=True, text=True, timeout=100, env=env)
    assert r.returncode == 0, r.stderr
    pinning = choose()
    assert json.loads(r.stdout)["pinning"] == {"server_cpu": pinning.server_cpu,
                                               "client_cpu": pinning.client_cpu}
