"""The suite's leak check (tests/conftest.py) on planted leaks: a test that starts
`sleep 60` and returns, and an orphan in a session of its own whose parent has exited.
Each test asserts that the check's detection finds the process, then stops it itself, so
the check has nothing left to fail the suite on."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import MARK
from tests.processes import alive, await_gone, kill_processes, new_processes, pids, stat, wait_for


def test_a_child_left_running_is_found_and_named() -> None:
    before = pids()
    assert new_processes(before, MARK) == []
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert new_processes(before, MARK) == [child.pid]
        # A grace that runs out while it still sleeps: still running, not gone.
        assert await_gone([child.pid], 0.2) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert new_processes(before, MARK) == []


def test_an_orphan_in_its_own_session_is_found_by_its_mark_and_killed() -> None:
    before = pids()
    # The shell starts `sleep` in a new session and exits: the sleep is reparented away
    # from this process (to init or a subreaper), so only its environment says whose it is.
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    orphan = int(out.stdout)
    try:
        wait_for("the orphan's own session", lambda: (s := stat(orphan)) and s[3] == str(orphan))
        assert orphan in new_processes(before, MARK)
        assert os.getpgid(orphan) == orphan  # a group of its own: killed as a group
    finally:
        assert kill_processes([orphan]) == []
    assert not alive(orphan)
    assert new_processes(before, MARK) == []


def test_a_process_of_another_run_is_not_this_runs() -> None:
    before = pids()
    env = {**os.environ, "METACTL_TEST_RUN": "another-run"}
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    stranger = int(out.stdout)
    try:
        assert stranger not in new_processes(before, MARK)
    finally:
        assert kill_processes([stranger]) == []
