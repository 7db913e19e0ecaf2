"""Every client command fails in one line, `error: NAME: message`, with the status of the
one table (docs/cli.md), against what a new user meets: a closed port, a listener that
accepts and never answers, one that answers garbage (an HTTP server), and an address that
is not one. Ctrl-C ends every command with 130 and no traceback, in real processes:
waiting on the network, following the log, running a scenario or a simulation."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.cli import main

REPO = Path(__file__).resolve().parents[2]

# (name, extra arguments) of every client command.
COMMANDS = [
    ("describe", ["describe"]),
    ("brokers", ["brokers"]),
    ("events", ["events"]),
    ("topics create", ["topics", "create", "--topic", "t", "--partitions", "1"]),
    ("elect", ["elect", "--election-type", "preferred", "--topic", "t", "--partition", "0"]),
    ("produce", ["produce", "--topic", "t", "--count", "1", "--acked-log", os.devnull]),
    ("consume", ["consume", "--topic", "t"]),
]


class Listener:
    """A TCP listener on loopback that accepts, then stays silent or sends `reply` (and
    keeps the connection open). `accepted` is set at the first connection."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply = reply
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                if self.reply is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(self.reply)
                self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@contextlib.contextmanager
def listening(reply: bytes | None = None) -> Iterator[Listener]:
    listener = Listener(reply)
    try:
        yield listener
    finally:
        listener.close()


def closed_port() -> str:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return f"127.0.0.1:{s.getsockname()[1]}"


def run(
    capsys: pytest.CaptureFixture[str], argv: list[str], address: str, timeout: str = "1"
) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([*argv, "--bootstrap-controller", address, "--insecure", "--timeout", timeout])
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line(err: str, name: str) -> None:
    assert err.startswith(f"error: {name}: "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    assert len(err.strip()) > len(f"error: {name}: ")  # a message, not just the name


@pytest.mark.parametrize(("label", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_client_command_fails_in_one_named_line(
    label: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens. (Where the answer is not the timeout, the timeout is generous: the
    # retries end first. With 1 s, a last retry that began near the deadline and met a
    # slow turn of this process's listener thread, late in a clean-clone run, was
    # REQUEST_TIMED_OUT instead.)
    status, out, err = run(capsys, argv, closed_port(), timeout="30")
    assert (status, out) == (5, "")
    assert_one_line(err, "NETWORK_EXCEPTION")
    assert "refused" in err.lower()
    # Accepts, never answers: the --timeout, not a hang.
    with listening() as silent:
        status, out, err = run(capsys, argv, silent.address)
    assert (status, out) == (5, "")
    assert_one_line(err, "REQUEST_TIMED_OUT")
    assert f"no answer from {silent.address} within 1 s" in err
    # Not our protocol (an HTTP server's answer).
    with listening(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as http:
        status, out, err = run(capsys, argv, http.address, timeout="30")
    assert (status, out) == (5, "")
    assert_one_line(err, "NETWORK_EXCEPTION")
    # Not an address: a usage error before anything is sent.
    for bad in ("127.0.0.1:99999", "nohost:", "no-port", "127.0.0.1:0"):
        status, out, err = run(capsys, argv, bad)
        assert (status, out) == (2, ""), bad
        assert_one_line(err, "INVALID_CONFIG")
        assert repr(bad) in err


def test_a_missing_log_is_not_found_and_names_both_places(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["describe", "--data-dir"],
        ["brokers", "--data-dir"],
        ["events", "--data-dir"],
        ["log", "dump", "--data-dir"],
    ):
        capsys.readouterr()
        assert main([*argv, str(tmp_path)]) == 4
        out, err = capsys.readouterr()
        assert out == ""
        assert_one_line(err, "LOG_DIR_NOT_FOUND")
        assert f"in {tmp_path} nor in {tmp_path / 'controller'}" in err


def test_log_export_wants_one_distinct_cluster_name_per_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "d"
    scenario = REPO / "simulation" / "scenarios" / "worked-5.3.3-balanced-recovery.yaml"
    assert main(["scenario", "run", str(scenario), "--data-dir", str(data)]) == 0
    out = tmp_path / "pq"
    for extra, message in (
        (["--cluster", "x"], "--cluster names 1 cluster(s) for 2 data directories"),
        ([], "cluster names must be distinct"),
    ):
        capsys.readouterr()
        argv = ["log", "export", "--data-dir", f"{data},{data}", "--parquet", str(out), *extra]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert_one_line(err, "INVALID_CONFIG")
        assert message in err
    assert not out.exists()


# --- Ctrl-C --------------------------------------------------------------------------------


def spawn(*argv: str, cwd: Path = REPO) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(proc: subprocess.Popen[str]) -> str:
    """SIGINT, then the process's exit within 20 s; its stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the process did not end within 20 s of Ctrl-C") from None
    return err


def assert_clean_interrupt(proc: subprocess.Popen[str], err: str) -> None:
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


@pytest.mark.parametrize(("label", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_ctrl_c_while_waiting_on_the_controller(label: str, argv: list[str]) -> None:
    with listening() as silent:
        proc = spawn(*argv, "--bootstrap-controller", silent.address, "--insecure")
        assert silent.accepted.wait(60), "the command never connected"
        assert_clean_interrupt(proc, interrupt(proc))


def test_ctrl_c_in_a_scenario_and_a_simulation(tmp_path: Path) -> None:
    steps = "".join("  - fence: 1\n  - restart: {broker: 1, clean: true}\n" for _ in range(20_000))
    scenario = tmp_path / "long.yaml"
    scenario.write_text(
        "brokers: [1, 2, 3]\n"
        "topics:\n  - {name: t, partitions: [[1, 2, 3]], min_insync_replicas: 2}\n"
        "steps:\n" + steps
    )
    proc = spawn("scenario", "run", str(scenario))
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("step ")  # running
    assert_clean_interrupt(proc, interrupt(proc))

    proc = spawn(
        "simulate", "history", "--brokers", "30", "--partitions", "20000", "--days", "365",
        "--out", str(tmp_path / "hist"),
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first progress line: it is running
    assert first.strip(), "no progress line"
    assert_clean_interrupt(proc, interrupt(proc))


def test_ctrl_c_in_events_follow_offline(tmp_path: Path) -> None:
    scenario = REPO / "simulation" / "scenarios" / "worked-5.3.3-balanced-recovery.yaml"
    made = subprocess.run(
        [sys.executable, "-m", "ops.cli", "scenario", "run", str(scenario),
         "--data-dir", str(tmp_path / "d")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    proc = spawn("events", "--data-dir", str(tmp_path / "d"), "--follow", "--since", "1970-01-01")
    assert proc.stdout is not None
    assert "registered" in proc.stdout.readline()  # the history, then it waits
    assert_clean_interrupt(proc, interrupt(proc))
