"""A child's log as `cluster up` reads it (`localcluster.child_log`): the tail of a log of any
size is read from its end, at most TAIL_MAX_BYTES (issue 22: `deaths()`, on the event
loop, read a dead child's whole log to keep its last lines), with the lines as a
text-mode read gives them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from localcluster.child_log import LOG_TAIL_LINES, TAIL_MAX_BYTES, readable_tail, tail_lines
from localcluster.children import Child
from localcluster.settings import UpSettings
from localcluster.supervisor import ClusterUp

HUGE = 64 * 1024 * 1024  # a sparse stretch: no disk, but 64 MiB to whoever reads it all


def read_bytes() -> int:
    """The bytes this thread has read with read() and the like (Linux's rchar)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def long_log(path: Path, lines: list[str]) -> None:
    with path.open("wb") as f:
        f.write(b"an early line\n")
        f.truncate(HUGE)  # a child that logged for days
        f.seek(HUGE)
        f.write(b"\n" + "".join(f"{x}\n" for x in lines).encode())


def test_the_tail_of_a_long_log_reads_only_its_end(tmp_path: Path) -> None:
    log = tmp_path / "broker-1.log"
    last = [f'{{"level": "info", "event": "line {i}", "n": {i}}}' for i in range(20)]
    long_log(log, last)
    before = read_bytes()
    tail = tail_lines(log, 10)
    took = read_bytes() - before
    assert tail == last[-10:]
    assert took <= TAIL_MAX_BYTES + 4096, took


def test_tail_lines_reads_as_a_text_file_does(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"one\r\ntwo\n\nthree \xff\nfour")
    assert tail_lines(log, 4) == ["two", "", "three \ufffd", "four"]
    assert tail_lines(log, 100) == ["one", "two", "", "three \ufffd", "four"]
    log.write_bytes(b"")
    assert tail_lines(log) == []
    assert readable_tail(log) == ["    (its log is empty)"]
    assert tail_lines(tmp_path / "missing.log") == []
    # A line cut by the bound is left out; a single line longer than it keeps its end.
    log.write_bytes(b"a" * 100 + b"\nlast\n")
    assert tail_lines(log, 8, max_bytes=50) == ["last"]
    log.write_bytes(b"b" * 100 + b"\n")
    assert tail_lines(log, 8, max_bytes=50) == ["b" * 49]


def test_a_dead_childs_report_reads_only_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "broker-1.log"
    long_log(log, ['{"level": "error", "event": "replica failed", "error": "disk full"}'])
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    up = ClusterUp(UpSettings(data_dir=tmp_path))
    up.children.append(Child("broker 1", "broker", proc, log, None))
    before = read_bytes()
    reports = up.deaths()
    took = read_bytes() - before
    assert len(reports) == 1
    assert "broker 1 (pid" in reports[0] and "exit status 3" in reports[0]
    assert 'error replica failed error="disk full"' in reports[0]
    assert len(reports[0].splitlines()) <= LOG_TAIL_LINES + 3
    assert took <= TAIL_MAX_BYTES + 4096, took
    assert up.deaths() == []  # told once
