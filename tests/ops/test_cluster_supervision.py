"""`cluster up` supervises its children, as real processes: a broker killed with -9 is
reported with the end of its log while the rest keep running, and the event feed says
what the controller did about it; a child that cannot start fails the start at once
with one line naming it and its log, leaving nothing behind; a second `cluster up` on
the same data directory is refused before it starts anything; if `cluster up` itself is
SIGKILLed its children go with it; and `--controllers 3 --etcd 3` runs an HA quorum."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.supervisor import ClusterUp
from ops.cli import main
from tests.ops.test_cluster_up import CLI, REPO, Up, env, free_port, metactl

pytestmark = pytest.mark.slow

BOUND_S = 60.0  # bounds a hang; nothing is timed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pids(banner: list[str]) -> dict[str, int]:
    line = next(x for x in banner if x.startswith("  pids:"))
    pairs = (p.strip().split("=") for p in line.split(":", 1)[1].split(", "))
    return {k: int(v) for k, v in pairs}


def read_until(up: Up, text: str) -> list[str]:
    """Lines `cluster up` prints after its banner, up to one containing `text`, which
    must come within BOUND_S."""
    lines = up.lines()
    seen: list[str] = []
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {text!r} within {BOUND_S:.0f} s: {seen}") from None
        if line is None:
            raise AssertionError(f"cluster up ended without {text!r}: {seen}")
        seen.append(line.rstrip("\n"))
        if text in line:
            return seen


def logged(log: Path) -> list[tuple[str, str]]:
    """(timestamp, event) of each JSON line of a child's log, in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            out.append((doc.get("timestamp", ""), doc.get("event", "")))
    return out


def assert_stopped_in_order(data: Path, brokers: list[int]) -> None:
    """Each broker was told once to stop, finished its controlled shutdown with the
    controller still there, and stopped before the controller did."""
    controller = logged(data / "logs" / "controller.log")
    controller_stopped = next(t for t, e in controller if e == "controller stopped")
    for b in brokers:
        events = logged(data / "logs" / f"broker-{b}.log")
        names = [e for _, e in events]
        assert "controlled shutdown complete" in names, names
        assert not any(e.startswith("second stop signal") for e in names), names
        assert not any(e.startswith("controller unreachable") for e in names), names
        assert max(t for t, e in events if e == "stopped cleanly") < controller_stopped


def gone(pid: int) -> bool:
    deadline = time.monotonic() + BOUND_S
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling another process's exit
    return True


@pytest.fixture
def three(tmp_path: Path) -> Iterator[Up]:
    u = Up(tmp_path / "data", "--brokers", "3", "--insecure")
    # Up's defaults give one broker; the later flag wins with argparse.
    try:
        yield u
    finally:
        u.stop()


def test_a_dead_broker_is_reported_and_the_feed_tells_the_fence(three: Up) -> None:
    banner = three.await_banner()
    children = pids(banner)
    victim = children["broker 2"]
    os.kill(victim, signal.SIGKILL)
    lines = read_until(three, "broker 2 fenced")
    report = next(i for i, x in enumerate(lines) if x.startswith("!! broker 2"))
    assert "killed by SIGKILL" in lines[report]
    assert any("registered" in x for x in lines[report + 1 :])  # the end of its log
    # The others keep running.
    assert all(alive(pid) for name, pid in children.items() if name != "broker 2")
    assert three.proc.poll() is None
    assert three.stop() == 0
    assert all(gone(pid) for pid in children.values())
    # Ctrl-C stopped the brokers first, each with a controlled shutdown, then the controller.
    assert_stopped_in_order(three.data, [1, 3])
    # And said so as it went (issue 34, item 6), the dead broker 2 not among them.
    said = read_until(three, "all stopped (")
    said = said[said.index("stopping: broker 1, broker 3 (controlled shutdown)…") :]
    stopped = sorted(x.split(" (")[0] for x in said[1:3])
    assert stopped == ["  broker 1 stopped", "  broker 3 stopped"], said
    assert said[3] == "stopping: controller…" and said[4].startswith("  controller stopped (")
    assert said[5].startswith("all stopped (") and len(said) == 6, said


