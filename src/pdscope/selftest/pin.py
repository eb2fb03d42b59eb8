"""Pinning the self-test: the reference server on one core, the client on another.

On a shared two-core machine the server and the client otherwise take turns on both cores, so a
late chunk cannot be blamed on either: the kernel moved one of them off a core the other
needed. Pinned, each has a core of its own, and the server's lateness is its own work, the
client's lateness the client's.

The server process is pinned right after it is started (before its interpreter has loaded, so
every thread it makes later inherits the core); the client is the calling thread, pinned for the
length of a ``with`` block and given its cores back on the way out, so that a library caller
(a test) is not left on one core. Worker processes the client starts inside the block inherit
its core.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from pdscope.errors import Field, InputError


@dataclass(frozen=True)
class Pinning:
    """The core of each side of the self-test."""

    server_cpu: int
    client_cpu: int


def usable_cpus() -> list[int]:
    """The cores this process may run on, in order (what the scheduler allows it, not what the
    machine has: a container or ``taskset`` can allow fewer)."""
    return sorted(os.sched_getaffinity(0))


def choose(cpus: list[int] | None = None) -> Pinning:
    """The server on the last usable core, the client on the first (core 0 takes most of the
    interrupts: the server, whose lateness is the reference, keeps away from it).

    Raises :class:`InputError` (naming the field ``pin``) with fewer than two cores: pinned to
    the same core, server and client would measure each other."""
    cpus = usable_cpus() if cpus is None else sorted(cpus)
    if len(cpus) < 2:
        raise InputError(Field("pin"), f" needs two cores, one for the reference server and one"
                         f" for the client; this process may run on {len(cpus)}"
                         f" ({', '.join(map(str, cpus)) or 'none'})")
    return Pinning(server_cpu=cpus[-1], client_cpu=cpus[0])


def pin_process(pid: int, cpu: int) -> None:
    """Pin a process (its main thread, and every thread it makes from now on) to one core."""
    os.sched_setaffinity(pid, {cpu})


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """The calling thread on one core for the block, its former cores given back after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
