"""`metactl audit` as a process of its own (issue 34): the JVM it starts is gone when it
returns, and without PySpark it says in one line how to get it.

The audit runs in a subprocess with its own JVM: not the suite's session (which is
stopped once, at the end of the run). The missing-PySpark runs make ``import pyspark``
fail in the subprocess (``sys.modules['pyspark'] = None``, as an uninstalled package
fails) and start no JVM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from audit.spark import PYSPARK_HINT
from tests.audit.real_logs import StoppedLog
from tests.processes import BOUND_S, alive, children, read_lines, session, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# `python -c` this, then the command's arguments: metactl with PySpark impossible to import.
WITHOUT_PYSPARK = (
    "import sys; sys.modules['pyspark'] = None; "
    "from ops.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_the_jvm_is_gone_when_the_audit_returns(stopped: StoppedLog) -> None:
    cmd = [sys.executable, "-m", "ops.cli", "audit", "elections", "--data-dir"]
    cmd += [str(stopped.data_dir), "--master", "local[1]", "--driver-memory", "1g"]
    proc = subprocess.Popen(
        [*cmd, "--progress", "lines"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        assert read_lines(proc, proc.stderr, seen, "spark job "), f"no job: {seen}"
        jvm = wait_for("JVM", lambda: children(proc.pid))[0]
        read_lines(proc, proc.stderr, seen)
        out: list[str] = []
        read_lines(proc, proc.stdout, out)
        proc.wait(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(seen)
    assert proc.returncode == 0, err
    assert "elections audit of" in "".join(out)
    # At the moment the command has returned: no JVM, nothing of its session (its Python
    # workers) left. A state, not a wait.
    assert not alive(jvm) and session(jvm) == [], (jvm, session(jvm))
    lines = err.splitlines()
    ticks = [line for line in lines[1:] if not line.startswith("spark job ")]
    assert all(re.fullmatch(r"starting Spark \(local\[1\]\)… \d+ s", t) for t in ticks), err


def _without_pyspark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK, *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=BOUND_S,
        check=False,
    )


def test_without_pyspark_one_line_says_how_to_get_it(stopped: StoppedLog) -> None:
    for job in ("elections", "all"):
        done = _without_pyspark("audit", job, "--data-dir", str(stopped.data_dir))
        assert done.stderr == f"error: PYSPARK_NOT_FOUND: {PYSPARK_HINT}\n", done.stderr
        assert done.returncode == 4 and done.stdout == ""  # "not found", as JAVA_NOT_FOUND
    assert PYSPARK_HINT == (
        "the audits need PySpark: run `make audit` (or `pip install -e '.[audit]'`)"
    )
    # The standalone cluster's entry point says the same.
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK.replace("ops.cli", "audit.standalone")],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=BOUND_S,
        check=False,
    )
    assert done.stderr == f"error: PYSPARK_NOT_FOUND: {PYSPARK_HINT}\n" and done.returncode == 1
    # Help never needs it (nor imports it: the import would fail here).
    for argv in (["--help"], ["audit", "--help"], ["audit", "offline", "--help"]):
        done = _without_pyspark(*argv)
        assert done.returncode == 0 and "usage:" in done.stdout and done.stderr == "", argv
