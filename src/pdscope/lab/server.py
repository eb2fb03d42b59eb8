"""Start, find and stop lab servers, and remember what was started.

Each server is started in its own process group and recorded in a state file
(``<state dir>/<engine>-<port>.json``: pid, start time, port, log, flags). ``stop`` ends that
process group by the recorded pid, after checking the pid still belongs to the process that was
started (same create time), so a recycled pid is never killed. Nothing is ever looked up or
killed by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from pdscope.errors import Field, InputError, RunError
from pdscope.lab.engines import HOST, Engine, check_engine_args, get_engine
from pdscope.lab.model import SERVED_NAME, cache_root

START_TIMEOUT_S = 900.0  # the first vLLM start compiles for minutes on two cores
STOP_TIMEOUT_S = 30.0


def state_dir() -> Path:
    """``$PDSCOPE_LAB_STATE``, else ``<cache>/lab``."""
    if os.environ.get("PDSCOPE_LAB_STATE"):
        return Path(os.environ["PDSCOPE_LAB_STATE"])
    return cache_root() / "lab"


@dataclass(frozen=True)
class LabServer:
    """A running lab server. ``url`` is the base URL (no ``/v1``); ``model`` the served name."""

    engine: str
    port: int
    pid: int
    create_time: float
    log_path: str
    extra_args: tuple[str, ...] = ()
    model: str = SERVED_NAME
    started_at: float = field(default_factory=time.time)
    host: str = HOST  # where it listens: 127.0.0.1 unless started with expose

    @property
    def url(self) -> str:
        host = HOST if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def state_file(self) -> Path:
        return state_dir() / f"{self.engine}-{self.port}.json"

    def alive(self) -> bool:
        """The recorded process still runs and is the one that was started."""
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.create_time) < 1.0
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def answers(self, timeout: float = 2.0) -> bool:
        return _http_ok(self.url + get_engine(self.engine).ready_path, timeout)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["extra_args"] = list(self.extra_args)
        d["url"] = self.url
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LabServer:
        return cls(
            engine=d["engine"],
            port=int(d["port"]),
            pid=int(d["pid"]),
            create_time=float(d["create_time"]),
            log_path=d["log_path"],
            extra_args=tuple(d.get("extra_args", ())),
            model=d.get("model", SERVED_NAME),
            started_at=float(d.get("started_at", 0.0)),
            host=str(d.get("host", HOST)),
        )


def _http_ok(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def recorded(engine: str | None = None) -> list[LabServer]:
    """Servers in the state folder (running or not), optionally of one engine."""
    folder = state_dir()
    out = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            server = LabServer.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, OSError):
            continue
        if engine is None or server.engine == engine:
            out.append(server)
    return out


def status(engine: str | None = None) -> list[tuple[LabServer, str]]:
    """Each recorded server with its state: ``running`` (answers), ``starting`` (alive, not
    answering yet) or ``dead`` (the process is gone; its record is removed)."""
    out = []
    for server in recorded(engine):
        if not server.alive():
            server.state_file.unlink(missing_ok=True)
            out.append((server, "dead"))
        elif server.answers():
            out.append((server, "running"))
        else:
            out.append((server, "starting"))
    return out


def log_tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


ProgressFn = Callable[[float, str], None]


def start(
    engine_name: str,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    *,
    timeout: float = START_TIMEOUT_S,
    progress: ProgressFn | None = None,
    expose: bool = False,
) -> tuple[LabServer, bool]:
    """Start a lab server in the background and wait until it answers.

    Returns ``(server, reused)``. A server of the same engine already running on the port with
    the same flags is reused; on other flags, or a port held by anything else, this fails with
    a message saying so. A server that dies while starting fails with the tail of its log.
    ``port=0`` picks a free port. The server listens on 127.0.0.1 only: a ``--host`` or
    ``--port`` among ``extra_args`` is refused unless ``expose`` (see
    :func:`~pdscope.lab.engines.check_engine_args`)."""
    engine = get_engine(engine_name)
    host, flag_port = check_engine_args(extra_args, expose=expose)
    if flag_port is not None:
        if port not in (None, flag_port):
            raise InputError(f"two ports: {port} and the engine flag --port {flag_port}")
        port = flag_port
    engine.require_installed()
    port = engine.default_port if port is None else port
    if port == 0:
        port = free_port()
    extra = tuple(extra_args)

    for server, state in status(engine.name):
        # A dead record (the server crashed or was killed) was just removed: start afresh.
        if server.port != port or state == "dead":
            continue
        if server.extra_args != extra:
            flags = " ".join(server.extra_args) or "no extra flags"
            raise InputError(
                f"a {engine.name} lab server already runs on port {port} with {flags}:"
                f" stop it first (`pdscope lab stop`) or give another ", Field("port")
            )
        if state == "running":
            return server, True
        return _wait_ready(engine, server, timeout, progress), True

    if not _port_free(port):
        raise InputError(
            f"port {port} on {HOST} is taken by another program: give another ", Field("port")
        )

    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{engine.name}-{port}.log"
    cmd = engine.command(port, extra)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=engine.environment(),
            start_new_session=True,  # its own process group: stop ends all its children
        )
    server = LabServer(
        engine=engine.name,
        port=port,
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        log_path=str(log_path),
        extra_args=extra,
        host=host,
    )
    server.state_file.write_text(json.dumps(server.to_json(), indent=2))
    try:
        return _wait_ready(engine, server, timeout, progress, proc), False
    except BaseException:
        # Interrupted or failed while starting: leave nothing behind.
        _terminate(server)
        raise


def _wait_ready(
    engine: Engine,
    server: LabServer,
    timeout: float,
    progress: ProgressFn | None,
    proc: subprocess.Popen[bytes] | None = None,
) -> LabServer:
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        exited = proc.poll() is not None if proc is not None else not server.alive()
        if exited:
            server.state_file.unlink(missing_ok=True)
            raise RunError(
                f"the {engine.name} lab server exited while starting; the end of its log"
                f" ({server.log_path}):\n{log_tail(server.log_path)}"
            )
        if server.answers(timeout=1.0):
            return server
        if elapsed > timeout:
            _terminate(server)
            raise RunError(
                f"the {engine.name} lab server did not answer within {timeout:.0f} s; the end"
                f" of its log ({server.log_path}):\n{log_tail(server.log_path)}"
            )
        if progress is not None:
            last = log_tail(server.log_path, 1)
            progress(elapsed, last)
        time.sleep(1.0)


def _terminate(server: LabServer, timeout: float = STOP_TIMEOUT_S) -> None:
    """End the server's whole process group: SIGTERM, then SIGKILL after ``timeout``."""
    if server.alive():
        try:
            pgid = os.getpgid(server.pid)
        except ProcessLookupError:
            pgid = None
        # The group was created for this server (start_new_session): it holds only its tree.
        if pgid == server.pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if server.alive() or pgid == server.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)
    # Reap it if it is our child (a server started by this process).
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(server.pid, os.WNOHANG)
    server.state_file.unlink(missing_ok=True)


def stop(engine: str | None = None, port: int | None = None) -> list[LabServer]:
    """Stop recorded servers (of one engine, on one port, or all). Returns those stopped."""
    if engine is not None:
        engine = get_engine(engine).name
    stopped = []
    for server in recorded(engine):
        if port is not None and server.port != port:
            continue
        _terminate(server)
        stopped.append(server)
    return stopped


@contextlib.contextmanager
def running(
    engine: str = "vllm",
    *,
    port: int | None = 0,
    extra_args: Sequence[str] = (),
    timeout: float = START_TIMEOUT_S,
    progress: ProgressFn | None = None,
    expose: bool = False,
) -> Iterator[LabServer]:
    """A lab server for the length of a ``with`` block::

        with pdscope.lab.running("vllm") as server:
            print(server.url, server.model)

    It is stopped at the end unless it was already running before (then it is left as found).
    ``port=0`` (the default here) picks a free port, so this never collides with a lab started
    from the command line."""
    server, reused = start(engine, port, extra_args, timeout=timeout, progress=progress,
                           expose=expose)
    try:
        yield server
    finally:
        if not reused:
            _terminate(server)
