"""The offline commands read a log on etcd as they read a SQLite one: `log dump`,
`log verify`, `describe`, `brokers` and `events` take the log's URL where they take a
data directory. The log is written here by the real controller driver on a real etcd
member."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from localcluster.etcd import LocalEtcd
from metadata_log.batch_format import StoredBatch
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import op_put
from metadata_log.mirror import MirrorReport, mirror_to_sqlite
from metadata_log.sqlite_store import SqliteLogStore
from ops.cli import main
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import BrokerHeartbeatRequest, RegisterBroker


def write_log(url: str) -> int:
    """Three brokers and a topic `orders` (3 partitions, RF 3); the log's end offset."""

    async def run() -> int:
        store = await EtcdLogStore.open(url)
        ctl = await Controller.open(store, clock=VirtualClock(1_700_000_000_000))
        try:
            for b in (1, 2, 3):
                r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
                await ctl.submit(
                    BrokerHeartbeatRequest(
                        broker_id=b,
                        broker_epoch=r.broker_epoch,  # type: ignore[union-attr]
                        metadata_offset=1 << 40,
                    )
                )
            await ctl.submit(CreateTopic(name="orders", partitions=3, replication_factor=3))
            return ctl.committed_image.end_offset
        finally:
            await ctl.close()
            await store.close()

    return asyncio.run(run())


REPO = Path(__file__).resolve().parents[2]

# Builds metactl's parser and starts and stops a controller on a SQLite log, then names
# the etcd client's modules that were loaded.
ETCD_FREE = """
import asyncio, sys, tempfile
from pathlib import Path
from controller.runtime.service import ControllerService
from ops.cli import build_parser

build_parser()

async def serve(d):
    service = ControllerService(Path(d), "127.0.0.1:0")
    await service.start()
    await service.stop()

with tempfile.TemporaryDirectory() as d:
    asyncio.run(serve(d))
print(sorted(m for m in ("grpc", "etcd3aio") if m in sys.modules))
"""


