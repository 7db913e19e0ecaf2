"""localcluster.procs.ready_line: a child's READY line, read through a thread, bounded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localcluster.procs import ready_line

# Writes its lines at once (one flush), then waits for stdin to close.
CHILD = "import sys; sys.stdout.write({text!r}); sys.stdout.flush(); sys.stdin.read()"


def child(text: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(text=text)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()


def test_a_ready_line_behind_another_in_one_write_is_seen_at_once() -> None:
    # Both lines arrive in one read: a select() on the pipe after the first readline()
    # would wait for more output, which never comes, and time out.
    proc = child("starting up\nREADY broker=1 epoch=0\nlater\n")
    try:
        seen: list[str] = []
        assert ready_line(proc, 30, seen=seen) == "READY broker=1 epoch=0"
        assert seen == ["starting up\n", "READY broker=1 epoch=0\n"]
        assert proc.stdout is not None and proc.stdout.readline() == "later\n"  # left
    finally:
        finish(proc)


def test_the_end_of_output_is_none_and_silence_is_a_timeout() -> None:
    proc = child("no ready line\n")
    try:
        with pytest.raises(TimeoutError, match="not ready within"):
            ready_line(proc, 0.2)
    finally:
        finish(proc)
    ended = subprocess.Popen(
        [sys.executable, "-c", "print('bye')"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert ready_line(ended, 30) is None
    finally:
        ended.wait(timeout=30)
        assert ended.stdout is not None
        ended.stdout.close()
