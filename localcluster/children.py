"""The children `cluster up` supervises: a child process with its log, how its end is
told, and how a cluster's children are stopped.

A `Child` is one process `cluster up` started (an etcd member, a controller, a broker),
in a process group of its own, its stderr in ``DATA_DIR/logs`` (read back readable:
`localcluster.child_log`). `exit_text` says how it ended; `stop_children` stops a
cluster's children in order: brokers (their controlled shutdown needs a controller),
then the controllers, then etcd.

This module decides nothing about what runs: `localcluster.supervisor` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from localcluster.child_log import LOG_TAIL_LINES, readable_tail, tail_lines

__all__ = ["STOP_TIMEOUT_S", "Child", "exit_text", "stop_children"]

STOP_TIMEOUT_S: Final = 30.0


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


def stop_children(children: list[Child]) -> None:
    """Brokers, then controllers, then etcd: SIGTERM (SIGCONT first, for a paused one),
    SIGKILL after the bound. Brokers and controllers together; etcd members one after
    the other, as `LocalEtcd.stop` does: a leader stopped while its followers stop too
    waits out etcd's 5 s leadership-transfer timeout. Idempotent."""

    def term(c: Child) -> None:
        if c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGTERM)

    for kind in ("broker", "controller", "etcd"):
        group = [c for c in children if c.kind == kind]
        one_by_one = kind == "etcd"
        for c in group:
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGCONT)
                if not one_by_one:
                    term(c)
        for c in group:
            if one_by_one:
                term(c)
            try:
                c.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"{c.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it",
                      file=sys.stderr)  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
            if c.proc.stdout is not None:
                c.proc.stdout.close()
            if c.log_file is not None:
                c.log_file.close()
