"""`metactl controller serve` on a corrupted log: a real subprocess, a real SQLite file
whose early batch is damaged. Start-up fails at once with one line naming the file and
the offset, and the process exits 1 (it used to print the line and hang, not listening:
the store it had opened kept aiosqlite's non-daemon threads alive). `--verify-log full`
also finds damage that the default tail check and replay never read (behind a snapshot).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from localcluster.etcd import LocalEtcd
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from protocol.messages.broker_controller import RegisterBroker
from tests.metadata_log.test_verify_open import corrupt_payload

REPO = Path(__file__).resolve().parents[2]
# Bounds a hung child (a failure), not the speed of a healthy one.
EXIT_BOUND_S = 60


def metactl() -> list[str]:
    script = Path(sys.executable).with_name("metactl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ops.cli"]


async def write_log(data_dir: Path, *, brokers: int, snapshot_at: int | None = None) -> None:
    """One batch per broker registration (the real controller writes them); with
    `snapshot_at`, a snapshot once that many brokers are registered."""
    store = await SqliteLogStore.open(data_dir)
    ctl = await Controller.open(store, config=ControllerConfig(), clock=VirtualClock())
    try:
        for b in range(brokers):
            await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"broker-{b}"))
            if snapshot_at is not None and b + 1 == snapshot_at:
                assert await ctl.write_snapshot() == snapshot_at
    finally:
        await ctl.close()
        await store.close()


def serve(data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*metactl(), "controller", "serve", "--data-dir", str(data_dir), "--listen",
         "127.0.0.1:0", "--insecure", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )  # fmt: skip


def failed_start(proc: subprocess.Popen[str], path: Path, offset: int) -> list[str]:
    """Await the exit; assert status 1, no READY, no traceback, and exactly one line
    naming the file and the offset. Returns the stderr lines."""
    try:
        out, err = proc.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("controller serve did not exit on a corrupted log") from None
    assert proc.returncode == 1, (out, err)
    assert "READY" not in out
    assert "Traceback" not in err
    lines = err.splitlines()
    naming = [line for line in lines if f"at offset {offset}" in line]
    assert naming == [f"error: CORRUPT_MESSAGE: batch CRC mismatch ({path} at offset {offset})"]
    return lines


@pytest.mark.parametrize("verify", [[], ["--verify-log", "tail"], ["--verify-log", "full"]])
def test_an_early_corrupt_batch_fails_start_up_and_the_process_exits(
    tmp_path: Path, verify: list[str]
) -> None:
    asyncio.run(write_log(tmp_path, brokers=100))
    path = tmp_path / LOG_FILE_NAME
    corrupt_payload(path, 3)  # 97 batches before the end: outside the 64-batch tail check
    lines = failed_start(serve(tmp_path, *verify), path, 3)
    if verify[-1:] == ["full"]:
        assert any('"verifying the whole metadata log"' in line for line in lines)


def test_damage_behind_a_snapshot_is_found_only_by_verify_log_full(tmp_path: Path) -> None:
    asyncio.run(write_log(tmp_path, brokers=110, snapshot_at=100))
    path = tmp_path / LOG_FILE_NAME
    corrupt_payload(path, 3)

    # Default: the tail (offsets 46..109) is intact and replay starts at the snapshot.
    proc = serve(tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("READY controller listen=")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_BOUND_S) == 0
        proc.communicate()

    failed_start(serve(tmp_path, "--verify-log", "full"), path, 3)


def test_a_healthy_log_with_verify_log_full_serves(tmp_path: Path) -> None:
    asyncio.run(write_log(tmp_path, brokers=10, snapshot_at=5))
    proc = serve(tmp_path, "--verify-log", "full")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("READY controller listen=")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_BOUND_S) == 0
        _, err = proc.communicate()
    verified = [line for line in err.splitlines() if '"metadata log verified"' in line]
    assert len(verified) == 1
    # Plaintext is said out loud: one WARNING that any client may act as anyone.
    [insecure] = [line for line in err.splitlines() if "TLS is off (--insecure)" in line]
    assert '"level": "warning"' in insecure
    assert '"records": 10' in verified[0] and '"snapshots": 1' in verified[0]


def test_start_up_failures_are_one_line_and_an_exit(tmp_path: Path) -> None:
    """A port in use and a log another controller holds: one `error: NAME:` line naming
    the cause, exit 1, no traceback, nothing left running (the bound catches a hang)."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        r = subprocess.run(
            [*metactl(), "controller", "serve", "--data-dir", str(tmp_path / "a"),
             "--listen", f"127.0.0.1:{port}", "--insecure"],
            capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
        )  # fmt: skip
    finally:
        busy.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert (
        line == f"error: LISTEN_FAILED: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    # A busy --metrics port is the same failure, with the same name and status (issue 22:
    # it was INVALID_CONFIG).
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        r = subprocess.run(
            [*metactl(), "controller", "serve", "--data-dir", str(tmp_path / "m"),
             "--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}", "--insecure"],
            capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
        )  # fmt: skip
    finally:
        busy.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: LISTEN_FAILED: cannot serve /metrics on 127.0.0.1:{port}")

    holder = serve(tmp_path / "b")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("READY controller listen=")
        r = subprocess.run(
            [*metactl(), "controller", "serve", "--data-dir", str(tmp_path / "b"),
             "--listen", "127.0.0.1:0", "--insecure"],
            capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
        )  # fmt: skip
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=EXIT_BOUND_S)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: LOG_ERROR: metadata log ") and "lock" in line


def test_an_etcd_log_that_cannot_be_used_is_one_line(tmp_path: Path, etcd: LocalEtcd) -> None:
    """Unreachable etcd endpoints are named; another cluster's log is refused by id."""
    r = subprocess.run(
        [*metactl(), "controller", "serve", "--data-dir", str(tmp_path / "a"), "--insecure",
         "--listen", "127.0.0.1:0", "--metadata-log", "etcd://127.0.0.1:1,127.0.0.1:2/x"],
        capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: METADATA_STORE_UNAVAILABLE: etcd at 127.0.0.1:1,127.0.0.1:2")

    url = etcd.url(f"startup/{tmp_path.name}")
    asyncio.run(_create_etcd_log(url, "cluster-a"))
    r = subprocess.run(
        [*metactl(), "controller", "serve", "--data-dir", str(tmp_path / "b"), "--insecure",
         "--listen", "127.0.0.1:0", "--metadata-log", url, "--cluster-id", "cluster-b"],
        capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: INCONSISTENT_CLUSTER_ID: ") and "'cluster-a'" in line


async def _create_etcd_log(url: str, cluster_id: str) -> None:
    store = await EtcdLogStore.open(url, cluster_id=cluster_id)
    await store.close()
