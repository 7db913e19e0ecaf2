"""The children `cluster up` supervises: a child process with its log, how its end is
told, and how a cluster's children are stopped.

A `Child` is one process `cluster up` started (an etcd member, a controller, a broker),
in a process group of its own, its stderr in ``DATA_DIR/logs`` (read back readable:
`localcluster.child_log`). `exit_text` says how it ended; `stop_children` stops a
cluster's children in order: brokers (their controlled shutdown needs a controller),
then the controllers, then etcd, saying what it stops as it goes (issue 34, item 6:
Ctrl-C was silent for 9-13 s): ``stopping: broker 1, broker 2 (controlled shutdown)…``,
then ``  broker 2 stopped (1.2 s)`` as each one ends, and so on.

This module decides nothing about what runs: `localcluster.supervisor` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from localcluster.child_log import LOG_TAIL_LINES, readable_tail, tail_lines

__all__ = ["STOP_TIMEOUT_S", "Child", "exit_text", "stop_children"]

STOP_TIMEOUT_S: Final = 30.0
STOP_POLL_S: Final = 0.02  # how often the children being stopped are looked at


@dataclass
class Child:
    name: str
    kind: str  # "etcd", "controller", "broker"
    proc: subprocess.Popen[Any]
    log_path: Path
    log_file: IO[str] | None
    ready: str = ""
    reported: bool = False  # its death has been told

    def tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of its log, as written."""
        return tail_lines(self.log_path, n)

    def readable_tail(self) -> list[str]:
        """The last lines of its log as an operator reads them (`localcluster.child_log`)."""
        return readable_tail(self.log_path)


def exit_text(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


def stop_children(children: list[Child], say: Callable[[str], None] | None = None) -> None:
    """Brokers, then controllers, then etcd: SIGTERM (SIGCONT first, for a paused one),
    SIGKILL after the bound. Brokers and controllers together; etcd members one after
    the other, as `LocalEtcd.stop` does: a leader stopped while its followers stop too
    waits out etcd's 5 s leadership-transfer timeout. `say` is told what is stopped, in
    order, and how long each took (from its SIGTERM to its exit), as each ends; a child
    that ended already is not named. Idempotent (a second call stops and says nothing)."""
    began = time.monotonic()
    stopped = False
    for kind in ("broker", "controller", "etcd"):
        group = [c for c in children if c.kind == kind]
        for c in group:
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGCONT)
        batches = [[c] for c in group] if kind == "etcd" else [group]
        for batch in batches:
            stopped |= _stop(batch, say)
        for c in group:
            if c.proc.stdout is not None:
                c.proc.stdout.close()
            if c.log_file is not None:
                c.log_file.close()
    if stopped and say is not None:
        say(f"all stopped ({time.monotonic() - began:.1f} s)")


def _numbered(c: Child) -> tuple[str, int]:
    """Its sort key: broker 10 after broker 9 (a restarted child is last in the list)."""
    head, _, number = c.name.rpartition(" ")
    return (head, int(number)) if number.isdigit() else (c.name, 0)


def _stop(batch: list[Child], say: Callable[[str], None] | None) -> bool:
    """`batch` stopped together: SIGTERM to each that runs, then each one's exit awaited
    (SIGKILL once it outlives `STOP_TIMEOUT_S` from its SIGTERM), told to `say` in the
    order they end. Whether any ran."""
    running = sorted((c for c in batch if c.proc.poll() is None), key=_numbered)
    if not running:
        return False
    if say is not None:
        how = " (controlled shutdown)" if running[0].kind == "broker" else ""
        say(f"stopping: {', '.join(c.name for c in running)}{how}…")
    termed = time.monotonic()
    for c in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.proc.pid, signal.SIGTERM)
    pending = list(running)
    while pending:
        for c in [c for c in pending if c.proc.poll() is not None]:
            pending.remove(c)
            if say is not None:
                status = c.proc.returncode  # 0, or the SIGTERM it was sent: as asked
                how = "" if status in (0, -signal.SIGTERM) else f", {exit_text(status)}"
                say(f"  {c.name} stopped ({time.monotonic() - termed:.1f} s{how})")
        if pending and time.monotonic() - termed > STOP_TIMEOUT_S:
            for c in pending:
                print(f"{c.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it",
                      file=sys.stderr, flush=True)  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
                if say is not None:
                    say(f"  {c.name} killed ({time.monotonic() - termed:.1f} s)")
            pending = []
        elif pending:
            time.sleep(STOP_POLL_S)  # each one's end told as it comes, not in list order
    return True
