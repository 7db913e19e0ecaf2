"""Waiting on processes in tests: a bounded poll, /proc's view of a process, a process's
exit as an event (a pidfd), and a subprocess's output read line by line with a bound.

Bounds here are bounds on waiting, never timing assertions.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
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


def run_stopping(
    cmd: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    grace: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)` for a command
    that starts processes of its own (`chaos run`, `cluster up`): if it overruns, or the
    test is interrupted while it runs (pytest-timeout raises in the test), it gets SIGINT
    first, so that it stops what it started (resuming what it paused), and SIGKILL only
    after `grace` seconds. subprocess.run would SIGKILL it at once, orphaning its
    children."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:
        out = err = ""
        try:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=grace)
        except BaseException:  # still running after the grace, or interrupted again
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):  # with what it said while stopping
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --- the suite's leak check (tests/conftest.py) ------------------------------------------------
#
# A process belongs to this test run if it carries the run's mark in its environment (every
# child inherits os.environ, through setpriv, new sessions and reparenting to init alike) or
# descends from this pytest process by its parent chain (a child given an environment of its
# own). Only processes that appeared since a snapshot are looked at, so a check is two
# listdir("/proc") and a few reads, whatever else runs on the machine.

RUN_MARK = "METACTL_TEST_RUN"


def pids() -> set[int]:
    """Every process on the machine now (/proc's numeric entries: processes, not threads)."""
    return {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}


def environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent's parent, ... up to init (or to a process gone meanwhile)."""
    chain: list[int] = []
    while pid > 1 and len(chain) < 64 and (fields := stat(pid)) is not None:
        pid = int(fields[1])
        chain.append(pid)
    return chain


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "(gone)"


def program(pid: int) -> str:
    """What `pid` runs, without its options: its command line up to the first argument
    that starts with "--" (`.../python -m brokers_stub`, `/usr/bin/etcd`)."""
    words = cmdline(pid).split()
    head = [words[0]] if words else []
    for word in words[1:]:
        if word.startswith("--"):
            break
        head.append(word)
    return " ".join(head)


def new_processes(
    before: set[int], mark: str, owners: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    """Live processes not in `before` that belong to the run marked `mark` (its mark in
    their environment, or descendants of this process), except those that descend from
    one of `owners` (a fixture's JVM and the Python workers it forks, say)."""
    root = os.getpid()
    entry = f"{RUN_MARK}={mark}".encode()
    found = []
    for pid in pids() - before:
        if pid == root or pid in owners or not alive(pid):
            continue
        up = ancestors(pid)
        if owners.intersection(up):
            continue
        if root in up or environ_has(pid, entry):
            found.append(pid)
    return sorted(found)


def await_gone(procs: list[int], bound: float) -> list[int]:
    """Wait, on their exit events (pidfds), until every one of `procs` has exited or
    `bound` seconds have passed; those still running."""
    fds: dict[int, int] = {}
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    try:
        deadline = time.monotonic() + bound
        waiting = set(fds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(waiting), [], [], left)
            waiting -= set(ready)
        return sorted(pid for fd, pid in fds.items() if fd in waiting and alive(pid))
    finally:
        for fd in fds:
            os.close(fd)


def kill_processes(procs: list[int], bound: float = 10.0) -> list[int]:
    """SIGKILL each process and, when it leads a process group of its own (the harnesses
    start children with start_new_session), its whole group; those still running after
    `bound` seconds (none, short of an unkillable process)."""
    own_group = os.getpgrp()
    for pid in procs:
        fields = stat(pid)
        if fields is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if int(fields[2]) == pid and pid != own_group:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
    return await_gone(procs, bound)


def describe(procs: list[int]) -> str:
    return "; ".join(f"pid {pid}: {cmdline(pid)}" for pid in procs)
