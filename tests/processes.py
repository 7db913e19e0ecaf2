"""Waiting on processes in tests: a bounded poll, /proc's view of a process, a process's
exit as an event (a pidfd), and a subprocess's output read line by line with a bound.

Bounds here are bounds on waiting, never timing assertions.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import IO, TypeVar

from localcluster.procs import ready_line

T = TypeVar("T")

BOUND_S = 120.0


def wait_for(what: str, probe: Callable[[], T], bound: float = BOUND_S, every: float = 0.2) -> T:
    """`probe`'s first truthy answer, asked every `every` seconds; AssertionError naming
    `what` if none comes within `bound` seconds."""
    deadline = time.monotonic() + bound
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} within {bound:g} s")
        time.sleep(every)


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, ppid, pgrp, session,
    ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running (a zombie holds nothing: it is not)."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def matching(test: Callable[[list[str]], bool]) -> list[int]:
    """The processes whose stat fields pass `test`."""
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in pids if (fields := stat(pid)) is not None and test(fields)]


def children(pid: int) -> list[int]:
    return matching(lambda fields: int(fields[1]) == pid)


def session(sid: int) -> list[int]:
    """Live processes of session `sid`."""
    return matching(lambda fields: int(fields[3]) == sid and fields[0] != "Z")


def wait_exit(pid: int, bound: float = BOUND_S) -> bool:
    """Wait for `pid` to exit, on the event itself (its pidfd turns readable; a zombie
    has exited): True once it has (or was gone already), False if it still runs after
    `bound` seconds. Once the pidfd is open, a reused pid cannot be mistaken for it."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], bound)
        return bool(ready)
    finally:
        os.close(fd)


def wait_session_gone(sid: int, bound: float = 30.0) -> None:
    """Wait until no live process is left in session `sid`; AssertionError naming those
    left after `bound` seconds."""
    deadline = time.monotonic() + bound
    while left := session(sid):
        for pid in left:
            if not wait_exit(pid, max(deadline - time.monotonic(), 0.0)):
                raise AssertionError(f"session {sid} still runs {session(sid)} after {bound} s")


def read_lines(
    proc: subprocess.Popen[str],
    stream: IO[str],
    seen: list[str],
    until: str | None = None,
    bound: float = BOUND_S,
) -> bool:
    """Lines of `stream` into `seen`, up to the first that contains `until` (True) or the
    stream's end (False; with no `until`, read to the end); AssertionError with what was
    seen if neither comes within `bound` seconds."""

    def found(line: str) -> bool:
        return until is not None and until in line

    try:
        return ready_line(proc, bound, stream=stream, until=found, seen=seen) is not None
    except TimeoutError:
        wanted = repr(until) if until is not None else "end of output"
        raise AssertionError(f"no {wanted} within {bound:g} s: {''.join(seen)}") from None
