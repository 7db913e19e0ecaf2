"""Ctrl-C in an audit: the real command in a subprocess, SIGINT to its process group (as a
terminal sends it) while a Spark job runs. Exit 130, no Python or Java stack, the job
cancelled, the session stopped and the JVM gone.

The audit runs in a process of its own (its own JVM): this is not the suite's session.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.processes import BOUND_S, children, read_lines, wait_for, wait_session_gone

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


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
        # The step that collects to pandas through Arrow: PySpark's clean-up of an
        # interrupted job of it raises a JVM error of its own, which must still end as
        # Ctrl-C.
        marker = "started: invariants: each partition's history replayed (rows)"
        assert proc.stderr is not None and proc.stdout is not None
        assert read_lines(proc, proc.stderr, seen, marker), f"ended before {marker!r}: {seen}"
        jvm = wait_for("JVM", lambda: children(proc.pid))[0]
        wait_for("Python worker of the JVM", lambda: children(jvm))
        os.killpg(proc.pid, signal.SIGINT)
        read_lines(proc, proc.stderr, seen)  # to its end: the audit has closed it
        out: list[str] = []
        read_lines(proc, proc.stdout, out)
        proc.wait(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(seen)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "at org.apache" not in err and "Exception" not in err
    lines = err.splitlines()
    assert lines[0].startswith("starting Spark"), err  # before the JVM, then the jobs
    # While the JVM starts, a line every few seconds; then the jobs.
    ticks = [line for line in lines[1:] if not line.startswith("spark job ")]
    assert all(re.fullmatch(r"starting Spark \(local\[1\]\)… \d+ s", t) for t in ticks), err
    assert out == []  # no summary of a cancelled audit
    wait_session_gone(jvm)  # the JVM and every process it started: its session is empty


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
        launcher = wait_for("JVM", lambda: children(proc.pid), every=0.02)  # spark-submit
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)  # nothing read before: all is here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and err == "" and out == ""
    wait_session_gone(launcher[0])  # the JVM and everything it started
