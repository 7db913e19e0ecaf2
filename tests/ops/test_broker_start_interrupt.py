"""Ctrl-C in `metactl broker start`, as a real process and a real SIGINT (issue 22): it
ends at once with status 130, one line saying that `cluster up` goes on starting the
broker, and no traceback; and a Ctrl-C while the command is still importing its modules
ends it with 130 and no traceback too (it printed a KeyboardInterrupt traceback and died
of the signal).

`cluster up` is played by a Unix socket in the test that takes the request and never
answers, as `cluster up` does while the broker starts (up to a minute). Nothing is
timed: the test awaits the request (or the slow import's line), then the exit."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

from localcluster.control import CONTROL_SOCKET
from tests.ops.test_cluster_up import CLI, REPO, env

BOUND_S = 60.0  # bounds a hang; nothing is timed


def test_ctrl_c_while_cluster_up_starts_the_broker_ends_at_once_with_130(
    tmp_path: Path,
) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / CONTROL_SOCKET))
    listener.listen(1)
    listener.settimeout(BOUND_S)
    proc = subprocess.Popen(
        [*CLI, "broker", "start", "--id", "2", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
    )  # fmt: skip
    try:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as f:
            assert json.loads(f.readline()) == {"start_broker": 2}  # it waits for the answer
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=BOUND_S)
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out == ""
    log = tmp_path.resolve() / "logs" / "broker-2.log"
    assert err == (
        f"interrupted: cluster up goes on starting broker 2 (its log: {log}); "
        "`metactl brokers` shows it once it registers\n"
    )


def test_ctrl_c_while_the_command_is_still_importing_ends_it_with_130(tmp_path: Path) -> None:
    # A stand-in for structlog (the slowest of the CLI's imports) that says it is being
    # imported, then waits: the SIGINT lands inside the CLI's imports, before `main`.
    fake = tmp_path / "fake" / "structlog"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys, time\nprint('importing', flush=True)\ntime.sleep(600)\n"
    )
    e = env()
    e["PYTHONPATH"] = f"{fake.parent}:{e['PYTHONPATH']}"
    proc = subprocess.Popen(
        [*CLI, "broker", "start", "--id", "1", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=e,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "importing\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err == ""