def test_children_are_stopped_while_the_thread_that_started_them_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `setpriv --pdeathsig` signals a child when the thread that forked it ends: were the
    # children stopped after that (asyncio.run ends its worker threads), every child would
    # get SIGTERM at once, the controller with the brokers. In-process, to see the threads.
    spawners: list[threading.Thread] = []
    alive_at_stop: list[bool] = []
    real_spawn, real_stop = ClusterUp.spawn, ClusterUp.stop

    def spawn(self: ClusterUp, name: str, kind: str, cmd: list[str]) -> Any:
        spawners.append(threading.current_thread())
        return real_spawn(self, name, kind, cmd)

    def stop(self: ClusterUp) -> None:
        alive_at_stop.append(all(t.is_alive() for t in spawners))
        real_stop(self)

    monkeypatch.setattr(ClusterUp, "spawn", spawn)
    monkeypatch.setattr(ClusterUp, "stop", stop)
    status = main(
        ["cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure", "--brokers", "1",
         "--listen", f"127.0.0.1:{free_port()}", "--metrics", "127.0.0.1:0",
         "--kafka-base-port", "0", "--partitions", "1", "--min-isr", "1", "--exit-after-ready"]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    assert len(spawners) == 2 and alive_at_stop[:1] == [True], alive_at_stop
    assert_stopped_in_order(tmp_path / "data", [1])


def test_a_child_that_cannot_start_fails_the_start_with_its_log(tmp_path: Path) -> None:
    """The controller exits before READY (a strategy only it checks; a busy port is
    refused before anything starts, test_broker_start.py): the start fails naming it,
    with its own last lines."""
    r = subprocess.run(
        [*CLI, "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure",
         "--listen", f"127.0.0.1:{free_port()}", "--metrics", "127.0.0.1:0",
         "--unclean-recovery-strategy", "nosuch"],
        capture_output=True, text=True, cwd=REPO, env=env(), timeout=BOUND_S, check=False,
    )  # fmt: skip
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("error: CLUSTER_START_FAILED: controller exited before it was ready")
    assert "UNKNOWN_RECOVERY_POLICY" in first
    tail = r.stderr.splitlines()[2:]
    assert any("unknown unclean recovery strategy 'nosuch'" in x for x in tail), tail
    # It stopped what it started and let go of the data directory: it can start again.
    again = Up(tmp_path / "data", "--insecure")
    try:
        assert again.await_banner()[0].startswith("metactl cluster up:")
    finally:
        assert again.stop() == 0


def test_a_second_cluster_up_on_the_same_data_dir_is_refused_at_once(tmp_path: Path) -> None:
    first = Up(tmp_path / "data", "--insecure")
    try:
        first.await_banner()
        r = metactl(
            "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure",
            "--listen", f"127.0.0.1:{free_port()}", cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode != 0
        assert r.stderr.startswith("error: CLUSTER_START_FAILED: a cluster is already running")
        assert f"pid {first.proc.pid}" in r.stderr
    finally:
        assert first.stop() == 0


def test_children_do_not_outlive_a_killed_cluster_up(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", "--insecure")
    children = pids(up.await_banner())
    os.kill(up.proc.pid, signal.SIGKILL)  # only cluster up itself, not its group
    up.proc.wait()
    assert all(gone(pid) for pid in children.values())


def test_an_ha_quorum_on_etcd(tmp_path: Path) -> None:
    # Port 0: each controller binds any free port (the next ports after a chosen one may
    # be taken on a busy test machine). etcd's from --etcd-base-port (`Up`).
    flags = ["--insecure", "--controllers", "3", "--etcd", "3", "--listen", "127.0.0.1:0"]
    up = Up(tmp_path / "data", *flags)
    try:
        banner = up.await_banner()
        assert "3 controllers" in banner[0] and "3-member etcd" in banner[0]
        children = pids(banner)
        assert {"etcd-1", "etcd-2", "etcd-3", "controller 1", "controller 3"} <= set(children)
        describe = up.command("describe")
        r = metactl(*describe, cwd=tmp_path)
        assert r.returncode == 0 and "Topic: demo" in r.stdout, r.stderr
        bootstrap = describe[describe.index("--bootstrap-controller") + 1]
        assert len(bootstrap.split(",")) == 3
        log = next(x.split()[1] for x in banner if x.startswith("  log:"))
        r = metactl("log", "verify", "--data-dir", log, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("ok: etcd://"), r.stderr
    finally:
        assert up.stop() == 0
    assert all(gone(pid) for pid in children.values())
    # Again on the same directory (issue 33, item 3), while outgoing connections hold the
    # etcd ports it kept (as a connection with SO_REUSEADDR, which etcd's listeners bind
    # past; tests/localcluster/test_etcd_restart_ports.py has the ones without).
    kept = json.loads((tmp_path / "data" / "etcd" / "ports.json").read_text())["ports"]
    with held_by_connections(kept):
        again = Up(tmp_path / "data", *flags, "--etcd-base-port", str(kept[0]))
        try:
            banner = again.await_banner()
            r = metactl(*again.command("describe"), cwd=tmp_path)
            assert r.returncode == 0 and "Topic: demo" in r.stdout, r.stderr
        finally:
            assert again.stop() == 0
    assert json.loads((tmp_path / "data" / "etcd" / "ports.json").read_text())["ports"] == kept


@contextlib.contextmanager
def held_by_connections(ports: list[int]) -> Iterator[None]:
    """An outgoing connection (SO_REUSEADDR) from each of `ports` to a listener of its
    own, open until the end."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.socket())
        server.bind(("127.0.0.1", 0))
        server.listen(len(ports))
        for port in ports:
            client = stack.enter_context(socket.socket())
            client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            client.bind(("127.0.0.1", port))
            client.connect(server.getsockname())
            stack.enter_context(server.accept()[0])
        yield
