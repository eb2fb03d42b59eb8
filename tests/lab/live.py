"""pdscope's commands run beside a load, their output read while they run: a watch that has
printed its first window has scraped the server twice, so a load started after that cannot end
before the watch begins (CI once had a watch start after a 15 s load it was meant to see)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any


class Lines(list[str]):
    """A stream's lines so far, appended by ``reader`` (which ends at the end of the stream)."""

    reader: threading.Thread


def collect(stream: IO[str] | None) -> Lines:
    """The lines of a stream as they come, read on a thread of their own."""
    lines = Lines()
    assert stream is not None

    def read() -> None:
        for line in stream:
            lines.append(line)

    lines.reader = threading.Thread(target=read, daemon=True)
    lines.reader.start()
    return lines


def wait_for(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def pdscope(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pdscope", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "120"},
    )


class Watch:
    """``pdscope watch URL --json`` with its output collected as it comes."""

    def __init__(self, url: str, *flags: str) -> None:
        self.proc = pdscope("watch", url, "--json", *flags)
        self.lines = collect(self.proc.stdout)
        self.errors = collect(self.proc.stderr)

    def first_window(self, timeout: float = 60) -> None:
        """Wait until the first window is printed (the watch has scraped twice)."""
        wait_for("watch's first window",
                 lambda: bool(self.lines) or self.proc.poll() is not None, timeout)
        assert self.lines, "".join(self.errors)

    def windows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def wait(self, timeout: float = 90) -> int:
        """Its end (``--count`` windows), and every line it printed read."""
        code = self.proc.wait(timeout=timeout)
        self._drain()
        return code

    def stop(self) -> int:
        """Stopped as a user stops it (Ctrl-C); the windows it printed by then are all kept."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _drain(self) -> None:
        for lines in (self.lines, self.errors):  # their end of file comes with the process's
            lines.reader.join(timeout=10)