def test_the_etcd_client_loads_only_for_an_etcd_log() -> None:
    """The etcd client library and gRPC (tens of ms per process) are not loaded by the
    metactl parser, nor by a controller whose log is SQLite."""
    done = subprocess.run(
        [sys.executable, "-c", ETCD_FREE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


@pytest.fixture
def url(etcd: LocalEtcd) -> str:
    return etcd.url(f"offline/{uuid.uuid4().hex[:10]}")


def test_offline_commands_read_an_etcd_log(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    end = write_log(url)
    assert main(["log", "verify", "--data-dir", url]) == 0
    assert f"{end:,} records" in capsys.readouterr().out
    assert main(["log", "dump", "--data-dir", url, "--type", "Topic", "--json"]) == 0
    [topic] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert topic["name"] == "orders" and topic["partitions"] == 3
    assert main(["describe", "--data-dir", url, "--topic", "orders"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Topic: orders\t") and out.count("\tPartition: ") == 3
    assert main(["brokers", "--data-dir", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [b["broker_id"] for b in doc["brokers"]] == [1, 2, 3]
    assert main(["events", "--data-dir", url]) == 0
    assert "broker 3" in capsys.readouterr().out


def test_a_damaged_etcd_log_is_named_by_verify(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(url)

    async def damage() -> None:
        etcd = await Etcd.connect(EtcdTarget.parse(url))
        try:
            key = etcd.target.key(f"log/{0:020d}")
            kv, _ = await etcd.get(key)
            value = bytearray(kv.value)
            value[-1] ^= 0x01
            await etcd.txn("damage", [], [op_put(key, bytes(value))])
        finally:
            await etcd.close()

    asyncio.run(damage())
    assert main(["log", "verify", "--data-dir", url]) == 1
    err = capsys.readouterr().err
    assert "CORRUPT_MESSAGE" in err and "first bad offset: 0" in err


def test_a_missing_etcd_log_is_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "dump", "--data-dir", url]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: LOG_ERROR: no metadata log at etcd://")


def test_a_mirror_is_the_same_log_batch_for_batch(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    end = write_log(url)
    assert main(["log", "mirror", "--data-dir", url, "--to", str(tmp_path / "m")]) == 0
    assert f"offsets [0, {end})" in capsys.readouterr().out

    async def both() -> tuple[list[Any], list[Any]]:
        async with await EtcdLogStore.open(url, read_only=True) as a:
            etcd = [b async for chunk in a.iter_stored() for b in chunk]
        async with await SqliteLogStore.open(tmp_path / "m", read_only=True) as b:
            sqlite = [x async for chunk in b.iter_stored() for x in chunk]
        return etcd, sqlite

    etcd, sqlite = asyncio.run(both())
    assert etcd == sqlite and sum(b.count for b in sqlite) == end
    assert main(["log", "verify", "--data-dir", str(tmp_path / "m")]) == 0
    # A second mirror into the same place is refused; the first stays intact.
    assert main(["log", "mirror", "--data-dir", url, "--to", str(tmp_path / "m")]) != 0
    assert "exists" in capsys.readouterr().err


def test_a_mirror_copies_the_snapshots_and_start_of_a_truncated_log(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log deleted up to a snapshot: the copy starts where it starts and holds that
    snapshot. A snapshot taken while the copy is made, past its end, is left out."""
    write_log(url)
    out = tmp_path / "m"

    async def run() -> tuple[MirrorReport, int, int]:
        store = await EtcdLogStore.open(url)
        ctl = await Controller.open(store, clock=VirtualClock(1_700_000_001_000))
        try:
            snapshot = await ctl.write_snapshot()
            await ctl.submit(CreateTopic(name="later", partitions=1, replication_factor=3))
            assert await store.delete_before_snapshot() > 0
            async with await EtcdLogStore.open(url, read_only=True) as source:
                copy = source.iter_stored

                async def copy_then_write(chunk: int = 64) -> AsyncIterator[list[StoredBatch]]:
                    async for batches in copy(chunk):
                        yield batches
                    # The copy's end is fixed; the log moves on and is snapshotted past it.
                    await ctl.submit(CreateTopic(name="during", partitions=1, replication_factor=3))
                    await ctl.write_snapshot()

                source.iter_stored = copy_then_write  # type: ignore[method-assign]
                report = await mirror_to_sqlite(source, out)
            return report, snapshot, store.start_offset
        finally:
            await ctl.close()
            await store.close()

    report, snapshot, start = asyncio.run(run())
    assert start == snapshot > 0
    assert (report.start_offset, report.snapshots) == (start, 1)

    async def mirrored() -> tuple[int, list[int], int]:
        async with await SqliteLogStore.open(out, read_only=True) as m:
            return m.start_offset, await m.snapshot_offsets(), m.end_offset

    assert asyncio.run(mirrored()) == (start, [snapshot], report.end_offset)
    assert main(["log", "verify", "--data-dir", str(out)]) == 0
    assert main(["describe", "--data-dir", str(out), "--json"]) == 0
    topics = {
        p["topic"] for p in json.loads(capsys.readouterr().out.splitlines()[-1])["partitions"]
    }
    assert topics == {"orders", "later"}


def test_an_etcd_log_exports_to_parquet_through_a_mirror(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Spark audits' input (Parquet, or SQLite files) from an etcd log: every record,
    under the prefix's name as the cluster."""
    import pyarrow.dataset as ds

    end = write_log(url)
    out = tmp_path / "parquet"
    assert main(["log", "export", "--data-dir", url, "--parquet", str(out)]) == 0
    assert f"exported {end:,} records" in capsys.readouterr().out
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == end
    assert set(table.column("cluster").to_pylist()) == {url.rsplit("/", 1)[-1]}
    assert sorted(table.column("offset").to_pylist()) == list(range(end))
