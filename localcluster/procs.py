"""Plain child-process helpers for the tools that start a controller and brokers of their
own (the chaos runner, the produce benchmark): start one with its stderr in a log file,
wait for its READY line, wait for every broker to be active, stop them in order.

`cluster up` has its own supervisor (localcluster/supervisor.py: readiness bounds, death reports,
the event feed). This module decides nothing; it only runs processes.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from clients.controller import INSECURE, Security, call
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse

__all__ = [
    "await_active_brokers",
    "await_ready",
    "ready_line",
    "shutdown",
    "start_process",
]


def start_process(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen[str], IO[str]]:
    """`cmd` in a process group of its own, stdout piped (its READY line), stderr
    appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("a")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
    )
    return proc, log_file


def _is_ready(line: str) -> bool:
    return line.startswith("READY")


def ready_line(
    proc: subprocess.Popen[str],
    timeout_s: float,
    *,
    stream: IO[str] | None = None,
    until: Callable[[str], bool] = _is_ready,
    seen: list[str] | None = None,
) -> str | None:
    """The first line of the process's `stream` (its stdout) that passes `until` (its
    READY line), stripped; None if the stream ends first; TimeoutError if none comes
    within `timeout_s` (the wait is bounded even if it prints nothing). Every line read,
    that one included, is appended to `seen`.

    A thread reads the lines and hands them over through a queue: select() on the pipe
    would miss lines already pulled into the stream's buffer by an earlier readline().
    The thread stops after the line it waited for, so later lines stay in `stream`."""
    source = proc.stdout if stream is None else stream
    assert source is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        try:
            for line in source:
                lines.put(line)
                if until(line):
                    return
        except (OSError, ValueError):
            pass  # closed under it (the process is being stopped): the end of its lines
        lines.put(None)

    threading.Thread(target=pump, name=f"lines-of-{proc.pid}", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            raise TimeoutError(f"not ready within {timeout_s:.0f} s") from None
        if line is None:
            return None
        if seen is not None:
            seen.append(line)
        if until(line):
            return line.strip()


def await_ready(proc: subprocess.Popen[str], what: str, timeout_s: float = 60) -> str:
    """The process's READY line; RuntimeError if it exits first or stays silent past
    `timeout_s`."""
    try:
        line = ready_line(proc, timeout_s)
    except TimeoutError:
        raise RuntimeError(f"{what} was not ready within {timeout_s:.0f} s") from None
    if line is None:
        raise RuntimeError(f"{what} exited before it was ready (status {proc.wait()})")
    return line


async def await_active_brokers(
    address: str,
    brokers: int,
    timeout_s: float = 60,
    *,
    security: Security = INSECURE,
    check: Callable[[], None] | None = None,
) -> None:
    """Brokers unfence once they have caught up with the log; wait for all of them.
    `check` runs before each look (it raises to give up, e.g. when a process died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check is not None:
            check()
        r = await call(address, DescribeClusterRequest(), security=security)
        assert isinstance(r, DescribeClusterResponse)
        if sum(1 for b in r.brokers if not b.fenced and not b.controlled_shutdown) >= brokers:
            return
        await asyncio.sleep(0.1)  # polling an observable state
    raise RuntimeError(f"brokers did not all become active within {timeout_s:.0f} s")


def shutdown(procs: list[tuple[str, subprocess.Popen[str], IO[str]]]) -> None:
    """Brokers first (controlled shutdown needs the controller), then the controller."""
    brokers = [p for p in procs if p[0] != "controller"]
    controller = [p for p in procs if p[0] == "controller"]
    for group in (brokers, controller):
        for _, p, _ in group:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for name, p, f in group:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop within 30 s; killing it", file=sys.stderr)
                p.kill()
                p.wait()
            f.close()
