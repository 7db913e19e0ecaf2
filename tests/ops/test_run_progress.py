"""Progress of the long commands (`ops.run_progress`): a line at the first update, then
at most one every few seconds, and one at the end, when stderr is not a terminal; a
`rich` bar when it is. Driven by events (updates) and a clock of the test's own: nothing
here sleeps or depends on how fast the machine is.
"""

from __future__ import annotations

import io

import pytest

from ops.cli import main
from ops.run_progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_come_at_the_first_update_then_every_interval_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("simulate faults", 10, unit="schedules", mode="lines", stream=out,
                 every_s=5.0, clock=clock)  # fmt: skip
    assert out.getvalue() == ""  # nothing before the first update
    p.update(1, "0 lost silently")
    assert out.getvalue().splitlines() == [
        "simulate faults: 1/10 schedules (10%), 0 lost silently; 0 s elapsed, about 0 s left"
    ]
    for done in range(2, 6):  # updates within the interval: no line
        clock.t += 1.0
        p.update(done)
    assert p.lines == 1
    clock.t += 1.0  # 5 s after the first line: the next update writes one
    p.update(6, "1 lost silently")
    assert p.lines == 2
    assert out.getvalue().splitlines()[-1] == (
        "simulate faults: 6/10 schedules (60%), 1 lost silently; 5 s elapsed, about 3 s left"
    )
    clock.t += 0.5
    p.update(10)
    assert p.lines == 2
    p.close()
    assert out.getvalue().splitlines()[-1] == (
        "simulate faults: 10/10 schedules (100%), 1 lost silently; 6 s elapsed"
    )


def test_off_prints_nothing_and_notes_go_above_the_bar() -> None:
    out = io.StringIO()
    with Progress("x", 3, mode="off", stream=out) as p:
        p.update(1, "a")
        p.note("an event")
    assert out.getvalue() == ""
    out = io.StringIO()
    with Progress("chaos run", 60, unit="s", mode="bars", stream=out) as p:
        p.update(30, "faults, 12 faults")
        p.note("[  12.00s] fault: kill broker-1")
    text = out.getvalue()
    assert "fault: kill broker-1" in text and "chaos run" in text


def test_auto_is_lines_when_not_a_terminal() -> None:
    assert Progress("x", 1, stream=io.StringIO()).mode == "lines"


def test_simulate_faults_reports_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "faults", "--schedules", "4", "--seed", "2", "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    # The first schedule's line, then (a short run) only the last one.
    assert lines[0].startswith("simulate faults: 1/4 schedules (25%), ")
    assert lines[-1].startswith("simulate faults: 4/4 schedules (100%), ")
    assert all(line.startswith("simulate faults: ") for line in lines)
    assert captured.out.count("\n") == 1  # stdout is exactly the JSON object
    assert main(["simulate", "faults", "--schedules", "2", "--progress", "off"]) == 0
    assert capsys.readouterr().err == ""
