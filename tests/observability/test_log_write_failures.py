"""`metactl_log_append_failures_total`: appends that fail for real raise it, scraped over
HTTP from a real controller service driven over TCP.

Two ways to make the disk refuse writes:
- SQLite's own page limit (`debug_limit_pages`, as the existing disk-full tests do): SQLite
  fails the commit with SQLITE_FULL, exactly as on a full disk; runs everywhere.
- a really full filesystem: the controller as a subprocess in a private mount namespace
  whose data directory is a 1 MiB tmpfs, filled by its own log (needs root and
  `unshare`; skipped otherwise). Freeing a ballast file lets it commit again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metactl.errors import StorageError
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker
from tests.metadata_log.log_fixtures import LineReader

FAILURES = "metactl_log_append_failures_total"
REPO = Path(__file__).resolve().parents[2]


async def scrape(address: str) -> dict[str, float]:
    """Every unlabelled sample of the service's /metrics, over HTTP."""

    def get() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            body: bytes = resp.read()
            return body.decode()

    text = await asyncio.to_thread(get)
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


async def start_brokers(conn: RpcClient, *brokers: int) -> None:
    for b in brokers:
        r = await conn.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        hb = await conn.request(
            BrokerHeartbeatRequest(
                broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
            )
        )
        assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced


async def create(conn: RpcClient, name: str, partitions: int) -> str | None:
    """Create a topic (RF 3); its error code, or None."""
    r = await conn.request(
        CreateTopicsRequest(
            topics=[CreateTopic(name=name, partitions=partitions, replication_factor=3)]
        )
    )
    assert isinstance(r, CreateTopicsResponse)
    return r.results[0].error_code


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    config = ControllerConfig(broker_session_timeout_ms=600_000)
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=config, metrics="127.0.0.1:0")
    await svc.start()
    yield svc
    await svc.stop()


async def test_disk_full_appends_raise_the_counter_and_nothing_commits(
    service: ControllerService,
) -> None:
    store = service.store
    assert store is not None
    host, port = parse_address(service.address)
    conn = await RpcClient.open(host, port)
    try:
        await start_brokers(conn, 1, 2, 3)
        assert await create(conn, "wide", 2000) is None  # broker 3 is in 2000 ISRs
        assert (await scrape(service.metrics_address))[FAILURES] == 0  # present from the start
        end = store.end_offset

        await store.debug_limit_pages(0)  # the disk is full
        assert await create(conn, "big-1", 2000) == "KAFKA_STORAGE_ERROR"
        assert await create(conn, "big-2", 2000) == "KAFKA_STORAGE_ERROR"
        # The fence a session expiry submits (broker 3 leaves 2000 ISRs) cannot commit.
        with pytest.raises(StorageError):
            await service.controller.submit(FenceBroker(broker_id=3))
        metrics = await scrape(service.metrics_address)
        assert metrics[FAILURES] == 3
        assert store.end_offset == end  # nothing committed
        described = await conn.request(DescribeClusterRequest())  # still serving
        assert isinstance(described, DescribeClusterResponse)
        assert described.committed_offset == end
        assert {p.topic for p in described.partitions} == {"wide"}
        assert all(not b.fenced for b in described.brokers)

        await store.debug_limit_pages(None)  # space again: commits resume
        assert await create(conn, "big-1", 2000) is None
        after = await scrape(service.metrics_address)
        assert after[FAILURES] == 3  # successes do not count
        assert store.end_offset > end
    finally:
        await conn.close()


# --- a really full filesystem -------------------------------------------------------------


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
        check=False,
    )  # fmt: skip
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(
    not _can_mount_tmpfs(), reason="needs root and unshare to mount a private tmpfs"
)

# In a private mount namespace: a 1 MiB tmpfs on $1 (gone when the process exits), a
# 256 KiB ballast file to free later, then the controller with its log on the tmpfs.
_IN_NAMESPACE = (
    'mount -t tmpfs -o size=1m tmpfs "$1" && '
    'dd if=/dev/zero of="$1/ballast" bs=1k count=256 2>/dev/null && '
    'shift && exec "$@"'
)


def controller_on_tmpfs(mnt: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_NAMESPACE, "sh",
         str(mnt), sys.executable, "-m", "controller", "--data-dir", str(mnt / "log"),
         "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--insecure",
         "--session-timeout-ms", "600000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )  # fmt: skip


@pytest.mark.slow
@needs_tmpfs
async def test_a_full_filesystem_raises_the_counter_until_space_is_freed(tmp_path: Path) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = controller_on_tmpfs(mnt)
    try:
        assert proc.stdout is not None
        ready = LineReader(proc.stdout, "controller").next()
        assert ready.startswith("READY controller"), ready
        fields = dict(f.split("=", 1) for f in ready.split()[2:])
        # The tmpfs as the controller sees it (its mount namespace, through /proc).
        disk = Path(f"/proc/{proc.pid}/root") / mnt.relative_to("/")
        assert (disk / "ballast").stat().st_size == 256 * 1024
        host, port = parse_address(fields["listen"])
        conn = await RpcClient.open(host, port)
        try:
            await start_brokers(conn, 1, 2, 3)
            # Fill the disk with the log itself until an append fails.
            errors: list[str | None] = []
            for i in range(200):
                errors.append(await create(conn, f"fill-{i}", 200))
                if errors[-1] is not None:
                    break
            assert errors[-1] == "KAFKA_STORAGE_ERROR", errors
            committed = (await scrape(fields["metrics"]))["metactl_last_committed_offset"]
            # Every further append fails, and each one counts.
            for i in range(3):
                assert await create(conn, f"more-{i}", 200) == "KAFKA_STORAGE_ERROR"
            metrics = await scrape(fields["metrics"])
            assert metrics[FAILURES] == 4
            assert metrics["metactl_last_committed_offset"] == committed
            described = await conn.request(DescribeClusterRequest())
            assert isinstance(described, DescribeClusterResponse)
            assert described.committed_offset == committed + 1

            (disk / "ballast").unlink()  # space again
            assert await create(conn, "after", 10) is None
            metrics = await scrape(fields["metrics"])
            assert metrics[FAILURES] == 4
            assert metrics["metactl_last_committed_offset"] > committed
        finally:
            await conn.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
