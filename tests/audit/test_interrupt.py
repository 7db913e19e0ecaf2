"""Ctrl-C in an audit: the real command in a subprocess, SIGINT to its process group (as a
terminal sends it) while a Spark job runs. Exit 130, no Python or Java stack, the job
cancelled, the session stopped and the JVM gone.

The audit runs in a process of its own (its own JVM): this is not the suite's session.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 120.0  # a bound on waiting, not a timing assertion


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, ppid, pgrp, session,
    ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _matching(test: Callable[[list[str]], bool]) -> list[int]:
    """The processes whose stat fields pass `test`."""
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in pids if (fields := _stat(pid)) is not None and test(fields)]


def _children(pid: int) -> list[int]:
    return _matching(lambda fields: int(fields[1]) == pid)


def _session(sid: int) -> list[int]:
    """Live processes of session `sid`."""
    return _matching(lambda fields: int(fields[3]) == sid and fields[0] != "Z")


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _read_until(proc: subprocess.Popen[str], marker: str, seen: list[str]) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 1.0)
        if not ready:
            continue
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"the audit ended before {marker!r}: {''.join(seen)}")
        seen.append(line)
        if marker in line:
            return
    raise AssertionError(f"no {marker!r} within {BOUND_S} s: {''.join(seen)}")


def test_ctrl_c_cancels_the_job_and_exits_130(sim_log: tuple[Path, Any]) -> None:
    path, _ = sim_log
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ops.cli", "audit", "invariants", "--method", "rows"]
    cmd += ["--data-dir", str(path), "--master", "local[1]", "--driver-memory", "1g"]
    cmd += ["--progress", "lines"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group, like a shell job
    )
    seen: list[str] = []
    try:
        # A job that collects to pandas through Arrow: PySpark's clean-up of an interrupted
        # one raises a JVM error of its own, which must still end as Ctrl-C.
        _read_until(proc, "started: toPandas", seen)
        spawned = _children(proc.pid)  # the JVM
        assert spawned
        deadline = time.monotonic() + BOUND_S
        descendants: list[int] = []
        while not descendants and time.monotonic() < deadline:
            descendants = [p for c in spawned for p in _children(c)]  # its Python workers
            time.sleep(0.05)
        assert descendants
        os.killpg(proc.pid, signal.SIGINT)
        out, rest = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "at org.apache" not in err and "Exception" not in err
    assert all(line.startswith("spark job ") for line in err.splitlines()), err
    assert out == ""  # no summary of a cancelled audit
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in spawned + descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in spawned + descendants if _alive(p)]


def test_ctrl_c_while_the_jvm_starts_leaves_no_jvm(sim_log: tuple[Path, Any]) -> None:
    # PySpark's launcher, interrupted, leaves a JVM that never exits (its main thread dies,
    # its py4j server thread lives on): the command must kill it.
    path, _ = sim_log
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ops.cli", "audit", "elections", "--data-dir", str(path)]
    proc = subprocess.Popen(
        [*cmd, "--master", "local[1]", "--driver-memory", "1g"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + BOUND_S
        launcher: list[int] = []
        while not launcher and time.monotonic() < deadline:
            launcher = _children(proc.pid)  # spark-submit, becoming the JVM
            time.sleep(0.02)
        assert launcher, "the command started no JVM"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and err == "" and out == ""
    deadline = time.monotonic() + 30
    while _session(launcher[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session(launcher[0]) == []
